"""What a benchmark measures and how repeated measurements become the reported records.

A scenario's single repetition returns ``Measurement`` values (metric, value, unit). The harness
tags them with scenario, system and N, repeats, and ``aggregate`` turns the repetitions into one
record per metric: ``value`` is the median, with ``min``, ``max`` and the number of ``runs``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """One figure from one repetition. ``value`` None means "not measured" (``note`` says why)."""

    metric: str
    value: float | None
    unit: str
    note: str = ""
    scenario: str = ""  # when set, the scenario it belongs to, instead of the measuring case's


@dataclass(frozen=True)
class Sample:
    """A measurement tagged with where it comes from."""

    scenario: str
    system: str
    n: int
    metric: str
    value: float | None
    unit: str
    note: str = ""


class Unavailable(Exception):
    """A scenario or system that cannot be measured here (not implemented yet, tool missing)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def lag_measurements(lags: Sequence[float], expected: int, cap: float, prefix: str = "lag") -> list[Measurement]:
    """p50/p99/max of lags (seconds), how many of ``expected`` happened, and ``all_done``: the time
    from the due time until the last one, when all did.

    Jobs that had not happened when the measurement gave up, ``cap`` seconds after the due time,
    count with a lag of ``cap`` (also those that slipped in while the system was being stopped):
    the percentiles are then lower bounds, and their note says so.
    """
    lags = [lag for lag in lags if lag <= cap]
    out = [Measurement("completed", float(len(lags)), "jobs")]
    missing = max(expected - len(lags), 0)
    counted = [*lags, *([cap] * missing)]
    note = f"lower bound: {missing} of {expected} not done after {cap:.0f} s, counted at {cap:.0f} s" if missing else ""
    if counted:
        out += [
            Measurement(f"{prefix}_p50", percentile(counted, 50), "s", note),
            Measurement(f"{prefix}_p99", percentile(counted, 99), "s", note),
            Measurement(f"{prefix}_max", max(counted), "s", note),
        ]
    if missing:
        out.append(Measurement("timed_out", 1.0, "runs", note=f"{len(lags)} of {expected} within {cap:.0f} s"))
    elif lags:
        out.append(Measurement("all_done", max(lags), "s"))
    return out


def aggregate(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    """One record per (scenario, system, n, metric, unit), in first-seen order.

    ``value`` is the median over repetitions, with ``min``, ``max`` and ``runs``. Measurements
    without a value (unavailable, skipped) give a record whose value is None and whose note says why.
    """
    groups: dict[tuple[str, str, int, str, str], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.scenario, sample.system, sample.n, sample.metric, sample.unit), []).append(sample)
    records: list[dict[str, Any]] = []
    for (scenario, system, n, metric, unit), group in groups.items():
        values = [s.value for s in group if s.value is not None]
        notes = sorted({s.note for s in group if s.note})
        record: dict[str, Any] = {
            "scenario": scenario,
            "system": system,
            "n": n,
            "metric": metric,
            "value": statistics.median(values) if values else None,
            "unit": unit,
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "runs": len(values),
        }
        if metric == "timed_out":
            # Summing says how many repetitions hit the cap; the median of ones would hide it.
            record["value"] = float(sum(values))
        if notes:
            record["note"] = "; ".join(notes)
        records.append(record)
    return records
