"""On time per account, as a number operators can alert on without a label per account.

A run is on time when its run delay (started_at - scheduled_at) is at most 60 s (DESIGN.md). An
account's on-time ratio over a window counts the runs queued in it that started, plus those that
can no longer be on time (still waiting more than 60 s after their schedule); runs cancelled before
they started count neither way. The scheduler exports how many accounts have a ratio at or below
each of a few fixed bounds (a cumulative gauge: one series per bound, whatever the number of
accounts); ``runplane status`` names the worst accounts.
"""

from __future__ import annotations

from collections.abc import Iterable

ON_TIME_SECONDS = 60
# The bounds of the accounts gauge (its ``at_most`` label). 1 counts every account with runs in the window.
RATIO_BOUNDS = (0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


def ratio(on_time: int, considered: int) -> float:
    """The share of ``considered`` runs that were on time; 1 when there were none to judge."""
    return on_time / considered if considered else 1.0


def accounts_at_or_below(ratios: Iterable[float]) -> dict[str, int]:
    """For each bound, as its ``at_most`` label, how many of ``ratios`` are at or below it."""
    values = list(ratios)
    return {f"{bound:g}": sum(1 for r in values if r <= bound) for bound in RATIO_BOUNDS}
