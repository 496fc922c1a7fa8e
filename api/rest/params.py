"""Query parameters as dbt Cloud's clients send them: lists repeated, comma-joined or JSON-ish."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping

from fastapi import Request

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


def related(values: list[str] | None) -> set[str]:
    """The include_related of a run request; an unknown name is InvalidArgument."""
    names = words(values)
    unknown = names - RUN_RELATED
    if unknown:
        allowed = ", ".join(sorted(RUN_RELATED))
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


def order_by(value: str | None, allowed: tuple[str, ...], default: str = "id") -> str:
    """A field to order by, ``-`` in front for descending; only the ones listed in ``allowed``."""
    if not value:
        return default
    if value.removeprefix("-") not in allowed:
        names = ", ".join(allowed)
        raise InvalidArgument("order_by", f"{value[:40]!r} is not one of {names} (with '-' for descending)")
    return value


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


def dbt_versions(request: Request) -> InstalledDbtVersions:
    """The dbt versions runs may name (``runplane.dbt.versions``), as the app was made with."""
    versions: InstalledDbtVersions = request.app.state.dbt_versions
    return versions
