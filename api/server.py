"""The gRPC server: JobService and RunService behind token auth, plus health checking and reflection.

``serve`` is the service entry point (``runplane api``); ``start_server`` starts the same server
in-process (tests use it on port 0).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection
from psycopg_pool import AsyncConnectionPool

from api.auth import AuthInterceptor
from api.jobs import JobService
from api.pickup_publisher import PickupPublisher
from api.projects import ProjectService
from api.runs import RunService
from api.store import Store
from runplane.bus import Topology
from runplane.db import Connection, open_pool
from runplane.errors import ServiceUnavailable
from runplane.settings import Settings
from runplane.v1 import jobs_pb2, jobs_pb2_grpc, projects_pb2, projects_pb2_grpc, runs_pb2, runs_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    projects_pb2.DESCRIPTOR.services_by_name["ProjectService"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # artifacts travel whole
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
    draining: asyncio.Event = field(default_factory=asyncio.Event)

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish within ``grace`` seconds, then close."""
        if self.draining.is_set():
            return
        self.draining.set()  # log followers end; health says NOT_SERVING
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await self.pickups.close()
        await self.pool.close()


async def start_server(settings: Settings, *, port: int | None = None) -> RunningApi:
    """Start the API on ``settings.api.host`` and ``port`` (default ``settings.api.port``; 0 picks one)."""
    pool = await open_pool(settings.database_url, min_size=1, max_size=POOL_SIZE, name="api")
    pickups = PickupPublisher(settings.amqp_url, Topology(settings.bus_prefix))
    try:
        store = Store(pool)
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
        await server.start()
    except BaseException:
        await pickups.close()
        await pool.close()
        raise
    for name in SERVICE_NAMES:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await pickups.connect()  # early, so the first trigger does not pay for it; failure only warns
    log.info("api listening", extra={"address": f"{settings.api.host}:{bound}"})
    return RunningApi(server, bound, health, pool, pickups, draining)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then drain within ``settings.drain_seconds``."""
    api = await start_server(settings)
    try:
        await stop.wait()
    finally:
        log.info("api draining")
        await api.stop(max(0.0, settings.drain_seconds - CLOSE_MARGIN_SECONDS))
