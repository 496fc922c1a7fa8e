"""The named SQL files: array parameters go to Postgres in binary."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

# An array parameter sent as text: a "%(name)s" placeholder cast to an array type.
ARRAY_IN_TEXT = re.compile(r"%\(\w+\)s::\w+\[\]")

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "dispatcher", "orchestrator", "queuer_worker", "runner", "runplane", "scheduler")


def test_no_array_parameter_is_sent_as_text() -> None:
    sources = [p for part in PRODUCT for p in (ROOT / part).rglob("*") if p.suffix in {".sql", ".py"}]
    assert len(sources) > 50
    slips = [f"{p.relative_to(ROOT)}: {m}" for p in sources for m in ARRAY_IN_TEXT.findall(p.read_text())]
    assert slips == []


def test_the_pattern_finds_a_text_array_and_passes_a_binary_one(database_url: str) -> None:
    assert ARRAY_IN_TEXT.findall("WHERE id = ANY(%(ids)s::bigint[])") == ["%(ids)s::bigint[]"]
    assert ARRAY_IN_TEXT.findall("WHERE id = ANY(%(ids)b::bigint[])") == []
    with psycopg.connect(database_url) as conn:  # what binary arrays carry, edge cases included
        row = conn.execute(
            "SELECT %(ids)b::bigint[], %(none)b::text[], %(keys)b::text[], %(hashes)b::bytea[]",
            {"ids": [1, 2**62, None], "none": [], "keys": ["a", "", "é"], "hashes": [b"\x00\xff"]},
        ).fetchone()
    assert row == ([1, 2**62, None], [], ["a", "", "é"], [b"\x00\xff"])
