"""The fleet part of ``python -m bench.peak``: a peak over two simulated clusters of hollow nodes.

Two real control planes (``tests/support/kubernetes_cluster.py``), each with kube-scheduler and
``--nodes`` kubemark hollow nodes (``tests/support/hollow_fleet.py``: the real kubelet on a fake
runtime, so every Pod it is given "runs" at once). runplane's own processes drive them: the
scheduler loop and one ``kubernetes`` dispatcher per cluster, both consuming the same pickup queue,
each stopping at its cluster's capacity (``kubernetes.capacity``, the fleet's Pods). At the due
second the queuer's own code queues the N runs and sends their Pickups (``bench.peak.fire_tick``).

A hollow node runs no runner, so the bench claims for it: a watch of each cluster's Pods sees a
run's container running and, within ``CLAIM_INTERVAL``, moves the run starting → running, as its
runner's claim would (the same compare-and-set as ``claim_run``, without the token a real runner
holds, and with a lease that outlasts the bench). Prep time is then dispatched → Running as the
watch saw it, plus that interval.

A hollow node has 1 core, 3.75 GiB and 110 Pods (kubemark's fake cAdvisor), so a run Pod here asks for
5m of CPU and 32 MiB: a node holds 110. Reports what ``bench.peak`` reports for a case, plus Pod
create → Running (from the watch) and the runs each cluster took.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.dispatch_throughput import Processes, _cleanup_prefix, _env, _wait_for_dispatchers
from bench.kubernetes_pods import NAMESPACE, Watch, percentile
from bench.peak import _seed, announce, ceiling, due_minute, fire_tick, run_figures, wait_until_claimed
from bench.sandbox import temporary_database
from dispatcher.kubernetes.pods import RUN_ID
from runplane.basics.settings import Settings
from tests.support.hollow_fleet import HollowFleet
from tests.support.kubernetes_cluster import ControlPlane

CLUSTERS = ("fleet-a", "fleet-b")
MEMORY_MB = 32
CPU_REQUEST = "5m"
PODS_PER_NODE = 110  # kubemark's hollow kubelet: maxPods
LEAD_SECONDS = 15.0
CLAIM_INTERVAL = 0.1
LEASE_SECONDS = 3600

# claim_run's compare-and-set (transitions.sql) for runs whose Pod the watch saw Running.
CLAIM = """UPDATE runs SET status = 3, started_at = clock_timestamp(), lease_owner = 'bench-fleet',
                  lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s),
                  heartbeat_at = clock_timestamp(), waiting_reason = ''
            WHERE id = ANY(%(ids)s) AND status = 2"""


class PodClaims:
    """One cluster's Pods from a watch (``bench.kubernetes_pods.Watch``): the runs of those seen Running,
    handed to ``take`` to be claimed, and each Pod's create → Running."""

    def __init__(self, plane: ControlPlane) -> None:
        self._to_claim: list[int] = []
        self._lock = threading.Lock()
        self._watch = Watch(plane, on_running=self._running)

    def _running(self, pod: dict[str, Any]) -> None:
        run_id = (pod["metadata"].get("labels") or {}).get(RUN_ID)
        if run_id:
            with self._lock:
                self._to_claim.append(int(run_id))

    def take(self) -> list[int]:
        with self._lock:
            taken, self._to_claim = self._to_claim, []
        return taken

    def create_to_running(self) -> list[float]:
        """Seconds from a Pod's first sight to its container seen running, for each Pod seen running."""
        return [marks["running"] - marks["created"] for marks in self._watch.all_marks() if "running" in marks]

    def close(self) -> None:
        self._watch.close()


def _claim_until(url: str, watches: list[PodClaims], stop: threading.Event) -> None:
    """Claim, every ``CLAIM_INTERVAL``, the runs whose Pods were seen Running since the last pass."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(CLAIM_INTERVAL):
            ids = [run_id for watch in watches for run_id in watch.take()]
            if ids:
                conn.execute(CLAIM, {"ids": ids, "lease": LEASE_SECONDS})


def _fleet_memory_mb(fleets: list[HollowFleet]) -> int:
    """Resident memory of every process the fleets started (hollow nodes and schedulers)."""
    total = 0
    for fleet in fleets:
        for _, proc in fleet.processes.started:
            try:
                total += psutil.Process(proc.pid).memory_info().rss
            except psutil.NoSuchProcess:
                continue
    return total // 2**20


def _wait_until_claimed(
    conn: psycopg.Connection[Any], n: int, timeout: float, planes: list[ControlPlane], fleets: list[HollowFleet]
) -> None:
    """``bench.peak.wait_until_claimed``, failing at once when a process of a cluster has ended."""
    deadline = time.monotonic() + timeout
    while not wait_until_claimed(conn, n, min(5.0, max(0.0, deadline - time.monotonic()))):
        for processes in [plane.processes for plane in planes] + [fleet.processes for fleet in fleets]:
            processes.check_alive()
        if time.monotonic() >= deadline:
            return


def _case(planes: list[ControlPlane], fleets: list[HollowFleet], n: int, timeout: float) -> dict[str, Any]:
    base = Settings()
    prefix = f"bfleet{uuid.uuid4().hex[:10]}"
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        with psycopg.connect(url, autocommit=True) as conn:
            job_ids = _seed(conn, n, MEMORY_MB)
        env = _env(base, url, prefix, "kubernetes")
        env.update(
            RUNPLANE_KUBERNETES__NAMESPACE=NAMESPACE,
            RUNPLANE_KUBERNETES__IMAGE="local/busybox:1",  # a hollow node runs any image
            RUNPLANE_KUBERNETES__CPU_REQUEST=CPU_REQUEST,
            RUNPLANE_KUBERNETES__CAPACITY=str(len(fleets[0].names) * PODS_PER_NODE),
            # A run whose Pod is slow to run is not relaunched while the bench waits for it: a relaunch
            # deletes and creates Pods in the middle of the peak, more load on the API servers measured.
            RUNPLANE_SCHEDULER__START_TIMEOUT=str(timeout),
        )
        settings = base.model_copy(update={"database_url": url, "bus_prefix": prefix, "redis_prefix": prefix})
        processes = Processes(env, Path(logs))
        watches = [PodClaims(plane) for plane in planes]
        stop = threading.Event()
        claimer = threading.Thread(target=_claim_until, args=(url, watches, stop), name="bench-fleet-claims")
        try:
            processes.start("scheduler", "scheduler")
            for cluster, plane, fleet in zip(CLUSTERS, planes, fleets, strict=True):
                processes.start(
                    "dispatcher",
                    f"dispatcher-{cluster}",
                    RUNPLANE_DISPATCHER__CLUSTER=cluster,
                    RUNPLANE_KUBERNETES__KUBECONFIG=str(plane.kubeconfig),
                    RUNPLANE_KUBERNETES__NODE_SELECTOR=json.dumps(fleet.selector),
                )
            _wait_for_dispatchers(url, len(CLUSTERS))
            claimer.start()
            fire = due_minute(LEAD_SECONDS)
            asyncio.run(fire_tick(settings, url, job_ids, fire))
            with psycopg.connect(url, autocommit=True) as conn:
                _wait_until_claimed(conn, n, timeout, planes, fleets)
                figures = run_figures(conn)
                rows = conn.execute("SELECT cluster, count(*) FROM runs GROUP BY 1 ORDER BY 1").fetchall()
                by_cluster = {str(cluster or "none"): int(count) for cluster, count in rows}
        finally:
            stop.set()
            if claimer.is_alive():
                claimer.join()
            for watch in watches:
                watch.close()
            processes.stop()
            _cleanup_prefix(base, prefix)
    running = [value for watch in watches for value in watch.create_to_running()]
    return {
        "case": "cold",
        "n": n,
        **figures,
        "pod_running_p50_s": round(percentile(running, 50), 3) if running else None,
        "pod_running_p99_s": round(percentile(running, 99), 3) if running else None,
        "pod_running_max_s": round(max(running), 3) if running else None,
        "pods_running": len(running),
        "runs_by_cluster": by_cluster,
        "served_warm": 0.0,
        "fleet_memory_mb": _fleet_memory_mb(fleets),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def fleet(n: int, nodes: int, timeout: float) -> dict[str, Any]:
    """Two control planes of ``nodes`` hollow nodes each; one peak of ``n`` runs over them."""
    results: dict[str, Any] = {"part": "fleet", "clusters": len(CLUSTERS), "nodes_per_cluster": nodes, **ceiling()}
    planes: list[ControlPlane] = []
    fleets: list[HollowFleet] = []
    try:
        began = time.monotonic()
        for cluster in CLUSTERS:
            plane = ControlPlane.start()
            planes.append(plane)
            rest = plane.rest()
            rest.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            rest.close()
            fleets.append(HollowFleet.start(plane, nodes, prefix=cluster))
        results["fleet_start_s"] = round(time.monotonic() - began, 1)
        results["cases"] = [announce(_case(planes, fleets, n, timeout))]
    finally:
        for started in fleets:
            started.stop()
        for plane in planes:
            plane.stop()
    return results
