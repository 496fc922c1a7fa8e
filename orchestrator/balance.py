"""Rebalancing: which jobs to move so every worker owns within the tolerance of the mean."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Move:
    donor: str
    target: str
    job_ids: list[int]


def balanced(counts: dict[str, int], tolerance: float) -> bool:
    """True when every worker's count is within ``tolerance`` (a fraction) of the mean."""
    if len(counts) < 2:
        return True
    mean = sum(counts.values()) / len(counts)
    # Rounding: with few jobs one job may already be more than the tolerance; allow that one.
    slack = max(mean * tolerance, 1.0)
    return all(abs(n - mean) <= slack for n in counts.values())


def plan_moves(owned: dict[str, list[int]], tolerance: float) -> list[Move]:
    """Moves that bring every worker to floor or ceil of the mean; none when already balanced.

    ``owned`` maps every live worker (including ones that own nothing) to its jobs. Workers that
    own the most keep the larger quotas, so as few jobs as possible move.
    """
    counts = {worker: len(jobs) for worker, jobs in owned.items()}
    if balanced(counts, tolerance):
        return []
    total = sum(counts.values())
    order = sorted(owned, key=lambda w: (-counts[w], w))
    base, extra = divmod(total, len(order))
    quota = {worker: base + (1 if i < extra else 0) for i, worker in enumerate(order)}
    surplus = {w: list(owned[w][quota[w] :]) for w in order if counts[w] > quota[w]}
    needs = [(w, quota[w] - counts[w]) for w in order if counts[w] < quota[w]]
    moves: list[Move] = []
    donors = iter(sorted(surplus.items()))
    donor, spare = next(donors, ("", []))
    for target, need in needs:
        missing = need
        while missing > 0:
            if not spare:
                donor, spare = next(donors)
            take, spare = spare[:missing], spare[missing:]
            moves.append(Move(donor, target, take))
            missing -= len(take)
    return moves


def spread(items: Sequence[T], loads: dict[str, int]) -> list[tuple[str | None, Sequence[T]]]:
    """``items`` split over the workers of ``loads`` (worker -> jobs it owns) so their counts even out,
    the least loaded first; one share for the shared queue (None) when no worker is alive.

    A dead worker's jobs go to live workers' own queues, never to the shared queue: a worker frozen
    while it was declared dead still has a consumer attached to the shared queue (its connection
    stays open until the broker notices), and an Assign handed to it there would wait in the very
    process its jobs were taken from."""
    if not loads:
        return [(None, items)] if items else []
    total = sum(loads.values()) + len(items)
    base, extra = divmod(total, len(loads))
    # The odd ones over the mean go to the most loaded, who are nearest them already.
    by_load = sorted(loads, key=lambda w: (-loads[w], w))
    quota = {worker: base + (1 if i < extra else 0) for i, worker in enumerate(by_load)}
    shares: list[tuple[str | None, Sequence[T]]] = []
    rest = items
    for worker in reversed(by_load):  # the quotas' shortfalls add up to at least len(items)
        want = max(0, quota[worker] - loads[worker])
        take, rest = rest[:want], rest[want:]
        if take:
            shares.append((worker, take))
    return shares
