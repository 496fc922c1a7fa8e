"""The real promtool (Debian's `prometheus` package, installed by `make test`): checks and unit tests
of PromQL, for the chart's alert rules and the dashboard's queries."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args: str) -> str:
    """Run promtool; its output, or the test fails with what it said."""
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus package")
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
