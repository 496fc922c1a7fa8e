"""The API process: the public gRPC server, the runner API on a port of its own (``api.runner_port``),
the REST API with the web pages, and the outgoing webhook deliveries, over one pool and one store.

``serve`` is the service entry point (``runplane api``): the REST server and the webhook deliveries
run as eternal tasks of one TaskGroup, as every service's loops do, so one that dies or ends early
stops the process. ``start_server`` starts the same servers in-process and returns them running
(tests use them on port 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
from grpc_health.v1 import _async as health_aio  # the asyncio servicer grpc_health.v1.health.aio names
from psycopg_pool import AsyncConnectionPool

from api.grpc.server import public_server
from api.pickup_publisher import PickupPublisher
from api.rest.app import create_app
from api.rest.server import RestServer, bind_rest
from api.runner.call_limits import CallLimitInterceptor
from api.runner.run_token import RunTokenInterceptor
from api.runner.service import RunnerService
from api.store import Store
from api.webhooks.commit_statuses import CommitStatusDeliverer
from api.webhooks.deliveries import WebhookDeliverer
from api.webhooks.targets import TargetPolicy
from runplane.adapters.bus import Topology
from runplane.adapters.db import Connection, open_pool
from runplane.adapters.grpc_options import RUNNER_SERVER
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.secrets import SecretBox, box_from_settings
from runplane.basics.settings import Settings
from runplane.basics.supervise import spawn
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles
from runplane.v1 import runner_pb2_grpc

log = logging.getLogger(__name__)

POOL_SIZE = 10
# Time kept back from the drain bound for closing the pool and the bus after the server stops.
CLOSE_MARGIN_SECONDS = 1.0

# Starts a task that runs as long as the process serves: (name, coroutine, the event it runs until).
StartTask = Callable[[str, Coroutine[Any, Any, None], asyncio.Event], asyncio.Task[None]]


@dataclass
class RunningApi:
    """A started server and what it holds; ``stop`` drains and releases everything."""

    server: grpc.aio.Server
    port: int
    health: health_aio.HealthServicer
    pool: AsyncConnectionPool[Connection]
    pickups: PickupPublisher
    runner_server: grpc.aio.Server
    runner_port: int
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    rest: RestServer | None = None
    deliverer: WebhookDeliverer | None = None
    deliveries: asyncio.Task[None] | None = None
    deliveries_stop: asyncio.Event = field(default_factory=asyncio.Event)
    commit_statuses: CommitStatusDeliverer | None = None
    commit_status_task: asyncio.Task[None] | None = None

    async def start_side_tasks(self, start: StartTask) -> None:
        """Start the REST server (returning once it listens) and the webhook deliveries."""
        if self.rest is not None:
            await self.rest.start(lambda coro: start("api:rest", coro, self.draining))
        if self.deliverer is not None:
            run = self.deliverer.run(self.deliveries_stop)
            self.deliveries = start("api:webhook-deliveries", run, self.deliveries_stop)
        if self.commit_statuses is not None:
            run = self.commit_statuses.run(self.deliveries_stop)
            self.commit_status_task = start("api:commit-statuses", run, self.deliveries_stop)

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish within ``grace`` seconds, then close."""
        if self.draining.is_set():
            return
        self.draining.set()  # log followers end; health says NOT_SERVING
        await self.health.enter_graceful_shutdown()
        self.deliveries_stop.set()  # an attempt in flight is recorded, or leased and sent again later
        for task in (self.deliveries, self.commit_status_task):
            if task is not None and not task.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), grace + 1.0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        stopping = [self.server.stop(grace), self.runner_server.stop(grace)]
        if self.rest is not None:
            stopping.append(self.rest.stop(grace))
        await asyncio.gather(*stopping)
        await self.pickups.close()
        await self.pool.close()


def _plain_task(name: str, coro: Coroutine[Any, Any, None], until: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.create_task(coro, name=name)


async def start_server(
    settings: Settings,
    *,
    port: int | None = None,
    runner_port: int | None = None,
    rest_port: int | None = None,
    deliveries: bool = True,
) -> RunningApi:
    """Start the gRPC API on ``settings.api.host`` and ``port`` (default ``settings.api.port``; 0 picks one),
    the runner API on ``runner_port`` (default ``settings.api.runner_port``), the REST API on ``rest_port``
    (default: ``settings.api.rest_port``, or a free port when ``port`` is 0; -1 starts none), and, unless
    ``deliveries`` is False, the outgoing webhook deliveries.
    """
    api = await _open(settings, port=port, runner_port=runner_port, rest_port=rest_port, deliveries=deliveries)
    try:
        await api.start_side_tasks(_plain_task)
    except BaseException:
        await api.stop(0)
        raise
    return api


async def _open(
    settings: Settings,
    *,
    port: int | None = None,
    runner_port: int | None = None,
    rest_port: int | None = None,
    deliveries: bool = True,
) -> RunningApi:
    """The gRPC servers started, the REST port bound; the REST server and the deliveries not yet started."""
    box = _secret_box(settings)
    if rest_port is None:
        rest_port = 0 if port == 0 and settings.api.rest_port >= 0 else settings.api.rest_port
    pool = await open_pool(settings.database_url, min_size=1, max_size=POOL_SIZE, name="api")
    pickups = PickupPublisher(settings.amqp_url, Topology(settings.bus_prefix))
    draining = asyncio.Event()
    try:
        store = Store(pool, box)
        public = public_server(settings, store, pickups, draining)
        server = public.server
        address = f"{settings.api.host}:{settings.api.port if port is None else port}"
        bound = server.add_insecure_port(address)
        if bound == 0:
            raise ServiceUnavailable(f"cannot listen on {address}")
        runner_server = grpc.aio.server(
            interceptors=[CallLimitInterceptor(settings.api.runner_limits), RunTokenInterceptor()],
            options=RUNNER_SERVER,
        )
        runner_service = RunnerService(store, pickups, settings.runner, box)
        await runner_service.warm_up()
        runner_pb2_grpc.add_RunnerServiceServicer_to_server(runner_service, runner_server)
        runner_address = f"{settings.api.host}:{settings.api.runner_port if runner_port is None else runner_port}"
        runner_bound = runner_server.add_insecure_port(runner_address)
        if runner_bound == 0:
            raise ServiceUnavailable(f"cannot listen on {runner_address}")
        await server.start()
        await runner_server.start()
        rest = None
        if rest_port >= 0:
            try:
                app = create_app(
                    store,
                    pickups,
                    box,
                    targets=TargetPolicy(settings.webhooks.allowed_networks),
                    repositories=settings.repositories,
                    log_poll_interval=settings.api.log_poll_interval,
                    draining=draining,
                    max_body_bytes=settings.api.max_body_bytes,
                    web_session_lifetime=timedelta(hours=settings.api.web_session_hours),
                    dbt_versions=InstalledDbtVersions.of(settings),
                    warehouses=WarehouseFiles.of(settings),
                )
                rest = bind_rest(app, settings.api, rest_port)
            except BaseException:
                await asyncio.gather(server.stop(0), runner_server.stop(0))
                raise
    except BaseException:
        await pickups.close()
        await pool.close()
        raise
    await public.serving()
    await pickups.connect()  # early, so the first trigger does not pay for it; failure only warns
    log.info(
        "api listening",
        extra={"address": f"{settings.api.host}:{bound}", "runner_address": f"{settings.api.host}:{runner_bound}"},
    )
    api = RunningApi(server, bound, public.health, pool, pickups, runner_server, runner_bound, draining, rest)
    if box is not None and deliveries:
        scheme = "https" if rest is not None and rest.https else "http"
        public_url = settings.api.public_url or f"{scheme}://{settings.api.host}:{rest.port if rest else rest_port}"
        api.deliverer = WebhookDeliverer(pool, box, settings.webhooks, settings.notifications, public_url)
        api.commit_statuses = CommitStatusDeliverer(pool, box, settings.webhooks, public_url)
    return api


def _secret_box(settings: Settings) -> SecretBox | None:
    """The keys of stored secrets; None when none are configured (then no secret can be stored or read,
    and outgoing webhooks are off)."""
    if not settings.secret_keys.get_secret_value().strip():
        log.warning(
            "RUNPLANE_SECRET_KEYS is empty: secret variables can be neither stored nor given to runners, "
            "and outgoing webhooks are off"
        )
        return None
    return box_from_settings(settings)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then drain within ``settings.drain_seconds``."""
    grace = max(0.0, settings.drain_seconds - CLOSE_MARGIN_SECONDS)
    api = await _open(settings)
    try:
        async with asyncio.TaskGroup() as group:

            def supervised(name: str, coro: Coroutine[Any, Any, None], until: asyncio.Event) -> asyncio.Task[None]:
                return spawn(group, name, coro, eternal=True, stop=until)

            await api.start_side_tasks(supervised)
            await stop.wait()
            log.info("api draining")
            await api.stop(grace)  # inside the group: the REST server and the deliveries end first
    finally:
        await api.stop(grace)  # a side task died: the group cancelled the rest; release what is held
