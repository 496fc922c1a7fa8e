"""Rebalancing plans: every worker ends within the tolerance, moving as few jobs as possible."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.balance import balanced, plan_moves, spread


def apply(owned: dict[str, list[int]], tolerance: float = 0.10) -> dict[str, list[int]]:
    after = {w: list(jobs) for w, jobs in owned.items()}
    for move in plan_moves(owned, tolerance):
        for job_id in move.job_ids:
            after[move.donor].remove(job_id)
            after[move.target].append(job_id)
    return after


def test_a_fourth_worker_gets_a_quarter() -> None:
    owned = {"a": list(range(0, 1000)), "b": list(range(1000, 2000)), "c": list(range(2000, 3000)), "d": []}
    moves = plan_moves(owned, 0.10)
    assert {m.target for m in moves} == {"d"}
    assert sum(len(m.job_ids) for m in moves) == 750
    after = apply(owned)
    assert sorted(len(j) for j in after.values()) == [750, 750, 750, 750]
    assert sorted(j for jobs in after.values() for j in jobs) == list(range(3000))


def test_within_tolerance_moves_nothing() -> None:
    assert plan_moves({"a": list(range(1050)), "b": list(range(1050, 2000))}, 0.10) == []
    assert balanced({"a": 1, "b": 0}, 0.10)  # one job cannot be split


@given(st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=6))
def test_any_start_ends_balanced_with_every_job_once(sizes: list[int]) -> None:
    owned: dict[str, list[int]] = {}
    next_id = 0
    for i, size in enumerate(sizes):
        owned[f"w{i}"] = list(range(next_id, next_id + size))
        next_id += size
    after = apply(owned)
    assert balanced({w: len(j) for w, j in after.items()}, 0.10)
    assert sorted(j for jobs in after.values() for j in jobs) == list(range(next_id))


def test_a_dead_workers_jobs_are_spread_over_the_live_workers_least_loaded_first() -> None:
    loads = {"busy": 8, "idle": 0, "some": 4}
    shares = spread(list(range(10)), loads)
    assert shares == [("idle", [0, 1, 2, 3, 4, 5, 6]), ("some", [7, 8, 9])]
    assert sorted(n + sum(len(s) for w, s in shares if w == worker) for worker, n in loads.items()) == [7, 7, 8]


def test_a_dead_workers_jobs_wait_on_the_shared_queue_only_when_no_worker_is_alive() -> None:
    assert spread([1, 2, 3], {}) == [(None, [1, 2, 3])]
    assert spread([], {}) == []
    assert spread([1, 2, 3], {"a": 50, "b": 49}) == [("b", [1, 2]), ("a", [3])]
