"""``python -m bench.kubernetes_prep [--runs N]``: prep time and run delay on a real Kubernetes node,
cold Pods and the warm pool side by side.

Needs root and ``make k8s``. One control plane and node (``tests/support/kubernetes_cluster.py``),
the runner image built here, a fresh database, the API (with the runner API on the node's bridge
address) and the real ``Dispatcher`` in this process. Each run is queued (scheduled now), picked up
by the dispatcher (queued → starting, launch), and claimed by its runner through the runner API
(starting → running). From the run's own stamps:

- prep time = started_at − dispatched_at (dispatched → runner claimed);
- run delay = started_at − scheduled_at.

Cold: every run gets a Pod of its own, ``--concurrency`` runs in flight (each its own account). Its
parts: API create (the launcher's calls: token Secret, Pod, owner), scheduling (the call's end → bound
to the node, from a watch), container start (bound → the runner container started, by the node's
dockerd: the kubelet noticing, sandbox, volumes, container), runner start (container started → the
claim: Python's start, imports, the call). The kubelet's own status reaches the API seconds late
under churn (its API rate limit), so it is not used.

Warm: the dispatcher keeps a pool (``--pool`` Pods); runs come one at a time, each once a pool Pod is
waiting, so every run meets a waiting Pod (how fast the pool refills is not what is measured).

Prints a table and writes ``bench/results/kubernetes_prep.json``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from api.process import start_server
from bench.dispatch_throughput import clean_prefix
from bench.kubernetes_pods import IMAGES, NAMESPACE, Watch, cluster, percentile, write_figures
from bench.sandbox import temporary_database, unique_name
from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.outcomes import PostgresPodOutcomes
from dispatcher.kubernetes.pool import PooledLauncher, WarmPools
from dispatcher.kubernetes.watch import PodWatcher
from dispatcher.launcher import Launcher, LaunchRequest, LaunchResult
from dispatcher.service import Dispatcher
from runplane.adapters.db import Connection, fetch_one, open_pool
from runplane.adapters.locks import RedisAccountLocks
from runplane.basics.settings import (
    ApiSettings,
    DispatcherSettings,
    KubernetesSettings,
    RunnerSettings,
    Settings,
    WarmPoolSettings,
)
from runplane.basics.types import AccountId
from tests.support.kubernetes_cluster import ControlPlane, Node
from tests.support.ports import free_port

MEMORY_MB = 256
CLAIM_TIMEOUT = 240.0


@dataclass
class Timed:
    """The launcher's calls per run, in wall-clock seconds: (began, returned)."""

    inner: Launcher
    name: str = "kubernetes"
    calls: dict[int, tuple[float, float]] = field(default_factory=dict)

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        began = time.time()
        result = await self.inner.launch(request)
        self.calls[request.run_id] = (began, time.time())
        return result

    async def close(self) -> None:
        await self.inner.close()


@dataclass(frozen=True)
class Stamps:
    """A run's stamps (epoch seconds); ``started`` None until its runner claimed it."""

    scheduled: float
    dispatched: float | None
    started: float | None
    pod_name: str


@dataclass(frozen=True)
class Created:
    id: int


@dataclass(frozen=True)
class Count:
    n: int


def _settings(database_url: str, node: Node, image: str, pools: list[WarmPoolSettings]) -> Settings:
    runner_port = free_port()
    prefix = unique_name("rpkprep")
    return Settings(
        database_url=database_url,
        bus_prefix=prefix,
        redis_prefix=prefix,
        log_level="WARNING",
        api=ApiSettings(host=node.host_ip, port=0, runner_port=runner_port, rest_port=-1),
        runner=RunnerSettings(api_address=f"{node.host_ip}:{runner_port}"),
        dispatcher=DispatcherSettings(launcher="kubernetes", cluster="bench"),
        kubernetes=KubernetesSettings(
            namespace=NAMESPACE,
            image=image,
            image_pull_policy="Never",
            cpu_request="10m",
            pod_retention_seconds=5.0,
            sweep_interval=0.5,
            orphan_grace_seconds=1.0,
            warm_pools=pools,
            pool_interval=0.2,
        ),
    )


async def _account(db: AsyncConnectionPool[Connection]) -> AccountId:
    async with db.connection() as conn:
        account = await fetch_one(
            conn,
            "INSERT INTO accounts (name, run_slots, memory_mb) VALUES ('bench', 1000, %(memory)s) RETURNING id",
            {"memory": MEMORY_MB},
            Created,
        )
    assert account is not None
    return AccountId(account.id)


async def _one_run(db: AsyncConnectionPool[Connection], dispatcher: Dispatcher, account: AccountId) -> Stamps:
    """Queue a run (of a job of its own: serial execution holds nothing back), dispatch it, and wait until
    its runner claimed it."""
    async with db.connection() as conn:
        job = await fetch_one(
            conn,
            "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%(account)s, 'prep', 'deploy', ARRAY['true'])"
            " RETURNING id",
            {"account": account},
            Created,
        )
        assert job is not None
        run = await fetch_one(
            conn,
            """INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, status,
                                 scheduled_at)
               VALUES (%(account)s, %(job)s, 'deploy', 'api', gen_random_uuid()::text, true, 1, clock_timestamp())
               RETURNING id""",
            {"account": account, "job": job.id},
            Created,
        )
    assert run is not None
    await dispatcher.dispatch([AccountId(account)])
    deadline = time.monotonic() + CLAIM_TIMEOUT
    while time.monotonic() < deadline:
        async with db.connection() as conn:
            stamps = await fetch_one(
                conn,
                "SELECT extract(epoch FROM scheduled_at)::float8 AS scheduled,"
                " extract(epoch FROM dispatched_at)::float8 AS dispatched,"
                " extract(epoch FROM started_at)::float8 AS started, pod_name FROM runs WHERE id = %(id)s",
                {"id": run.id},
                Stamps,
            )
        if stamps is not None and stamps.started is not None:
            return stamps
        await asyncio.sleep(0.02)
    raise TimeoutError(f"run {run.id} not claimed within {CLAIM_TIMEOUT:.0f} s")


def _prep(stamps: Stamps) -> float:
    assert stamps.started is not None and stamps.dispatched is not None
    return stamps.started - stamps.dispatched


def _delay(stamps: Stamps) -> float:
    assert stamps.started is not None
    return stamps.started - stamps.scheduled


def _summary(prefix: str, values: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_p50_s": percentile(values, 50),
        f"{prefix}_p99_s": percentile(values, 99),
        f"{prefix}_max_s": max(values),
    }


async def _with_system(
    settings: Settings,
    plane: ControlPlane,
    make_launcher: Callable[[AsyncConnectionPool[Connection]], Launcher],
    measure: Callable[[AsyncConnectionPool[Connection], Dispatcher], Awaitable[dict[str, Any]]],
    *,
    pools: bool,
) -> dict[str, Any]:
    """The API, the Pod watcher (and the warm pools) and a dispatcher, around ``measure``."""
    db = await open_pool(settings.database_url, max_size=8)
    launcher = make_launcher(db)
    api = await start_server(settings, port=0)
    locks = RedisAccountLocks.from_url(settings.redis_url, prefix=settings.redis_prefix, ttl_ms=10_000)
    stop = asyncio.Event()
    watcher = PodWatcher(settings, PostgresPodOutcomes(db, settings), configuration=plane.configuration())
    tasks = [asyncio.create_task(watcher.run(stop), name="bench:pod-watcher")]
    if pools:
        keeper = WarmPools(settings, db, configuration=plane.configuration())
        tasks.append(asyncio.create_task(keeper.run(stop), name="bench:warm-pools"))
    try:
        dispatcher = Dispatcher(settings, db, None, locks, launcher, dispatcher_id="bench")
        return await measure(db, dispatcher)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await launcher.close()
        await locks.close()
        await api.stop(0)
        await db.close()
        await clean_prefix(settings.amqp_url, settings.bus_prefix)  # the API's Pickups declared its queue


def _container_started_at(node: Node, pod_name: str) -> float | None:
    """When the runner container of ``pod_name`` started, by the node's dockerd (epoch seconds)."""
    found = node.docker(
        "ps", "-a", "-q", "--filter", f"label=io.kubernetes.pod.name={pod_name}",
        "--filter", "label=io.kubernetes.container.name=runner",
    ).split()  # fmt: skip
    if not found:
        return None
    stamp = node.docker("inspect", "-f", "{{.State.StartedAt}}", found[0]).strip()
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{fraction[:6] or '0'}+00:00").timestamp()


async def cold(plane: ControlPlane, node: Node, settings: Settings, runs: int, concurrency: int) -> dict[str, Any]:
    timed = Timed(KubernetesLauncher(settings, configuration=plane.configuration()))
    watch = Watch(plane)  # the scheduler's binding reaches the API at once (a kubelet's status may lag)
    offset = time.time() - time.monotonic()  # the watch's monotonic marks onto the wall clock

    async def measure(db: AsyncConnectionPool[Connection], dispatcher: Dispatcher) -> dict[str, Any]:
        samples: list[tuple[Stamps, float | None]] = []
        queue = list(range(runs))

        async def worker() -> None:
            account = await _account(db)
            while queue:
                queue.pop()
                stamps = await _one_run(db, dispatcher, account)
                samples.append((stamps, await asyncio.to_thread(_container_started_at, node, stamps.pod_name)))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        parts: dict[str, list[float]] = {"api_create": [], "scheduling": [], "container_start": [], "runner_start": []}
        by_pod = {f"runplane-run-{run_id}-1": call for run_id, call in timed.calls.items()}
        for stamps, container_started in samples:
            marks = watch.marks(stamps.pod_name)
            call = by_pod.get(stamps.pod_name)
            if call is None or "scheduled" not in marks or container_started is None or stamps.started is None:
                continue
            scheduled = max(call[1], marks["scheduled"] + offset)  # bound while the call's last request ran
            parts["api_create"].append(call[1] - call[0])
            parts["scheduling"].append(scheduled - call[1])
            parts["container_start"].append(container_started - scheduled)
            parts["runner_start"].append(stamps.started - container_started)
        figures: dict[str, Any] = {"cold_runs": len(samples), "cold_concurrency": concurrency}
        figures |= _summary("cold_prep", [_prep(s) for s, _ in samples])
        figures |= _summary("cold_delay", [_delay(s) for s, _ in samples])
        figures["cold_parts_measured"] = len(parts["api_create"])
        for part, values in parts.items():
            figures |= {f"cold_{part}_p50_s": percentile(values, 50), f"cold_{part}_mean_s": statistics.fmean(values)}
        return figures

    try:
        return await _with_system(settings, plane, lambda _: timed, measure, pools=False)
    finally:
        watch.close()


async def warm(plane: ControlPlane, settings: Settings, runs: int) -> dict[str, Any]:
    config = plane.configuration()

    def pooled(db: AsyncConnectionPool[Connection]) -> Launcher:
        return PooledLauncher(settings, db, KubernetesLauncher(settings, configuration=config), configuration=config)

    async def measure(db: AsyncConnectionPool[Connection], dispatcher: Dispatcher) -> dict[str, Any]:
        account = await _account(db)
        samples: list[Stamps] = []
        for _ in range(runs):
            await _pool_pod_waiting(db)
            samples.append(await _one_run(db, dispatcher, account))
        figures: dict[str, Any] = {
            "warm_runs": len(samples),
            "warm_runs_in_pool_pods": sum(1 for s in samples if s.pod_name.startswith("runplane-pool-")),
        }
        figures |= _summary("warm_prep", [_prep(s) for s in samples])
        figures |= _summary("warm_delay", [_delay(s) for s in samples])
        return figures

    return await _with_system(settings, plane, pooled, measure, pools=True)


async def _pool_pod_waiting(db: AsyncConnectionPool[Connection]) -> None:
    deadline = time.monotonic() + CLAIM_TIMEOUT
    while time.monotonic() < deadline:
        async with db.connection() as conn:
            row = await fetch_one(
                conn,
                "SELECT count(*) AS n FROM pool_runners"
                " WHERE assigned_at IS NULL AND seen_at > clock_timestamp() - interval '5 seconds'",
                {},
                Count,
            )
        if row is not None and row.n > 0:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("no pool Pod waiting")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kubernetes_prep", description=__doc__)
    parser.add_argument("--runs", type=int, default=100, help="runs of each kind")
    parser.add_argument("--concurrency", type=int, default=3, help="cold runs in flight")
    parser.add_argument("--pool", type=int, default=4, help="waiting Pods the warm pool keeps")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    with temporary_database() as database_url, cluster(with_node=True) as (plane, node):
        assert node is not None
        env = {**os.environ, "DOCKER_HOST": node.docker_host}
        image = subprocess.run([str(IMAGES)], env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
        pool = WarmPoolSettings(name="bench", memory_mb=MEMORY_MB, min_size=args.pool, max_size=args.pool)
        figures |= asyncio.run(cold(plane, node, _settings(database_url, node, image, []), args.runs, args.concurrency))
        figures |= asyncio.run(warm(plane, _settings(database_url, node, image, [pool]), args.runs))
    figures["load_average_after"] = os.getloadavg()[0]
    write_figures("kubernetes_prep.json", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
