"""``python -m bench.kubernetes_pods [--pods N] [--creates N]``: run Pods on a real Kubernetes node.

Needs root and ``make k8s`` (a kube-apiserver, scheduler, controller-manager and kubelet v1.20 built
from Debian's source package; the node runs Pods on a private dockerd). Measures:

- ``creates_per_s``: Pods the ``kubernetes`` launcher creates per second against the real API
  server (control plane only, so nothing but the API server and etcd is measured), ``--creates``
  launches at a concurrency of 16.
- cold prep time over ``--pods`` launches of the runner image on the real node, one after another,
  and its parts, from the watch events the bench receives and the container's log timestamps:
  API create (the create call), scheduling (created → bound to the node), container start (bound →
  container running, which includes the sandbox and the image's start), runner start (container
  running → the runner's first log line). ``prep`` is launch → the runner's first log line.

Prints a table and writes ``bench/results/kubernetes.json``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import urllib3

from dispatcher.kubernetes.launcher import KubernetesLauncher
from dispatcher.launcher import LaunchRequest
from runplane.basics.settings import DispatcherSettings, KubernetesSettings, Settings
from runplane.basics.types import AccountId, JobId, RunId
from tests.support.kubernetes_cluster import ControlPlane, Node

RESULTS = Path(__file__).resolve().parent / "results"
IMAGES = Path(__file__).resolve().parents[1] / "deploy" / "k8s-local" / "images.sh"
NAMESPACE = "bench"


def _settings(image: str = "runplane-runner:0.1.0") -> Settings:
    kubernetes = KubernetesSettings(namespace=NAMESPACE, image=image, image_pull_policy="Never", cpu_request="10m")
    return Settings(dispatcher=DispatcherSettings(launcher="kubernetes", cluster="bench"), kubernetes=kubernetes)


def _request(run_id: int) -> LaunchRequest:
    return LaunchRequest(RunId(run_id), JobId(1), AccountId(1), attempt=1, memory_mb=256, timeout_seconds=0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def creates_per_second(plane: ControlPlane, count: int, concurrency: int = 16) -> dict[str, float]:
    launcher = KubernetesLauncher(_settings(), configuration=plane.configuration())
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(run_id: int) -> None:
        async with semaphore:
            began = time.monotonic()
            await launcher.launch(_request(run_id))
            latencies.append(time.monotonic() - began)

    try:
        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(1, count + 1)))
        elapsed = time.monotonic() - started
    finally:
        await launcher.close()
    return {
        "creates_per_s": count / elapsed,
        "create_p50_s": percentile(latencies, 50),
        "create_p99_s": percentile(latencies, 99),
    }


class Watch:
    """Arrival times (monotonic) of what each Pod went through, from one watch of the namespace;
    ``on_running`` is called (on the watch's thread) with each Pod when its container is first seen running."""

    def __init__(self, plane: ControlPlane, on_running: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self._on_running = on_running
        self._lock = threading.Lock()
        self._http = urllib3.PoolManager(ca_certs=str(plane.ca_file), cert_reqs="CERT_REQUIRED", retries=False)
        url = f"{plane.url}/api/v1/namespaces/{NAMESPACE}/pods?watch=true&timeoutSeconds=3600"
        headers = {"Authorization": f"Bearer {plane.admin_token}"}
        self._response = self._http.request("GET", url, headers=headers, preload_content=False, timeout=3700)
        threading.Thread(target=self._read, name="bench-watch", daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        try:
            for chunk in self._response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._note(json.loads(line)["object"], time.monotonic())
        except Exception:  # closed at the end of the bench
            return

    def _note(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            marks = self.seen.setdefault(name, {})
            marks.setdefault("created", now)
            if pod["spec"].get("nodeName"):
                marks.setdefault("scheduled", now)
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                if ("running" in status["state"] or "terminated" in status["state"]) and "running" not in marks:
                    marks["running"] = now
                    if self._on_running is not None:
                        self._on_running(pod)

    def marks(self, name: str) -> dict[str, float]:
        with self._lock:
            return dict(self.seen.get(name, {}))

    def all_marks(self) -> list[dict[str, float]]:
        with self._lock:
            return [dict(marks) for marks in self.seen.values()]

    def close(self) -> None:
        self._response.release_conn()
        self._http.clear()


def _first_log_line_at(plane: ControlPlane, name: str, deadline: float) -> datetime | None:
    """The timestamp of the container's first log line (the kubelet's, nanosecond precision)."""
    http = urllib3.PoolManager(ca_certs=str(plane.ca_file), cert_reqs="CERT_REQUIRED", retries=False)
    url = f"{plane.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}/log?timestamps=true&limitBytes=4096"
    headers = {"Authorization": f"Bearer {plane.admin_token}"}
    try:
        while time.monotonic() < deadline:
            response = http.request("GET", url, headers=headers, timeout=10)
            text = response.data.decode(errors="replace")
            if response.status == 200 and text.strip():
                stamp = text.split(" ", 1)[0]
                return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00")
            time.sleep(0.05)
    finally:
        http.clear()
    return None


async def cold_pods(plane: ControlPlane, image: str, count: int) -> dict[str, float]:
    """Launch ``count`` runner Pods one after another; the parts of each one's prep time."""
    launcher = KubernetesLauncher(_settings(image), configuration=plane.configuration())
    watch = Watch(plane)
    parts: dict[str, list[float]] = {"api_create": [], "scheduling": [], "container_start": [], "runner_start": []}
    prep: list[float] = []
    try:
        for run_id in range(100_001, 100_001 + count):
            wall = time.time()
            began = time.monotonic()
            result = await launcher.launch(_request(run_id))
            created = time.monotonic()
            first_line = await asyncio.to_thread(_first_log_line_at, plane, result.pod_name, began + 120)
            marks = watch.marks(result.pod_name)
            if first_line is None or "running" not in marks or "scheduled" not in marks:
                print(f"{result.pod_name}: not started within 120 s; skipped", file=sys.stderr)
                continue
            runner_at = began + (first_line.timestamp() - wall)  # the log's wall clock onto the monotonic one
            parts["api_create"].append(created - began)
            parts["scheduling"].append(marks["scheduled"] - created)
            parts["container_start"].append(marks["running"] - marks["scheduled"])
            parts["runner_start"].append(max(0.0, runner_at - marks["running"]))
            prep.append(runner_at - began)
            await launcher.delete_pod(result.pod_name)
    finally:
        watch.close()
        await launcher.close()
    figures = {"cold_prep_p50_s": percentile(prep, 50), "cold_prep_p99_s": percentile(prep, 99), "pods": len(prep)}
    for part, values in parts.items():
        figures[f"{part}_p50_s"] = percentile(values, 50)
        figures[f"{part}_p99_s"] = percentile(values, 99)
        figures[f"{part}_mean_s"] = statistics.fmean(values)
    return figures


@contextmanager
def cluster(with_node: bool) -> Iterator[tuple[ControlPlane, Node | None]]:
    plane = ControlPlane.start()
    node = None
    try:
        rest = plane.rest()
        rest.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        rest.close()
        node = Node.start(plane) if with_node else None
        yield plane, node
    finally:
        if node is not None:
            node.stop()
        plane.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kubernetes_pods", description=__doc__)
    parser.add_argument("--pods", type=int, default=100, help="cold runner Pods on the real node")
    parser.add_argument("--creates", type=int, default=500, help="Pod creates against the API server")
    args = parser.parse_args(argv)
    figures: dict[str, float] = {}
    with cluster(with_node=False) as (plane, _):
        figures.update(asyncio.run(creates_per_second(plane, args.creates)))
    if args.pods:
        with cluster(with_node=True) as (plane, node):
            assert node is not None
            env = {**os.environ, "DOCKER_HOST": node.docker_host}
            image = subprocess.run([str(IMAGES)], env=env, capture_output=True, text=True, check=True).stdout.split()[
                -1
            ]
            figures.update(asyncio.run(cold_pods(plane, image, args.pods)))
    write_figures("kubernetes.json", figures)
    return 0


def write_figures(file_name: str, figures: Mapping[str, object]) -> None:
    """Print ``figures`` as a table and write them to ``bench/results/<file_name>``."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / file_name).write_text(json.dumps(figures, indent=2) + "\n")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.3f}" if isinstance(value, float) else f"{key:<{width}}  {value}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
