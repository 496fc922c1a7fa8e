"""RunService: trigger runs, read them, cancel them, follow their logs, fetch their artifacts."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from api import convert, paging
from api.auth import current_account
from api.pickup_publisher import PickupPublisher
from api.store import Row, Store
from api.validation import TriggerSpec, positive_id, run_statuses, text, trigger_spec
from runplane import instruments, tracing
from runplane.db import Connection
from runplane.errors import FailedPrecondition, InvalidArgument, NotFound
from runplane.supervise import sleep_or_stop
from runplane.types import AccountId, JobId, JobType, RunId, RunStatus, Trigger, ci_schema, takes_run_slot
from runplane.v1 import runs_pb2, runs_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[object, object]
LOG_BATCH = 500
MAX_ARTIFACT_PATH = 1024


def client_idempotency_key(account_id: AccountId, key: str) -> str:
    """A client's key, namespaced by account so that two accounts' keys never collide."""
    return f"api:{account_id}:{key}"


def generated_idempotency_key() -> str:
    return f"api-once:{uuid.uuid4().hex}"


class RunService(runs_pb2_grpc.RunServiceServicer):
    def __init__(
        self,
        store: Store,
        pickups: PickupPublisher,
        *,
        max_page_size: int,
        log_poll_interval: float,
        draining: asyncio.Event,
    ) -> None:
        self._store = store
        self._pickups = pickups
        self._max_page_size = max_page_size
        self._log_poll_interval = log_poll_interval
        self._draining = draining

    async def TriggerRun(self, request: runs_pb2.TriggerRunRequest, context: Context) -> runs_pb2.Run:
        account_id = current_account()
        spec = trigger_spec(request)
        key = client_idempotency_key(account_id, spec.client_key) if spec.client_key else generated_idempotency_key()
        async with self._store.transaction() as conn:
            # The row lock orders triggers of one job against each other and against DeleteJob.
            job = await self._store.get_job(conn, account_id, spec.job_id, for_update=True)
            if job is None:
                raise NotFound(f"job {spec.job_id} not found")
            if spec.client_key and (existing := await self._store.run_by_idempotency_key(conn, key)):
                return await self._replayed(conn, existing, spec)
            await self._check_trigger(conn, job, spec)
            row = await self._store.insert_run(conn, **self._run_params(job, spec, key))
            if row is None:  # a concurrent trigger with the same key won
                existing = await self._store.run_by_idempotency_key(conn, key)
                assert existing is not None
                return await self._replayed(conn, existing, spec)
            run = await self._run(conn, row)
        log.info(
            "run queued",
            extra={"account_id": account_id, "job_id": spec.job_id, "run_id": run.id, "trigger": spec.trigger.value},
        )
        await self._pickups.publish(account_id)
        return run

    async def GetRun(self, request: runs_pb2.GetRunRequest, context: Context) -> runs_pb2.Run:
        account_id = current_account()
        async with self._store.connection() as conn:
            return await self._run(conn, await self._existing(conn, account_id, request.run_id))

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
            steps = await self._store.run_steps(conn, [r["id"] for r in rows])
        return runs_pb2.ListRunsResponse(
            runs=[convert.run(r, steps[r["id"]]) for r in rows], next_page_token=next_token
        )

    async def CancelRun(self, request: runs_pb2.CancelRunRequest, context: Context) -> runs_pb2.Run:
        account_id = current_account()
        run_id = positive_id(request.run_id, "run_id")
        # A run may move between the statements (queued -> starting, or back after a failed
        # launch); each statement is a compare-and-set, so retrying settles it.
        for _ in range(5):
            async with self._store.connection() as conn:
                row = await self._store.cancel_queued_run(
                    conn, account_id, run_id, "Cancelled on request before it started."
                )
                if row is None:
                    row = await self._store.request_cancel(conn, account_id, run_id)
                if row is not None:
                    log.info("run cancel requested", extra={"account_id": account_id, "run_id": run_id})
                    if row["status"] == RunStatus.CANCELLED:
                        instruments.cancellations.add(1, {"reason": "user"})
                    return await self._run(conn, row)
                current = await self._existing(conn, account_id, run_id)
                if RunStatus(current["status"]).is_terminal:
                    raise FailedPrecondition(
                        f"run {run_id} already finished ({RunStatus(current['status']).name.lower()})"
                    )
        raise FailedPrecondition(f"run {run_id} keeps changing status; try again")

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
            run_id = RunId((await self._existing(conn, account_id, request.run_id))["id"])
        while True:
            # Status first, chunks second: a runner writes its last chunks before the final
            # status, so a terminal status read here means no chunk can appear after this read.
            async with self._store.connection() as conn:
                status = await self._store.run_status(conn, run_id)
                rows = await self._store.log_chunks(conn, run_id, after_seq=after_seq, limit=LOG_BATCH)
            for row in rows:
                yield convert.log_chunk(row)
                after_seq = row["seq"]
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
            run_id = RunId((await self._existing(conn, account_id, request.run_id))["id"])
            rows = await self._store.list_artifacts(conn, run_id)
        return runs_pb2.ListArtifactsResponse(artifacts=[convert.artifact(r) for r in rows])

    async def GetArtifact(self, request: runs_pb2.GetArtifactRequest, context: Context) -> runs_pb2.ArtifactContent:
        account_id = current_account()
        path = text(request.path, "path", max_length=MAX_ARTIFACT_PATH, required=True)
        step_index = request.step_index if request.HasField("step_index") else None
        if step_index is not None and step_index < 0:
            raise InvalidArgument("step_index", "must be a step index (0 is the first step), or unset for the last")
        async with self._store.connection() as conn:
            run_id = RunId((await self._existing(conn, account_id, request.run_id))["id"])
            row = await self._store.get_artifact(conn, run_id, path, step_index)
        if row is None:
            of_step = "" if step_index is None else f" from step {step_index}"
            raise NotFound(f"run {run_id} has no artifact {path!r}{of_step}")
        return runs_pb2.ArtifactContent(artifact=convert.artifact(row), content=bytes(row["content"]))

    async def _existing(self, conn: Connection, account_id: AccountId, run_id: int) -> Row:
        positive_id(run_id, "run_id")
        row = await self._store.get_run(conn, account_id, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def _run(self, conn: Connection, row: Row) -> runs_pb2.Run:
        steps = await self._store.run_steps(conn, [row["id"]])
        return convert.run(row, steps[row["id"]])

    async def _replayed(self, conn: Connection, existing: Row, spec: TriggerSpec) -> runs_pb2.Run:
        """The run an idempotency key already made; the key must have been used for this job."""
        if existing["job_id"] != spec.job_id:
            raise FailedPrecondition(
                f"idempotency_key {spec.client_key!r} was already used for job {existing['job_id']}"
            )
        return await self._run(conn, existing)

    async def _check_trigger(self, conn: Connection, job: Row, spec: TriggerSpec) -> None:
        """What a trigger needs of the job: the right type, a pull request, an active job."""
        job_type = JobType(job["job_type"])
        pull_request = spec.overrides.pull_request_number
        if spec.trigger is Trigger.CI and job_type is not JobType.CI:
            raise InvalidArgument("trigger", f"a ci trigger needs a ci job; job {job['id']} is a {job_type} job")
        if spec.trigger is Trigger.MERGE and job_type is not JobType.MERGE:
            raise InvalidArgument("trigger", f"a merge trigger needs a merge job; job {job['id']} is a {job_type} job")
        if job_type is JobType.CI and not pull_request:
            raise InvalidArgument("overrides.pull_request_number", "a ci run needs the number of its pull request")
        if job["deactivated_at"] is None:
            return
        if spec.trigger is Trigger.MANUAL:
            # "Run now" on a deactivated job reactivates it, as saving it does.
            await self._store.reactivate_job(conn, JobId(job["id"]))
            log.info("job reactivated by run now", extra={"account_id": job["account_id"], "job_id": job["id"]})
            return
        raise FailedPrecondition(
            f"job {job['id']} is deactivated ({job['deactivation_reason'] or 'no reason recorded'}); "
            "save the job or run it now (trigger manual) to reactivate it"
        )

    def _run_params(self, job: Row, spec: TriggerSpec, key: str) -> dict[str, object]:
        job_type = JobType(job["job_type"])
        pull_request = spec.overrides.pull_request_number
        schema = spec.overrides.schema or ""
        if job_type is JobType.CI and pull_request:
            # A CI run builds in its pull request's schema, whatever it asks: never in production's.
            schema = ci_schema(job["id"], pull_request)
        return {
            "account_id": job["account_id"],
            "job_id": job["id"],
            "job_type": job_type.value,
            "trigger": spec.trigger.value,
            "cause": spec.cause,
            "idempotency_key": key,
            "priority": job["priority"],
            "takes_slot": takes_run_slot(job_type),
            "overrides": spec.overrides.as_json(),
            "pull_request_number": pull_request,
            "schema_name": schema,
            "trace_parent": tracing.current_traceparent(),
        }
