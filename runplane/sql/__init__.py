"""Named SQL queries, loaded once from ``.sql`` files.

A file holds queries separated by ``-- name: <query_name>`` lines (procrastinate style).

An array parameter is written ``%(name)b::type[]``: psycopg sends it in binary. In text each element
is quoted by psycopg and parsed again by Postgres, about 9 µs an element against about 1 µs, and a
dispatch pass or a queuer's tick sends arrays of thousands (``tests/runplane/test_sql.py`` finds a slip).
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into {name: sql}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """Load the named queries of ``package``'s ``filename``."""
    return parse_queries(resources.files(package).joinpath(filename).read_text(encoding="utf-8"))
