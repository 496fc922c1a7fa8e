"""Real dbt runs: the example project as a git repository, the API in-process, the runner in-process.

dbt comes from ``.venv-dbt`` (``make .venv-dbt``); the warehouse is the test's own database on the
local Postgres, so every test builds into schemas nobody else sees.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import SecretStr

from api.admin import create_account
from api.process import RunningApi
from api.rest.server import RestServer
from client.cli import channel
from runner.service import run as run_runner
from runplane.basics.secrets import generate_key
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, projects_pb2, projects_pb2_grpc, runs_pb2, runs_pb2_grpc
from tests.support.api import serving_api, wants_rest
from tests.support.records import make_starting

ROOT = Path(__file__).resolve().parents[2]
# Outside the checkout, which may itself be under /tmp (a clone made with mktemp -d).
KEPT_WAREHOUSES = Path("/var/lib/runplane-test-warehouses")
EXAMPLE = ROOT / "examples" / "jaffle_shop"
DBT_BIN = ROOT / ".venv-dbt" / "bin"
DBT_VERSION = "1.10"

Db = psycopg.Connection[Any]
OK, ERROR = common_pb2.RUN_STATUS_SUCCESS, common_pb2.RUN_STATUS_ERROR


def dbt_run_marks(timeout: float) -> list[pytest.MarkDecorator]:
    """A module of real dbt runs: slow, needs dbt, ``timeout`` seconds a test, and the bus queues its
    services made are deleted after each test."""
    return [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(timeout), pytest.mark.usefixtures("_cleanup_bus")]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def make_repository(path: Path, source: Path = EXAMPLE) -> Path:
    """``source`` committed on branch main of a new repository at ``path``."""
    shutil.copytree(source, path)
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "add", "-A")
    commit(path, "the example project")
    return path


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=Test", "-c", "user.email=test@example.com", "commit", "--quiet", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="session")
def dbt_bin() -> Path:
    if not (DBT_BIN / "dbt").is_file():
        pytest.fail(f"dbt is not installed in {DBT_BIN}: run `make .venv-dbt`")
    return DBT_BIN


@pytest.fixture
def dbt_settings(settings: Settings, dbt_bin: Path, tmp_path: Path) -> Settings:
    runner = settings.runner.model_copy(
        update={
            "dbt_versions": {DBT_VERSION: str(dbt_bin)},
            "repository_cache": str(tmp_path / "repository-cache"),
            "interrupt_grace": 20.0,
            "cancel_grace": 5.0,
            "heartbeat_interval": 1.0,
            "local_warehouse_root": str(KEPT_WAREHOUSES),
        }
    )
    return settings.model_copy(update={"runner": runner, "secret_keys": SecretStr(generate_key())})


@pytest.fixture
def kept_directory() -> Iterator[Path]:
    """A directory of the test's own outside the temporary ones, where a run may keep a warehouse file
    (one under /tmp is refused: a run does not keep it)."""
    parent = KEPT_WAREHOUSES
    parent.mkdir(exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix="warehouse-", dir=parent))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
        with contextlib.suppress(OSError):
            parent.rmdir()  # the last test out takes it


@dataclass
class Client:
    account_id: int
    jobs: jobs_pb2_grpc.JobServiceAsyncStub
    runs: runs_pb2_grpc.RunServiceAsyncStub
    projects: projects_pb2_grpc.ProjectServiceAsyncStub


@pytest.fixture
async def api(request: pytest.FixtureRequest, dbt_settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    """gRPC and the runner API; REST for the tests that ask for ``rest_server``. No test here waits
    for an outgoing webhook, so the deliveries are not started."""
    async with serving_api(dbt_settings, rest=wants_rest(request), deliveries=False) as running:
        yield running


@pytest.fixture
def rest_server(api: RunningApi) -> RestServer:
    assert api.rest is not None, "the api fixture starts REST for the tests that ask for rest_server"
    return api.rest


@contextlib.asynccontextmanager
async def account_client(api: RunningApi, settings: Settings, name: str) -> AsyncIterator[Client]:
    """A new account (4 run slots, 4 GiB a run) and the API as it sees it, with its token."""
    account_id, token = await create_account(settings, name=name, run_slots=4, memory_mb=4096)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Client(
            account_id,
            jobs_pb2_grpc.JobServiceStub(chan),
            runs_pb2_grpc.RunServiceStub(chan),
            projects_pb2_grpc.ProjectServiceStub(chan),
        )


@pytest.fixture
async def client(api: RunningApi, dbt_settings: Settings) -> AsyncIterator[Client]:
    async with account_client(api, dbt_settings, "jaffle") as made:
        yield made


def warehouse(database_url: str, **changes: str) -> projects_pb2.Connection:
    """The test's own database as the warehouse (the local server trusts its clients)."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    fields = {
        "host": str(info.get("host", "127.0.0.1")),
        "port": str(info.get("port", "5432")),
        "user": str(info.get("user", "postgres")),
        "dbname": str(info["dbname"]),
    }
    fields.update(changes)
    return projects_pb2.Connection(adapter_type="postgres", fields=fields, secret_fields={"password": "pw-s3cret-xyz"})


async def environment(
    client: Client, database_url: str, repository: str, *, subdirectory: str = "", **fields: Any
) -> projects_pb2.Environment:
    project = await client.projects.CreateProject(
        projects_pb2.CreateProjectRequest(name="jaffle", repository_url=repository, subdirectory=subdirectory)
    )
    request = projects_pb2.CreateEnvironmentRequest(
        project_id=project.id,
        name="production",
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
        dbt_version=DBT_VERSION,
        git_branch="main",
        connection=fields.pop("connection", None) or warehouse(database_url),
        target_name="prod",
        schema="analytics",
        threads=4,
    )
    for name, value in fields.items():
        if isinstance(value, dict):  # a map field is filled, not assigned
            getattr(request, name).update(value)
        else:
            setattr(request, name, value)
    return await client.projects.CreateEnvironment(request)


async def dbt_job(client: Client, environment_id: int, steps: list[str], **settings: Any) -> jobs_pb2.Job:
    job_type = settings.pop("job_type", common_pb2.JOB_TYPE_DEPLOY)
    return await client.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(
            name=f"job {len(steps)}",
            job_type=job_type,
            steps=steps,
            settings=jobs_pb2.JobSettings(environment_id=environment_id, **settings),
        )
    )


async def run_job(
    client: Client, settings: Settings, db: psycopg.Connection[Any], job_id: int, **request: Any
) -> runs_pb2.Run:
    """Trigger a run, execute it with the real runner, and read it back."""
    run = await client.runs.TriggerRun(runs_pb2.TriggerRunRequest(job_id=job_id, **request))
    token = start_run(db, run.id)
    assert await run_runner(settings, run.id, token) == 0
    return await client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run.id))


def start_run(db: psycopg.Connection[Any], run_id: int) -> str:
    """What a dispatcher does before it launches the runner; the run's token."""
    return make_starting(db, run_id)


# A dbt run's setup steps (checkout, profile, dbt packages) come first; the job's commands after them.
SETUP = 3


def commands_of(run: runs_pb2.Run) -> list[runs_pb2.RunStep]:
    return [step for step in run.steps if not step.setup]


async def run_log(client: Client, run_id: int, step: int | None = None) -> str:
    """The run's log, or one step's."""
    chunks = client.runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=run_id))
    return "".join([chunk.text async for chunk in chunks if step is None or chunk.step_index == step])


def duckdb_tables(path: Path, schema: str = "analytics") -> set[str]:
    """The tables of ``schema`` in the DuckDB file at ``path``, read with the dbt install's duckdb."""
    read = (
        "import duckdb, sys; print('\\n'.join(r[0] for r in duckdb.connect(sys.argv[1], read_only=True).execute("
        "'select table_name from information_schema.tables where table_schema = ?', [sys.argv[2]]).fetchall()))"
    )
    done = subprocess.run(
        [str(DBT_BIN / "python"), "-c", read, str(path), schema], check=True, capture_output=True, text=True
    )
    return set(done.stdout.split())


def tables(db: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = db.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)).fetchall()
    return {str(r[0]) for r in rows}


def sleeping_queries(db: psycopg.Connection[Any]) -> int:
    """Queries of the warehouse still in a model's pg_sleep(120) (the slow model of the cancel tests)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%%pg_sleep(120)%%'"
        " AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row[0])
