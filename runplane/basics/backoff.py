"""The one backoff formula: how long to wait before trying again, for everything runplane retries —
a failed run's retry, a failed launch, a webhook delivery, a dependency that is down, a Kubernetes
API call, a crashed child of ``runplane up``.

:func:`ceiling` doubles from ``first`` with each attempt, up to ``cap``. :func:`jittered` waits a
uniformly random time in the ceiling's upper half ("equal jitter"): waiters that failed together do
not all try again together, and none waits less than half the ceiling. Deterministic waits (a
launch's backoff, restarts) use the ceiling itself.
"""

from __future__ import annotations

import math
import random

# 2**64 times any first wait is past any cap; bounding the exponent keeps the maths in floats.
MAX_DOUBLINGS = 64


def ceiling(first: float, attempt: int, *, cap: float = math.inf) -> float:
    """Seconds before try ``attempt + 1`` (``attempt`` counts from 1): ``first * 2**(attempt-1)``, at
    most ``cap``."""
    return float(min(cap, first * 2.0 ** min(max(0, attempt - 1), MAX_DOUBLINGS)))


def jittered(first: float, attempt: int, *, cap: float = math.inf) -> float:
    """A random wait between half the :func:`ceiling` and all of it."""
    top = ceiling(first, attempt, cap=cap)
    return top / 2 + random.uniform(0, top / 2)
