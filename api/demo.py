"""The demo of ``make run``: an account, a token and a few jobs, and with dbt installed a dbt project,
its environment and dbt jobs. ``runplane.commands.demo`` says where the project and its warehouse are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.admin import issue_token
from api.projects_validation import EnvironmentSpec, ProjectSpec
from api.store import Store
from api.validation import CompletionTriggerSpec, JobSpec, Variables
from runplane.adapters.db import Connection, open_pool
from runplane.basics.secrets import SecretBox, box_from_settings
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, JobId, JobType, RunStatus

DEMO_RUN_SLOTS = 2
DEMO_MEMORY_MB = 1024

# The demo jobs, by name; "run-now" comes first because the banner triggers it.
DEMO_JOBS = [
    JobSpec(
        name="run-now",
        job_type=JobType.DEPLOY,
        steps=[
            "echo start",
            "mkdir -p target && python3 -c \"import json; json.dump({'nodes': {'model.demo.orders': {}}}, "
            "open('target/manifest.json', 'w'))\"",
            "echo done",
        ],
    ),
    JobSpec(
        name="hourly-models",
        job_type=JobType.DEPLOY,
        steps=[
            "echo building models",
            'mkdir -p target && echo \'{"results": [{"status": "success"}]}\' > target/run_results.json',
        ],
        # Every minute, so whoever runs the demo sees the schedule fire.
        cron="* * * * *",
        timezone="UTC",
    ),
    JobSpec(
        name="pr-checks",
        job_type=JobType.CI,
        steps=["echo checking the pull request"],
        on_pull_request=True,
    ),
]


async def seed_demo(settings: Settings, name: str, project: DemoProject | None = None) -> tuple[int, str, list[int]]:
    """The demo account (reused by name), a fresh token and the demo jobs (made once), with the dbt
    project, its environment and dbt jobs when ``project`` is given."""
    pool = await open_pool(settings.database_url, max_size=1, name="admin")
    try:
        store = Store(pool)
        async with store.transaction() as conn:
            account_id = await store.account_by_name(conn, name)
            if account_id is None:
                account_id = await store.insert_account(
                    conn, name=name, run_slots=DEMO_RUN_SLOTS, memory_mb=DEMO_MEMORY_MB
                )
            token = await issue_token(store, conn, account_id)
            job_ids: list[int] = []
            for spec in DEMO_JOBS:
                job_ids.append(await _job_once(store, conn, account_id, spec))
            if project is not None:
                job_ids += await _seed_dbt_demo(store, conn, account_id, project, box_from_settings(settings))
    finally:
        await pool.close()
    return account_id, token, job_ids


@dataclass(frozen=True)
class DemoProject:
    """Where the demo's dbt project and its warehouse are (made by ``runplane.commands.demo``)."""

    repository_url: str
    warehouse: dict[str, str]  # postgres profile fields: host, port, user, dbname
    dbt_version: str
    warehouse_secrets: dict[str, str] = field(default_factory=dict)  # the password, in clear (encrypted here)


DEMO_PROJECT_NAME = "jaffle_shop"
DEMO_ENVIRONMENT_NAME = "production"


def demo_dbt_jobs(environment_id: int, build_job_id: int | None) -> list[JobSpec]:
    """The demo's dbt jobs: a scheduled build, a CI job, and one chained to the build's success."""
    jobs = [
        JobSpec(
            name="jaffle-build",
            job_type=JobType.DEPLOY,
            steps=["dbt build", "dbt docs generate", "dbt source freshness"],
            cron="*/10 * * * *",
            timezone="UTC",
            environment_id=environment_id,
            threads=0,
        ),
        JobSpec(
            name="jaffle-ci",
            job_type=JobType.CI,
            steps=["dbt build"],
            on_pull_request=True,
            environment_id=environment_id,
            threads=0,
        ),
    ]
    if build_job_id is not None:
        jobs.append(
            JobSpec(
                name="jaffle-after-build",
                job_type=JobType.DEPLOY,
                steps=["dbt test --select customers orders"],
                on_completion=[CompletionTriggerSpec(JobId(build_job_id), (RunStatus.SUCCESS,))],
                environment_id=environment_id,
                threads=0,
            )
        )
    return jobs


async def _seed_dbt_demo(
    store: Store, conn: Connection, account_id: AccountId, project: DemoProject, box: SecretBox
) -> list[int]:
    """The demo's project, environment and dbt jobs, each made once (found by name after that); the
    environment's warehouse is set again each time (where the demo's warehouse is now)."""
    projects = [p for p in await store.list_projects(conn, account_id) if p.name == DEMO_PROJECT_NAME]
    if projects:
        project_id = projects[0].id
    else:
        project_spec = ProjectSpec(DEMO_PROJECT_NAME, project.repository_url, "", "none", "")
        project_id = (await store.insert_project(conn, account_id, project_spec, "")).id
    environments = [
        e for e in await store.list_environments(conn, account_id, project_id) if e.name == DEMO_ENVIRONMENT_NAME
    ]
    environment = EnvironmentSpec(
        project_id=project_id,
        name=DEMO_ENVIRONMENT_NAME,
        environment_type="deployment",
        dbt_version=project.dbt_version,
        git_branch="main",
        adapter_type="postgres",
        connection=project.warehouse,
        connection_secrets=project.warehouse_secrets,
        target_name="prod",
        schema="analytics",
        threads=4,
        variables=Variables(plain={"DBT_DEMO": "runplane"}, secrets={}, unset_secrets=[]),
    )
    secrets = {name: box.encrypt(value) for name, value in project.warehouse_secrets.items()}
    if environments:
        environment_id = environments[0].id
        await store.update_environment(conn, account_id, environment_id, environment, secrets)
    else:
        environment_id = (await store.insert_environment(conn, account_id, environment, secrets)).id
    job_ids: list[int] = []
    build_job_id: int | None = None
    for spec in demo_dbt_jobs(environment_id, None)[:1]:
        build_job_id = await _job_once(store, conn, account_id, spec)
        job_ids.append(build_job_id)
    for spec in demo_dbt_jobs(environment_id, build_job_id)[1:]:
        job_id = await _job_once(store, conn, account_id, spec)
        await store.replace_completion_triggers(conn, JobId(job_id), spec)
        job_ids.append(job_id)
    return job_ids


async def _job_once(store: Store, conn: Connection, account_id: AccountId, spec: JobSpec) -> int:
    job = await store.job_by_name(conn, account_id, spec.name)
    if job is None:
        job, _ = await store.insert_job(conn, account_id, spec)
    return int(job.id)
