"""Cron maths: validation and the next fire time in an IANA time zone, DST-correct.

Fire times are unix seconds. Evaluation happens in local wall time of the job's zone: a wall time
skipped by a spring-forward gap does not fire; a wall time repeated by a fall-back fires once, at
its first occurrence.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from runplane.basics.errors import InvalidArgument, RunplaneError

MAX_CRON_LENGTH = 200
# A schedule must fire within this many years of now. Eight years covers ``0 0 29 2 *`` across a
# century year that is not a leap year (2096 -> 2104); an expression such as ``0 0 31 2 *`` (no 31st
# of February) never fires and is refused.
FIRE_HORIZON_YEARS = 8


class NeverFires(RunplaneError):
    """A schedule whose next fire cannot be found (it names a date that never exists)."""


def validate_cron(expr: str, field: str = "cron") -> str:
    """The expression, stripped, or InvalidArgument naming ``field``."""
    expr = expr.strip()
    if not expr:
        raise InvalidArgument(field, "must not be empty")
    if len(expr) > MAX_CRON_LENGTH:
        raise InvalidArgument(field, f"must be at most {MAX_CRON_LENGTH} characters")
    if len(expr.split()) != 5:
        raise InvalidArgument(field, f"{expr!r} must have five fields (minute hour day month weekday)")
    try:
        valid = croniter.is_valid(expr)
    except Exception:  # croniter raises more than its own errors on odd input
        valid = False
    if not valid:
        raise InvalidArgument(field, f"{expr!r} is not a valid cron expression")
    return expr


def validate_fires(expr: str, timezone: str, field: str = "cron", *, now: float | None = None) -> None:
    """InvalidArgument naming ``field`` unless ``expr`` fires in ``timezone`` within the horizon."""
    start = time.time() if now is None else now
    try:
        first = next_fire(expr, timezone, start)
    except NeverFires:
        first = None
    if first is None or first - start > FIRE_HORIZON_YEARS * 366 * 86400:
        raise InvalidArgument(field, f"{expr!r} never fires in the next {FIRE_HORIZON_YEARS} years")


def validate_timezone(name: str, field: str = "timezone") -> str:
    name = name.strip() or "UTC"
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # Only the start of what was sent: the error never echoes unbounded input.
        raise InvalidArgument(field, f"{name[:64]!r} is not an IANA time zone") from exc
    return name


@lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    if len(name) > 64 or "\x00" in name:
        raise ValueError(name)
    return ZoneInfo(name)


def next_fire(expr: str, timezone: str, after: float) -> int:
    """The first fire time strictly after ``after`` (unix seconds); NeverFires when there is none."""
    # Fire times are whole seconds: the first one after floor(after) is also the first after ``after``.
    return _next_fire(expr, timezone, math.floor(after))


@lru_cache(maxsize=16_384)
def _next_fire(expr: str, timezone: str, after: int) -> int:
    # Cached: a burst of jobs sharing a schedule asks the same question many times in one second.
    tz = zone(timezone)
    it = _iterator(expr)
    # Iterate in naive local wall time: croniter then only ever yields wall times that match the
    # expression, and the zone decides which of them exist (gap) or repeat (fold).
    it.set_current(_wall(after, tz), force=True)
    try:
        for _ in range(_MAX_CANDIDATES):
            candidate: datetime = it.get_next(datetime)
            ts = _wall_to_unix(candidate, tz)
            if ts is not None and ts > after:
                return ts
    except (CroniterError, ValueError, OverflowError) as exc:
        # croniter gives up on a date that never exists (the 31st of February), or runs past year 9999.
        raise NeverFires(f"{expr!r} does not fire after {after} in {timezone}") from exc
    raise NeverFires(f"{expr!r} does not fire after {after} in {timezone}")


def previous_fire(expr: str, timezone: str, at_or_before: float) -> int | None:
    """The newest fire time at or before ``at_or_before``; None if there is none in a year."""
    return _previous_fire(expr, timezone, math.floor(at_or_before))


@lru_cache(maxsize=16_384)
def _previous_fire(expr: str, timezone: str, at_or_before: int) -> int | None:
    tz = zone(timezone)
    it = _iterator(expr)
    local = datetime.fromtimestamp(math.floor(at_or_before), tz)
    start = local.replace(tzinfo=None)
    if local.fold:
        # In the second pass of a repeated hour, later wall times of that hour already happened (in
        # the first pass): start the search past them.
        first_offset, offset = local.replace(fold=0).utcoffset(), local.utcoffset()
        if first_offset is not None and offset is not None:
            start += first_offset - offset
    # One second past it, so a fire exactly at ``at_or_before`` counts.
    it.set_current(start + timedelta(seconds=1), force=True)
    limit = at_or_before - 366 * 86400
    try:
        for _ in range(_MAX_CANDIDATES):
            candidate: datetime = it.get_prev(datetime)
            ts = _wall_to_unix(candidate, tz)
            if ts is None:
                continue
            if ts < limit:
                return None
            if ts <= at_or_before:
                return ts
    except (CroniterError, ValueError, OverflowError):
        return None  # a date that never exists: nothing was missed
    return None


# Bounds a search through wall times that never exist or lie on the wrong side of a fold.
_MAX_CANDIDATES = 2_000


@lru_cache(maxsize=4096)
def _iterator(expr: str) -> croniter:
    """One parsed expression per distinct cron string; callers reposition it with set_current."""
    return croniter(expr, datetime(2000, 1, 1))


def _wall(unix_ts: int, tz: ZoneInfo) -> datetime:
    """Naive local wall time of an instant (on a fold, the wall time as shown at that instant)."""
    return datetime.fromtimestamp(unix_ts, tz).replace(tzinfo=None)


def _wall_to_unix(wall: datetime, tz: ZoneInfo) -> int | None:
    """Unix seconds of a local wall time: None inside a spring-forward gap, the first instant on a
    fall-back repeat."""
    first = wall.replace(tzinfo=tz, fold=0)
    # A wall time in a gap does not survive the round trip through UTC.
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall:
        return None
    return int(first.timestamp())


def fires_between(expr: str, timezone: str, after: float, until: float, limit: int = 10_000) -> list[int]:
    """Every fire time in (after, until], at most ``limit``."""
    out: list[int] = []
    t = after
    while len(out) < limit:
        t = next_fire(expr, timezone, t)
        if t > until:
            break
        out.append(t)
    return out


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)
