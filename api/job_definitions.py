"""Saving and deleting a job definition: the one home of what a create or an update checks against the
account's other objects (its environment, the job it defers to, the jobs whose completion triggers
it) and writes. gRPC's ``JobService``, REST and the web pages' job form call these; each door turns
its own request into a :class:`JobSpec` first (``api.validation.job_spec``).

Every write that matters to scheduling bumps ``jobs.version``; the table's trigger then NOTIFYs
``runplane_jobs`` so the orchestrator hands the new definition to the job's queuer worker.
"""

from __future__ import annotations

import dataclasses
import logging

from api.idempotency import check_same_request, fingerprint
from api.lookup import existing_job
from api.rows import Job
from api.store import Store
from api.validation import JobSpec, positive_id
from runplane.adapters import instruments
from runplane.adapters.db import Connection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound, VersionConflict
from runplane.basics.types import AccountId, JobId

log = logging.getLogger(__name__)


async def create_job(store: Store, account_id: AccountId, spec: JobSpec, *, create_key: str | None = None) -> Job:
    """The new job; with a ``create_key`` used before, the job that key created.

    The key is the account's (the unique index is on ``jobs (account_id, create_key)``), so a retry,
    even one racing the first create, makes no second job. A retry must describe the same job
    (``api.idempotency``).
    """
    sent = create_fingerprint(spec) if create_key else None
    async with store.transaction() as conn:
        await _check_references(store, conn, account_id, None, spec)
        row, created = await store.insert_job(conn, account_id, spec, create_key=create_key, create_fingerprint=sent)
        if not created:
            check_same_request(row.create_fingerprint, sent, made=f"create job {row.id}", request="definition")
            if row.deleted_at is not None:
                raise FailedPrecondition(f"the job created with this idempotency key ({row.id}) was deleted")
            log.info("job create retried", extra={"account_id": account_id, "job_id": row.id})
            return row
        await store.replace_completion_triggers(conn, JobId(row.id), spec)
    log.info("job created", extra={"account_id": account_id, "job_id": row.id})
    return row


def create_fingerprint(spec: JobSpec) -> str:
    """A digest of a job definition, to tell a retried create from another create reusing its key.

    Secret values are left out (only their names count): the digest is stored beside the job.
    """
    fields = dataclasses.asdict(spec)
    fields["secrets"] = sorted(spec.secrets)
    return fingerprint(fields)


async def update_job(
    store: Store, account_id: AccountId, job_id: JobId, spec: JobSpec, *, expected_version: int = 0
) -> Job:
    """The job replaced by ``spec``; refused when ``expected_version`` (0: any) is not the stored one."""
    async with store.transaction() as conn:
        current = await existing_job(store, conn, account_id, job_id, for_update=True)
        if expected_version and expected_version != current.version:
            raise VersionConflict(f"job {job_id}", current.version, expected_version)
        await _check_references(store, conn, account_id, job_id, spec)
        row = await store.update_job(conn, account_id, job_id, spec)
        await store.replace_completion_triggers(conn, job_id, spec)
    log.info("job updated", extra={"account_id": account_id, "job_id": job_id, "version": row.version})
    return row


async def delete_job(store: Store, account_id: AccountId, job_id: int) -> None:
    """Deletes the job; its queued runs end cancelled and other jobs' completion triggers on it go."""
    job_id = JobId(positive_id(job_id, "job_id"))
    async with store.transaction() as conn:
        if not await store.delete_job(conn, account_id, job_id):
            raise NotFound(f"job {job_id} not found")
        cancelled = await store.cancel_queued_runs_of_job(
            conn, job_id, f"Cancelled: job {job_id} was deleted before this run started."
        )
        await store.drop_completion_triggers_on(conn, job_id)
    log.info("job deleted", extra={"account_id": account_id, "job_id": job_id, "cancelled_runs": cancelled})
    if cancelled:
        instruments.cancellations.add(cancelled, {"reason": "job_deleted"})


async def _check_references(
    store: Store, conn: Connection, account_id: AccountId, job_id: JobId | None, spec: JobSpec
) -> None:
    await _check_environment(store, conn, account_id, spec)
    await _check_deferral(store, conn, account_id, job_id, spec)
    await _check_completion_triggers(store, conn, account_id, job_id, spec)


async def _check_environment(store: Store, conn: Connection, account_id: AccountId, spec: JobSpec) -> None:
    if spec.environment_id is not None and await store.get_environment(conn, account_id, spec.environment_id) is None:
        raise InvalidArgument("settings.environment_id", f"environment {spec.environment_id} not found")


async def _check_deferral(
    store: Store, conn: Connection, account_id: AccountId, job_id: JobId | None, spec: JobSpec
) -> None:
    """A job defers to another live job of the account, or to one of its environments; a dbt job."""
    deferred = spec.defer_to_job_id or spec.defer_to_environment_id
    if deferred and spec.environment_id is None:
        raise InvalidArgument("settings.environment_id", "a job that defers runs dbt: give it an environment")
    if spec.defer_to_job_id is not None:
        if spec.defer_to_job_id == job_id:
            raise InvalidArgument("settings.defer_to_job_id", "a job cannot defer to itself")
        if not await store.live_job_ids(conn, account_id, [spec.defer_to_job_id]):
            raise InvalidArgument("settings.defer_to_job_id", f"job {spec.defer_to_job_id} not found")
    if spec.defer_to_environment_id is not None and (
        await store.get_environment(conn, account_id, spec.defer_to_environment_id) is None
    ):
        raise InvalidArgument(
            "settings.defer_to_environment_id", f"environment {spec.defer_to_environment_id} not found"
        )


async def _check_completion_triggers(
    store: Store, conn: Connection, account_id: AccountId, job_id: JobId | None, spec: JobSpec
) -> None:
    """Upstream jobs must be live jobs of the same account, other than the job, without loops."""
    upstream_ids = [t.upstream_job_id for t in spec.on_completion]
    if not upstream_ids:
        return
    live = await store.live_job_ids(conn, account_id, list(upstream_ids))
    for i, upstream in enumerate(upstream_ids):
        field = f"triggers.on_completion[{i}].upstream_job_id"
        if upstream == job_id:
            raise InvalidArgument(field, "a job cannot run on its own completion")
        if upstream not in live:
            raise InvalidArgument(field, f"job {upstream} not found")
    if job_id is not None and await store.completion_creates_cycle(conn, job_id, list(upstream_ids)):
        raise InvalidArgument("triggers.on_completion", "these triggers would make jobs trigger each other in a loop")
