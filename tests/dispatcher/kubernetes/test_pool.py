"""Warm pools against the real API server and Postgres: the pool's size follows the queue between its
minimum and maximum, and Pods that never call the runner API are replaced.

No node: pool Pods stay pending, which is all sizing needs (a Pod not given a run counts as idle
whether it is starting or waiting). Runs in pool Pods on a real node: tests/system/test_kubernetes_pool.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatcher.kubernetes.pool import POOL, WarmPools
from runplane.adapters.db import open_pool
from runplane.basics.settings import WarmPoolSettings
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.kubernetes_cluster import ControlPlane, Rest
from tests.support.records import Conn, create_account, create_job, queue_run

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
