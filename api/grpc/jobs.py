"""JobService: create, read, list, replace and delete job definitions (creating and replacing in
``api.job_definitions``, shared with the web pages)."""

from __future__ import annotations

import logging

import grpc

from api.grpc import convert, paging
from api.grpc.auth import current_account, current_caller
from api.job_definitions import create_job, delete_job, update_job
from api.lookup import existing_job
from api.pausing import set_paused
from api.rows import Job
from api.store import Store
from api.validation import checked_idempotency_key, job_spec, positive_id
from runplane.adapters.db import Connection
from runplane.basics.types import AccountId, JobId
from runplane.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[object, object]


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, store: Store, *, max_page_size: int) -> None:
        self._store = store
        self._max_page_size = max_page_size

    async def CreateJob(self, request: jobs_pb2.CreateJobRequest, context: Context) -> jobs_pb2.Job:
        spec = job_spec(request)
        key = checked_idempotency_key(request.idempotency_key, "idempotency_key")
        row = await create_job(self._store, current_account(), spec, create_key=key)
        async with self._store.connection() as conn:
            return await self._job(conn, row)

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
            triggers = await self._store.completion_triggers(conn, [r.id for r in rows])
        return jobs_pb2.ListJobsResponse(
            jobs=[convert.job(r, triggers[r.id]) for r in rows], next_page_token=next_token
        )

    async def UpdateJob(self, request: jobs_pb2.UpdateJobRequest, context: Context) -> jobs_pb2.Job:
        job_id = JobId(positive_id(request.job_id, "job_id"))
        spec = job_spec(request)
        row = await update_job(self._store, current_account(), job_id, spec, expected_version=request.expected_version)
        async with self._store.connection() as conn:
            return await self._job(conn, row)

    async def DeleteJob(self, request: jobs_pb2.DeleteJobRequest, context: Context) -> jobs_pb2.DeleteJobResponse:
        await delete_job(self._store, current_account(), request.job_id)
        return jobs_pb2.DeleteJobResponse()

    async def PauseJob(self, request: jobs_pb2.PauseJobRequest, context: Context) -> jobs_pb2.Job:
        return await self._set_paused(request.job_id, paused=True, note=request.note)

    async def UnpauseJob(self, request: jobs_pb2.UnpauseJobRequest, context: Context) -> jobs_pb2.Job:
        return await self._set_paused(request.job_id, paused=False)

    async def ListSkippedOccurrences(
        self, request: jobs_pb2.ListSkippedOccurrencesRequest, context: Context
    ) -> jobs_pb2.ListSkippedOccurrencesResponse:
        account_id = current_account()
        limit = paging.page(request.page_size, "", self._max_page_size, "skipped", account_id).limit
        async with self._store.connection() as conn:
            job = await self._existing(conn, account_id, request.job_id)
            rows = await self._store.skipped_occurrences(conn, account_id, JobId(job.id), limit=limit)
        return jobs_pb2.ListSkippedOccurrencesResponse(occurrences=[convert.skipped_occurrence(r) for r in rows])

    async def _set_paused(self, job_id: int, *, paused: bool, note: str = "") -> jobs_pb2.Job:
        row = await set_paused(self._store, current_account(), job_id, paused=paused, who=current_caller(), note=note)
        async with self._store.connection() as conn:
            return await self._job(conn, row)

    async def _existing(self, conn: Connection, account_id: AccountId, job_id: int, *, for_update: bool = False) -> Job:
        return await existing_job(self._store, conn, account_id, job_id, for_update=for_update)

    async def _job(self, conn: Connection, row: Job) -> jobs_pb2.Job:
        triggers = await self._store.completion_triggers(conn, [row.id])
        return convert.job(row, triggers[row.id])
