"""The public gRPC server: JobService, ProjectService and RunService behind token auth, plus health
checking and reflection. The API process (``api.process``) starts it beside its other doors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from grpc_health.v1 import _async as health_aio  # the asyncio servicer grpc_health.v1.health.aio names
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from api.grpc.auth import AuthInterceptor
from api.grpc.jobs import JobService
from api.grpc.notifications import NotificationService
from api.grpc.projects import ProjectService
from api.grpc.runs import RunService
from api.notification_definitions import Notifications
from api.pickup_publisher import PickupPublisher
from api.store import Store
from runplane.adapters.grpc_options import MAX_MESSAGE_BYTES
from runplane.basics.addresses import AddressPolicy
from runplane.basics.secrets import SecretBox, SecretKeyError, box_from_settings
from runplane.basics.settings import Settings
from runplane.dbt.versions import InstalledDbtVersions
from runplane.v1 import (
    jobs_pb2,
    jobs_pb2_grpc,
    notifications_pb2,
    notifications_pb2_grpc,
    projects_pb2,
    projects_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)

SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    projects_pb2.DESCRIPTOR.services_by_name["ProjectService"].full_name,
    notifications_pb2.DESCRIPTOR.services_by_name["NotificationService"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
)


@dataclass
class PublicServer:
    """The server (not yet started) and its health servicer."""

    server: grpc.aio.Server
    health: health_aio.HealthServicer

    async def serving(self) -> None:
        """Tell health checks every public service answers."""
        for name in SERVICE_NAMES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)


def public_server(settings: Settings, store: Store, pickups: PickupPublisher, draining: asyncio.Event) -> PublicServer:
    """The public services on one server; ``draining`` ends log followers when the process stops."""
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(store)],
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    jobs_pb2_grpc.add_JobServiceServicer_to_server(JobService(store, max_page_size=settings.api.max_page_size), server)
    projects_pb2_grpc.add_ProjectServiceServicer_to_server(ProjectService(store, settings), server)
    notifications_pb2_grpc.add_NotificationServiceServicer_to_server(
        NotificationService(
            Notifications(store, _box_or_none(settings)), AddressPolicy(settings.webhooks.allowed_networks)
        ),
        server,
    )
    runs_pb2_grpc.add_RunServiceServicer_to_server(
        RunService(
            store,
            pickups,
            max_page_size=settings.api.max_page_size,
            log_poll_interval=settings.api.log_poll_interval,
            draining=draining,
            dbt_versions=InstalledDbtVersions.of(settings),
        ),
        server,
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    return PublicServer(server, health)


def _box_or_none(settings: Settings) -> SecretBox | None:
    """The keys of stored secrets; None when none are configured (a receiver's secret is then refused)."""
    if not settings.secret_keys.get_secret_value().strip():
        return None
    try:
        return box_from_settings(settings)
    except SecretKeyError:
        return None
