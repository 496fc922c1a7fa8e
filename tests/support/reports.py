"""Whether the test a fixture serves failed: its teardown then prints what to read beside the failure.

``tests/conftest.py`` keeps each phase's report on the test item (``report_setup``,
``report_call``), as pytest's documentation suggests for fixtures that act on a failure.
"""

from __future__ import annotations

import pytest


def failed(request: pytest.FixtureRequest) -> bool:
    """The test's own call failed, or never ran (its setup failed)."""
    report = getattr(request.node, "report_call", None)
    return report is None or report.failed
