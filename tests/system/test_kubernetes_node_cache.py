"""The node's cache keeper seen from a real run Pod (kubelet v1.20, the runner image built here).

The runner API listens on the node's bridge address; the launcher's Pod, with
``kubernetes.node_cache_socket_dir`` set, mounts the socket's directory read-only. Its container (as
uid 10001, read-only root filesystem, no capability) stores a packages entry with its run's token and
restores it into another directory; the entry lands on the node under the run's account, another
token is refused, and the Pod cannot write into the socket's directory. The keeper is first a
process on the node, then the Pod of the chart's own DaemonSet (rendered by Helm).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import stat
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.kubernetes.pods import build_token_secret
from dispatcher.launcher import LaunchRequest
from runner.control_plane import RunnerApi
from runner.node_cache import NodeCacheKeeper
from runplane.basics.settings import Settings
from runplane.basics.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import k8s_settings
from tests.support.api import serving_api
from tests.support.files import directory_for_all
from tests.support.helm import helm
from tests.support.kubernetes_cluster import RestError
from tests.support.kubernetes_fixtures import Cluster
from tests.support.kubernetes_system import describe_pods
from tests.support.polling import eventually
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.usefixtures("_cleanup_bus")]

KEY = "ef" * 32
# What the Pod runs instead of `runplane runner`: the runner's own client of the node's keeper.
IN_THE_POD = f"""
import asyncio, os, pathlib, sys
from runner.cache_keeper import CacheError, InProcessCache
from runner.node_cache import NodeCacheClient
from runplane.basics.settings import Settings

run_id, lease_id = int(sys.argv[1]), sys.argv[2]
token = pathlib.Path("/var/run/runplane/token").read_text().strip()
socket = pathlib.Path(os.environ["RUNPLANE_RUNNER__NODE_CACHE_SOCKET"])

def client(token):
    local = InProcessCache(Settings())
    return NodeCacheClient(socket, token=token, run_id=run_id, lease_id=lease_id, local=local)

async def main():
    made = pathlib.Path("/work/made/dbt_packages/pkg")
    made.mkdir(parents=True)
    (made / "m.sql").write_text("installed in the pod")
    print("STORE", repr(await client(token).store_packages("{KEY}", made.parent.parent, "dbt_packages")), flush=True)
    into = pathlib.Path("/work/into")
    into.mkdir()
    restored = await client(token).restore_packages("{KEY}", into, "dbt_packages")
    print("RESTORE", restored, (into / "dbt_packages/pkg/m.sql").read_text(), flush=True)
    try:
        await client("rpr_" + "x" * 40).restore_packages("{KEY}", into, "dbt_packages")
        print("WRONG served", flush=True)
    except CacheError as exc:
        print("WRONG refused:", exc, flush=True)
    try:
        (socket.parent / "planted").write_text("x")
        print("PLANT written", flush=True)
    except OSError as exc:
        print("PLANT refused:", exc.strerror, flush=True)

asyncio.run(main())
"""


@dataclass
class Node:
    settings: Settings
    socket_dir: Path
    root: Path


@pytest.fixture
async def pod_api(cluster: Cluster, settings: Settings) -> AsyncIterator[Settings]:
    """The runner API on the node's bridge address, where Pods reach it; the settings that say so."""
    host = cluster.node.host_ip
    api = settings.api.model_copy(update={"host": host})
    runner = settings.runner.model_copy(update={"api_address": f"{host}:{settings.api.runner_port}"})
    settings = settings.model_copy(update={"api": api, "runner": runner})
    async with serving_api(settings, rest=False, deliveries=False):
        yield settings


@pytest.fixture
def host_dirs() -> Iterator[tuple[Path, Path]]:
    """(the socket's directory, the cache's directory) on the node, removed after the test."""
    made = directory_for_all("rp-node-cache-"), directory_for_all("rp-node-entries-")
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def node_cache(pod_api: Settings, host_dirs: tuple[Path, Path]) -> AsyncIterator[Node]:
    """A keeper as a process on the node."""
    socket_dir, root = host_dirs
    keeper = NodeCacheKeeper(socket_dir / "cache.sock", root, pod_api.runner.api_address)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.serve(stop), name="node-cache")
    try:
        await eventually(lambda: task.done() or (socket_dir / "cache.sock").exists(), 10, what="the socket")
        assert not task.done(), task.exception()
        yield Node(pod_api, socket_dir, root)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def _log(cluster: Cluster, name: str) -> str:
    try:
        return cluster.kube.text("GET", f"/api/v1/namespaces/{cluster.namespace}/pods/{name}/log")
    except RestError as exc:
        if exc.status in (400, 404):  # not started, or not synced by the kubelet yet
            return ""
        raise


async def _store_and_restore_from_a_run_pod(cluster: Cluster, node_cache: Node, db: Conn) -> None:
    """A run claimed here, a launcher Pod of it speaking for its runner; what it and the node saw."""
    account = create_account(db)
    run_id = queue_run(db, create_job(db, account))
    token = make_starting(db, run_id)
    api = RunnerApi(node_cache.settings.runner.api_address, token, run_id)
    try:
        assert await api.claim() is not None  # the Pod's script speaks for the runner under this lease
        settings = k8s_settings(
            namespace=cluster.namespace,
            image=cluster.image,
            image_pull_policy="Never",
            cpu_request="10m",
            node_cache_socket_dir=str(node_cache.socket_dir),
        )
        launcher = KubernetesLauncher(settings, configuration=cluster.plane.configuration())
        request = LaunchRequest(RunId(run_id), JobId(1), AccountId(account), 1, 256, 0, token)
        pod = launcher.pod_for(request)
        await launcher.close()
        pod["spec"]["containers"][0]["command"] = ["python3", "-c", IN_THE_POD, str(run_id), api.lease_id]
        name = pod["metadata"]["name"]
        kube = cluster.kube
        secret = build_token_secret(request, settings.kubernetes, cluster="east")
        kube.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", secret)
        kube.post(f"/api/v1/namespaces/{cluster.namespace}/pods", pod)
        try:
            log = await eventually(
                lambda: asyncio.to_thread(_log, cluster, name), 300, until=lambda text: "PLANT" in text, what="the Pod"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe_pods(kube, cluster.namespace)}") from None

        assert "STORE ''" in log, log
        assert "RESTORE True installed in the pod" in log, log
        assert "WRONG refused:" in log and "not for run" in log, log
        assert "PLANT refused: Read-only file system" in log, log
        kept = node_cache.root / str(account) / KEY / "tree" / "pkg" / "m.sql"
        assert kept.read_text() == "installed in the pod"
        assert [p.name for p in node_cache.root.iterdir()] == [str(account)]
    finally:
        with contextlib.suppress(Exception):
            await api.close()


async def test_a_run_pod_stores_and_restores_through_the_nodes_keeper_with_its_token(
    cluster: Cluster, node_cache: Node, db: Conn
) -> None:
    await _store_and_restore_from_a_run_pod(cluster, node_cache, db)


async def test_the_charts_keeper_pod_owns_its_directories_and_serves_run_pods(
    cluster: Cluster, pod_api: Settings, host_dirs: tuple[Path, Path], db: Conn
) -> None:
    socket_dir, root = host_dirs
    rendered = helm(
        "template", "rp", ".", "--namespace", "runplane", "-f", "ci/node-cache-values.yaml",
        "--set", f"nodeCache.socketDir={socket_dir}", "--set", f"nodeCache.cacheDir={root}",
    )  # fmt: skip
    (daemon_set,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet"]
    # Its Pod as the DaemonSet controller would make it, on this node, with the image built here and
    # the runner API where this node's Pods reach it.
    spec: dict[str, Any] = {
        k: v
        for k, v in daemon_set["spec"]["template"]["spec"].items()
        if k not in ("nodeSelector", "tolerations", "imagePullSecrets")
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node-cache-keeper"}, "spec": spec}
    for container in (*spec["initContainers"], *spec["containers"]):
        container["image"], container["imagePullPolicy"] = cluster.image, "Never"
    keeper = spec["containers"][0]
    keeper["env"] = [
        e if e["name"] != "RUNPLANE_RUNNER__API_ADDRESS" else {**e, "value": pod_api.runner.api_address}
        for e in keeper["env"]
    ]
    keeper["resources"]["requests"]["cpu"] = "10m"
    cluster.kube.post(f"/api/v1/namespaces/{cluster.namespace}/pods", pod)
    try:
        await eventually((socket_dir / "cache.sock").exists, 300, what="the keeper Pod's socket")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_pods(cluster.kube, cluster.namespace)}") from None
    assert (root.stat().st_uid, stat.S_IMODE(root.stat().st_mode)) == (10002, 0o700)
    assert (socket_dir / "cache.sock").stat().st_uid == 10002
    await _store_and_restore_from_a_run_pod(cluster, Node(pod_api, socket_dir, root), db)
