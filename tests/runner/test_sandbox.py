"""The steps' namespaces (``runner.sandbox``): the run's own /tmp covers the host's, yet the dbt
installs the steps need stay in sight when they live under it (a checkout under /tmp, as a CI
clone may be)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import sandbox
from runplane.adapters import run_scratch

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (make fence-packages)"
)


@pytest.fixture
def install_under_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rp-dbt-install-", dir="/tmp") as root:
        bin_dir = Path(root) / "bin"
        bin_dir.mkdir()
        tool = bin_dir / "dbt"
        tool.write_text("#!/bin/sh\necho dbt from under /tmp\n")
        tool.chmod(0o755)
        yield Path(root)


def _scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run's scratch space as a plain directory (no mount), with a directory for every place."""
    scratch = tmp_path_factory.mktemp("scratch")
    run_scratch.make_directories(scratch, os.getuid())
    return scratch


def _run(argv: tuple[str, ...], command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*argv, "/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)


def test_the_host_tmp_is_covered_but_the_dbt_install_under_it_is_seen_read_only(
    install_under_tmp: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_tmp = _scratch(tmp_path_factory)
    tool = install_under_tmp / "bin" / "dbt"

    hidden = _run(sandbox.confinement(run_tmp, []), f"{tool}")
    assert hidden.returncode != 0, hidden.stdout  # the run's /tmp covers the host's

    shown = _run(sandbox.confinement(run_tmp, [], [str(install_under_tmp)]), f"{tool} && touch {tool}.new")
    assert "dbt from under /tmp" in shown.stdout
    assert shown.returncode != 0 and "Read-only" in shown.stderr  # seen, not writable
    assert not Path(f"{tool}.new").exists()


def test_an_install_outside_the_covered_directories_is_not_bound_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_tmp = _scratch(tmp_path_factory)
    argv = sandbox.confinement(run_tmp, [], ["/usr"])
    assert "--ro-bind" not in argv
