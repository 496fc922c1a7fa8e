"""What a job or a run answer includes beside its own row: its environment, project and repository,
and a job's completion trigger, read once per request for every row of the answer."""

from __future__ import annotations

from dataclasses import dataclass

from api.rest import shapes
from api.rows import Environment, JobWithEnvironment, Project
from api.store import Store
from runplane.adapters.db import Connection
from runplane.basics.types import AccountId


@dataclass(frozen=True)
class Places:
    """An account's environments and projects by id (an account has few of them)."""

    environments: dict[int, Environment]
    projects: dict[int, Project]

    def environment(self, environment_id: int | None) -> shapes.Environment | None:
        row = self.environments.get(environment_id) if environment_id is not None else None
        return None if row is None else shapes.environment(row)

    def project_row(self, environment_id: int | None) -> Project | None:
        env = self.environments.get(environment_id) if environment_id is not None else None
        return None if env is None else self.projects.get(env.project_id)

    def project(self, environment_id: int | None) -> shapes.Project | None:
        row = self.project_row(environment_id)
        return None if row is None else shapes.project(row)

    def repository(self, environment_id: int | None) -> shapes.Repository | None:
        row = self.project_row(environment_id)
        return None if row is None else shapes.repository(row)


async def places(store: Store, conn: Connection, account_id: AccountId) -> Places:
    environments = await store.list_environments(conn, account_id, None)
    projects = await store.list_projects(conn, account_id)
    return Places({e.id: e for e in environments}, {p.id: p for p in projects})


async def jobs(
    store: Store, conn: Connection, account_id: AccountId, rows: list[JobWithEnvironment]
) -> list[shapes.Job]:
    """Job rows as dbt Cloud jobs, each with its environment, project and completion trigger."""
    if not rows:
        return []
    where = await places(store, conn, account_id)
    triggers = await store.completion_triggers(conn, [r.id for r in rows])
    upstream_ids = {int(t.upstream_job_id) for ts in triggers.values() for t in ts}
    projects_of_jobs: dict[int, int | None] = {}
    for upstream in upstream_ids:
        job = await store.get_job(conn, account_id, upstream)
        projects_of_jobs[upstream] = None if job is None else job.project_id
    return [
        shapes.job(
            row,
            environment_of=where.environment(row.environment_id),
            project_of=where.project(row.environment_id),
            completion=shapes.completion_conditions(triggers.get(row.id, []), projects_of_jobs),
        )
        for row in rows
    ]
