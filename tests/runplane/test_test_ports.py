"""The ports the tests' servers get: two test processes are never handed the same port at once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.support import ports


def test_a_port_handed_out_is_not_handed_out_again_while_its_server_may_still_be_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "_CLAIMS", tmp_path / "claims.json")
    first = ports.free_port()
    # Another process drawing the same port next (its test-bind succeeds: no server has bound it yet).
    draws = iter([first, first, first + 1 if first + 1 in ports._PORTS else first - 1])
    monkeypatch.setattr(random, "choice", lambda _ports: next(draws))
    second = ports.free_port()
    assert second != first
    claims = (tmp_path / "claims.json").read_text()
    assert str(first) in claims and str(second) in claims
