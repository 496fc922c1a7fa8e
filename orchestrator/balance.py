"""Rebalancing: which jobs to move so every worker owns within the tolerance of the mean."""

from __future__ import annotations

from dataclasses import dataclass


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
