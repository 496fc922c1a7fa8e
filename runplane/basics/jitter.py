"""A job's jitter: the fixed offset each fire of its schedule comes later by.

The offset is a hash of the job's id, bounded by the job's ``jitter_seconds``: the same for every fire
of the job and on every worker that ever owns it, so a fire's time is known in advance (the demand
forecast counts it in its minute) and jobs that share a cron (``0 * * * *``) spread over the window
instead of landing in one second. The occurrence itself (its idempotency key, the schedule in force
at it) stays the cron's instant; only when its run is due moves.
"""

from __future__ import annotations

import hashlib


def jitter_offset(job_id: int, jitter_seconds: int) -> int:
    """Seconds in [0, ``jitter_seconds``] that every fire of ``job_id`` comes later by."""
    if jitter_seconds <= 0:
        return 0
    digest = hashlib.blake2b(job_id.to_bytes(8, "big", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_seconds + 1)
