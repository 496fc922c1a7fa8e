"""The tokens runplane issues, and the one way they are stored: only their sha256 (:func:`token_hash`).

- API tokens (``rp_…``): shown once when made, for the public APIs and the web pages.
- Run tokens (``rpr_…``): the runner's only credential. The dispatcher makes one for a run each time
  it moves the run queued → starting and hands it to the launcher (``runs.runner_token_hash``). The
  runner API accepts it for that run alone, and only while the run is starting (to claim it) or
  running under the lease the claim took: a relaunch issues a new token, a terminal run or a lost
  lease makes the old one useless. A warm pool Pod's token is a run token too, good for waiting for
  a run until it is spent at the hand-over.
"""

from __future__ import annotations

import hashlib
import secrets

API_TOKEN_PREFIX = "rp_"
RUN_TOKEN_PREFIX = "rpr_"


def new_api_token() -> str:
    """A fresh API token (about 256 bits of randomness)."""
    return API_TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_run_token() -> str:
    """A fresh run token (about 256 bits of randomness)."""
    return RUN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    """What is stored of any token, and what a presented token is looked up by."""
    return hashlib.sha256(token.encode("utf-8")).digest()
