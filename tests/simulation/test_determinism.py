"""A simulated history is a function of its seed: the same seed gives the same trace, in this
process and in another one with a different string-hash seed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.simulation.run import random_history
from tests.simulation.world import World

SEED = 11


def _trace(seed: int) -> list[str]:
    world = World(seed)
    try:
        world.start()
        random_history(world, 6)
        world.run_for(60)
    finally:
        world.close()
    return world.trace_lines


def test_the_same_seed_gives_the_same_history() -> None:
    first, second = _trace(SEED), _trace(SEED)
    assert len(first) > 30
    assert first == second
    assert _trace(SEED + 1) != first


def test_the_history_does_not_depend_on_string_hashing() -> None:
    code = (
        "import hashlib; from tests.simulation.test_determinism import _trace; "
        f"print(hashlib.sha256(chr(10).join(_trace({SEED})).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hash_seed in ("1", "2")
    }
    assert len(digests) == 1, digests
