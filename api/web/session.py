"""Who is looking at a page: the account's API token in a cookie, and the CSRF token of its forms.

Logging in checks the token exactly as an API call does (``Store.account_for_token``) and every
page checks it again, so a revoked or expired token ends its sessions at once. The cookie is
HttpOnly and SameSite=Lax (a link from elsewhere opens the page logged in); every form that
changes something carries a CSRF value, an HMAC of a fixed label keyed with the session's token,
which a page of another site can neither read nor compute.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, Request

from api.scopes import Scope, TokenGrant, check_scope
from api.store import Store
from runplane.basics.errors import PermissionDenied, Unauthenticated
from runplane.basics.tokens import token_hash
from runplane.basics.types import AccountId

COOKIE = "runplane_session"
CSRF_FIELD = "csrf_token"
# The login form's own CSRF value (no session yet to key one with): a random value in a cookie that
# only /ui/login sees and in the form, which must match (a page of another site can set neither), so
# no other site can log a browser into an account of its choosing.
LOGIN_CSRF_COOKIE = "runplane_login_csrf"
_CSRF_LABEL = b"runplane web pages: csrf"
MAX_TOKEN_LENGTH = 200


class LoginRequired(Unauthenticated):
    """No session, or its token no longer works: the page sends the browser to the login form."""


@dataclass(frozen=True)
class Viewer:
    grant: TokenGrant
    csrf: str

    @property
    def account_id(self) -> AccountId:
        return self.grant.account_id

    @property
    def can_change(self) -> bool:
        """Whether the token may trigger and cancel (the buttons are shown only then)."""
        try:
            check_scope(self.grant, "change", Scope.JOB_ADMIN)
        except PermissionDenied:
            return False
        return True


def login_csrf() -> str:
    return secrets.token_urlsafe(32)


def login_csrf_matches(cookie: str, field: str) -> bool:
    return bool(cookie) and hmac.compare_digest(cookie.encode(), field.encode())


def csrf_for(token: str) -> str:
    return hmac.new(token.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).hexdigest()


async def grant_for(store: Store, token: str) -> TokenGrant | None:
    """The token's account and scopes, or None when it is unknown, revoked or expired."""
    token = token.strip()
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    return await store.account_for_token(token_hash(token))


async def viewer(request: Request) -> Viewer:
    """The session's account; LoginRequired without a session whose token still works."""
    token = request.cookies.get(COOKIE, "")
    store: Store = request.app.state.store
    grant = await grant_for(store, token)
    if grant is None:
        raise LoginRequired("log in with an API token of your account")
    return Viewer(grant, csrf_for(token))


async def poster(who: Annotated[Viewer, Depends(viewer)], csrf_token: Annotated[str, Form()] = "") -> Viewer:
    """The viewer of a form that changes something: the form's CSRF value must match the session's."""
    if not hmac.compare_digest(csrf_token.encode(), who.csrf.encode()):
        raise PermissionDenied("this form is out of date or did not come from runplane's pages; reload and try again")
    return who


async def changer(request: Request, who: Annotated[Viewer, Depends(poster)]) -> Viewer:
    """A poster whose token may change jobs and runs (``job_admin``), as the APIs require for the same change."""
    check_scope(who.grant, f"{request.method} {request.url.path}", Scope.JOB_ADMIN)
    return who


Looking = Annotated[Viewer, Depends(viewer)]
Posting = Annotated[Viewer, Depends(poster)]
Changing = Annotated[Viewer, Depends(changer)]
