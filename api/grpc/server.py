"""The gRPC servers: JobService and RunService behind token auth, plus health checking and reflection;
and the runner API (RunnerService, run tokens) on a port of its own (``api.runner_port``).

``serve`` is the service entry point (``runplane api``); ``start_server`` starts the same servers
in-process (tests use them on port 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection
from psycopg_pool import AsyncConnectionPool

from api.auth import AuthInterceptor
from api.grpc.jobs import JobService
from api.grpc.projects import ProjectService
from api.grpc.runs import RunService
from api.pickup_publisher import PickupPublisher
from api.rest.app import create_app
from api.rest.server import RestServer, start_rest
from api.runner.run_token import RunTokenInterceptor
from api.runner.service import RunnerService
from api.store import Store
from api.webhooks.deliveries import WebhookDeliverer
from api.webhooks.targets import TargetPolicy
from runplane.adapters.bus import Topology
from runplane.adapters.db import Connection, open_pool
from runplane.adapters.grpc_options import MAX_MESSAGE_BYTES, RUNNER_SERVER
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.secrets import SecretBox, box_from_settings
from runplane.basics.settings import Settings
from runplane.v1 import (
    jobs_pb2,
    jobs_pb2_grpc,
    projects_pb2,
    projects_pb2_grpc,
    runner_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    projects_pb2.DESCRIPTOR.services_by_name["ProjectService"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
)
POOL_SIZE = 10
# Time kept back from the drain bound for closing the pool and the bus after the server stops.
CLOSE_MARGIN_SECONDS = 1.0


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
    deliveries: asyncio.Task[None] | None = None
    deliveries_stop: asyncio.Event = field(default_factory=asyncio.Event)

    def side_tasks(self) -> set[asyncio.Task[None]]:
        """Tasks that must run as long as the process serves: the REST server and webhook deliveries."""
        return {t for t in (self.rest.task if self.rest else None, self.deliveries) if t is not None}

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish within ``grace`` seconds, then close."""
        if self.draining.is_set():
            return
        self.draining.set()  # log followers end; health says NOT_SERVING
        await self.health.enter_graceful_shutdown()
        self.deliveries_stop.set()  # an attempt in flight is recorded, or leased and sent again later
        if self.deliveries is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.deliveries), grace + 1.0)
            self.deliveries.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.deliveries
        stopping = [self.server.stop(grace), self.runner_server.stop(grace)]
        if self.rest is not None:
            stopping.append(self.rest.stop(grace))
        await asyncio.gather(*stopping)
        await self.pickups.close()
        await self.pool.close()


async def start_server(
    settings: Settings, *, port: int | None = None, runner_port: int | None = None, rest_port: int | None = None
) -> RunningApi:
    """Start the gRPC API on ``settings.api.host`` and ``port`` (default ``settings.api.port``; 0 picks one),
    the runner API on ``runner_port`` (default ``settings.api.runner_port``), and the REST API on
    ``rest_port`` (default: ``settings.api.rest_port``, or a free port when ``port`` is 0).
    """
    box = _secret_box(settings)
    if rest_port is None:
        rest_port = 0 if port == 0 and settings.api.rest_port >= 0 else settings.api.rest_port
    pool = await open_pool(settings.database_url, min_size=1, max_size=POOL_SIZE, name="api")
    pickups = PickupPublisher(settings.amqp_url, Topology(settings.bus_prefix))
    try:
        store = Store(pool, box)
        server = grpc.aio.server(
            interceptors=[AuthInterceptor(store)],
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        draining = asyncio.Event()
        jobs_pb2_grpc.add_JobServiceServicer_to_server(
            JobService(store, max_page_size=settings.api.max_page_size), server
        )
        projects_pb2_grpc.add_ProjectServiceServicer_to_server(ProjectService(store, settings), server)
        runs_pb2_grpc.add_RunServiceServicer_to_server(
            RunService(
                store,
                pickups,
                max_page_size=settings.api.max_page_size,
                log_poll_interval=settings.api.log_poll_interval,
                draining=draining,
            ),
            server,
        )
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        address = f"{settings.api.host}:{settings.api.port if port is None else port}"
        bound = server.add_insecure_port(address)
        if bound == 0:
            raise ServiceUnavailable(f"cannot listen on {address}")
        runner_server = grpc.aio.server(interceptors=[RunTokenInterceptor()], options=RUNNER_SERVER)
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
                    log_poll_interval=settings.api.log_poll_interval,
                    draining=draining,
                )
                rest = await start_rest(app, settings.api, rest_port)
            except BaseException:
                await asyncio.gather(server.stop(0), runner_server.stop(0))
                raise
    except BaseException:
        await pickups.close()
        await pool.close()
        raise
    for name in SERVICE_NAMES:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await pickups.connect()  # early, so the first trigger does not pay for it; failure only warns
    log.info(
        "api listening",
        extra={"address": f"{settings.api.host}:{bound}", "runner_address": f"{settings.api.host}:{runner_bound}"},
    )
    api = RunningApi(server, bound, health, pool, pickups, runner_server, runner_bound, draining, rest)
    if box is not None:
        deliverer = WebhookDeliverer(pool, box, settings.webhooks)
        api.deliveries = asyncio.create_task(deliverer.run(api.deliveries_stop), name="webhook-deliveries")
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
    api = await start_server(settings)
    try:
        stopping = asyncio.create_task(stop.wait(), name="api-stop")
        done, _ = await asyncio.wait({stopping, *api.side_tasks()}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        if not stop.is_set():  # a side task ended on its own: stop the process loudly
            for task in done:
                task.result()
            raise ServiceUnavailable(f"{', '.join(t.get_name() for t in done)} stopped unexpectedly")
    finally:
        log.info("api draining")
        await api.stop(max(0.0, settings.drain_seconds - CLOSE_MARGIN_SECONDS))
