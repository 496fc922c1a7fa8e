"""Choosing the launcher named by ``settings.dispatcher.launcher``, and what runs beside it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg_pool import AsyncConnectionPool

from dispatcher.intake import Intake
from dispatcher.launcher import Launcher
from dispatcher.local_launcher import LocalLauncher
from dispatcher.noop_launcher import NoopLauncher
from runplane.adapters.db import Connection
from runplane.basics import supervise
from runplane.basics.errors import InvalidArgument
from runplane.basics.settings import Settings

if TYPE_CHECKING:  # imported when chosen: the Kubernetes client is heavy
    from dispatcher.kubernetes.gate import ClusterGate
    from dispatcher.kubernetes.pool import WarmPools
    from dispatcher.kubernetes.watch import PodWatcher


DEFAULT_CREATE_RATE = 50.0  # Pods per second expected of a cluster with no create limit, until measured
# A local dispatcher's batch waits at most this long for half its capacity to come free: a fork takes
# milliseconds, so its measured rate never binds and the horizon only paces the batches.
LOCAL_INTAKE_HORIZON = 1.0


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

            if not settings.kubernetes.warm_pools:
                return KubernetesLauncher(settings)
            from dispatcher.kubernetes.pool import PooledLauncher

            return PooledLauncher(settings, pool, KubernetesLauncher(settings))
    raise InvalidArgument("dispatcher.launcher", f"unknown launcher {name!r}: local, noop or kubernetes")


@dataclass
class KubernetesCompanion:
    """Beside a Kubernetes dispatcher: the Pod watcher, and the warm pools when it keeps any."""

    watcher: PodWatcher
    pools: WarmPools | None = None

    def run_pod_count(self) -> int:
        return self.watcher.run_pod_count()

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            supervise.spawn(group, "pod-watcher", self.watcher.run(stop))
            if self.pools is not None:
                supervise.spawn(group, "warm-pools", self.pools.run(stop))


def companion(settings: Settings, pool: AsyncConnectionPool[Connection]) -> KubernetesCompanion | None:
    """The background work a launcher needs beside the dispatcher: for Kubernetes, the Pod watcher and
    the warm pools."""
    if settings.dispatcher.launcher != "kubernetes":
        return None
    from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
    from dispatcher.kubernetes.watch import PodWatcher

    watcher = PodWatcher(settings, PostgresPodOutcomes(pool, settings))
    if not settings.kubernetes.warm_pools:
        return KubernetesCompanion(watcher)
    from dispatcher.kubernetes.pool import WarmPools

    return KubernetesCompanion(watcher, WarmPools(settings, pool, active_pods=watcher.active_count))


def intake_gate(settings: Settings, watcher: KubernetesCompanion | None) -> ClusterGate | None:
    """What decides whether this dispatcher takes pickups: for Kubernetes, its cluster's health and room."""
    if settings.dispatcher.launcher != "kubernetes":
        return None
    from dispatcher.kubernetes.gate import ClusterGate

    # Waiting pool Pods do not fill the cluster for runs: each takes one without a new Pod.
    return ClusterGate(settings, active_pods=watcher.run_pod_count if watcher is not None else None)


def intake(settings: Settings, watcher: KubernetesCompanion | None, launcher: Launcher) -> Intake | None:
    """The bound on the runs this dispatcher holds (``dispatcher.intake``): for Kubernetes, its cluster's
    room and measured create rate; locally, the room its capacity leaves; None: the dispatcher takes
    what its prefetch brings (the noop launcher of the benchmarks)."""
    if isinstance(launcher, LocalLauncher):
        local = launcher

        def local_room() -> int:
            return local.capacity - local.alive()

        return Intake(
            rate=DEFAULT_CREATE_RATE,
            horizon=LOCAL_INTAKE_HORIZON,
            room=local_room,
            full=local.capacity,
            cluster=settings.dispatcher.cluster,
        )
    k8s = settings.kubernetes
    if settings.dispatcher.launcher != "kubernetes" or k8s.intake_horizon <= 0:
        return None

    def room() -> int | None:
        if k8s.capacity <= 0 or watcher is None:
            return None
        # The room for runs: waiting pool Pods take runs without a new Pod (the pools grow only
        # within the room all Pods leave, ``WarmPools``).
        return k8s.capacity - watcher.run_pod_count()

    # Until its first launches are measured, a dispatcher expects the create rate it is allowed.
    prior = k8s.pod_creates_per_second if k8s.pod_creates_per_second > 0 else DEFAULT_CREATE_RATE
    return Intake(rate=prior, horizon=k8s.intake_horizon, room=room, cluster=settings.dispatcher.cluster)
