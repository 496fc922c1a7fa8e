"""How big a pool of started runners should be now: warm Pods of one kind, or the local fork server's
spares. One rule for both.

A pool holds, between its minimum and maximum and within the room its cluster has left, the larger
of the runs already due and queued for it (reactive) and the forecast: the most runs due in one
minute that is under way or starts within the lead time (``runplane/demand/forecast.py``). So it
grows to a peak's size a lead time before the peak's minute, holds through the minute, and shrinks
once the minute is over and the queue has drained. The lead time is at least the configured one,
and longer when the runners the peak still lacks cannot be created in time at the pool's measured
create rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runplane.adapters import instruments
from runplane.demand.forecast import MINUTE, Forecast, RunnerKind

NO_POOL = "none"  # the pool of a launch no pool fits


@dataclass(frozen=True)
class PoolPlan:
    """One look at a pool: what the forecast asks, how far ahead, and the size it should have."""

    forecast: int  # the most runs due in one minute within the lead time
    lead: float  # seconds before a minute the pool holds its forecast
    queued: int  # due runs queued for the pool now
    target: int


def lead_time(configured: float, *, peak: int, idle: int, create_rate: float, horizon: float) -> float:
    """At least ``configured``; long enough to start the ``peak - idle`` runners missing at
    ``create_rate`` per second; never beyond the forecast's ``horizon``."""
    missing = max(0, peak - idle)
    needed = missing / create_rate if create_rate > 0 else horizon
    return min(horizon, max(configured, needed))


def plan_pool(
    forecast: Forecast,
    fits: Callable[[RunnerKind], bool],
    *,
    now: float,
    lead: float,
    idle: int,
    queued: int,
    min_size: int,
    max_size: int,
    create_rate: float,
    horizon_minutes: int,
    room: int | None = None,
    share: int = 1,
) -> PoolPlan:
    """The size a pool should have at ``now`` (see the module's docstring); ``room``: how many more
    runners the cluster holds (None: no limit); ``share``: how many pools serve the same runs alike
    (each holds its part)."""
    peak = -(-max((forecast.due(minute, fits) for minute in forecast.minutes()), default=0) // share)
    ahead_lead = lead_time(lead, peak=peak, idle=idle, create_rate=create_rate, horizon=horizon_minutes * MINUTE)
    ahead = -(-forecast.ahead(now, ahead_lead, fits) // share)
    queued = -(-queued // share)
    target = max(min_size, min(max_size, max(queued, ahead)))
    if room is not None:
        target = min(target, max(0, room))
    return PoolPlan(forecast=ahead, lead=ahead_lead, queued=queued, target=target)


def record_launch(*, pool: str, cluster: str, warm: bool) -> None:
    """Export one launch: whether a started runner of the run's pool was waiting for it (warm) or the
    run waited for a runner to start (cold); ``pool`` is ``NO_POOL`` when no pool fits the run."""
    instruments.pool_launches.add(1, {"pool": pool, "cluster": cluster, "served": "warm" if warm else "cold"})


def record_plan(plan: PoolPlan, *, pool: str, cluster: str, idle: int) -> None:
    """Export a look at a pool: its idle runners, target, forecast, queue and lead time."""
    labels = {"pool": pool, "cluster": cluster}
    instruments.pool_idle.set(idle, labels)
    instruments.pool_target.set(plan.target, labels)
    instruments.pool_forecast.set(plan.forecast, labels)
    instruments.pool_queued.set(plan.queued, labels)
    instruments.pool_lead_time.set(plan.lead, labels)
