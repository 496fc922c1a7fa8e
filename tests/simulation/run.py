"""``make simulate``: random histories from consecutive seeds, as many as fit in the time given;
prints histories per second, and for a failure its seed and trace.

    python -m tests.simulation.run [--seconds 60] [--first-seed 0] [--steps 12] [--history all] [--jobs N]
    python -m tests.simulation.run --seed 229 --history freezes      # one history, its whole trace
    python -m tests.simulation.run --digest 20 [--first-seed 0] [--history all]  # traces' digests

``--digest N`` runs seeds ``first-seed`` … ``first-seed + N - 1`` of each kind and prints the SHA-256
of each history's trace and one of them all: a change that must not change behaviour leaves every
digest as it was.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.simulation.world import CRONS, World


def random_history(world: World, steps: int) -> None:
    """Apply ``steps`` operations drawn from the world's seed, with time passing between them."""
    rng = random.Random(world.seed * 7919 + 1)
    for _ in range(steps):
        op = rng.randrange(13)
        index = rng.randrange(8)
        seconds = rng.uniform(1.0, 20.0)
        if op == 0:
            world.freeze_worker(index, seconds)
        elif op == 1:
            world.partition_worker(index, seconds)
        elif op == 2:
            world.broker_outage(rng.uniform(1.0, 15.0))
        elif op == 3:
            world.lossy_bus(seconds, rng.choice((0.0, 0.1, 0.3)), rng.choice((0.0, 0.2)), rng.choice((0.0, 0.5, 3.0)))
        elif op == 4:
            world.crash_worker(index)
        elif op == 5:
            world.delete_worker_queue(index)
        elif op == 6:
            world.leader_loses_lock()
        elif op == 7:
            world.crash_leader()
        elif op == 8:
            world.freeze_leader(seconds)
        elif op == 9:
            world.create_job(rng.choice(CRONS))
        elif op == 10:
            world.change_job(index, rng.choice(("cron", "pause", "delete")), rng.choice(CRONS))
        world.run_for(rng.uniform(0.0, 30.0))


def freeze_history(world: World, steps: int) -> None:
    """The fault suite's SIGSTOP of a queuer worker, on a busy machine: workers frozen past being
    declared dead, one to three times, their every-minute jobs firing meanwhile."""
    rng = random.Random(world.seed)
    for _ in range(rng.randrange(1, 4)):
        world.run_for(rng.uniform(0, 40))
        world.freeze_worker(rng.randrange(3), rng.uniform(6.5, 14))


def freeze_edit_history(world: World, steps: int) -> None:
    """A worker frozen across fire seconds, past being declared dead, while jobs' crons change and
    pauses toggle: when it thaws, its heap still holds the schedules from before the freeze."""
    rng = random.Random(world.seed)
    for _ in range(rng.randrange(1, 4)):
        world.run_for(rng.uniform(0, 40))
        world.freeze_worker(rng.randrange(2), rng.uniform(6.5, 25))
        for _ in range(rng.randrange(1, 6)):
            world.run_for(rng.uniform(0.5, 6.0))
            world.change_job(rng.randrange(12), rng.choice(("cron", "cron", "pause")), rng.choice(world.crons))


def freeze_create_history(world: World, steps: int) -> None:
    """A worker frozen past being declared dead while new jobs are created: their Assigns go to the
    shared queue, where the frozen worker's consumer is still attached and may take one, to claim
    it when it thaws, dead or re-registered."""
    rng = random.Random(world.seed)
    for _ in range(rng.randrange(1, 4)):
        world.run_for(rng.uniform(0, 40))
        world.freeze_worker(rng.randrange(3), rng.uniform(6.5, 25))
        for _ in range(rng.randrange(1, 5)):
            world.run_for(rng.uniform(0.2, 5.0))
            world.create_job(rng.choice(world.crons))


def stall_history(world: World, steps: int) -> None:
    """A leader that stalls past losing its lock, one to three times, with jobs changing around it:
    the newer leader acts on the changes while the deposed one, thawed, may still act on its own."""
    _stalls(world, at_send=False, shortest=1.0, changes=(0, 4), creates=0.3)


def send_stall_history(world: World, steps: int) -> None:
    """A leader that stalls between recording a decision and sending it, past losing its lock, with
    jobs changing around it: its message leaves in the old term, after the newer leader's own."""
    _stalls(world, at_send=True, shortest=3.0, changes=(1, 5), creates=0.4)


def _stalls(world: World, *, at_send: bool, shortest: float, changes: tuple[int, int], creates: float) -> None:
    rng = random.Random(world.seed)
    for _ in range(rng.randrange(1, 4)):
        world.run_for(rng.uniform(0, 40))
        world.stall_leader(rng.uniform(shortest, 15.0), at_send=at_send)
        for _ in range(rng.randrange(*changes)):
            world.run_for(rng.uniform(0.0, 3.0))
            if rng.random() < creates:
                world.create_job(rng.choice(CRONS))
            else:
                world.change_job(rng.randrange(8), rng.choice(("cron", "pause", "delete")), rng.choice(CRONS))


@dataclass(frozen=True)
class History:
    apply: Callable[[World, int], None]
    world: dict[str, Any]


HISTORIES = {
    "random": History(random_history, {}),
    "stalls": History(stall_history, {"slow_calls": 0.1, "slowest_call": 2.0}),
    "sends": History(send_stall_history, {}),
    "edits": History(
        freeze_edit_history,
        {
            "workers_at_start": 2,
            "jobs_at_start": 12,
            "crons": ("* * * * *", "*/2 * * * *", "*/3 * * * *"),
            "graces": (300,),
            "slow_calls": 0.15,
            "slowest_call": 3.0,
        },
    ),
    # "edits" with every third job jittered: each occurrence is checked against its due time.
    "jitter": History(
        freeze_edit_history,
        {
            "workers_at_start": 2,
            "jobs_at_start": 12,
            "crons": ("* * * * *", "*/2 * * * *", "*/3 * * * *"),
            "graces": (0, 300),
            "slow_calls": 0.15,
            "slowest_call": 3.0,
            "jitter_seconds": 20,
        },
    ),
    "creates": History(
        freeze_create_history,
        {"workers_at_start": 3, "jobs_at_start": 6, "graces": (300,), "slow_calls": 0.1, "slowest_call": 2.0},
    ),
    "freezes": History(
        freeze_history,
        {
            "workers_at_start": 2,
            "jobs_at_start": 12,
            "crons": ("* * * * *",),
            "graces": (300,),
            "slow_calls": 0.15,
            "slowest_call": 3.0,
        },
    ),
    # "freezes" with short graces and every other job given a catch-up window: fires missed while a
    # frozen worker held them are caught up (or given up) by the next owner, each one run at most.
    "catchup": History(
        freeze_history,
        {
            "workers_at_start": 2,
            "jobs_at_start": 12,
            "crons": ("* * * * *", "*/2 * * * *"),
            "graces": (0, 10),
            "slow_calls": 0.15,
            "slowest_call": 3.0,
            "catchup_window_seconds": 150,
        },
    ),
}


def run_seed(history: str, seed: int, steps: int = 12) -> World:
    """One history; raises ``PropertyViolated`` (or what the code under test raised) on failure, with
    the seed and the end of the trace in its notes."""
    world = World(seed, **HISTORIES[history].world)
    try:
        _play(world, history, steps)
    except Exception as exc:
        exc.add_note(world.report())
        raise
    return world


def _play(world: World, history: str, steps: int) -> None:
    try:
        world.start()
        HISTORIES[history].apply(world, steps)
        world.check()
    finally:
        world.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--history", choices=["all", *sorted(HISTORIES)], default="all", help="all: each seed in every kind"
    )
    parser.add_argument("--seed", type=int, help="run this one seed and print its whole trace")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes running histories")
    parser.add_argument("--digest", type=int, metavar="N", help="print the digests of N seeds' traces per kind")
    args = parser.parse_args()
    kinds = sorted(HISTORIES) if args.history == "all" else [args.history]
    if args.digest is not None:
        return _digests(kinds, args.first_seed, args.digest, args.steps, args.jobs)
    if args.seed is not None:
        if len(kinds) > 1:
            parser.error("--seed needs --history: one of " + ", ".join(kinds))
        try:
            world = run_seed(args.history, args.seed, args.steps)
        except Exception as exc:
            print(*getattr(exc, "__notes__", []), f"FAILED: {exc!r}", sep="\n")
            return 1
        print(world.report(len(world.trace_lines)), "OK", sep="\n")
        return 0
    return _explore(kinds, args.first_seed, args.steps, args.seconds, args.jobs)


def _try(kind: str, seed: int, steps: int) -> str | None:
    """One history in a worker process: None, or what failed with the end of its trace."""
    try:
        run_seed(kind, seed, steps)
    except Exception as exc:
        return "\n".join([*getattr(exc, "__notes__", [])[-1:], f"{kind} seed {seed} FAILED: {exc!r}\n"])
    return None


def trace_digest(kind: str, seed: int, steps: int = 12) -> str:
    """The SHA-256 of one history's whole trace, whether or not the history held its properties
    (a failing one is marked so)."""
    world = World(seed, **HISTORIES[kind].world)
    outcome = "ok"
    try:
        _play(world, kind, steps)
    except Exception as exc:
        outcome = f"FAILED {exc!r}"
    digest = hashlib.sha256("\n".join(world.trace_lines).encode()).hexdigest()
    return digest if outcome == "ok" else f"{digest} {outcome}"


def _digests(kinds: list[str], first_seed: int, count: int, steps: int, jobs: int) -> int:
    """Each history's trace digest, in a fixed order, and the digest of them all."""
    work = [(kind, seed) for kind in kinds for seed in range(first_seed, first_seed + count)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        digests = list(pool.map(trace_digest, *zip(*work, strict=True), itertools.repeat(steps)))
    whole = hashlib.sha256()
    for (kind, seed), digest in zip(work, digests, strict=True):
        print(f"{kind:>8} {seed:5d} {digest}")
        whole.update(f"{kind} {seed} {digest}\n".encode())
    print(f"all {len(work)} histories: {whole.hexdigest()}")
    return 0


def _explore(kinds: list[str], first_seed: int, steps: int, seconds: float, jobs: int) -> int:
    """Histories from consecutive seeds, each in every kind, on ``jobs`` processes, for ``seconds``."""
    started = time.monotonic()
    work = ((kind, seed) for seed in itertools.count(first_seed) for kind in kinds)
    ran, last_seed = 0, first_seed
    failed: list[str] = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        running: dict[concurrent.futures.Future[str | None], tuple[str, int]] = {}
        while True:
            while time.monotonic() - started < seconds and len(running) < 2 * jobs:
                kind, seed = next(work)
                running[pool.submit(_try, kind, seed, steps)] = (kind, seed)
            if not running:
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                kind, seed = running.pop(future)
                last_seed = max(last_seed, seed)
                failure = future.result()
                if failure is not None:
                    failed.append(f"{kind} {seed}")
                    print(failure, flush=True)
                ran += 1
                if ran % 100 == 0:
                    elapsed = time.monotonic() - started
                    print(f"{ran} histories, {ran / elapsed:.1f}/s, {len(failed)} failed", flush=True)
    elapsed = time.monotonic() - started
    seeds = f"{'/'.join(kinds)} seeds {first_seed}..{last_seed}"
    print(f"{ran} histories in {elapsed:.0f}s ({ran / elapsed:.1f}/s) on {jobs} processes, {seeds}; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
