"""The web pages' sessions, kept in Postgres (``web_sessions``, queries in ``sessions.sql``).

Logging in with an API token makes a session: a random id (``secrets.token_urlsafe(32)``) that goes
in the browser's cookie, while the server keeps only its sha256 with the account, the token it was
made from, when it was made and last seen, and its expiry. The token itself never leaves the login
form. A session works until it is logged out (its row deleted), until its expiry, and only while
its token works: revoking the token, or the token expiring, ends every session made from it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from api.scopes import TokenGrant
from api.store import Store
from runplane.adapters.db import fetch_one
from runplane.basics.tokens import token_hash
from runplane.basics.types import AccountId
from runplane.sql import load_queries

QUERIES = load_queries("api.web", "sessions.sql")
MAX_TOKEN_LENGTH = 200
MAX_SESSION_ID_LENGTH = 100  # token_urlsafe(32) is 43 characters


@dataclass(frozen=True)
class WebSession:
    """A live session as the pages see it (never its id: that is only in the browser's cookie)."""

    account_id: AccountId
    token_id: int
    expires_at: datetime
    scopes: list[str]

    @property
    def grant(self) -> TokenGrant:
        return TokenGrant(self.account_id, frozenset(self.scopes), f"token #{self.token_id} (web pages)")


class WebSessions:
    """Sessions of ``store``'s database, each good for ``lifetime`` at most."""

    def __init__(self, store: Store, lifetime: timedelta) -> None:
        self._store = store
        self._lifetime = lifetime

    async def start(self, token: str) -> tuple[str, WebSession] | None:
        """A new session's id and the session, or None when the token is unknown, revoked or expired.

        Rows no page can use any more are deleted on the way, so the table holds live sessions only.
        """
        token = token.strip()
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        session_id = secrets.token_urlsafe(32)
        async with self._store.transaction() as conn:
            await conn.execute(QUERIES["forget_ended_sessions"])
            made = await fetch_one(
                conn,
                QUERIES["start_session"],
                {
                    "id_hash": token_hash(session_id),
                    "token_hash": token_hash(token),
                    "lifetime_seconds": self._lifetime.total_seconds(),
                },
                WebSession,
            )
        return None if made is None else (session_id, made)

    async def resolve(self, session_id: str) -> WebSession | None:
        """The session of a cookie's id, or None when there is none, it expired, or its token no longer works."""
        if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH:
            return None
        async with self._store.connection() as conn:
            return await fetch_one(conn, QUERIES["resolve_session"], {"id_hash": token_hash(session_id)}, WebSession)

    async def end(self, session_id: str) -> None:
        """Log out: the session's row is deleted, so its cookie no longer works anywhere."""
        if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH:
            return
        async with self._store.connection() as conn:
            await conn.execute(QUERIES["end_session"], {"id_hash": token_hash(session_id)})
