"""Rerunning a failed run from its failed step: the one home of that rule, for gRPC's ``RerunRun``,
REST's ``.../runs/{id}/retry/`` and ``.../jobs/{id}/rerun/`` (dbt Cloud's "Rerun from failure").

The new run links to the failed one (``parent_run_id``), is triggered ``retry`` (dbt Cloud's run
reason category "retry") and keeps the failed run's overrides. Its steps are the failed command and
the ones after it, all the job's commands when a setup step failed (every run has its own setup; it
is no command to rerun). The job options' optional steps are left to the job: freshness is not run
again, docs are generated again when the job or the run asks. A failed dbt step that ``dbt retry``
supports (dbt >= 1.6) becomes ``dbt retry --state <dir>``, with the failed run's
``run_results.json`` of that step fetched into ``<dir>`` before the steps (``RunSpec.state_files``):
only the nodes that failed or were skipped run again. Any other step runs again as it was.
"""

from __future__ import annotations

import shlex
from dataclasses import fields, replace

from api.lookup import existing_job, existing_run
from api.pickup_publisher import PickupPublisher
from api.rows import Run, RunStep
from api.store import Store
from api.triggering import client_idempotency_key, rerun_spec, trigger_run
from api.validation import RunOverridesSpec, TriggerSpec
from runplane.basics.errors import FailedPrecondition
from runplane.basics.types import AccountId, JobId, RunStatus, Trigger

RETRY_STATE_DIR = ".runplane/retry-state"
RUN_RESULTS = "target/run_results.json"
# The dbt commands that write run_results.json and that `dbt retry` can resume.
RETRYABLE = {"build", "run", "test", "seed", "snapshot", "compile", "clone", "run-operation", "show"}
RETRYABLE_PAIRS = {("docs", "generate"), ("source", "freshness")}
# dbt Cloud's reason a run cannot be retried: runplane reruns any failed run from its failure.
NOT_FAILED = "RETRY_NOT_FAILED_RUN"


def retry_refusal(run: Run) -> str | None:
    """Why ``run`` cannot be rerun from its failure, in dbt Cloud's words; None when it can."""
    return None if run.status == RunStatus.ERROR else NOT_FAILED


def retryable_with_dbt_retry(command: str) -> bool:
    """Whether ``command`` is a dbt command whose failure ``dbt retry`` resumes."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if len(words) < 2 or words[0] != "dbt":
        return False
    sub = [w for w in words[1:] if not w.startswith("-")]
    return bool(sub) and (sub[0] in RETRYABLE or tuple(sub[:2]) in RETRYABLE_PAIRS)


def resume_from(steps: list[RunStep]) -> int:
    """The command to start again from: the first required one that did not succeed; the first
    command when a setup step failed (setup runs in every run, it is no command to rerun) or none
    did."""
    commands = [s for s in steps if not s.setup]
    failed = next((s for s in steps if not s.optional and s.status != RunStatus.SUCCESS), None)
    start = failed if failed is not None and not failed.setup else (commands[0] if commands else None)
    return int(start.step_index) if start is not None else 0


async def rerun_from_failure(
    store: Store, pickups: PickupPublisher, account_id: AccountId, run_id: int, client_key: str | None = None
) -> Run:
    """Queue the rerun of the failed run ``run_id`` from its failed step; the new run (the one
    ``client_key`` already made, when a client retries with its key)."""
    async with store.connection() as conn:
        failed = await existing_run(store, conn, account_id, run_id)
        if retry_refusal(failed) is not None:
            raise FailedPrecondition(
                f"run {run_id} did not fail ({RunStatus(failed.status).name.lower()}): only a failed run is rerun "
                "from its failure"
            )
        steps = (await store.run_steps(conn, [run_id]))[run_id]
        artifacts = {(r.path, r.step_index) for r in await store.list_artifacts(conn, failed.id)}
    start = resume_from(steps)
    commands = [str(s.command) for s in steps if not s.optional and not s.setup and s.step_index >= start]
    state_files: list[dict[str, object]] = []
    if commands and retryable_with_dbt_retry(commands[0]) and (RUN_RESULTS, start) in artifacts:
        commands[0] = f"dbt retry --state {RETRY_STATE_DIR}"
        state_files.append(
            {
                "source_run_id": run_id,
                "step_index": start,
                "path": RUN_RESULTS,
                "dest": f"{RETRY_STATE_DIR}/run_results.json",
            }
        )
    kept = {f.name for f in fields(RunOverridesSpec)} - {"resume", "state_files"}
    overrides = replace(
        RunOverridesSpec(**{k: v for k, v in (failed.overrides or {}).items() if k in kept}),
        steps=commands or None,
        resume=True,
        state_files=state_files or None,
    )
    spec = TriggerSpec(
        JobId(failed.job_id),
        Trigger.RETRY,
        f"Rerun of run {run_id} from step {start + 1}",
        client_key,
        overrides,
        same_request_on_retry=False,  # a retry with the key is answered by rerun_job before it gets here
    )
    row, _ = await trigger_run(store, pickups, account_id, spec, parent_run_id=run_id)
    return row


async def rerun_job(
    store: Store, pickups: PickupPublisher, account_id: AccountId, job_id: int, client_key: str | None = None
) -> Run:
    """dbt Cloud's "rerun the job": after an error its latest run again from its failure, else a new run.

    A client's key makes the retry of a request return the run the first one made, whatever the
    job's latest run is by then (that run, not yet failed, would make the retry a new run).
    """
    async with store.connection() as conn:
        await existing_job(store, conn, account_id, job_id)
        if client_key:
            made = await store.run_by_idempotency_key(conn, client_idempotency_key(account_id, client_key))
            if made is not None:
                if made.job_id != job_id:
                    raise FailedPrecondition(f"idempotency key already used for job {made.job_id}: use a new key")
                return made
        latest = await store.latest_run_of_job(conn, account_id, job_id)
    if latest is not None and retry_refusal(latest) is None:
        return await rerun_from_failure(store, pickups, account_id, latest.id, client_key)
    spec = replace(rerun_spec(job_id, None, Trigger.API), client_key=client_key, same_request_on_retry=False)
    row, _ = await trigger_run(store, pickups, account_id, spec)
    return row
