"""What a queuer worker holds, as one number: the XOR of a hash of each (job_id, version) it holds.

The worker keeps it up to date as its heap changes and reports it in every heartbeat; the leader
computes the same number from the ownership rows, so a worker that does not hold what it owns
(jobs it lost, an Update it never applied) is noticed and sent them again.
"""

from __future__ import annotations

_MASK = (1 << 63) - 1
_U64 = 0xFFFFFFFFFFFFFFFF


def job_digest(job_id: int, version: int) -> int:
    """A 63-bit hash of one (job_id, version) pair (splitmix64); the XOR over a set of them is
    order-independent and updated in O(1) when one changes."""
    z = (job_id * 0x9E3779B97F4A7C15 + version * 0xD1B54A32D192ED03) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return (z ^ (z >> 31)) & _MASK
