"""Two clusters, a dispatcher process each, one pickup queue: a burst is split by what each cluster's
dispatcher measures it can create, a cluster that stalls hands the rest to the other, and no run gets
two Pods.

Two real kube-apiservers. East's dispatcher reaches its API server through a TCP proxy in this test,
which delays every chunk (a slow API: fewer Pods created per second) or goes silent (a stalled API).
The Pods ask for a node label no node has, so they stay pending: each Pod is one launch, counted
across both API servers by the run its name carries (``runplane-run-<run>-<attempt>``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from runplane.adapters.bus import AmqpBus, Topology
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from runplane.runs.pickups import send_pickups
from tests.support.kubernetes_cluster import ControlPlane, Rest
from tests.support.polling import eventually
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run
from tests.support.stalling_proxy import StallingProxy
from tests.support.two_clusters import TwoClusters

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Clusters(TwoClusters):
    services: Services
    proxy: StallingProxy  # east's API server is reached through it
    kubeconfig: Path  # east's, through the proxy

    def start_dispatchers(self, **env: str) -> None:
        for name, kubeconfig in (("east", self.kubeconfig), ("west", self.west.kubeconfig)):
            self.services.start(
                "dispatcher",
                name=f"dispatcher-{name}",
                RUNPLANE_DISPATCHER__LAUNCHER="kubernetes",
                RUNPLANE_DISPATCHER__CLUSTER=name,
                RUNPLANE_KUBERNETES__KUBECONFIG=str(kubeconfig),
                RUNPLANE_KUBERNETES__NAMESPACE=self.namespace,
                RUNPLANE_KUBERNETES__IMAGE="local/busybox:1",
                RUNPLANE_KUBERNETES__NODE_SELECTOR='{"runplane.dev/test-node": "none"}',
                **env,
            )

    async def burst(self, db: Conn, accounts: int, runs_each: int) -> list[int]:
        """Queue the runs of new accounts, then send one Pickup naming them all (as a queuer's tick does)."""
        ids = []
        account_ids = [create_account(db, run_slots=runs_each, memory_mb=64) for _ in range(accounts)]
        for account in account_ids:
            ids += [queue_run(db, create_job(db, account, name=f"job {i}")) for i in range(runs_each)]
        bus = await AmqpBus.connect(self.settings.amqp_url)
        try:
            await send_pickups(bus, Topology(self.settings.bus_prefix), account_ids, source="queuer")
        finally:
            await bus.close()
        return ids

    async def all_launched(self, ids: list[int], timeout: float) -> list[tuple[int, int, str, str]]:
        return await eventually(
            lambda: asyncio.to_thread(self.runs),
            timeout,
            until=lambda runs: sorted(r[0] for r in runs if r[1] == RunStatus.STARTING and r[3]) == sorted(ids),
            what="every run launched in one cluster or the other",
        )


def pods_per_run(names: list[str]) -> Counter[int]:
    """Pods by the run their name carries: ``runplane-run-<run>-<attempt>``."""
    return Counter(int(name.split("-")[2]) for name in names)


@pytest.fixture
async def clusters(
    settings: Settings,
    services: Services,
    second_control_plane: ControlPlane,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> AsyncIterator[Clusters]:
    east, west = second_control_plane, control_plane
    namespace = f"runs-{uuid.uuid4().hex[:10]}"
    for plane in (east, west):
        rest: Rest = plane.rest()
        rest.post("/api/v1/namespaces", {"metadata": {"name": namespace}})
        rest.close()
    proxy = StallingProxy(east.url.removeprefix("https://"))
    await proxy.start()
    kubeconfig = east.write_kubeconfig(
        tmp_path / "east-kubeconfig", east.admin_token, server=f"https://{proxy.address}"
    )
    services.with_api = False  # no Pod runs here: nothing calls the runner API
    services.env.update(
        RUNPLANE_SCHEDULER__START_TIMEOUT="600",  # Pods stay pending: no reaping here
        RUNPLANE_KUBERNETES__INTAKE_HORIZON="1",
        RUNPLANE_KUBERNETES__HEALTH_INTERVAL="0.5",
        RUNPLANE_KUBERNETES__HEALTH_FAILURES="2",
        RUNPLANE_KUBERNETES__API_ATTEMPTS="1",
        RUNPLANE_KUBERNETES__REQUEST_TIMEOUT="5",
        RUNPLANE_KUBERNETES__SWEEP_INTERVAL="1",
        RUNPLANE_KUBERNETES__WATCH_TIMEOUT_SECONDS="5",  # a watch that went silent with the stall ends soon
        RUNPLANE_SCHEDULER__LAUNCH_ATTEMPTS="10",
        RUNPLANE_SCHEDULER__LAUNCH_BACKOFF="0.5",
    )
    try:
        services.start("scheduler")  # sends the Pickups of runs a failed launch put back in the queue
        yield Clusters(settings=settings, east=east, west=west, namespace=namespace, services=services, proxy=proxy,
                       kubeconfig=kubeconfig)  # fmt: skip
    finally:
        services.stop_all()
        await proxy.close()
        for plane in (east, west):
            rest = plane.rest()
            rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
            rest.delete(f"/api/v1/namespaces/{namespace}")
            rest.close()


async def test_a_burst_is_split_by_each_clusters_create_rate_and_no_run_gets_two_pods(
    clusters: Clusters, db: Conn
) -> None:
    clusters.proxy.delay = 0.15  # east's API answers slowly: its dispatcher creates fewer Pods a second
    # The same allowance for both (10 Pods/s, so 10 runs a batch until measured): only the measured rates differ.
    clusters.start_dispatchers(RUNPLANE_KUBERNETES__POD_CREATES_PER_SECOND="10")
    await eventually(lambda: asyncio.to_thread(lambda: clusters.services.log_text("dispatcher-west")), 30,
                     until=lambda text: "dispatcher ready" in text, what="the west dispatcher")  # fmt: skip
    ids = await clusters.burst(db, accounts=50, runs_each=3)

    final = await clusters.all_launched(ids, 240)
    took = Counter(r[2] for r in final)
    # East took more than its first batch (10, from the allowance): it came back for what its measured
    # rate let it start, while the faster cluster took most of the burst.
    assert took["east"] > 10, took
    assert took["west"] >= 2 * took["east"], took
    east, west = (
        await asyncio.to_thread(clusters.pods, clusters.east),
        await asyncio.to_thread(clusters.pods, clusters.west),
    )
    assert sorted(east) == sorted(r[3] for r in final if r[2] == "east")
    assert sorted(west) == sorted(r[3] for r in final if r[2] == "west")
    assert set((pods_per_run(east) + pods_per_run(west)).values()) == {1}  # no run got a Pod twice


async def test_a_cluster_that_stalls_hands_the_burst_to_the_other_and_no_run_gets_two_pods(
    clusters: Clusters, db: Conn
) -> None:
    clusters.proxy.delay = 0.05  # a batch of east's launches takes a while: some are in flight when it stalls
    clusters.start_dispatchers(RUNPLANE_KUBERNETES__POD_CREATES_PER_SECOND="10")
    await eventually(lambda: asyncio.to_thread(lambda: clusters.services.log_text("dispatcher-east")), 30,
                     until=lambda text: "dispatcher ready" in text, what="the east dispatcher")  # fmt: skip
    ids = await clusters.burst(db, accounts=20, runs_each=3)
    await eventually(lambda: asyncio.to_thread(clusters.pods, clusters.east), 60, until=bool, what="east's first Pod")
    clusters.proxy.stall(later_too=True)  # east's API goes silent mid-burst: its launches time out

    final = await clusters.all_launched(ids, 240)
    took = Counter(r[2] for r in final)
    assert took["west"] > 2 * took["east"], took  # west took the burst
    with psycopg.connect(clusters.settings.database_url, autocommit=True) as conn:
        handed_over = conn.execute(
            "SELECT count(*) FROM runs WHERE cluster = 'west' AND launch_attempts > 1"
        ).fetchone()
    assert handed_over is not None and int(str(handed_over[0])) > 0  # runs east held when it stalled went to west

    # Pods of launches: one per run's current launch, in the cluster the run names. A Pod east created
    # while its answer was lost (an earlier launch of a run west has now) cannot claim its run: the
    # relaunch issued the run a new token. The Pod watcher removes it once the run is claimed.
    clusters.proxy.forward_later()
    east, west = (
        await asyncio.to_thread(clusters.pods, clusters.east),
        await asyncio.to_thread(clusters.pods, clusters.west),
    )
    current = {r[3] for r in final}
    assert sorted(name for name in east if name in current) == sorted(r[3] for r in final if r[2] == "east")
    assert sorted(name for name in west if name in current) == sorted(r[3] for r in final if r[2] == "west")
    assert set(pods_per_run([name for name in east + west if name in current]).values()) == {1}
    with psycopg.connect(clusters.settings.database_url, autocommit=True) as conn:
        attempts = {int(str(r[0])): int(str(r[1])) for r in conn.execute("SELECT id, launch_attempts FROM runs")}
    earlier = [name for name in east + west if name not in current]
    assert all(int(name.split("-")[3]) < attempts[int(name.split("-")[2])] for name in earlier), earlier
