"""Warm pools against the real API server and Postgres: the pool's size follows the queue between its
minimum and maximum, and Pods that never call the runner API are replaced.

No node: pool Pods stay pending, which is all sizing needs (a Pod not given a run counts as idle
whether it is starting or waiting). Runs in pool Pods on a real node: tests/system/test_kubernetes_pool.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.pods import RUN_ID
from dispatcher.kubernetes.pool import POOL, PooledLauncher, WarmPools
from dispatcher.launcher import LaunchRequest
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings, WarmPoolSettings
from runplane.basics.types import AccountId, JobId, RunId
from runplane.demand.forecast import MINUTE
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, Rest
from tests.support.metrics import counted
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run
from tests.support.wall_clock import FakeClock

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pools(control_plane: ControlPlane, runs_namespace: str, database_url: str) -> AsyncIterator[WarmPools]:
    settings = k8s_settings(
        namespace=runs_namespace,
        image="local/busybox:1",
        warm_pools=[WarmPoolSettings(name="small", memory_mb=256, min_size=1, max_size=3)],
        pool_start_seconds=600,
    ).model_copy(update={"database_url": database_url})
    db = await open_pool(database_url, max_size=2)
    keeper = WarmPools(settings, db, configuration=control_plane.configuration())
    try:
        yield keeper
    finally:
        await db.close()


def pool_pods(kube: Rest, namespace: str) -> list[str]:
    return kube.pod_names(namespace, f"{POOL}=small")


def rows(db: Conn) -> list[str]:
    return [str(r[0]) for r in db.execute("SELECT name FROM pool_runners ORDER BY name").fetchall()]


async def test_the_pool_grows_with_the_queue_up_to_its_maximum_and_shrinks_to_its_minimum(
    pools: WarmPools, kube: Rest, runs_namespace: str, db: Conn
) -> None:
    await pools.keep()
    (oldest,) = pool_pods(kube, runs_namespace)  # the minimum with nothing queued
    fits = create_job(db, create_account(db, memory_mb=256, run_slots=10))
    other = create_job(db, create_account(db, name="big", memory_mb=4096, run_slots=10))
    for _ in range(5):
        queue_run(db, fits)
        queue_run(db, other)  # another memory: not this pool's queue

    await pools.keep()
    grown = pool_pods(kube, runs_namespace)
    assert len(grown) == 3  # five queued runs fit, the maximum is three
    assert rows(db) == grown  # each Pod's token is known to the runner API

    db.execute("UPDATE runs SET status = 30, finished_at = now() WHERE status = 1")  # the queue drains
    await pools.keep()
    (kept,) = rows(db)
    assert kept in grown and kept != oldest  # down to the minimum, the oldest idle Pods retired first
    remaining = pool_pods(kube, runs_namespace)
    pods = kube.get(f"/api/v1/namespaces/{runs_namespace}/pods")["items"]
    deleting = {p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")}
    assert len(set(remaining) - deleting) == 1


def peak_settings(namespace: str, database_url: str, *, min_size: int, max_size: int, **kubernetes: Any) -> Settings:
    """A pool of small Pods (256 MB) between ``min_size`` and ``max_size``."""
    return k8s_settings(
        namespace=namespace,
        image="local/busybox:1",
        warm_pools=[WarmPoolSettings(name="small", memory_mb=256, min_size=min_size, max_size=max_size)],
        pool_start_seconds=600,
        **kubernetes,
    ).model_copy(update={"database_url": database_url})


def forecast(db: Conn, memory_mb: int, minute: int, fires: int) -> None:
    """A queuer worker's forecast of ``fires`` runs of plain commands with ``memory_mb`` in ``minute``."""
    db.execute(
        "INSERT INTO demand_forecast (worker_id, dbt_version, memory_mb, minute, fires) VALUES ('w', '', %s, %s, %s)",
        (memory_mb, minute, fires),
    )


async def test_the_pool_grows_to_the_forecast_a_lead_time_before_the_minute_and_shrinks_after(
    control_plane: ControlPlane, kube: Rest, runs_namespace: str, database_url: str, db: Conn
) -> None:
    peak = 1_900_000_020 // MINUTE * MINUTE  # a minute only the forecast names
    clock = FakeClock(peak - 90)
    settings = peak_settings(
        runs_namespace, database_url, min_size=1, max_size=5, pool_lead_seconds=30, pool_creates_per_pass=10
    )
    for memory_mb, fires in ((256, 4), (4096, 7)):  # the other memory is another pool's kind
        forecast(db, memory_mb, peak, fires)
    pool = await open_pool(database_url, max_size=2)
    keeper = WarmPools(settings, pool, configuration=control_plane.configuration(), wall_clock=clock)
    try:
        await keeper.keep()
        assert len(rows(db)) == 1  # the minimum: the minute is more than the lead time away

        clock.advance_to(peak - 30)
        await keeper.keep()
        assert keeper.plans["small"].forecast == 4 and keeper.plans["small"].lead == 30
        grown = rows(db)
        assert len(grown) == 4 and sorted(pool_pods(kube, runs_namespace)) == grown

        clock.advance_to(peak + 59)  # still the minute: held
        await keeper.keep()
        assert rows(db) == grown

        clock.advance_to(peak + MINUTE)  # the minute is over and nothing is queued
        await keeper.keep()
        assert len(rows(db)) == 1
    finally:
        await pool.close()


async def test_a_run_is_never_given_to_two_pods_while_the_pool_resizes_during_a_peak(
    control_plane: ControlPlane, kube: Rest, runs_namespace: str, database_url: str, db: Conn
) -> None:
    peak = 1_900_000_020 // MINUTE * MINUTE
    clock = FakeClock(peak - 10)
    settings = peak_settings(
        runs_namespace, database_url, min_size=0, max_size=12, pool_creates_per_pass=12, pod_creates_per_second=0
    )
    forecast(db, 256, peak, 12)
    account = create_account(db, memory_mb=256, run_slots=100)
    job = create_job(db, account)
    pool = await open_pool(database_url, max_size=6)
    config = control_plane.configuration()
    keeper = WarmPools(settings, pool, configuration=config, wall_clock=clock)
    launcher = PooledLauncher(settings, pool, KubernetesLauncher(settings, configuration=config), configuration=config)
    try:
        await keeper.keep()  # twelve Pods ahead of the peak
        # No node here: the Pods cannot call the runner API, so their calls are written for them.
        db.execute("UPDATE pool_runners SET seen_at = now()")
        requests = []
        for _ in range(24):
            run_id = queue_run(db, job)
            requests.append(
                LaunchRequest(
                    RunId(run_id),
                    JobId(job),
                    AccountId(account),
                    attempt=1,
                    memory_mb=256,
                    timeout_seconds=0,
                    token=make_starting(db, run_id),
                )
            )

        async def resize() -> None:
            for moment in (peak + 30, peak + MINUTE, peak + MINUTE + 1):  # the minute passes: the pool shrinks
                clock.advance_to(moment)
                db.execute("UPDATE pool_runners SET seen_at = now() WHERE assigned_at IS NULL")
                await keeper.keep()

        await asyncio.gather(resize(), *(launcher.launch(request) for request in requests))

        given = rows_of(db, "SELECT run_id, count(*) FROM pool_runners WHERE run_id IS NOT NULL GROUP BY run_id")
        assert given and all(count == 1 for _, count in given)  # some runs went warm, each to one Pod
        pods = kube.get(f"/api/v1/namespaces/{runs_namespace}/pods")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        pods_of_run = Counter(p["metadata"]["labels"].get(RUN_ID) for p in live)
        assert all(pods_of_run[str(request.run_id)] == 1 for request in requests)  # warm or cold, one Pod each
        retired = {p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")}
        assert not retired & {str(name) for (name,) in rows_of(db, "SELECT name FROM pool_runners")}
        assert keeper.plans["small"].target == 0  # the peak's Pods not used were retired
    finally:
        await launcher.close()
        await pool.close()


def rows_of(db: Conn, sql: str) -> list[tuple[object, ...]]:
    return list(db.execute(sql).fetchall())


async def test_a_pool_pod_that_never_calls_is_replaced(
    pools: WarmPools, kube: Rest, runs_namespace: str, db: Conn
) -> None:
    await pools.keep()
    (first,) = rows(db)
    db.execute("UPDATE pool_runners SET created_at = now() - interval '1 hour'")  # past pool_start_seconds
    await pools.keep()
    (second,) = rows(db)
    assert second != first and pools.replaced == 1
    pods = kube.get(f"/api/v1/namespaces/{runs_namespace}/pods")["items"]
    gone = [p for p in pods if p["metadata"]["name"] == first and not p["metadata"].get("deletionTimestamp")]
    assert not gone


async def test_each_launch_is_counted_warm_or_cold_by_pool(
    control_plane: ControlPlane, runs_namespace: str, database_url: str, db: Conn, metric_reader: InMemoryMetricReader
) -> None:
    settings = peak_settings(runs_namespace, database_url, min_size=1, max_size=1, pod_creates_per_second=0)
    small_account = create_account(db, memory_mb=256, run_slots=10)
    big_account = create_account(db, name="big", memory_mb=4096, run_slots=10)
    small, big = create_job(db, small_account), create_job(db, big_account)
    pool = await open_pool(database_url, max_size=2)
    config = control_plane.configuration()
    keeper = WarmPools(settings, pool, configuration=config)
    launcher = PooledLauncher(settings, pool, KubernetesLauncher(settings, configuration=config), configuration=config)

    def served(pool_name: str, how: str) -> float:
        return counted(metric_reader, "runplane.pool.launches", pool=pool_name, cluster="east", served=how)

    def request(account: int, job: int, memory_mb: int) -> LaunchRequest:
        run_id = queue_run(db, job)
        return LaunchRequest(
            RunId(run_id), JobId(job), AccountId(account), 1, memory_mb, 0, token=make_starting(db, run_id)
        )

    before = {key: served(*key) for key in (("small", "warm"), ("small", "cold"), ("none", "cold"))}
    try:
        await keeper.keep()  # the pool's one Pod
        db.execute("UPDATE pool_runners SET seen_at = now()")  # no node: its call is written for it
        first, second, other = (
            request(small_account, small, 256),
            request(small_account, small, 256),
            request(big_account, big, 4096),
        )
        assert (await launcher.launch(first)).warm  # the waiting Pod takes it
        assert not (await launcher.launch(second)).warm  # none left waiting: a Pod of its own
        assert not (await launcher.launch(other)).warm  # no pool has its memory
        after = {key: served(*key) for key in before}
        assert {key: after[key] - before[key] for key in before} == {
            ("small", "warm"): 1,
            ("small", "cold"): 1,
            ("none", "cold"): 1,
        }
    finally:
        await launcher.close()
        await pool.close()
