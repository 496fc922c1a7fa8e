"""API tokens, for every door: reading them from an ``authorization`` value (``Bearer <token>``, or dbt
Cloud's ``Token <token>``), and the prefix shown in token lists. They are made and hashed by
``runplane.basics.tokens``, as every token runplane issues. Each door resolves them its own way:
the gRPC interceptor (``api.grpc.auth``), the REST dependency (``api.rest.auth``), the web session
(``api.web.session``), the runner API's run tokens (``api.runner.run_token``).
"""

from __future__ import annotations

from typing import Any

from runplane.basics.errors import Unauthenticated

TOKEN_PREFIX_LENGTH = 8


def token_prefix(token: str) -> str:
    return token[:TOKEN_PREFIX_LENGTH]


def token_from_header(text: str) -> str:
    """The token of an authorization value: ``Bearer <token>`` or ``Token <token>`` (dbt Cloud's form)."""
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        raise Unauthenticated("authorization must be 'Bearer <token>' or 'Token <token>'")
    return token.strip()


def bearer_token(metadata: Any) -> str:
    """The token of the ``authorization`` metadata, or Unauthenticated."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return token_from_header(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
    raise Unauthenticated("missing 'authorization: Bearer <token>' metadata")
