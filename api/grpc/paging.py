"""Keyset paging with opaque page tokens.

A token carries the last id of the previous page and a fingerprint of the filters it was made
for, so a token reused with other filters is refused instead of silently skipping rows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Protocol, TypeVar

from runplane.basics.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
_MAX_TOKEN_LENGTH = 512


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


Row = TypeVar("Row", bound=_Identified)


@dataclass(frozen=True)
class Page:
    size: int
    after_id: int | None  # None: the first page
    fingerprint: str

    @property
    def limit(self) -> int:
        """Rows to fetch: one more than the page, to know whether another page follows."""
        return self.size + 1

    def split(self, rows: list[Row]) -> tuple[list[Row], str]:
        """The rows of this page and the token of the next one (empty after the last page)."""
        if len(rows) <= self.size:
            return rows, ""
        rows = rows[: self.size]
        last = rows[-1].id
        payload = json.dumps({"a": last, "f": self.fingerprint}, separators=(",", ":"))
        return rows, base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def fingerprint(*filters: object) -> str:
    return hashlib.sha256(json.dumps(filters, default=str).encode()).hexdigest()[:16]


def page(page_size: int, page_token: str, max_page_size: int, *filters: object) -> Page:
    """The page a List request asks for, or InvalidArgument naming page_size / page_token."""
    if page_size < 0 or page_size > max_page_size:
        raise InvalidArgument("page_size", f"must be between 0 and {max_page_size} (got {page_size})")
    size = page_size or min(DEFAULT_PAGE_SIZE, max_page_size)
    fp = fingerprint(*filters)
    if not page_token:
        return Page(size, None, fp)
    return Page(size, _decode(page_token, fp), fp)


def _decode(token: str, expected_fingerprint: str) -> int:
    bad = InvalidArgument("page_token", "is not a token this list returned")
    if len(token) > _MAX_TOKEN_LENGTH:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(payload, dict):
        raise bad
    after, fp = payload.get("a"), payload.get("f")
    if not isinstance(after, int) or isinstance(after, bool) or not isinstance(fp, str) or after <= 0:
        raise bad
    if fp != expected_fingerprint:
        raise InvalidArgument("page_token", "was made for a list with other filters")
    return after
