"""A run's overrides, read one way by every part: the effective timeout the dispatcher gives the
launcher is the one the runner API gives the runner."""

from __future__ import annotations

import pytest

from runplane.basics.run_overrides import run_override, run_timeout


def test_an_override_is_found_by_its_snake_or_camel_case_name() -> None:
    assert run_override({"target_name": "ci"}, "target_name") == "ci"
    assert run_override({"targetName": "ci"}, "target_name") == "ci"
    assert run_override({}, "target_name") is None


@pytest.mark.parametrize(
    ("overrides", "job_timeout", "effective"),
    [
        ({"timeout_seconds": 60}, 600, 60),
        ({"timeoutSeconds": 60}, 600, 60),
        ({"timeout_seconds": 0}, 600, 600),
        ({"timeout_seconds": -5}, 600, 600),  # never a negative deadline
        ({"timeout_seconds": True}, 600, 600),
        ({}, None, 0),
        (None, 30, 30),
        ("not a mapping", 30, 30),
    ],
)
def test_the_effective_timeout_is_a_positive_override_else_the_jobs(
    overrides: object, job_timeout: int | None, effective: int
) -> None:
    assert run_timeout(overrides, job_timeout) == effective
