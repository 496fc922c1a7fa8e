"""Reading one of an account's projects, environments, jobs, runs or artifacts: another account's ids look
exactly like missing ones."""

from __future__ import annotations

from api.rows import ArtifactWithContent, Environment, JobWithEnvironment, Project, RunWithEnvironment
from api.store import Store
from api.validation import positive_id, text
from runplane.adapters.db import Connection
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.types import AccountId

MAX_ARTIFACT_PATH = 1024


async def existing_job(
    store: Store, conn: Connection, account_id: AccountId, job_id: int, *, for_update: bool = False
) -> JobWithEnvironment:
    positive_id(job_id, "job_id")
    row = await store.get_job(conn, account_id, job_id, for_update=for_update)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


async def existing_project(
    store: Store, conn: Connection, account_id: AccountId, project_id: int, *, for_update: bool = False
) -> Project:
    positive_id(project_id, "project_id")
    row = await store.get_project(conn, account_id, project_id, for_update=for_update)
    if row is None:
        raise NotFound(f"project {project_id} not found")
    return row


async def existing_environment(
    store: Store, conn: Connection, account_id: AccountId, environment_id: int, *, for_update: bool = False
) -> Environment:
    positive_id(environment_id, "environment_id")
    row = await store.get_environment(conn, account_id, environment_id, for_update=for_update)
    if row is None:
        raise NotFound(f"environment {environment_id} not found")
    return row


async def existing_run(store: Store, conn: Connection, account_id: AccountId, run_id: int) -> RunWithEnvironment:
    positive_id(run_id, "run_id")
    row = await store.get_run(conn, account_id, run_id)
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return row


async def run_artifact(
    store: Store, conn: Connection, account_id: AccountId, run_id: int, path: str, *, step_index: int | None = None
) -> ArtifactWithContent:
    """The artifact at ``path`` of the run (written by step ``step_index`` when given), with its content."""
    path = text(path, "path", max_length=MAX_ARTIFACT_PATH, required=True)
    run = (await existing_run(store, conn, account_id, run_id)).id
    if step_index is not None and step_index < 0:
        raise InvalidArgument("step_index", "must be a step index (0 is the first step), or unset for the last")
    row = await store.get_artifact(conn, run, path, step_index)
    if row is None:
        where = "" if step_index is None else f" from step {step_index + 1}"
        raise NotFound(f"run {run} has no artifact {path!r}{where}")
    return row
