"""JobService: create, read, list, replace and delete job definitions.

Every write that matters to scheduling bumps ``jobs.version``; the table's trigger then NOTIFYs
``runplane_jobs`` so the orchestrator hands the new definition to the job's queuer worker.
"""

from __future__ import annotations

import logging

import grpc

from api.auth import current_account
from api.grpc import convert, paging
from api.lookup import existing_job
from api.pausing import set_paused
from api.store import Row, Store
from api.validation import MAX_IDEMPOTENCY_KEY, JobSpec, job_spec, positive_id, text
from runplane.adapters import instruments
from runplane.adapters.db import Connection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound
from runplane.basics.types import AccountId, JobId
from runplane.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[object, object]


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, store: Store, *, max_page_size: int) -> None:
        self._store = store
        self._max_page_size = max_page_size

    async def CreateJob(self, request: jobs_pb2.CreateJobRequest, context: Context) -> jobs_pb2.Job:
        account_id = current_account()
        spec = job_spec(request)
        key = text(request.idempotency_key, "idempotency_key", max_length=MAX_IDEMPOTENCY_KEY).strip() or None
        async with self._store.transaction() as conn:
            await self._check_environment(conn, account_id, spec)
            await self._check_deferral(conn, account_id, None, spec)
            await self._check_completion_triggers(conn, account_id, None, spec)
            row, created = await self._store.insert_job(conn, account_id, spec, create_key=key)
            if not created:
                if row["deleted_at"] is not None:
                    raise FailedPrecondition(f"the job created with this idempotency key ({row['id']}) was deleted")
                log.info("job create retried", extra={"account_id": account_id, "job_id": row["id"]})
                return await self._job(conn, row)
            await self._store.replace_completion_triggers(conn, JobId(row["id"]), spec)
            out = await self._job(conn, row)
        log.info("job created", extra={"account_id": account_id, "job_id": row["id"]})
        return out

    async def GetJob(self, request: jobs_pb2.GetJobRequest, context: Context) -> jobs_pb2.Job:
        account_id = current_account()
        async with self._store.connection() as conn:
            row = await self._existing(conn, account_id, request.job_id)
            return await self._job(conn, row)

    async def ListJobs(self, request: jobs_pb2.ListJobsRequest, context: Context) -> jobs_pb2.ListJobsResponse:
        account_id = current_account()
        page = paging.page(request.page_size, request.page_token, self._max_page_size, "jobs", account_id)
        async with self._store.connection() as conn:
            rows = await self._store.list_jobs(conn, account_id, after_id=page.after_id, limit=page.limit)
            rows, next_token = page.split(rows)
            triggers = await self._store.completion_triggers(conn, [r["id"] for r in rows])
        return jobs_pb2.ListJobsResponse(
            jobs=[convert.job(r, triggers[r["id"]]) for r in rows], next_page_token=next_token
        )

    async def UpdateJob(self, request: jobs_pb2.UpdateJobRequest, context: Context) -> jobs_pb2.Job:
        account_id = current_account()
        job_id = JobId(positive_id(request.job_id, "job_id"))
        spec = job_spec(request)
        async with self._store.transaction() as conn:
            current = await self._existing(conn, account_id, job_id, for_update=True)
            if request.expected_version and request.expected_version != current["version"]:
                raise FailedPrecondition(
                    f"job {job_id} is at version {current['version']}, not {request.expected_version}: "
                    "read it again and reapply the change"
                )
            await self._check_environment(conn, account_id, spec)
            await self._check_deferral(conn, account_id, job_id, spec)
            await self._check_completion_triggers(conn, account_id, job_id, spec)
            row = await self._store.update_job(conn, account_id, job_id, spec)
            await self._store.replace_completion_triggers(conn, job_id, spec)
            out = await self._job(conn, row)
        log.info("job updated", extra={"account_id": account_id, "job_id": job_id, "version": row["version"]})
        return out

    async def DeleteJob(self, request: jobs_pb2.DeleteJobRequest, context: Context) -> jobs_pb2.DeleteJobResponse:
        account_id = current_account()
        job_id = JobId(positive_id(request.job_id, "job_id"))
        async with self._store.transaction() as conn:
            if not await self._store.delete_job(conn, account_id, job_id):
                raise NotFound(f"job {job_id} not found")
            cancelled = await self._store.cancel_queued_runs_of_job(
                conn, job_id, f"Cancelled: job {job_id} was deleted before this run started."
            )
            await self._store.drop_completion_triggers_on(conn, job_id)
        log.info("job deleted", extra={"account_id": account_id, "job_id": job_id, "cancelled_runs": cancelled})
        if cancelled:
            instruments.cancellations.add(cancelled, {"reason": "job_deleted"})
        return jobs_pb2.DeleteJobResponse()

    async def PauseJob(self, request: jobs_pb2.PauseJobRequest, context: Context) -> jobs_pb2.Job:
        return await self._set_paused(request.job_id, paused=True)

    async def UnpauseJob(self, request: jobs_pb2.UnpauseJobRequest, context: Context) -> jobs_pb2.Job:
        return await self._set_paused(request.job_id, paused=False)

    async def _set_paused(self, job_id: int, *, paused: bool) -> jobs_pb2.Job:
        row = await set_paused(self._store, current_account(), job_id, paused=paused)
        async with self._store.connection() as conn:
            return await self._job(conn, row)

    async def _existing(self, conn: Connection, account_id: AccountId, job_id: int, *, for_update: bool = False) -> Row:
        return await existing_job(self._store, conn, account_id, job_id, for_update=for_update)

    async def _job(self, conn: Connection, row: Row) -> jobs_pb2.Job:
        triggers = await self._store.completion_triggers(conn, [row["id"]])
        return convert.job(row, triggers[row["id"]])

    async def _check_environment(self, conn: Connection, account_id: AccountId, spec: JobSpec) -> None:
        if (
            spec.environment_id is not None
            and await self._store.get_environment(conn, account_id, spec.environment_id) is None
        ):
            raise InvalidArgument("settings.environment_id", f"environment {spec.environment_id} not found")

    async def _check_deferral(
        self, conn: Connection, account_id: AccountId, job_id: JobId | None, spec: JobSpec
    ) -> None:
        """A job defers to another live job of the account, or to one of its environments; a dbt job."""
        deferred = spec.defer_to_job_id or spec.defer_to_environment_id
        if deferred and spec.environment_id is None:
            raise InvalidArgument("settings.environment_id", "a job that defers runs dbt: give it an environment")
        if spec.defer_to_job_id is not None:
            if spec.defer_to_job_id == job_id:
                raise InvalidArgument("settings.defer_to_job_id", "a job cannot defer to itself")
            if not await self._store.live_job_ids(conn, account_id, [spec.defer_to_job_id]):
                raise InvalidArgument("settings.defer_to_job_id", f"job {spec.defer_to_job_id} not found")
        if spec.defer_to_environment_id is not None and (
            await self._store.get_environment(conn, account_id, spec.defer_to_environment_id) is None
        ):
            raise InvalidArgument(
                "settings.defer_to_environment_id", f"environment {spec.defer_to_environment_id} not found"
            )

    async def _check_completion_triggers(
        self, conn: Connection, account_id: AccountId, job_id: JobId | None, spec: JobSpec
    ) -> None:
        """Upstream jobs must be live jobs of the same account, other than the job, without loops."""
        upstream_ids = [t.upstream_job_id for t in spec.on_completion]
        if not upstream_ids:
            return
        live = await self._store.live_job_ids(conn, account_id, list(upstream_ids))
        for i, upstream in enumerate(upstream_ids):
            field = f"triggers.on_completion[{i}].upstream_job_id"
            if upstream == job_id:
                raise InvalidArgument(field, "a job cannot run on its own completion")
            if upstream not in live:
                raise InvalidArgument(field, f"job {upstream} not found")
        if job_id is not None and await self._store.completion_creates_cycle(conn, job_id, list(upstream_ids)):
            raise InvalidArgument(
                "triggers.on_completion", "these triggers would make jobs trigger each other in a loop"
            )
