"""Query parameters as dbt Cloud's clients send them: lists repeated, comma-joined or JSON-ish."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from enum import StrEnum

from fastapi import Request, Response

from runplane.basics.errors import InvalidArgument
from runplane.basics.types import RunStatus
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles

_LIST_NOISE = re.compile(r"[\[\]\"' ]")
# What dbt Cloud's include_related accepts for a run.
RUN_RELATED = frozenset(
    {
        "trigger",
        "job",
        "run_steps",
        "debug_logs",
        "environment",
        "repository",
        "project",
        "run_retries",
        "deferring_run",
        "used_repo_cache",
        "audit",
    }
)
# Text a filter may hold: no control characters (Postgres refuses NUL; none belongs in a name).
PLAIN_TEXT = r"^[^\x00-\x1f\x7f]*$"
# Every list also takes these, and echoes them in extra.filters.
PAGING = frozenset({"limit", "offset", "order_by"})
RUN_ORDERS = ("id", "created_at", "finished_at", "started_at", "status")
JOB_ORDERS = ("id", "name", "created_at", "updated_at")


def words(values: list[str] | None) -> set[str]:
    """``["trigger,job"]``, ``["trigger", "job"]`` and ``["['trigger', 'job']"]`` all mean {trigger, job}."""
    out: set[str] = set()
    for value in values or []:
        out.update(part for part in _LIST_NOISE.sub("", value).split(",") if part)
    return out


def related(values: list[str] | None, known: frozenset[str] = RUN_RELATED) -> set[str]:
    """The include_related of a request (a run's by default); an unknown name is InvalidArgument."""
    names = words(values)
    unknown = names - known
    if unknown:
        allowed = ", ".join(sorted(known))
        raise InvalidArgument("include_related", f"{sorted(unknown)[0][:40]!r} is not one of {allowed}")
    return names


def statuses(status: int | None, status_in: str | None) -> list[RunStatus]:
    """``status=10`` or ``status__in=[10,20]`` (either form of list) as run statuses."""
    codes: list[str] = [str(status)] if status is not None else []
    codes += sorted(words([status_in]) if status_in else set())
    known = {s.value for s in RunStatus}
    out: set[RunStatus] = set()
    for code in codes:
        if not code.lstrip("-").isdigit() or int(code) not in known:
            raise InvalidArgument(
                "status" if status is not None else "status__in", f"{code[:40]!r} is not a run status"
            )
        out.add(RunStatus(int(code)))
    return sorted(out)


def only_known(query: Mapping[str, str], known: frozenset[str]) -> None:
    """A query parameter the endpoint does not apply is refused, never silently ignored."""
    for name in query:
        if name not in known and name not in PAGING:
            allowed = ", ".join(sorted(known | PAGING))
            raise InvalidArgument(name[:60], f"is not a filter of this list (filters: {allowed})")


def refused(query: Mapping[str, str], reasons: Mapping[str, str]) -> None:
    """A documented filter on what runplane does not keep is refused with the reason, never ignored."""
    for name, reason in reasons.items():
        if name in query:
            raise InvalidArgument(name, reason)


def ids(value: str | None, name: str) -> tuple[int, ...]:
    """``[1,2]``, ``1,2`` or ``1`` as positive ids; anything else is InvalidArgument naming ``name``."""
    out: list[int] = []
    for part in words([value] if value else []):
        if not part.isdigit() or not 1 <= int(part) <= 2**63 - 1:
            raise InvalidArgument(name, f"{part[:40]!r} is not an id")
        out.append(int(part))
    if value is not None and not out:
        raise InvalidArgument(name, "name at least one id")
    return tuple(out)


class State(StrEnum):
    """dbt Cloud's ``state`` filter: 1 or ``active``, 2 or ``deleted``, or ``all``."""

    ACTIVE = "active"
    DELETED = "deleted"
    ALL = "all"


_STATES = {"1": State.ACTIVE, "2": State.DELETED, **{s.value: s for s in State}}


def state(value: str | None, default: State) -> State:
    """The ``state`` a list was asked for (``default`` without one)."""
    if value is None:
        return default
    found = _STATES.get(value.strip().lower())
    if found is None:
        raise InvalidArgument("state", f"{value[:40]!r} is not one of 1, 2, active, deleted, all")
    return found


# Where a URL's unescaped '+' of an offset became a space: "12:00:00 00:00".
_OFFSET_SPACE = re.compile(r" (\d{2}:?\d{2})$")


def date_range(value: str | None, name: str) -> tuple[datetime, datetime] | None:
    """A ``__range`` filter: two ISO 8601 date-times (or dates), comma-joined or as a JSON list; both ends
    are included, as dbt Cloud's (Django's) ``__range`` includes them. Without an offset they are UTC."""
    if value is None:
        return None
    parts = [p.strip().strip("\"'") for p in value.strip().strip("[]").split(",")]
    if len(parts) != 2 or not all(parts):
        raise InvalidArgument(name, "must be two date-times, the start and the end, e.g. 2024-05-01,2024-06-01")
    ends: list[datetime] = []
    for part in parts:
        try:
            moment = datetime.fromisoformat(_OFFSET_SPACE.sub(r"+\1", part))
        except ValueError:
            raise InvalidArgument(name, f"{part[:40]!r} is not an ISO 8601 date-time") from None
        ends.append(moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC))
    if ends[0] > ends[1]:
        raise InvalidArgument(name, "the start is after the end")
    return ends[0], ends[1]


def texts(value: str | None, name: str) -> tuple[str, ...]:
    """``["1.9","1.10"]``, ``1.9,1.10`` or ``1.9`` as the words a list filter names (none: not filtered)."""
    out = tuple(sorted(words([value]))) if value is not None else ()
    if value is not None and not out:
        raise InvalidArgument(name, "name at least one value")
    return out


def order_by(value: str | None, allowed: tuple[str, ...], default: str = "id") -> str:
    """A field to order by, ``-`` in front for descending; only the ones listed in ``allowed``."""
    if not value:
        return default
    if value.removeprefix("-") not in allowed:
        names = ", ".join(allowed)
        raise InvalidArgument("order_by", f"{value[:40]!r} is not one of {names} (with '-' for descending)")
    return value


# An entity tag is the object's version; If-Match may send it quoted (as ETag shows it) or bare.
_VERSION_TAG = re.compile(r'"?([1-9][0-9]{0,17})"?')


def tag(response: Response, version: int) -> None:
    """Send a job's, project's or environment's version as the answer's ETag (what an update's If-Match names)."""
    response.headers["ETag"] = f'"{version}"'


def expected_version(if_match: str | None) -> int:
    """The version an ``If-Match`` header names; 0 (any) without one or with ``*``."""
    if if_match is None or if_match.strip() == "*":
        return 0
    found = _VERSION_TAG.fullmatch(if_match.strip())
    if found is None:
        raise InvalidArgument("If-Match", "must be the version the object was read at, as its ETag shows it")
    return int(found.group(1))


@contextlib.contextmanager
def named_as(names: Mapping[str, str]) -> Iterator[None]:
    """An InvalidArgument raised inside names its field as the REST body does (``names``: runplane's → REST's)."""
    try:
        yield
    except InvalidArgument as exc:
        for ours, theirs in names.items():
            if exc.field == ours or exc.field.startswith((f"{ours}.", f"{ours}[")):
                reason = str(exc).removeprefix(f"{exc.field}: ")
                raise InvalidArgument(theirs + exc.field[len(ours) :], reason) from exc
        raise


def warehouses(request: Request) -> WarehouseFiles:
    """Where runs keep warehouse files (``runplane.dbt.warehouse_files``), as the app was made with."""
    rule: WarehouseFiles = request.app.state.warehouses
    return rule


def same_account(named: int | None, account_id: int) -> None:
    """A body's ``account_id``, when it sends one, must be the URL's: another is refused, never ignored."""
    if named is not None and named != account_id:
        raise InvalidArgument("account_id", f"names account {named}; the URL names account {account_id}")


def dbt_versions(request: Request) -> InstalledDbtVersions:
    """The dbt versions runs may name (``runplane.dbt.versions``), as the app was made with."""
    versions: InstalledDbtVersions = request.app.state.dbt_versions
    return versions
