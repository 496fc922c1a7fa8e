"""Break the protocol on purpose and count the histories the simulator needs to notice.

    python -m tests.simulation.mutations [--seconds 60]

Each mutation is applied by monkeypatching, only in this process: the regression histories run
(as in the normal test run) until one fails, then, apart, histories of every kind from seed 0 on
until one fails or the time is up. Prints, per mutation, which regression history caught it, how
many fresh histories it took, and the end of the failing trace.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from orchestrator.decisions import WorkerInfo
from orchestrator.inbox import Inbox
from orchestrator.rows import Ownership
from queuer_worker.holdings import REGISTERING_BEATS, Holdings
from runplane.basics.stamps import ZERO, Stamp, StampGate
from tests.simulation.run import run_seed
from tests.simulation.test_protocol import REGRESSIONS
from tests.simulation.twins import MemoryOwnershipStore


def _admit_without_floor(self: StampGate, job_id: int, stamp: Stamp) -> bool:
    if not self.observe_term(stamp.term):
        return False
    last = self.applied.get(job_id)
    if last is not None and stamp <= last:
        return False
    self.applied[job_id] = stamp
    self.newest = max(self.newest, stamp)
    return True


def _any_term(self: StampGate, term: int) -> bool:
    self.newest_term = max(self.newest_term, term)
    return True


def _keep_everything(self: Holdings, stamp: Stamp) -> None:
    self.registering_beats = REGISTERING_BEATS


async def _accept_dead_claim(
    self: Inbox, claimer: str, job_ids: list[int], _rows: list[Ownership], stamp: Stamp
) -> None:
    await self.state.store.claim(claimer, job_ids, stamp)


def _write_in_any_term(self: MemoryOwnershipStore) -> None:
    return None


# The leader's floor: a claim of an Assign stamped at or before its drop-everything is refused.
_NO_LEADER_FLOOR = property(lambda _self: ZERO, lambda _self, _value: None)

Patch = tuple[Any, str, Any]
_WORKER_FLOOR: Patch = (StampGate, "admit", _admit_without_floor)
_WORKER_TERM: Patch = (StampGate, "observe_term", _any_term)

# Each protocol rule broken alone, then the two rules that another one backs up broken together
# with it: the worker's stamp floor with the leader's (which refuses the claim the worker's floor
# would have kept it from taking), and the worker's term check with the term fence on the leader's
# writes (which stops a deposed leader before it sends much a worker would have to refuse).
MUTATIONS: dict[str, list[Patch]] = {
    "drop the stamp floor": [_WORKER_FLOOR],
    "drop the stamp floor, the leader's too": [_WORKER_FLOOR, (WorkerInfo, "floor", _NO_LEADER_FLOOR)],
    "accept an older term": [_WORKER_TERM],
    "accept an older term, and no term fence": [_WORKER_TERM, (MemoryOwnershipStore, "_fence", _write_in_any_term)],
    "skip drop-everything": [(Holdings, "_drop_older_than", _keep_everything)],
    "let a dead worker's claim through": [(Inbox, "_refuse_claim", _accept_dead_claim)],
}


@contextlib.contextmanager
def mutated(patches: list[Patch]) -> Iterator[None]:
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


# The regression history that catches each mutation first (tests/simulation/test_mutations.py).
CAUGHT_BY: dict[str, tuple[str, int]] = {
    "drop the stamp floor": ("creates", 38),
    "drop the stamp floor, the leader's too": ("creates", 3),
    "accept an older term": ("sends", 6),
    "accept an older term, and no term fence": ("stalls", 13),
    "skip drop-everything": ("random", 36),
    "let a dead worker's claim through": ("creates", 0),
}
KINDS = ("random", "freezes", "stalls", "sends", "edits", "creates")


def hunt(candidates: Iterable[tuple[str, int]], seconds: float) -> tuple[int, float, str, str] | None:
    """Histories until one fails: (count, seconds, history and seed, end of its trace); None when
    none did in ``seconds``."""
    started = time.monotonic()
    for ran, (kind, seed) in enumerate(candidates, 1):
        if time.monotonic() - started > seconds:
            return None
        try:
            run_seed(kind, seed)
        except Exception as exc:
            notes = getattr(exc, "__notes__", [""])
            trace = "\n".join(notes[-1].splitlines()[-30:])
            return ran, time.monotonic() - started, f"{kind} seed {seed}: {exc!r}"[:400], trace
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    for title, patches in MUTATIONS.items():
        with mutated(patches):
            regression = hunt(REGRESSIONS, args.seconds)
            fresh = hunt(((kind, seed) for seed in range(100_000) for kind in KINDS), args.seconds)
        if regression is None:
            print(f"== {title}: NOT caught by the regression histories", flush=True)
        else:
            print(f"== {title}: caught by regression history {regression[0]} ({regression[2]})", flush=True)
        if fresh is None:
            print(f"   from seed 0 on: NOT caught in {args.seconds:.0f}s", flush=True)
            continue
        ran, took, what, trace = fresh
        print(f"   from seed 0 on: caught after {ran} histories, {took:.1f}s: {what}\n{trace}\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
