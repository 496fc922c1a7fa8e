"""A run at a later time, as real processes: it outlives a restart of every service and starts once."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from api.admin import create_account
from api.process import start_server
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, run_row

pytestmark = pytest.mark.slow


async def test_a_run_at_a_later_time_survives_a_restart_of_every_service_and_starts_once(
    db: Conn, services: Services, settings: Settings, tmp_path: Path
) -> None:
    record = tmp_path / "started"
    _, token = await create_account(settings, name="later", run_slots=1, memory_mb=512)
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=20)
    when = Timestamp()
    when.FromDatetime(run_at)
    api = await start_server(settings, port=0)
    try:
        async with channel(f"127.0.0.1:{api.port}", token) as chan:
            job = await jobs_pb2_grpc.JobServiceStub(chan).CreateJob(
                jobs_pb2.CreateJobRequest(
                    name="once", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=[f"echo $RUNPLANE_RUN_ID >> {record}"]
                )
            )
            run = await runs_pb2_grpc.RunServiceStub(chan).TriggerRun(
                runs_pb2.TriggerRunRequest(job_id=job.id, run_at=when)
            )
    finally:
        await api.stop(0)
    assert run.status == common_pb2.RUN_STATUS_QUEUED and run.scheduled_at.ToDatetime(UTC) == run_at

    # Every service starts, then dies (SIGKILL) before the run is due; the run is still waiting.
    first = [services.start("scheduler"), services.start("dispatcher")]
    first += [p for n, p in services.processes if n == "api"]
    assert run_row(db, run.id)["status"] == RunStatus.QUEUED
    for process in first:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert run_row(db, run.id)["status"] == RunStatus.QUEUED

    services.processes.clear()
    services.start("scheduler")
    services.start("dispatcher")
    wait_for(lambda: run_row(db, run.id)["status"] >= RunStatus.SUCCESS, timeout=90, what="the run to finish")
    done = run_row(db, run.id)
    assert done["status"] == RunStatus.SUCCESS
    assert done["started_at"] >= run_at  # not before its time
    assert record.read_text().split() == [str(run.id)]  # started once
