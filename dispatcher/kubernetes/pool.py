"""Warm Pod pools: started runner Pods wait on the runner API, so a dispatched run starts at once.

``WarmPools.run(stop)`` keeps each pool of ``kubernetes.warm_pools`` (one kind of Pod: image and
memory) between its minimum and maximum, following the forecast and the queue
(``dispatcher/pool_sizing.py``): ahead of a minute with runs due it grows to their number, a lead
time before the minute (at least ``pool_lead_seconds``, longer when the Pods cannot be created in
time at the rate this keeper measured), and back to the queue's size after, at least ``min_size``,
at most ``max_size``, and within the room ``capacity`` leaves. Each pool Pod gets a token of its
own (a per-Pod Secret, stored hashed in ``pool_runners``) that is good for one thing: waiting for
one run (``RunnerService.WaitForRun``). Pods that stop calling are replaced; idle Pods above the
size are retired oldest first.

``PooledLauncher`` is the ``kubernetes`` launcher with pools: a run whose kind has a pool goes to
the freshest waiting Pod of it (one ``UPDATE … FOR UPDATE SKIP LOCKED`` on ``pool_runners``); the
runner API hands that Pod the run with a new run token, and the Pod is relabelled as the run's, so
the Pod watcher treats it like any run Pod. With no waiting Pod (or Postgres not answering) the
run gets a cold Pod of its own. A pool Pod runs one run, then exits; the pool refills.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import kubernetes.client
from psycopg_pool import AsyncConnectionPool

from dispatcher.kubernetes import api as kubernetes_api
from dispatcher.kubernetes.api import CallRetries, KubernetesApiError
from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.pods import CLUSTER, MANAGED_BY, MANAGER, run_labels, runner_pod, token_secret
from dispatcher.launcher import LaunchRequest, LaunchResult
from dispatcher.pool_sizing import NO_POOL, PoolPlan, plan_pool, record_launch, record_plan
from runplane.adapters.db import Connection, fetch_one, fetch_value, fetch_values
from runplane.basics import supervise
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import Settings, WarmPoolSettings
from runplane.basics.tokens import new_run_token, token_hash
from runplane.basics.wall_clock import SYSTEM_CLOCK, WallClock
from runplane.demand.forecast import Forecast, RunnerKind, read_forecast
from runplane.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("dispatcher.kubernetes")
POOL = "runplane.dev/pool"
CONFLICT, NOT_FOUND = 409, 404


@dataclass(frozen=True)
class PoolSize:
    idle: int  # Pods not given a run yet: waiting, or still starting
    queued: int  # due queued runs of the pool's memory


def pool_image(pool: WarmPoolSettings, settings: Settings) -> str:
    k8s = settings.kubernetes
    return k8s.dbt_images.get(pool.dbt_version, k8s.image)


def fits_pool(pool: WarmPoolSettings, settings: Settings, kind: RunnerKind) -> bool:
    """Whether a run of ``kind`` would get a Pod like the pool's (image and memory)."""
    k8s = settings.kubernetes
    return pool.memory_mb == kind.memory_mb and pool_image(pool, settings) == k8s.dbt_images.get(
        kind.dbt_version, k8s.image
    )


def fitting_pool(request: LaunchRequest, settings: Settings) -> WarmPoolSettings | None:
    """The pool whose Pods are what this run's own Pod would be (image and memory), if any."""
    kind = RunnerKind(request.dbt_version, request.memory_mb)
    return next((pool for pool in settings.kubernetes.warm_pools if fits_pool(pool, settings, kind)), None)


class WarmPools:
    """Keeps the pools' Pods: refill, resize to the queue, replace silent Pods. Run ``run(stop)`` as a task."""

    def __init__(
        self,
        settings: Settings,
        db: AsyncConnectionPool[Connection],
        *,
        configuration: kubernetes.client.Configuration | None = None,
        active_pods: Callable[[], int] | None = None,
        wall_clock: WallClock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._k8s = settings.kubernetes
        self._cluster = settings.dispatcher.cluster
        self._db = db
        self._active_pods = active_pods
        self._clock = wall_clock
        # Pool Pods created per second, as measured (creates of a pass over the time they took); until
        # measured, what the settings allow.
        self.create_rate = self._k8s.pool_creates_per_pass / self._k8s.pool_interval
        self.plans: dict[str, PoolPlan] = {}  # the last look at each pool (observability and tests)
        config = configuration if configuration is not None else kubernetes_api.configuration(self._k8s)
        self._api_client = kubernetes.client.ApiClient(config)
        self._core = kubernetes.client.CoreV1Api(self._api_client)
        self._policy = CallRetries.from_settings(self._k8s)
        self.created = 0  # pool Pods created (observability and tests)
        self.replaced = 0  # silent pool Pods deleted

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while True:
                try:
                    await self.keep()
                except (KubernetesApiError, ServiceUnavailable) as exc:
                    log.warning("warm pools not kept this time", extra={"error": str(exc)})
                if await supervise.sleep_or_stop(stop, self._k8s.pool_interval):
                    return
        finally:
            kubernetes_api.close_client(self._api_client)

    async def keep(self) -> None:
        """One look at every pool."""
        forecast = self._settings.forecast
        async with self._db.connection() as conn:
            await conn.execute(QUERIES["pool_runners_done"], {"cluster": self._cluster})
            demand = await read_forecast(
                conn, now=self._clock.now(), stale_after=forecast.stale_after, api_window=forecast.api_window
            )
        for pool in self._k8s.warm_pools:
            await self._keep(pool, demand)

    async def _keep(self, pool: WarmPoolSettings, demand: Forecast) -> None:
        params = {"cluster": self._cluster, "pool": pool.name}
        async with self._db.connection() as conn:
            silent = await fetch_values(
                conn,
                QUERIES["pool_runners_silent"],
                {**params, "start": self._k8s.pool_start_seconds, "silent": self._k8s.pool_silent_seconds},
                str,
            )
            size = await fetch_one(conn, QUERIES["pool_size"], {**params, "memory_mb": pool.memory_mb}, PoolSize)
        for name in silent:
            self.replaced += 1
            log.info("pool pod silent; replacing it", extra={"pod": name, "pool": pool.name})
            await kubernetes_api.delete_pod(self._policy, self._core, self._k8s, name)
        assert size is not None
        plan = plan_pool(
            demand,
            lambda kind: fits_pool(pool, self._settings, kind),
            now=self._clock.now(),
            lead=self._k8s.pool_lead_seconds,
            idle=size.idle,
            queued=size.queued,
            min_size=pool.min_size,
            max_size=pool.max_size,
            create_rate=self.create_rate,
            horizon_minutes=self._settings.forecast.minutes,
            room=None
            if self._k8s.capacity <= 0 or self._active_pods is None
            else self._k8s.capacity - self._active_pods(),
        )
        self.plans[pool.name] = plan
        record_plan(plan, pool=pool.name, cluster=self._cluster, idle=size.idle)
        target = plan.target
        if size.idle > target:
            async with self._db.connection() as conn:
                retire = {**params, "count": size.idle - target}
                retired = await fetch_values(conn, QUERIES["pool_runners_retire"], retire, str)
            for name in retired:
                await kubernetes_api.delete_pod(self._policy, self._core, self._k8s, name)
        missing = min(target - size.idle, self._k8s.pool_creates_per_pass)
        if missing > 0:
            started = time.monotonic()
            await asyncio.gather(*(self._create(pool) for _ in range(missing)))
            if missing == self._k8s.pool_creates_per_pass:  # a full pass: the rate this cluster gives
                took = max(time.monotonic() - started, self._k8s.pool_interval)
                self.create_rate = 0.5 * self.create_rate + 0.5 * missing / took

    async def _create(self, pool: WarmPoolSettings) -> None:
        """A pool Pod: its row (the runner API knows its token), its Secret, the Pod; the Pod owns the Secret."""
        name = f"runplane-pool-{pool.name}-{secrets.token_hex(4)}"
        token = new_run_token()
        labels = {
            MANAGED_BY: MANAGER,
            "app.kubernetes.io/name": "runplane-runner",
            POOL: pool.name,
            CLUSTER: self._cluster,
        }
        runner = self._settings.runner
        pod = runner_pod(
            name,
            labels,
            ["--pool"],
            self._k8s,
            image=pool_image(pool, self._settings),
            memory_mb=pool.memory_mb,
            cancel_grace=runner.interrupt_grace + runner.cancel_grace,
            runner_api_address=runner.api_address,
            repositories=self._settings.repositories,
        )
        async with self._db.connection() as conn:
            await conn.execute(
                QUERIES["pool_runner_created"],
                {"name": name, "cluster": self._cluster, "pool": pool.name, "token_hash": token_hash(token)},
            )
        try:
            secret = token_secret(name, labels, token, self._k8s)
            create_secret, create_pod = self._core.create_namespaced_secret, self._core.create_namespaced_pod
            await kubernetes_api.in_namespace(self._policy, self._k8s, "create secret", create_secret, body=secret)
            created = await kubernetes_api.in_namespace(self._policy, self._k8s, "create pod", create_pod, body=pod)
        except KubernetesApiError:
            async with self._db.connection() as conn:
                await conn.execute(QUERIES["pool_runner_forget"], {"name": name})
            raise
        self.created += 1
        await kubernetes_api.give_secret_to_pod(self._policy, self._core, self._k8s, name, created)
        log.info("pool pod created", extra={"pod": name, "pool": pool.name})


class PooledLauncher:
    """The ``kubernetes`` launcher with warm pools: a waiting pool Pod when one fits, else a cold Pod."""

    name = "kubernetes"

    def __init__(
        self,
        settings: Settings,
        db: AsyncConnectionPool[Connection],
        cold: KubernetesLauncher,
        *,
        configuration: kubernetes.client.Configuration | None = None,
    ) -> None:
        self._settings = settings
        self._k8s = settings.kubernetes
        self._db = db
        self._cold = cold
        config = configuration if configuration is not None else kubernetes_api.configuration(self._k8s)
        self._api_client = kubernetes.client.ApiClient(config)
        self._core = kubernetes.client.CoreV1Api(self._api_client)
        self._policy = CallRetries.from_settings(self._k8s)
        self.warm = 0  # runs given to a pool Pod
        self.cold = 0  # runs that got a Pod of their own

    @property
    def cluster(self) -> str:
        return self._cold.cluster

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        pool = fitting_pool(request, self._settings)
        name = await self._assign(pool, request) if pool is not None else None
        pool_name = pool.name if pool is not None else NO_POOL
        if name is None:
            self.cold += 1
            result = await self._cold.launch(request)  # a launch that fails is counted as a failure, not here
            record_launch(pool=pool_name, cluster=self.cluster, warm=False)
            return result
        self.warm += 1
        record_launch(pool=pool_name, cluster=self.cluster, warm=True)
        fields = {"run_id": request.run_id, "job_id": request.job_id, "account_id": request.account_id, "pod": name}
        log.info("run given to a pool pod", extra=fields)
        try:  # the run's labels: the Pod watcher now reconciles this Pod with the run
            labels = {"metadata": {"labels": run_labels(request, self.cluster)}}
            await kubernetes_api.in_namespace(
                self._policy, self._k8s, "label pod", self._core.patch_namespaced_pod, name=name, body=labels
            )
        except KubernetesApiError as exc:
            log.warning("pool pod not labelled with its run", extra={**fields, "error": str(exc)})
        return LaunchResult(cluster=self.cluster, pod_name=name, warm=True)

    async def _assign(self, pool: WarmPoolSettings, request: LaunchRequest) -> str | None:
        params = {
            "cluster": self.cluster,
            "pool": pool.name,
            "run_id": request.run_id,
            "attempt": request.attempt,
            "silent": self._k8s.pool_silent_seconds,
        }
        try:
            async with self._db.connection() as conn:
                return await fetch_value(conn, QUERIES["assign_pool_runner"], params, str)
        except ServiceUnavailable as exc:
            log.warning("pool not reachable; a cold pod instead", extra={"run_id": request.run_id, "error": str(exc)})
            return None

    async def delete_pod(self, name: str) -> bool:
        return await self._cold.delete_pod(name)

    async def close(self) -> None:
        kubernetes_api.close_client(self._api_client)
        await self._cold.close()
