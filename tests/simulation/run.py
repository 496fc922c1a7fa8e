"""``make simulate``: random histories from consecutive seeds, as many as fit in the time given;
prints histories per second, and for a failure its seed and trace.

    python -m tests.simulation.run [--seconds 60] [--first-seed 0] [--steps 12]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

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


def run_seed(seed: int, steps: int) -> World:
    """One history; raises ``PropertyViolated`` (or what the code under test raised) on failure."""
    world = World(seed)
    try:
        world.start()
        random_history(world, steps)
        world.check()
    finally:
        world.close()
    return world


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, help="run this one seed and print its trace")
    args = parser.parse_args()
    if args.seed is not None:
        world = World(args.seed)
        try:
            world.start()
            random_history(world, args.steps)
            world.check()
            print(world.report(100000))
            print("OK")
        except Exception as exc:
            print(world.report(100000))
            print(f"FAILED: {exc!r}")
            return 1
        finally:
            world.close()
        return 0
    started = time.monotonic()
    seed = args.first_seed
    ran = 0
    failed: list[int] = []
    while time.monotonic() - started < args.seconds:
        world = World(seed)
        try:
            world.start()
            random_history(world, args.steps)
            world.check()
        except Exception as exc:
            failed.append(seed)
            print(world.report(60))
            print(f"seed {seed} FAILED: {exc!r}\n", flush=True)
        finally:
            world.close()
        ran += 1
        seed += 1
        if ran % 20 == 0:
            elapsed = time.monotonic() - started
            print(f"{ran} histories, {ran / elapsed:.1f}/s, {len(failed)} failed", flush=True)
    elapsed = time.monotonic() - started
    seeds = f"seeds {args.first_seed}..{seed - 1}"
    print(f"{ran} histories in {elapsed:.0f}s ({ran / elapsed:.1f}/s), {seeds}; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
