"""What a runner is told about its run (``runplane.v1.RunSpec``), made from the claimed run's row.

Run overrides are applied here, once, so the runner never needs the rules; secret environment
variables are decrypted here, for this runner alone, and listed in ``masked_values`` so the runner
replaces them with ``*****`` in everything it uploads. A job with an environment also gets its
``DbtContext`` (``runplane.dbt.context``), its environment's secret variables, connection secrets
and git credential decrypted here and masked the same way.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runplane.adapters.db import Connection, fetch_one
from runplane.basics.run_overrides import run_override as override
from runplane.basics.run_overrides import run_timeout
from runplane.basics.secrets import SecretBox, SecretKeyError
from runplane.basics.types import JOB_TYPE_TO_PROTO, TRIGGER_TO_PROTO, AccountId, JobId, JobType, RunId, Trigger
from runplane.dbt.context import ContextRow, DbtContext, context_from_row, to_proto
from runplane.sql import load_queries
from runplane.v1 import runner_pb2

Q = load_queries("api.runner")

SOURCE_FRESHNESS_STEP = "dbt source freshness"
GENERATE_DOCS_STEP = "dbt docs generate"
# A dbt run's setup steps, named as dbt Cloud names them; the runner's prep runs as these steps.
CLONE_STEP = "Clone git repository"
PROFILE_STEP = "Create profile from connection {connection}"
DEPS_STEP = "Invoke dbt deps"
DEFER_STATE_DIR = ".runplane/defer-state"
DEFER_MANIFEST = f"{DEFER_STATE_DIR}/manifest.json"
# dbt commands that take --defer --state, and those of them that take a node selection.
DEFERRABLE = {"build", "run", "test", "seed", "snapshot", "compile", "clone", "show", "ls", "list"}
SELECTING = DEFERRABLE - {"show"}


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """The ``claimed_run`` row: the run with its job's definition and its account's memory limit.
    ``secret_environment`` holds ciphertext."""

    id: RunId
    account_id: AccountId
    job_id: JobId
    job_type: str
    trigger: str
    cause: str
    trace_parent: str
    overrides: dict[str, Any]
    schema_name: str
    pull_request_number: int | None
    cancel_requested_at: datetime | None
    steps: list[str]
    environment: dict[str, str]
    secret_environment: dict[str, str]
    threads: int
    timeout_seconds: int
    target_name: str
    git_branch: str
    generate_docs: bool
    run_source_freshness: bool
    run_only_modified: bool
    memory_mb: int
    cpu_weight: int | None
    cpu_max: float | None


async def claimed_run(conn: Connection, params: dict[str, Any]) -> ClaimedRun | None:
    """The run ``params`` name (``run_id``, ``token_hash``, ``lease_id``) when that lease holds it."""
    return await fetch_one(conn, Q["claimed_run"], params, ClaimedRun)


async def load_dbt_context(conn: Connection, run_id: int, decrypt: Callable[[str], str]) -> DbtContext | None:
    """The DbtContext of a run, or None when its job has no environment (plain commands)."""
    row = await fetch_one(conn, Q["dbt_context"], {"run_id": run_id}, ContextRow)
    return None if row is None else context_from_row(row, decrypt)


def build_run_spec(
    row: ClaimedRun,
    *,
    lease_id: str,
    lease_seconds: float,
    heartbeat_interval: float,
    box: SecretBox | None,
    dbt: DbtContext | None = None,
) -> runner_pb2.RunSpec:
    """The spec of a claimed run. ``box`` may be None only when the job has no secret. ``dbt``: the
    run's context when its job has an environment, secrets already decrypted."""
    overrides = row.overrides if isinstance(row.overrides, dict) else {}
    commands, optional = job_steps(row, overrides, dbt)
    setup = setup_steps(dbt)
    steps = [*setup, *commands]
    environment = {str(k): str(v) for k, v in row.environment.items()}
    secrets = decrypt_secret_environment(row.secret_environment, box)
    environment.update(secrets)
    masked = set(secrets.values()) | set(dbt.secrets() if dbt is not None else ())
    spec = runner_pb2.RunSpec(
        run_id=row.id,
        account_id=row.account_id,
        job_id=row.job_id,
        steps=steps,
        environment=environment,
        masked_values=sorted(masked),
        threads=int(override(overrides, "threads") or row.threads),
        schema=str(override(overrides, "schema") or row.schema_name or ""),
        target_name=str(override(overrides, "target_name") or row.target_name or ""),
        git_branch=str(override(overrides, "git_branch") or row.git_branch or ""),
        pull_request_number=int(row.pull_request_number or 0),
        cause=row.cause,
        timeout_seconds=run_timeout(overrides, row.timeout_seconds),
        memory_mb=row.memory_mb,
        cpu_weight=row.cpu_weight or 0,
        cpu_max=row.cpu_max or 0.0,
        cancel_requested=row.cancel_requested_at is not None,
        trace_parent=row.trace_parent,
        lease_id=lease_id,
        lease_seconds=lease_seconds,
        heartbeat_interval=heartbeat_interval,
        job_type=JOB_TYPE_TO_PROTO[JobType(row.job_type)],
        trigger=TRIGGER_TO_PROTO[Trigger(row.trigger)],
        optional_steps=[len(setup) + i for i in optional],
        setup_steps=len(setup),
        state_files=[runner_pb2.StateFile(**f) for f in overrides.get("state_files") or []],
    )
    if dbt is not None:
        spec.dbt.CopyFrom(to_proto(dbt))
    return spec


def setup_steps(dbt: DbtContext | None) -> list[str]:
    """The setup steps listed before the job's commands: checkout, profile and dbt packages for a
    job with an environment (run even when ``dbt deps`` is skipped for the host's cache: its step
    then says so); none for plain commands, which check nothing out."""
    if dbt is None:
        return []
    return [CLONE_STEP, PROFILE_STEP.format(connection=dbt.adapter_type), DEPS_STEP]


def job_steps(row: ClaimedRun, overrides: dict[str, Any], dbt: DbtContext | None) -> tuple[list[str], list[int]]:
    """The job's commands with the job options around them, and the indexes of the optional ones
    among them.

    A dbt job's "run source freshness" adds ``dbt source freshness`` first and "generate docs" (the
    run's ``generate_docs`` override, else the job's) adds ``dbt docs generate`` last; neither one's
    failure fails the run. A schema drop run gets neither.
    """
    steps = [str(step) for step in override(overrides, "steps") or row.steps]
    if dbt is None or dbt.drop_schema:
        return steps, []
    if overrides.get("defer"):
        steps = [deferred_step(step, only_modified=row.run_only_modified) for step in steps]
    optional: list[int] = []
    if row.run_source_freshness and not overrides.get("resume"):
        steps.insert(0, SOURCE_FRESHNESS_STEP)
        optional.append(0)
    docs = overrides.get("generate_docs")
    if docs if docs is not None else row.generate_docs:
        steps.append(GENERATE_DOCS_STEP)
        optional.append(len(steps) - 1)
    return steps, optional


def deferred_step(command: str, *, only_modified: bool) -> str:
    """A dbt step with ``--defer --state`` (and, for Slim CI, ``--select state:modified+`` when it
    selects nothing itself); any other step as it is."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) < 2 or words[0] != "dbt" or words[1] not in DEFERRABLE or "--state" in words:
        return command
    extra = ["--defer", "--state", DEFER_STATE_DIR]
    selects = {"-s", "--select", "-m", "--models", "--selector"} & set(words)
    if only_modified and words[1] in SELECTING and not selects:
        extra += ["--select", "state:modified+"]
    return shlex.join([*words, *extra])


def decrypter(box: SecretBox | None) -> Callable[[str], str]:
    """Opens a stored secret; without keys configured, says so when a secret is there to open."""

    def decrypt(token: str) -> str:
        if box is None:
            raise SecretKeyError(
                "the run's environment or project has secrets but no RUNPLANE_SECRET_KEYS are configured"
            )
        return box.decrypt(token)

    return decrypt


def decrypt_secret_environment(stored: dict[str, Any], box: SecretBox | None) -> dict[str, str]:
    """Secret variables' plaintext from their stored ciphertext."""
    if not stored:
        return {}
    if box is None:
        raise SecretKeyError("the job has secrets but no RUNPLANE_SECRET_KEYS are configured")
    return {str(name): box.decrypt(str(token)) for name, token in stored.items()}
