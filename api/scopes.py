"""What an API token may do: its scopes, and the scope each call needs.

Three scopes, each including the one below it: ``read_only`` (get, list, follow logs),
``job_admin`` (also create, change and delete jobs; trigger and cancel runs) and ``account_admin``
(everything, including what later calls manage about the account itself). A call the token's scope
does not cover is PERMISSION_DENIED.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from runplane.basics.errors import InvalidArgument, PermissionDenied
from runplane.basics.types import AccountId


class Scope(enum.StrEnum):
    READ_ONLY = "read_only"
    JOB_ADMIN = "job_admin"
    ACCOUNT_ADMIN = "account_admin"


_RANK = {Scope.READ_ONLY: 0, Scope.JOB_ADMIN: 1, Scope.ACCOUNT_ADMIN: 2}
_READS = ("Get", "List", "Stream")


@dataclass(frozen=True)
class TokenGrant:
    account_id: AccountId
    scopes: frozenset[str]
    who: str = ""  # the token, in words a note of who did something keeps ("token #7 (deploy bot)")


def parse_scopes(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Validated scope names (InvalidArgument names the bad one)."""
    if not values:
        raise InvalidArgument("scopes", "name at least one of read_only, job_admin, account_admin")
    for value in values:
        if value not in Scope.__members__.values():
            raise InvalidArgument("scopes", f"{value!r} is not read_only, job_admin or account_admin")
    return tuple(sorted(set(values)))


def required_scope(method: str) -> Scope:
    """The least scope a call needs: reads need read_only, every other call of the public API job_admin."""
    name = method.rsplit("/", 1)[-1]
    return Scope.READ_ONLY if name.startswith(_READS) else Scope.JOB_ADMIN


def required_http_scope(http_method: str) -> Scope:
    """The same rule for the REST door: reading (GET, HEAD) needs read_only, every change job_admin."""
    return Scope.READ_ONLY if http_method.upper() in ("GET", "HEAD") else Scope.JOB_ADMIN


def check_scope(grant: TokenGrant, method: str, needed: Scope | None = None) -> None:
    """PERMISSION_DENIED unless the token's scopes cover ``method`` (a gRPC method, or ``needed`` when given)."""
    needed = required_scope(method) if needed is None else needed
    best = max((_RANK[Scope(s)] for s in grant.scopes if s in Scope.__members__.values()), default=-1)
    if best < _RANK[needed]:
        raise PermissionDenied(f"this token's scopes ({', '.join(sorted(grant.scopes))}) do not allow {method}")
