"""Choosing the launcher named by ``settings.dispatcher.launcher``, and what runs beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dispatcher.launcher import Launcher
from dispatcher.local_launcher import LocalLauncher
from dispatcher.noop_launcher import NoopLauncher
from runplane.db import Connection
from runplane.errors import InvalidArgument
from runplane.settings import Settings


def make_launcher(settings: Settings, pool: AsyncConnectionPool[Connection]) -> Launcher:
    name = settings.dispatcher.launcher
    match name:
        case "local":
            return LocalLauncher(settings.dispatcher.cluster, fork_server=settings.dispatcher.local_fork_server)
        case "noop":
            return NoopLauncher(settings.database_url, settings.dispatcher.cluster)
        case "kubernetes":
            # Imported only when chosen: the Kubernetes client is heavy.
            from dispatcher.kubernetes.launcher import KubernetesLauncher

            return KubernetesLauncher(settings)
    raise InvalidArgument("dispatcher.launcher", f"unknown launcher {name!r}: local, noop or kubernetes")


def companion(
    settings: Settings, pool: AsyncConnectionPool[Connection], stop: asyncio.Event
) -> Coroutine[Any, Any, None] | None:
    """The background work a launcher needs beside the dispatcher: the Pod watcher for Kubernetes."""
    if settings.dispatcher.launcher != "kubernetes":
        return None
    from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
    from dispatcher.kubernetes.watch import PodWatcher

    return PodWatcher(settings, PostgresPodOutcomes(pool, settings)).run(stop)
