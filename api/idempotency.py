"""Client idempotency keys: the one home of what a request retried with its key gets.

A key is the account's: two accounts' keys never meet. A retry must send the request it retries: a
digest of the validated request (its fingerprint) is kept beside what the first one made, and the
same key with another request is refused — FailedPrecondition, 409 over REST — rather than answered
with something the request did not describe, since the conflict is with stored state, not a
malformed request. Job creates (``jobs.create_fingerprint``) and run triggers
(``runs.trigger_fingerprint``) follow it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from runplane.basics.errors import FailedPrecondition


def fingerprint(request: Mapping[str, object]) -> str:
    """A digest of a validated request's fields (the caller leaves out what must not be stored)."""
    canonical = json.dumps(request, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_same_request(stored: str | None, sent: str | None, *, made: str, request: str) -> None:
    """Refuse a key whose first request (its ``stored`` fingerprint) is not this one (``sent``).

    ``made`` says what the key made ("create job 7"), ``request`` what the client sends ("definition").
    A stored None (kept before fingerprints were, or made without one) matches any retry.
    """
    if stored is not None and stored != sent:
        raise FailedPrecondition(
            f"idempotency key already used to {made} with another {request}: send that {request} again, "
            "or use a new key"
        )
