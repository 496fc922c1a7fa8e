"""Who is looking at a page: the session in a cookie, and the CSRF values of the forms.

Logging in checks the API token exactly as an API call does (``live_api_tokens``) and makes a
server-side session (``api.web.sessions``); the cookie holds only the session's random id, never
the token. Every page resolves the session again, so logging out, the session's expiry, or its
token revoked or expired ends it at once. The cookie is HttpOnly, SameSite=Lax (a link from
elsewhere opens the page logged in) and Secure under TLS; every form that changes something
carries a CSRF value, an HMAC of a fixed label keyed with the session's id, which a page of another
site can neither read nor compute. The login form, before any session, has a CSRF value of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, Request

from api.scopes import Scope, TokenGrant, check_scope
from api.web.sessions import WebSessions
from runplane.basics.errors import PermissionDenied, Unauthenticated
from runplane.basics.types import AccountId

COOKIE = "runplane_session"
CSRF_FIELD = "csrf_token"
# The login form's own CSRF value (no session yet to key one with): a random value in a cookie that
# only /ui/login sees and in the form, which must match (a page of another site can set neither), so
# no other site can log a browser into an account of its choosing.
LOGIN_CSRF_COOKIE = "runplane_login_csrf"
_CSRF_LABEL = b"runplane web pages: csrf"


class LoginRequired(Unauthenticated):
    """No session, or it ended: the page sends the browser to the login form."""


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


def csrf_for(session_id: str) -> str:
    """The CSRF value of a session's forms."""
    return hmac.new(session_id.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def sessions_of(request: Request) -> WebSessions:
    sessions: WebSessions = request.app.state.web_sessions
    return sessions


async def viewer(request: Request) -> Viewer:
    """The session's account; LoginRequired without a session that still works."""
    session_id = request.cookies.get(COOKIE, "")
    session = await sessions_of(request).resolve(session_id)
    if session is None:
        raise LoginRequired("log in with an API token of your account")
    return Viewer(session.grant, csrf_for(session_id))


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
