"""An environment's warehouse directory on the runner's host: every run of the environment, on any
uid, reads and writes what an earlier one wrote; a process of any other uid, or of another
environment's group, cannot open it; a directory of another group is refused; a link planted there
makes root change nothing outside it. Root only (the directory is root's, and the runs' uids are
switched to); the uids and groups are this test's own."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.control_plane import RunSpec
from runner.warehouse_directory import prepare_own, prepare_shared
from runplane.basics.settings import DispatcherSettings, RunnerSettings, Settings
from runplane.dbt.warehouse_files import WarehouseFiles, WarehousePathRefused
from runplane.v1 import projects_pb2
from tests.dbt.conftest import KEPT_WAREHOUSES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the warehouse directory is root's")

UID = 600_000 + (os.getpid() % 1000) * 4  # three uids of this test's own: two runs of E, one of F
GID_BASE = 1_600_000_000 + (os.getpid() % 1000) * 100
WRITE = "import sys; open(sys.argv[1], 'a').write(sys.argv[2])"
READ = "import sys; print(open(sys.argv[1]).read())"


@pytest.fixture
def root() -> Iterator[Path]:
    KEPT_WAREHOUSES.mkdir(exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix="root-", dir=KEPT_WAREHOUSES)) / "warehouses"
    made.parent.chmod(0o755)  # the runs' uids pass through to the root
    try:
        yield made
    finally:
        shutil.rmtree(made.parent, ignore_errors=True)


def settings(root: Path) -> RunnerSettings:
    return RunnerSettings(local_warehouse_root=str(root), local_warehouse_gid=GID_BASE)


def spec(environment_id: int, path: str) -> RunSpec:
    dbt = projects_pb2.DbtContext(environment_id=environment_id, adapter_type="duckdb", connection={"path": path})
    return RunSpec(run_id=1, dbt=dbt)


def as_run(uid: int, groups: tuple[int, ...], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` as a run's process: ``uid``, the ``groups`` its fence gave it, its umask."""
    return subprocess.run(
        ["/usr/bin/python3", "-I", "-c", code, *args],
        user=uid, group=uid, extra_groups=list(groups), umask=0o007,
        capture_output=True, text=True, cwd="/", env={}, check=False, timeout=30,
    )  # fmt: skip


def test_runs_of_one_environment_on_different_uids_share_its_file_and_no_other_uid_opens_it(root: Path) -> None:
    runner = settings(root)
    database = root / "shop" / "warehouse.duckdb"
    groups, refusal = prepare_shared(runner, spec(7, str(database)))
    assert refusal == "" and groups == (GID_BASE + 7,)
    made = (root / "shop").stat()
    assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (0, GID_BASE + 7, 0o2770)
    assert stat.S_IMODE(root.stat().st_mode) == 0o711

    first = as_run(UID, groups, WRITE, str(database), "first ")
    assert first.returncode == 0, first.stderr
    second = as_run(UID + 1, groups, WRITE, str(database), "second")  # another uid, the same environment
    assert second.returncode == 0, second.stderr
    assert as_run(UID + 1, groups, READ, str(database)).stdout.strip() == "first second"

    # Another environment's run, even on the uid that made the file, cannot open it, nor list the root.
    other_groups, _ = prepare_shared(runner, spec(8, str(root / "other" / "warehouse.duckdb")))
    for uid in (UID, UID + 2):
        denied = as_run(uid, other_groups, READ, str(database))
        assert denied.returncode != 0 and "PermissionError" in denied.stderr, denied
    listing = as_run(UID + 2, other_groups, "import os, sys; os.listdir(sys.argv[1])", str(root))
    assert "PermissionError" in listing.stderr

    # The next run's prep gives what the runs made to root and the group: the uid that made it owns nothing.
    prepare_shared(runner, spec(7, str(database)))
    kept = database.stat()
    assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (0, GID_BASE + 7, 0o660)
    assert as_run(UID + 2, groups, READ, str(database)).stdout.strip() == "first second"


def test_a_directory_of_another_group_is_refused_and_a_planted_link_changes_nothing_outside(root: Path) -> None:
    runner = settings(root)
    groups, _ = prepare_shared(runner, spec(7, str(root / "shop" / "warehouse.duckdb")))
    outside = root.parent / "secret"
    outside.write_text("root's")
    outside.chmod(0o600)
    planted = as_run(UID, groups, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(outside),
                     str(root / "shop" / "link"))  # fmt: skip
    assert planted.returncode == 0, planted.stderr

    groups, refusal = prepare_shared(runner, spec(7, str(root / "shop" / "warehouse.duckdb")))
    assert refusal == ""
    found = outside.stat()
    assert (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) == (0, 0, 0o600)

    groups, refusal = prepare_shared(runner, spec(9, str(root / "shop" / "stolen.duckdb")))
    assert groups == ()
    assert refusal.endswith("which belongs to another environment: give this environment a directory of its own")


def test_a_path_runs_cannot_keep_is_refused_before_the_run_starts(root: Path) -> None:
    runner = settings(root)
    for path, reason in {
        "/var/lib/elsewhere/shop/warehouse.duckdb": f"is outside the warehouse root {root}",
        f"{root}/warehouse.duckdb": f"is directly in the warehouse root {root}",
        "/tmp/shop/warehouse.duckdb": "is under /tmp",
        f"{root}/../escape/warehouse.duckdb": f"is outside the warehouse root {root}",
    }.items():
        groups, refusal = prepare_shared(runner, spec(7, path))
        assert groups == () and refusal.startswith(f"the environment's DuckDB path {reason}"), (path, refusal)
        assert prepare_own(runner, spec(7, path)).startswith(f"the environment's DuckDB path {reason}")
    assert prepare_shared(runner, spec(7, ":memory:")) == ((), "")
    assert prepare_shared(runner, spec(7, "md:analytics")) == ((), "")


def test_a_pod_keeps_no_warehouse_file() -> None:
    cluster = Settings(dispatcher=DispatcherSettings(launcher="kubernetes"))
    assert WarehouseFiles.of(cluster) == WarehouseFiles("")  # what the API checks a save with
    local = Settings(
        dispatcher=DispatcherSettings(launcher="local"), runner=RunnerSettings(local_warehouse_root="/srv/w/")
    )
    assert WarehouseFiles.of(local) == WarehouseFiles("/srv/w")
    pod = WarehouseFiles.of_root("")
    with pytest.raises(WarehousePathRefused, match="runs here execute in Kubernetes Pods, which keep no file"):
        pod.directory("/var/lib/runplane/warehouses/shop/warehouse.duckdb")
    assert prepare_own(RunnerSettings(local_warehouse_root=""), spec(7, "/srv/w/shop/x.duckdb")).startswith(
        "the environment's DuckDB path is a file on the runner's host, and runs here execute in Kubernetes Pods"
    )
