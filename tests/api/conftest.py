"""The API started in-process on a free port, against this test's database, with accounts and clients."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import psycopg
import pytest

from api.admin import create_account
from api.process import RunningApi
from api.rest.server import RestServer
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2_grpc
from tests.support.api import serving_api, wants_rest

AsyncDb = psycopg.AsyncConnection[tuple[Any, ...]]


@dataclass
class Client:
    """Stubs of both services over one channel that sends the account's token."""

    account_id: int
    token: str
    jobs: jobs_pb2_grpc.JobServiceAsyncStub
    runs: runs_pb2_grpc.RunServiceAsyncStub


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api": settings.api.model_copy(update={"log_poll_interval": 0.05})})


@pytest.fixture
async def api(request: pytest.FixtureRequest, api_settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    """The API in this process: gRPC and the runner API, and REST only when the test reaches it through
    ``rest_server`` (as ``rest``, ``other_rest`` and ``browser`` do). No test here waits for an
    outgoing webhook, so the deliveries are not started."""
    async with serving_api(api_settings, rest=wants_rest(request), deliveries=False) as running:
        yield running


@pytest.fixture
def rest_server(api: RunningApi) -> RestServer:
    """The API's REST server, which also serves the web pages."""
    assert api.rest is not None, "the api fixture starts REST for the tests that ask for rest_server"
    return api.rest


@contextlib.asynccontextmanager
async def connect(api: RunningApi, token: str | None, account_id: int = 0) -> AsyncIterator[Client]:
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Client(account_id, token or "", jobs_pb2_grpc.JobServiceStub(chan), runs_pb2_grpc.RunServiceStub(chan))


@pytest.fixture
async def client(api: RunningApi, settings: Settings) -> AsyncIterator[Client]:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with connect(api, token, account_id) as c:
        yield c


@pytest.fixture
async def other(api: RunningApi, settings: Settings) -> AsyncIterator[Client]:
    """A second account, to prove nothing leaks between accounts."""
    account_id, token = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    async with connect(api, token, account_id) as c:
        yield c


@pytest.fixture
async def adb(database_url: str) -> AsyncIterator[AsyncDb]:
    """An async connection for arranging and asserting while the in-process server runs."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        yield conn


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """The status code and details a call ends with (OK when it succeeds)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def deploy_job(name: str = "nightly", **fields: Any) -> jobs_pb2.CreateJobRequest:
    fields.setdefault("steps", ["echo hello"])
    fields.setdefault("job_type", common_pb2.JOB_TYPE_DEPLOY)
    return jobs_pb2.CreateJobRequest(name=name, **fields)


async def scalar(db: AsyncDb, query: str, *params: Any) -> Any:
    cur = await db.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


class Rest:
    def __init__(self, http: httpx.AsyncClient, account_id: int, token: str) -> None:
        self.http = http
        self.account_id = account_id
        self.token = token
        self.base = f"/api/v2/accounts/{account_id}"

    async def create_project_and_environment(self, db: AsyncDb) -> tuple[int, int]:
        """A project (``shop``) and its deployment environment (``prod``, dbt 1.10), as rows."""
        project = await scalar(
            db,
            "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop', 'file:///srv/shop')"
            " RETURNING id",
            self.account_id,
        )
        environment = await scalar(
            db,
            "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
            " schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', 'analytics') RETURNING id",
            self.account_id,
            project,
        )
        return int(project), int(environment)

    async def create_job(self, db: AsyncDb, name: str = "nightly", job_type: str = "deploy", **cols: Any) -> int:
        """Jobs are created over gRPC elsewhere; here a row is enough to trigger and list."""
        cols.setdefault("steps", ["echo hello"])
        keys = ", ".join(["account_id", "name", "job_type", *cols])
        marks = ", ".join(["%s"] * (3 + len(cols)))
        return int(
            await scalar(
                db,
                f"INSERT INTO jobs ({keys}) VALUES ({marks}) RETURNING id",
                self.account_id,
                name,
                job_type,
                *cols.values(),
            )
        )


@pytest.fixture
async def rest(rest_server: RestServer, settings: Settings) -> AsyncIterator[Rest]:
    account_id, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
    ) as http:
        yield Rest(http, account_id, token)


@pytest.fixture
async def other_rest(rest_server: RestServer, settings: Settings) -> AsyncIterator[Rest]:
    account_id, token = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Bearer {token}"}
    ) as http:
        yield Rest(http, account_id, token)
