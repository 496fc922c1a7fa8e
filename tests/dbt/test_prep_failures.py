"""Every way a run's prep can fail ends the run with its reason: a timeout or a cancel during a prep
part says so, and a file the prep cannot write is an error of the run, not a dead runner."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner.service import run as run_runner
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, runs_pb2
from tests.dbt.conftest import Client, commit, dbt_job, environment, make_repository, run_job, run_log, start_run
from tests.support.git_servers import SilentGitServer

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(300), pytest.mark.usefixtures("_cleanup_bus")]

Db = psycopg.Connection[Any]
OK = common_pb2.RUN_STATUS_SUCCESS


async def test_a_timeout_during_dbt_deps_is_reported_as_the_timeout(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, tmp_path: Path
) -> None:
    with SilentGitServer() as hanging:
        repo = make_repository(tmp_path / "jaffle")
        (repo / "packages.yml").write_text(f"packages:\n  - git: {hanging.url('macros')}\n    revision: main\n")
        commit(repo, "a package from a git host that hangs")
        env = await environment(client, database_url, str(repo))
        job = await dbt_job(client, env.id, ["echo never"], timeout_seconds=8)
        started = time.monotonic()
        run = await run_job(client, dbt_settings, db, job.id)
        elapsed = time.monotonic() - started

    assert run.status == common_pb2.RUN_STATUS_ERROR
    assert run.status_message.startswith("timed out after 8 s: timed out during dbt deps ("), run.status_message
    assert "dbt deps failed" not in run.status_message
    assert elapsed < 60
    log = await run_log(client, run.id)
    assert f"runplane: {run.status_message}" in log, log[-2000:]
    # Checkout and profile succeeded; the deps step ended as error with the reason in its own log;
    # the job's command never started.
    clone, profile, deps, command = run.steps
    assert [clone.status, profile.status, deps.status] == [OK, OK, common_pb2.RUN_STATUS_ERROR]
    assert deps.command == "Invoke dbt deps" and deps.finished_at.seconds and not deps.skipped
    assert f"runplane: {run.status_message}" in await run_log(client, run.id, 2)
    assert command.command == "echo never" and command.skipped


async def test_a_cancel_during_the_checkout_stops_it_and_says_so(
    client: Client, dbt_settings: Settings, db: Db, database_url: str
) -> None:
    with SilentGitServer() as hanging:
        # A git server on loopback: an operator's own rule allows it (the default refuses it at every
        # door), so the project names it around the doors and the runner host allows it.
        env = await environment(client, database_url, "https://git.example.com/jaffle.git")
        db.execute("UPDATE projects SET repository_url = %s WHERE id = %s", (hanging.url("jaffle"), env.project_id))
        allowing = dbt_settings.repositories.model_copy(
            update={"plain_schemes": True, "allowed_networks": ["127.0.0.0/8"]}
        )
        runner_settings = dbt_settings.model_copy(update={"repositories": allowing})
        job = await dbt_job(client, env.id, ["echo never"])
        run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job.id))
        token = start_run(db, run.id)
        runner = asyncio.create_task(run_runner(runner_settings, run.id, token))
        try:
            deadline = time.monotonic() + 60
            while not hanging.accepted:  # git is connected and waiting for the host
                assert not runner.done() and time.monotonic() < deadline, "the checkout never reached the host"
                await asyncio.sleep(0.1)
            db.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = %s", (run.id,))
            assert await asyncio.wait_for(runner, timeout=30) == 0
        finally:
            if not runner.done():
                runner.cancel()

    done = await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert done.status == common_pb2.RUN_STATUS_CANCELLED
    assert done.status_message == "cancelled by request during checkout"
    assert "runplane: cancelled by request during checkout" in await run_log(client, run.id, 0)
    assert done.steps[0].status == common_pb2.RUN_STATUS_CANCELLED
    assert all(step.skipped for step in done.steps[1:])


@pytest.fixture
def full_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 64 KiB tmpfs filled up, inside ``tmp_path``: the runner's temporary directory on a full disk."""
    mount = tmp_path / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", str(mount)], check=True)
    try:
        with pytest.raises(OSError, match="No space left"), (mount / "filler").open("wb", buffering=0) as filler:
            while True:
                filler.write(b"\0" * 4096)
        monkeypatch.setattr(tempfile, "tempdir", str(mount))  # the runner's temporary files
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


async def test_a_full_disk_during_prep_is_the_runs_error(
    client: Client, dbt_settings: Settings, db: Db, database_url: str, full_temporary_directory: Path
) -> None:
    work = full_temporary_directory.parent
    repo = make_repository(work / "jaffle")
    env = await environment(client, database_url, str(repo))
    job = await dbt_job(client, env.id, ["echo never"])
    runner = dbt_settings.runner.model_copy(update={"work_dir": str(work / "runs")})

    run = await run_job(client, dbt_settings.model_copy(update={"runner": runner}), db, job.id)

    assert run.status == common_pb2.RUN_STATUS_ERROR
    # git's trust file for a local repository is the first thing written there
    assert run.status_message.startswith("checkout: No space left on device"), run.status_message
    assert f"runplane: {run.status_message}" in await run_log(client, run.id, 0)
    assert run.steps[0].status == common_pb2.RUN_STATUS_ERROR and all(s.skipped for s in run.steps[1:])
