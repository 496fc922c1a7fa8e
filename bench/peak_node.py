"""The node part of ``python -m bench.peak``: a peak of as many runs as the real test node holds, with
no pool (cold), a warm pool sized from the queue (reactive) and the same pool sized from the
forecast (forecast-warmed), one after the other in one invocation on the same control plane and node.

The system is ``bench.kubernetes_prep``'s: the API (runner API on the node's bridge address), the Pod
watcher, the warm pools and the real ``Dispatcher`` in this process. At the due second the queuer's
code queues the tick and the dispatcher is handed its accounts (what a Pickup does).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

import kubernetes.client
import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.kubernetes_pods import IMAGES, NAMESPACE, cluster
from bench.kubernetes_prep import MEMORY_MB, _settings, _with_system
from bench.peak import _seed, announce, ceiling, due_minute, fire_tick, forecast_until, run_figures, wait_until_claimed
from bench.sandbox import temporary_database
from dispatcher.kubernetes.api import close_client
from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.pool import PooledLauncher
from dispatcher.launcher import Launcher
from dispatcher.service import Dispatcher
from runplane.adapters.db import Connection
from runplane.basics.settings import WarmPoolSettings
from runplane.basics.types import AccountId
from tests.support.kubernetes_cluster import ControlPlane, Node

NODE_CASES = ("cold", "reactive", "forecast")
POD_CPU_MILLI = 10  # bench.kubernetes_prep's cpu_request
LEAD_SECONDS = 90.0  # on two shared cores a runner Pod takes seconds of CPU to start


def _quantity(value: str) -> float:
    """A Kubernetes quantity (``2``, ``1500m``, ``16302060Ki``) as a number of units (cores, bytes)."""
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in sorted(suffixes.items(), key=lambda item: -len(item[0])):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def node_capacity(plane: ControlPlane) -> dict[str, int]:
    """How many run Pods the node holds: its allocatable Pods less those already there, and its CPU and
    memory over a run Pod's requests."""
    rest = plane.rest()
    try:
        [node] = rest.get("/api/v1/nodes")["items"]
        pods = rest.get("/api/v1/pods")["items"]
    finally:
        rest.close()
    allocatable = node["status"]["allocatable"]
    running = sum(1 for p in pods if p["status"].get("phase") in ("Pending", "Running"))
    by = {
        "pods": int(allocatable["pods"]) - running,
        "cpu": int(_quantity(allocatable["cpu"]) * 1000 // POD_CPU_MILLI),
        "memory": int(_quantity(allocatable["memory"]) // (MEMORY_MB * 2**20)),
    }
    return {**by, "holds": min(by.values())}


def _clear_namespace(plane: ControlPlane, timeout: float = 180.0) -> None:
    """Delete the bench's Pods and wait until they are gone, so each case starts on an empty node."""
    client = kubernetes.client.ApiClient(plane.configuration())
    core = kubernetes.client.CoreV1Api(client)
    try:
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        deadline = time.monotonic() + timeout
        while core.list_namespaced_pod(NAMESPACE).items and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        close_client(client)


async def _case(case: str, plane: ControlPlane, node: Node, image: str, *, n: int, timeout: float) -> dict[str, Any]:
    with temporary_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            job_ids = _seed(conn, n, MEMORY_MB)
            conn.execute("UPDATE accounts SET run_slots = %s", (n,))
        pools = [] if case == "cold" else [WarmPoolSettings(name="peak", memory_mb=MEMORY_MB, min_size=1, max_size=n)]
        base = _settings(url, node, image, pools)
        settings = base.model_copy(
            update={"kubernetes": base.kubernetes.model_copy(update={"pool_lead_seconds": LEAD_SECONDS})}
        )
        config = plane.configuration()
        cold = KubernetesLauncher(settings, configuration=config)

        def launcher(db: AsyncConnectionPool[Connection]) -> Launcher:
            return cold if case == "cold" else PooledLauncher(settings, db, cold, configuration=config)

        async def measure(_db: AsyncConnectionPool[Connection], dispatcher: Dispatcher) -> dict[str, Any]:
            fire = due_minute(LEAD_SECONDS)
            forecast = asyncio.create_task(forecast_until(settings, url, job_ids, fire)) if case == "forecast" else None
            accounts = await fire_tick(settings, url, job_ids, fire, pickups=False)
            await dispatcher.dispatch([AccountId(a) for a in sorted(set(accounts))])
            if forecast is not None:
                await forecast
            with psycopg.connect(url, autocommit=True) as conn:
                await asyncio.to_thread(wait_until_claimed, conn, n, timeout)
                figures = run_figures(conn)
                warm = conn.execute("SELECT count(*) FROM runs WHERE pod_name LIKE 'runplane-pool-%'").fetchone()
            return {**figures, "served_warm": round(int(str(warm[0] if warm else 0)) / n, 4)}

        try:
            figures = await _with_system(settings, plane, launcher, measure, pools=case != "cold")
        finally:
            await asyncio.to_thread(_clear_namespace, plane)
    return {"case": case, "n": n, **figures, "load_average": [round(x, 2) for x in os.getloadavg()]}


def node(n: int | None, cases: list[str] | None, timeout: float) -> dict[str, Any]:
    results: dict[str, Any] = {"part": "node", "lead_seconds": LEAD_SECONDS, **ceiling()}
    with cluster(with_node=True) as (plane, found):
        assert found is not None
        env = {**os.environ, "DOCKER_HOST": found.docker_host}
        image = subprocess.run([str(IMAGES)], env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
        capacity = node_capacity(plane)
        results["node_capacity"] = capacity
        size = n if n is not None else capacity["holds"]
        results["cases"] = [
            announce(asyncio.run(_case(case, plane, found, image, n=size, timeout=timeout)))
            for case in cases or NODE_CASES
        ]
    return results
