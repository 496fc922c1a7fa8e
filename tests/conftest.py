"""Test fixtures on the real Postgres, Redis and RabbitMQ of this machine.

Every test gets a fresh database cloned from a template migrated once per test session, and its own
bus and Redis prefixes, so tests cannot see each other (even from parallel checkouts).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING

import psycopg
import pytest
import redis
from pydantic import SecretStr

from runplane.basics import redis_keys
from runplane.basics.secrets import generate_key
from runplane.basics.settings import RepositorySettings, Settings
from runplane.commands.migrate import migrate
from runplane.commands.preflight import ensure_services
from tests.support.ports import free_port

if TYPE_CHECKING:  # imported by the one fixture that starts it: most tests never load the API server
    from api.process import RunningApi

pytest_plugins = ["tests.support.kubernetes_fixtures", "tests.support.metrics", "tests.support.queuer_fixtures"]

BASE = Settings()
# Two keys, as after a rotation: the newest encrypts, both decrypt.
TEST_SECRET_KEYS = f"{generate_key()},{generate_key()}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test, so a fixture's teardown knows whether the test failed.

    The report is made again when the per-test timeout went off while it was being made: the
    alarm of pytest-timeout spans the whole test protocol, reports included, and on a busy machine a
    test that fails close to its timeout can still be formatting its traceback when it fires. The
    ``Failed`` raised there would escape this hook, and pytest-xdist ends the whole session on it as
    an internal error. The alarm fires once, so the report is made again, as a failure: the test's
    own, or the timeout it went past."""
    try:
        report = yield
    except pytest.fail.Exception as timeout:
        report = pytest.TestReport.from_item_and_call(item, call)
        if report.outcome != "failed":
            report.outcome = "failed"
            report.longrepr = f"{timeout.msg} (while its {call.when} report was made)"
    setattr(item, f"report_{report.when}", report)
    return report


ADMIN_URL = psycopg.conninfo.make_conninfo(BASE.database_url, dbname="postgres")


def _db_url(name: str) -> str:
    return psycopg.conninfo.make_conninfo(BASE.database_url, dbname=name)


def _drop(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


# The per-test timeout is 20 s (pyproject.toml); a test marked `slow`, or one that may be the first
# to start a session's Kubernetes cluster, gets this one unless it names its own.
SLOW_TIMEOUT = 180
CLUSTER_FIXTURES = {"control_plane", "second_control_plane", "compacting_control_plane", "node"}


# Under pytest-xdist (`-n`, `--dist loadgroup`), the tests on a session's Kubernetes cluster share one
# worker, so the suite starts one control plane and one node, not one per worker.
SESSION_CLUSTER_FIXTURES = {"control_plane", "second_control_plane", "node"}


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, so the group is there before pytest-xdist reads the groups in its own
    # pytest_collection_modifyitems.
    if SESSION_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.xdist_group("kubernetes"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("slow") is not None or CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


@pytest.fixture(scope="session", autouse=True)
def _services() -> None:
    problems = ensure_services(BASE, say=lambda _: None)
    if problems:
        pytest.exit("\n".join(problems), returncode=3)


@pytest.fixture(scope="session")
def template_db(_dropper: _Dropper) -> Iterator[str]:
    """A migrated database that every test's database is cloned from."""
    name = f"rp_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    migrate(_db_url(name))
    yield name
    _dropper.names.put(name)


class _Dropper:
    """Drops the tests' databases on a thread of its own.

    DROP DATABASE takes about a second (Postgres waits for every backend to let go of the files), and
    the next test need not wait for it. The session ends only once every drop is done, and fails if
    one failed.
    """

    def __init__(self) -> None:
        self.names: queue.Queue[str | None] = queue.Queue()
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._drop_all, name="drop-test-databases", daemon=True)
        self.thread.start()

    def _drop_all(self) -> None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            while (name := self.names.get()) is not None:
                try:
                    _drop(conn, name)
                except psycopg.Error as exc:
                    self.failures.append(f"{name}: {exc}")

    def close(self) -> None:
        self.names.put(None)
        self.thread.join()
        assert not self.failures, f"test databases not dropped: {self.failures}"


# One per test process, closed in ``pytest_sessionfinish``: a session fixture's teardown runs inside
# the last test's teardown and so under that test's timeout, and waiting there for the drops still
# queued (a second or more each on a loaded machine) failed whichever test happened to come last.
_DROPPER: _Dropper | None = None


@pytest.fixture(scope="session")
def _dropper() -> _Dropper:
    global _DROPPER
    if _DROPPER is None:
        _DROPPER = _Dropper()
    return _DROPPER


def pytest_sessionfinish() -> None:
    """Wait for every test database to be dropped; a drop that failed ends the run in an error. Then
    delete the shared queues of every prefix this process handed out."""
    if _DROPPER is not None:
        _DROPPER.close()
    if _PREFIXES:
        asyncio.run(_delete_shared_queues(_PREFIXES))


# Every prefix handed out in this process. A test that opens its prefix's shared queues without a
# clean-up of its own (a bus, a dispatcher, a publisher made in the test) would leave them on the
# broker; they are deleted once at the end, in one connection (deleting a queue that is not there
# succeeds). Each queuer worker's own queue is named by its id and deleted by the fixtures that start workers.
_PREFIXES: list[str] = []


async def _delete_shared_queues(prefixes: list[str]) -> None:
    import aio_pika

    from runplane.adapters.bus import Topology

    connection = await aio_pika.connect(BASE.amqp_url)
    try:
        channel = await connection.channel()
        for prefix in prefixes:
            topology = Topology(prefix)
            for queue in (topology.assign, topology.orchestrator, topology.pickup, topology.dead_letter):
                await channel.queue_delete(queue)
    finally:
        await connection.close()


@pytest.fixture
def database_url(template_db: str, _dropper: _Dropper) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"rp_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(template_db)
            )
        )
    yield _db_url(name)
    _dropper.names.put(name)


@pytest.fixture
def prefix() -> str:
    """A unique prefix for this test's queues and Redis keys."""
    name = f"rpt{uuid.uuid4().hex[:10]}"
    _PREFIXES.append(name)
    return name


@pytest.fixture
def settings(database_url: str, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """This test's settings: its database and prefixes, secret keys, free ports for the APIs, and the
    test run's temporary directories as where projects may name local repositories."""
    base = Settings(
        database_url=database_url,
        bus_prefix=prefix,
        redis_prefix=prefix,
        log_format="text",
        secret_keys=SecretStr(TEST_SECRET_KEYS),
        repositories=RepositorySettings(local_roots=[str(tmp_path_factory.getbasetemp())]),
    )
    runner_port = free_port()
    return base.model_copy(
        update={
            "api": base.api.model_copy(
                update={"port": free_port(), "runner_port": runner_port, "rest_port": free_port()}
            ),
            # No installed dbt unless a test gives one (tests/dbt's dbt_settings): an API told of none
            # accepts any dbt version, whatever RUNPLANE_RUNNER__DBT_VERSIONS the shell exports.
            "runner": base.runner.model_copy(update={"api_address": f"127.0.0.1:{runner_port}", "dbt_versions": {}}),
        }
    )


@pytest.fixture
def service_env(settings: Settings) -> Iterator[dict[str, str]]:
    """Environment for service processes started by a test; the queues they made are deleted after."""
    env = os.environ.copy()
    env.update(
        RUNPLANE_DATABASE_URL=settings.database_url,
        RUNPLANE_BUS_PREFIX=settings.bus_prefix,
        RUNPLANE_REDIS_PREFIX=settings.redis_prefix,
        RUNPLANE_LOG_FORMAT="text",
        RUNPLANE_SECRET_KEYS=settings.secret_keys.get_secret_value(),
        RUNPLANE_API__PORT=str(settings.api.port),
        RUNPLANE_API__RUNNER_PORT=str(settings.api.runner_port),
        RUNPLANE_API__REST_PORT=str(settings.api.rest_port),
        RUNPLANE_RUNNER__API_ADDRESS=settings.runner.api_address,
        RUNPLANE_REPOSITORIES__LOCAL_ROOTS=json.dumps(settings.repositories.local_roots),
    )
    yield env
    # A fixture's teardown may run while the test's event loop is still set: a thread of its own.
    cleanup = threading.Thread(target=asyncio.run, args=(delete_queues(settings.bus_prefix, settings.database_url),))
    cleanup.start()
    cleanup.join()
    remove_demo(settings)


def remove_demo(settings: Settings) -> None:
    """What a ``runplane up --demo`` of these settings left: its git repository and its warehouse (kept
    across restarts of one install, so ``up`` leaves them; a test's install is never started again)."""
    from runplane.commands.demo import demo_repository_path
    from runplane.commands.demo_warehouse import DemoWarehouse

    shutil.rmtree(demo_repository_path(settings).parent, ignore_errors=True)
    warehouse = DemoWarehouse.for_install(settings)
    if warehouse.directory.exists():
        warehouse.stop()  # stopped with up, unless up was killed
        shutil.rmtree(warehouse.directory, ignore_errors=True)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection to this test's database, for arranging and asserting."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def _cleanup_bus(prefix: str, database_url: str) -> AsyncIterator[None]:
    yield
    await delete_queues(prefix, database_url)


async def delete_queues(prefix: str, database_url: str) -> None:
    """Delete every queue a test made: its prefix's shared queues and the own queue of each queuer
    worker its processes started (their ids from its database, which outlives this)."""
    from tests.support.queuer import delete_queues as delete_named

    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            worker_ids = [str(r[0]) for r in conn.execute("SELECT worker_id FROM queuer_workers")]
    except psycopg.Error:  # not migrated: no worker ever ran
        worker_ids = []
    await delete_named(prefix, worker_ids)


@pytest.fixture(autouse=True)
def _redis_cleanup(prefix: str) -> Iterator[None]:
    yield
    client = redis.Redis.from_url(BASE.redis_url)
    try:
        keys = list(client.scan_iter(redis_keys.every_key(prefix), count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """A test must not leave asyncio tasks running (kopf's _no_asyncio_pending_tasks)."""
    before = set(asyncio.all_tasks())
    yield
    for _ in range(50):
        leaked = {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}
        if not leaked:
            return
        await asyncio.sleep(0.02)
    names = sorted(t.get_name() for t in leaked)
    pytest.fail(f"leaked asyncio tasks: {names}")


@pytest.fixture
async def runner_api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    """The API in this process: the runner API on ``settings.api.runner_port`` for runners to reach, and
    the gRPC API; not REST nor the webhook deliveries, which no test of the runners uses."""
    from tests.support.api import serving_api

    async with serving_api(settings, rest=False, deliveries=False) as running:
        yield running
