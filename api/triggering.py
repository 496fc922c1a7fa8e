"""Triggering a run of a job: the one home of what a trigger checks and writes.

gRPC's ``TriggerRun``, the REST ``.../jobs/{id}/run/`` and ``.../rerun/``, and Git webhooks all queue
runs through :func:`trigger_run`; each turns its own request into a :class:`TriggerSpec` first.

A trigger may ask to reattach (``TriggerSpec.reattach``): when a run of the job with the same overrides
is queued, starting or running, the answer is that run (:class:`Triggered` says it reattached) and
nothing is queued. The job's row lock orders it against other triggers of the job, so two reattaching
triggers at once make one run.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from api.idempotency import check_same_request, fingerprint
from api.pickup_publisher import PickupPublisher
from api.rows import Job, Run, RunStep
from api.store import Store
from api.validation import RunOverridesSpec, TriggerSpec, checked_overrides
from runplane.adapters import tracing
from runplane.adapters.db import Connection
from runplane.basics.errors import FailedPrecondition, InvalidArgument, NotFound
from runplane.basics.types import AccountId, JobId, JobType, Trigger, ci_schema, takes_run_slot
from runplane.runs.pull_requests import record_pull_request_schema, supersede_older_ci_runs, superseded_message

log = logging.getLogger(__name__)


def client_idempotency_key(account_id: AccountId, key: str) -> str:
    """A client's key, namespaced by account so that two accounts' keys never collide."""
    return f"api:{account_id}:{key}"


def generated_idempotency_key() -> str:
    return f"api-once:{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Triggered:
    """What a trigger answers: the run with its steps, and whether it is a run already in progress
    that a reattaching trigger was given instead of a new one."""

    run: Run
    steps: list[RunStep]
    reattached: bool = False


async def trigger_run(
    store: Store,
    pickups: PickupPublisher,
    account_id: AccountId,
    spec: TriggerSpec,
    *,
    parent_run_id: int | None = None,
) -> tuple[Run, list[RunStep]]:
    """Queue a run of ``spec.job_id`` (or return the run its idempotency key already made), with its steps.

    A job of another account is NotFound, exactly like a missing one. A client's key replays its
    first run only for the same request (``api.idempotency``).
    """
    triggered = await trigger_or_reattach(store, pickups, account_id, spec, parent_run_id=parent_run_id)
    return triggered.run, triggered.steps


async def trigger_or_reattach(
    store: Store,
    pickups: PickupPublisher,
    account_id: AccountId,
    spec: TriggerSpec,
    *,
    parent_run_id: int | None = None,
) -> Triggered:
    """:func:`trigger_run`, saying whether the answer reattached to a run in progress."""
    key = client_idempotency_key(account_id, spec.client_key) if spec.client_key else generated_idempotency_key()
    async with store.transaction() as conn:
        # The row lock orders triggers of one job against each other and against DeleteJob.
        job = await store.get_job(conn, account_id, spec.job_id, for_update=True)
        if job is None:
            raise NotFound(f"job {spec.job_id} not found")
        if spec.client_key and (existing := await store.run_by_idempotency_key(conn, key)):
            return Triggered(*await _replayed(store, conn, existing, spec))
        await _check_trigger(store, conn, job, spec)
        if spec.reattach and (running := await store.run_in_progress_like(conn, job.id, spec.overrides.as_json())):
            log.info(
                "trigger reattached",
                extra={"account_id": account_id, "job_id": job.id, "run_id": running.id},
            )
            return Triggered(running, (await store.run_steps(conn, [running.id]))[running.id], reattached=True)
        row = await store.insert_run(
            conn, **_run_params(job, spec, key, parent_run_id), trigger_fingerprint=trigger_fingerprint(spec)
        )
        if row is None:  # a concurrent trigger with the same key won
            existing = await store.run_by_idempotency_key(conn, key)
            assert existing is not None
            return Triggered(*await _replayed(store, conn, existing, spec))
        if row.job_type == JobType.CI.value and row.pull_request_number:
            await _take_over_pull_request(conn, job, row, row.pull_request_number)
        steps = (await store.run_steps(conn, [row.id]))[row.id]
    log.info(
        "run queued",
        extra={"account_id": account_id, "job_id": spec.job_id, "run_id": row.id, "trigger": spec.trigger.value},
    )
    await pickups.publish(account_id)  # counted where it is sent
    return Triggered(row, steps)


def rerun_spec(job_id: int, source: Run | None, trigger: Trigger) -> TriggerSpec:
    """A rerun of ``job_id``: with the overrides of the run it reruns (``source``), or the job as saved."""
    raw = RunOverridesSpec(**(source.overrides if source else {}))
    cause = f"Rerun of run {source.id}" if source else "Rerun"
    return TriggerSpec(JobId(job_id), trigger, cause, None, checked_overrides(raw, lambda name: name))


def trigger_fingerprint(spec: TriggerSpec) -> str | None:
    """The digest a keyed trigger keeps, to tell its retry from another trigger reusing the key.

    ``run_at`` is left out: a retry may arrive after the time it asks for, which then reads as "now".
    """
    if not spec.client_key or not spec.same_request_on_retry:
        return None
    return fingerprint(
        {
            "job_id": spec.job_id,
            "trigger": spec.trigger.value,
            "cause": spec.cause,
            "overrides": spec.overrides.as_json(),
        }
    )


async def _replayed(store: Store, conn: Connection, existing: Run, spec: TriggerSpec) -> tuple[Run, list[RunStep]]:
    """The run an idempotency key already made; the key must have been used for this job and request."""
    if existing.job_id != spec.job_id:
        raise FailedPrecondition(f"idempotency_key {spec.client_key!r} was already used for job {existing.job_id}")
    made = f"trigger run {existing.id}"
    check_same_request(existing.trigger_fingerprint, trigger_fingerprint(spec), made=made, request="request")
    return existing, (await store.run_steps(conn, [existing.id]))[existing.id]


async def _check_trigger(store: Store, conn: Connection, job: Job, spec: TriggerSpec) -> None:
    """What a trigger needs of the job: the right type, a pull request, an active job."""
    job_type = JobType(job.job_type)
    pull_request = spec.overrides.pull_request_number
    if spec.trigger is Trigger.CI and job_type is not JobType.CI:
        raise InvalidArgument("trigger", f"a ci trigger needs a ci job; job {job.id} is a {job_type} job")
    if spec.trigger is Trigger.MERGE and job_type is not JobType.MERGE:
        raise InvalidArgument("trigger", f"a merge trigger needs a merge job; job {job.id} is a {job_type} job")
    if job_type is JobType.CI and not pull_request:
        raise InvalidArgument("overrides.pull_request_number", "a ci run needs the number of its pull request")
    if job.deactivated_at is None:
        return
    if spec.trigger is Trigger.MANUAL:
        # "Run now" on a deactivated job reactivates it, as saving it does.
        await store.reactivate_job(conn, JobId(job.id))
        log.info("job reactivated by run now", extra={"account_id": job.account_id, "job_id": job.id})
        return
    raise FailedPrecondition(
        f"job {job.id} is deactivated ({job.deactivation_reason or 'no reason recorded'}); "
        "save the job or run it now (trigger manual) to reactivate it"
    )


async def _take_over_pull_request(conn: Connection, job: Job, run: Run, number: int) -> None:
    """A new CI run of pull request ``number`` supersedes its older ones and keeps the schema in use."""
    sha = str((run.overrides or {}).get("git_sha") or "")
    await supersede_older_ci_runs(
        conn,
        job_id=run.job_id,
        pull_request_number=number,
        run_id=run.id,
        message=superseded_message(run.id, number, sha),
    )
    if job.environment_id is not None:  # plain commands build no schema
        await record_pull_request_schema(
            conn,
            account_id=run.account_id,
            job_id=run.job_id,
            pull_request_number=number,
            schema=run.schema_name,
            run_id=run.id,
        )


def _run_params(job: Job, spec: TriggerSpec, key: str, parent_run_id: int | None) -> dict[str, object]:
    job_type = JobType(job.job_type)
    pull_request = spec.overrides.pull_request_number
    schema = spec.overrides.schema or ""
    if job_type is JobType.CI and pull_request:
        # A CI run builds in its pull request's schema, whatever it asks: never in production's.
        schema = ci_schema(job.id, pull_request)
    return {
        "account_id": job.account_id,
        "job_id": job.id,
        "job_type": job_type.value,
        "trigger": spec.trigger.value,
        "cause": spec.cause,
        "idempotency_key": key,
        "priority": job.priority,
        "takes_slot": takes_run_slot(job_type),
        "overrides": spec.overrides.as_json(),
        "pull_request_number": pull_request,
        "schema_name": schema,
        "trace_parent": tracing.current_traceparent(),
        "parent_run_id": parent_run_id,
        # Run now and API triggers still run a paused job; the run says it was paused.
        "job_paused": job.paused_at is not None,
        "run_at": spec.run_at,
    }
