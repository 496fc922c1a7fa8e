"""The caller's account: ``Authorization: Token <t>`` or ``Bearer <t>``, the same tokens as gRPC."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader

from api.auth import token_from_header
from api.scopes import TokenGrant, check_scope, required_http_scope
from api.store import Store
from runplane.basics.errors import NotFound, Unauthenticated
from runplane.basics.tokens import token_hash
from runplane.basics.types import AccountId

# Declared as an API key header so the OpenAPI document says how to authenticate.
_authorization = APIKeyHeader(name="Authorization", auto_error=False, description="Token <token> or Bearer <token>")


async def caller_grant(request: Request, authorization: Annotated[str | None, Depends(_authorization)]) -> TokenGrant:
    """The token's account and scopes; 401 without a valid token, 403 when its scopes do not allow the call."""
    if authorization is None:
        raise Unauthenticated("missing 'Authorization: Token <token>' header")
    store: Store = request.app.state.store
    grant = await store.account_for_token(token_hash(token_from_header(authorization)))
    if grant is None:
        raise Unauthenticated("unknown, revoked or expired token")
    check_scope(grant, f"{request.method} {request.url.path}", required_http_scope(request.method))
    request.state.who = grant.who  # who makes the call, for the notes a change keeps (a pause)
    return grant


async def caller(grant: Annotated[TokenGrant, Depends(caller_grant)]) -> AccountId:
    """The account the token belongs to."""
    return grant.account_id


async def scoped_account(
    account_id: Annotated[int, Path(ge=1, le=2**63 - 1)], caller_account: Annotated[AccountId, Depends(caller)]
) -> AccountId:
    """The account in the path, when it is the caller's; any other id is 404 like a missing one."""
    if account_id != caller_account:
        raise NotFound(f"account {account_id} not found")
    return caller_account


Account = Annotated[AccountId, Depends(scoped_account)]
Caller = Annotated[AccountId, Depends(caller)]
Grant = Annotated[TokenGrant, Depends(caller_grant)]
