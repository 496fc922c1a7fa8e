"""The local launcher on its own: runners forked from the fork server, or fresh processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from dispatcher.local_launcher import LocalLauncher, closed_to_others
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.support.local_runs import (
    ended,
    fork_server_of_this_process,
    spares_said_ready,
    starting_run,
    waiting_spares,
)
from tests.support.metrics import counted
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.records import Conn, rows, run_row

pytestmark = pytest.mark.usefixtures("_cleanup_bus", "runner_api")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def gone(pid: int, timeout: float = 30) -> None:
    await eventually(lambda: _gone(pid), timeout, what=f"process {pid} to exit")


async def test_forked_runners_run_a_duplicate_changes_nothing_and_a_dead_server_is_replaced(
    db: Conn, settings: Settings
) -> None:
    launcher = LocalLauncher(settings)
    try:
        await launcher.start()
        request = starting_run(db, ["echo from a forked runner"])
        result = await launcher.launch(request)
        assert result.cluster == "local" and result.pod_name.startswith("pid:")
        first = await ended(db, request.run_id)
        assert first["status"] == RunStatus.SUCCESS
        assert first["started_at"] - first["dispatched_at"] < first["finished_at"] - first["dispatched_at"]

        duplicate = await launcher.launch(request)  # a second launch of the same run
        await gone(int(duplicate.pod_name.removeprefix("pid:")))
        assert run_row(db, request.run_id) == first
        assert len(rows(db, "SELECT 1 FROM run_log_chunks WHERE run_id = %s", (request.run_id,))) == 1

        server = psutil.Process(os.getpid()).children()
        [fork_server] = [p for p in server if "runner.fork_server" in " ".join(p.cmdline())]
        fork_server.send_signal(signal.SIGKILL)
        await gone(fork_server.pid)
        again = starting_run(db, ["echo after the fork server died"])
        await launcher.launch(again)
        assert (await ended(db, again.run_id))["status"] == RunStatus.SUCCESS
    finally:
        await launcher.close()


async def spare_of(server: psutil.Process, settings: Settings) -> psutil.Process:
    """The started runner the fork server keeps waiting for the next run."""

    def only_spare() -> psutil.Process | None:
        waiting = [p for p in waiting_spares(server, settings.runner.api_address) if p.status() != psutil.STATUS_ZOMBIE]
        return waiting[0] if len(waiting) == 1 else None

    spare = await eventually(only_spare, 30, what="the fork server's spare runner")
    assert spare is not None
    return spare


def served(reader: InMemoryMetricReader, settings: Settings, how: str) -> float:
    return counted(reader, "runplane.pool.launches", pool="local", cluster=settings.dispatcher.cluster, served=how)


async def test_a_run_goes_to_the_waiting_spare_and_a_new_spare_is_forked(
    db: Conn, settings: Settings, metric_reader: InMemoryMetricReader
) -> None:
    launcher = LocalLauncher(settings)
    try:
        await launcher.start()
        server = fork_server_of_this_process()
        spare = await spare_of(server, settings)
        assert spare.uids().real == os.getuid()  # no run yet: not yet switched to a run's uid
        await eventually(lambda: spares_said_ready(server) == 1, 30, what="the spare to say it is connected")
        warm_before = served(metric_reader, settings, "warm")
        request = starting_run(db, ["echo from the spare"])
        result = await launcher.launch(request)
        assert result.pod_name == f"pid:{spare.pid}"
        assert result.warm  # the runner was connected and waiting before the run came
        assert served(metric_reader, settings, "warm") == warm_before + 1
        assert (await ended(db, request.run_id))["status"] == RunStatus.SUCCESS
        text = rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (request.run_id,))
        assert text == [{"text": "from the spare\n"}]
        following = await spare_of(server, settings)
        assert following.pid != spare.pid
    finally:
        await launcher.close()
    await gone(following.pid)  # the server's EOF reaches its spare: nothing is left waiting


async def test_a_killed_spare_is_replaced_for_the_run(
    db: Conn, settings: Settings, metric_reader: InMemoryMetricReader
) -> None:
    launcher = LocalLauncher(settings)
    try:
        await launcher.start()
        spare = await spare_of(fork_server_of_this_process(), settings)
        spare.send_signal(signal.SIGKILL)
        await gone(spare.pid)
        cold_before = served(metric_reader, settings, "cold")
        request = starting_run(db, ["echo after the spare died"])
        result = await launcher.launch(request)
        assert result.pod_name != f"pid:{spare.pid}"
        assert not result.warm  # the run waited for a runner forked for it
        assert served(metric_reader, settings, "cold") == cold_before + 1
        assert (await ended(db, request.run_id))["status"] == RunStatus.SUCCESS
    finally:
        await launcher.close()


async def test_a_run_that_comes_before_the_spare_is_connected_is_served_cold(db: Conn, settings: Settings) -> None:
    nowhere = settings.runner.model_copy(update={"api_address": f"127.0.0.1:{free_port()}"})
    launcher = LocalLauncher(settings.model_copy(update={"runner": nowhere}))
    pid = 0
    try:
        await launcher.start()
        await spare_started(fork_server_of_this_process())
        result = await launcher.launch(starting_run(db, ["echo never claimed"]))
        pid = int(result.pod_name.removeprefix("pid:"))
        assert not result.warm  # its runner had not reached the runner API: the run waits for it
    finally:
        await launcher.close()
        if pid:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()  # it would wait for the runner API until its claim gives up
            await gone(pid)


async def spare_started(server: psutil.Process) -> None:
    """Wait until the fork server has its spare (a child) and it is still unconnected."""
    await eventually(lambda: len(server.children()) >= 1, 30, what="the fork server's spare")
    assert spares_said_ready(server) == 0


async def test_a_fresh_runner_process_per_run(db: Conn, settings: Settings) -> None:
    fresh = settings.dispatcher.model_copy(update={"local_fork_server": False})
    launcher = LocalLauncher(settings.model_copy(update={"dispatcher": fresh}))
    try:
        request = starting_run(db, ["echo from a fresh process"])
        result = await launcher.launch(request)
        assert not result.warm  # nothing was started ahead of the run
        row = await ended(db, request.run_id, timeout=60)
        assert row["status"] == RunStatus.SUCCESS
        assert row["pod_name"] == "" and result.pod_name.startswith("pid:")  # recording it is the dispatcher's job
        text = rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (request.run_id,))
        assert text == [{"text": "from a fresh process\n"}]
    finally:
        await launcher.close()


async def test_a_runner_counts_against_the_capacity_until_it_exits(db: Conn, settings: Settings) -> None:
    capped = settings.dispatcher.model_copy(update={"local_capacity": 3})
    launcher = LocalLauncher(settings.model_copy(update={"dispatcher": capped}))
    try:
        assert launcher.capacity == 3 and launcher.alive() == 0
        first = await launcher.launch(starting_run(db, ["sleep 1"]))
        second = await launcher.launch(starting_run(db, ["sleep 1"]))
        assert launcher.alive() == 2
        await gone(int(first.pod_name.removeprefix("pid:")))
        await gone(int(second.pod_name.removeprefix("pid:")))
        await eventually(lambda: launcher.alive() == 0, 5, what="the exits to be seen")
    finally:
        await launcher.close()


def test_a_path_closed_to_other_users_is_named() -> None:
    base = Path(tempfile.mkdtemp(prefix="rp-closed-"))
    try:
        base.chmod(0o755)
        python = base / "opt" / "bin" / "python"
        python.parent.mkdir(parents=True, mode=0o755)
        python.write_text("")
        python.chmod(0o755)
        link = base / "python-link"
        link.symlink_to(python)
        assert closed_to_others(python) is None
        (base / "opt").chmod(0o750)  # as /root is: the run's uid cannot reach what is inside
        assert closed_to_others(link) == base / "opt"
        (base / "opt").chmod(0o755)
        python.chmod(0o750)
        assert closed_to_others(python) == python
    finally:
        shutil.rmtree(base)
