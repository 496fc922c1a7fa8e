"""Choosing the launcher named by ``settings.dispatcher.launcher``, and what runs beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg_pool import AsyncConnectionPool

from dispatcher.launcher import Launcher
from dispatcher.local_launcher import LocalLauncher
from dispatcher.noop_launcher import NoopLauncher
from runplane.db import Connection
from runplane.errors import InvalidArgument
from runplane.settings import Settings

if TYPE_CHECKING:  # imported when chosen: the Kubernetes client is heavy
    from dispatcher.kubernetes.gate import ClusterGate
    from dispatcher.kubernetes.watch import PodWatcher


def make_launcher(settings: Settings, pool: AsyncConnectionPool[Connection]) -> Launcher:
    name = settings.dispatcher.launcher
    match name:
        case "local":
            return LocalLauncher(settings)
        case "noop":
            return NoopLauncher(settings.database_url, settings.dispatcher.cluster)
        case "kubernetes":
            # Imported only when chosen: the Kubernetes client is heavy.
            from dispatcher.kubernetes.launcher import KubernetesLauncher

            return KubernetesLauncher(settings)
    raise InvalidArgument("dispatcher.launcher", f"unknown launcher {name!r}: local, noop or kubernetes")


def companion(settings: Settings, pool: AsyncConnectionPool[Connection]) -> PodWatcher | None:
    """The background work a launcher needs beside the dispatcher: the Pod watcher for Kubernetes."""
    if settings.dispatcher.launcher != "kubernetes":
        return None
    from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
    from dispatcher.kubernetes.watch import PodWatcher

    return PodWatcher(settings, PostgresPodOutcomes(pool, settings))


def intake_gate(settings: Settings, watcher: PodWatcher | None) -> ClusterGate | None:
    """What decides whether this dispatcher takes pickups: for Kubernetes, its cluster's health and room."""
    if settings.dispatcher.launcher != "kubernetes":
        return None
    from dispatcher.kubernetes.gate import ClusterGate

    return ClusterGate(settings, active_pods=watcher.active_count if watcher is not None else None)
