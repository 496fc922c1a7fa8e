"""Per-run tokens: the runner's only credential.

The dispatcher makes one for a run each time it moves the run queued → starting and hands it to
the launcher; only its sha256 is stored (``runs.runner_token_hash``). The runner API accepts it for
that run alone, and only while the run is starting (to claim it) or running under the lease the
claim took: a relaunch issues a new token, a terminal run or a lost lease makes the old one useless.
"""

from __future__ import annotations

import hashlib
import secrets

RUN_TOKEN_PREFIX = "rpr_"


def new_run_token() -> str:
    """A fresh run token (256 bits of randomness)."""
    return RUN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def run_token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
