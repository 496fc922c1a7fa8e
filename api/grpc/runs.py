"""RunService: trigger runs, read them, cancel them, follow their logs, fetch their artifacts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from api.cancelling import cancel_run
from api.grpc import convert, paging
from api.grpc.auth import current_account
from api.lookup import existing_run, run_artifact
from api.pickup_publisher import PickupPublisher
from api.pull_requests import close_pull_request
from api.rerunning import rerun_from_failure
from api.rows import Run
from api.store import Store
from api.triggering import trigger_or_reattach
from api.validation import run_statuses, trigger_spec
from runplane.adapters.db import Connection
from runplane.basics.errors import InvalidArgument
from runplane.basics.supervise import sleep_or_stop
from runplane.dbt.versions import InstalledDbtVersions
from runplane.v1 import runs_pb2, runs_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[object, object]
LOG_BATCH = 500


class RunService(runs_pb2_grpc.RunServiceServicer):
    def __init__(
        self,
        store: Store,
        pickups: PickupPublisher,
        *,
        max_page_size: int,
        log_poll_interval: float,
        draining: asyncio.Event,
        dbt_versions: InstalledDbtVersions,
    ) -> None:
        self._store = store
        self._dbt_versions = dbt_versions
        self._pickups = pickups
        self._max_page_size = max_page_size
        self._log_poll_interval = log_poll_interval
        self._draining = draining

    async def TriggerRun(self, request: runs_pb2.TriggerRunRequest, context: Context) -> runs_pb2.Run:
        spec = trigger_spec(request)
        self._dbt_versions.check(spec.overrides.dbt_version, "overrides.dbt_version")
        triggered = await trigger_or_reattach(self._store, self._pickups, current_account(), spec)
        answer = convert.run(triggered.run, triggered.steps)
        answer.reattached = triggered.reattached
        return answer

    async def ClosePullRequest(
        self, request: runs_pb2.ClosePullRequestRequest, context: Context
    ) -> runs_pb2.ClosePullRequestResponse:
        account_id = current_account()
        if request.job_id < 0:
            raise InvalidArgument("job_id", "must be a job id, or 0 for every ci job")
        number = request.pull_request_number
        rows = await close_pull_request(
            self._store,
            self._pickups,
            account_id,
            number,
            job_ids=[request.job_id] if request.job_id else [],
            why=f"pull request #{number} was closed",
        )
        return runs_pb2.ClosePullRequestResponse(drop_runs=[convert.run(row, []) for row in rows])

    async def RerunRun(self, request: runs_pb2.RerunRunRequest, context: Context) -> runs_pb2.Run:
        row = await rerun_from_failure(self._store, self._pickups, current_account(), request.run_id)
        async with self._store.connection() as conn:
            return await self._run(conn, row)

    async def GetRun(self, request: runs_pb2.GetRunRequest, context: Context) -> runs_pb2.Run:
        account_id = current_account()
        async with self._store.connection() as conn:
            return await self._run(conn, await existing_run(self._store, conn, account_id, request.run_id))

    async def ListRuns(self, request: runs_pb2.ListRunsRequest, context: Context) -> runs_pb2.ListRunsResponse:
        account_id = current_account()
        if request.job_id < 0:
            raise InvalidArgument("job_id", "must be a job id, or 0 for every job")
        statuses = run_statuses(list(request.statuses), "statuses")
        job_id = request.job_id or None
        page = paging.page(
            request.page_size,
            request.page_token,
            self._max_page_size,
            "runs",
            account_id,
            job_id,
            [int(s) for s in statuses],
            request.retries_exhausted_only,
        )
        async with self._store.connection() as conn:
            rows = await self._store.list_runs(
                conn,
                account_id,
                job_id=job_id,
                statuses=statuses,
                retries_exhausted_only=request.retries_exhausted_only,
                after_id=page.after_id,
                limit=page.limit,
            )
            rows, next_token = page.split(rows)
            steps = await self._store.run_steps(conn, [r.id for r in rows])
        return runs_pb2.ListRunsResponse(runs=[convert.run(r, steps[r.id]) for r in rows], next_page_token=next_token)

    async def CancelRun(self, request: runs_pb2.CancelRunRequest, context: Context) -> runs_pb2.Run:
        row = await cancel_run(self._store, current_account(), request.run_id)
        async with self._store.connection() as conn:
            return await self._run(conn, row)

    async def StreamRunLogs(
        self, request: runs_pb2.StreamRunLogsRequest, context: Context
    ) -> AsyncIterator[runs_pb2.LogChunk]:
        """Chunks after ``after_seq`` in order; with ``follow``, until the run ends.

        A follower ends early (cleanly) when the server drains; it resumes with ``after_seq``.
        """
        account_id = current_account()
        if request.after_seq < 0:
            raise InvalidArgument("after_seq", "must not be negative")
        after_seq = request.after_seq
        async with self._store.connection() as conn:
            run_id = (await existing_run(self._store, conn, account_id, request.run_id)).id
        while True:
            # Status first, chunks second: a runner writes its last chunks before the final
            # status, so a terminal status read here means no chunk can appear after this read.
            async with self._store.connection() as conn:
                status = await self._store.run_status(conn, run_id)
                rows = await self._store.log_chunks(conn, run_id, after_seq=after_seq, limit=LOG_BATCH)
            for row in rows:
                yield convert.log_chunk(row)
                after_seq = row.seq
            if len(rows) == LOG_BATCH:
                continue
            if not request.follow or status.is_terminal:
                return
            if await sleep_or_stop(self._draining, self._log_poll_interval):
                return

    async def ListArtifacts(
        self, request: runs_pb2.ListArtifactsRequest, context: Context
    ) -> runs_pb2.ListArtifactsResponse:
        account_id = current_account()
        async with self._store.connection() as conn:
            run_id = (await existing_run(self._store, conn, account_id, request.run_id)).id
            rows = await self._store.list_artifacts(conn, run_id)
        return runs_pb2.ListArtifactsResponse(artifacts=[convert.artifact(r) for r in rows])

    async def GetArtifact(self, request: runs_pb2.GetArtifactRequest, context: Context) -> runs_pb2.ArtifactContent:
        async with self._store.connection() as conn:
            step_index = request.step_index if request.HasField("step_index") else None
            row = await run_artifact(
                self._store, conn, current_account(), request.run_id, request.path, step_index=step_index
            )
        return runs_pb2.ArtifactContent(artifact=convert.artifact(row), content=bytes(row.content))

    async def _run(self, conn: Connection, row: Run) -> runs_pb2.Run:
        steps = await self._store.run_steps(conn, [row.id])
        return convert.run(row, steps[row.id])
