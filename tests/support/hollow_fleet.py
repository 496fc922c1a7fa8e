"""A simulated fleet on a real control plane: kube-scheduler, the node lifecycle controller and N hollow
nodes (Kubernetes' kubemark).

A hollow node is kubemark ``--morph=kubelet`` (``cmd/kubemark/hollow-node.go``): the real kubelet code
with a fake container runtime and a fake cAdvisor (1 core, 3.75 GiB, 110 Pods). It registers a Node,
runs the Pods bound to it (every container "runs" at once, until the Pod is deleted) and reports
their status through the API server like a kubelet. The binary comes from ``make k8s``
(``deploy/k8s-local/build.sh --kubemark``, the same source tree as the control plane's).

kubemark puts its root directory and its fake runtime's socket (``/tmp/kubelet_remote.sock``, a fixed
name) under ``/tmp`` whatever the environment says, so each hollow node runs in a mount namespace of
its own whose ``/tmp`` is its own directory: two on one machine never share a socket, and removing
the fleet's directory removes all they wrote. Each node is labelled with the fleet's id
(``FLEET_LABEL``), so Pods can ask for the fleet's nodes and ``stop`` deletes exactly its Node objects.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.kubernetes_cluster import BUILD, ClusterError, ControlPlane, Processes, RestError, wait_for
from tests.support.ports import free_port

FLEET_LABEL = "runplane.dev/hollow-fleet"
# In its mount namespace: the node's own directory over /tmp, then kubemark in the same process.
_OWN_TMP = 'mount --bind "$0" /tmp && exec "$@"'


def kubemark_bin() -> Path:
    """The cached kubemark (``make k8s``), or ``$RUNPLANE_K8S_BIN/kubemark``; fails clearly when not built."""
    if os.environ.get("RUNPLANE_K8S_BIN"):
        return Path(os.environ["RUNPLANE_K8S_BIN"]) / "kubemark"
    done = subprocess.run([str(BUILD), "--locate", "--kubemark"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"kubemark is not built: run `make k8s` ({done.stderr.strip()})")
    return Path(done.stdout.strip()) / "kubemark"


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclass
class HollowFleet:
    """kube-scheduler, kube-controller-manager and ``len(names)`` hollow nodes on ``plane``, each node a
    process of its own."""

    plane: ControlPlane
    directory: Path
    fleet_id: str
    names: list[str]
    processes: Processes

    @property
    def selector(self) -> dict[str, str]:
        """The node selector that puts a Pod on this fleet's nodes only."""
        return {FLEET_LABEL: self.fleet_id}

    @classmethod
    def start(
        cls, plane: ControlPlane, nodes: int, *, prefix: str = "hollow", timeout: float | None = None
    ) -> HollowFleet:
        """Start the scheduler, the controllers and ``nodes`` hollow nodes named ``<prefix>-<i>``; wait until
        all are Ready.

        Everything started is stopped again if they are not Ready within ``timeout`` (default: 60 s and
        a second per node: on two shared cores each node's start takes a fraction of a CPU second)."""
        kubemark = kubemark_bin()
        fleet_id = secrets.token_hex(4)
        directory = Path(tempfile.mkdtemp(prefix="rpk-fleet-"))
        names = [f"{prefix}-{i}" for i in range(nodes)]
        fleet = cls(plane, directory, fleet_id, names, Processes(directory))
        try:
            fleet._start_control()
            for name in names:
                fleet._start_node(kubemark, name)
            wait_for(fleet._all_ready, timeout or 60.0 + nodes, f"{nodes} hollow nodes", directory / f"{names[0]}.log")
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def _start_control(self) -> None:
        b, kubeconfig = self.plane.bin, self.plane.kubeconfig
        self.processes.start(
            "kube-scheduler",
            [str(b / "kube-scheduler"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--port=0", f"--secure-port={free_port()}"],
        )  # fmt: skip
        # The API server taints every new Node not-ready (its TaintNodesByCondition admission); the node
        # lifecycle controller lifts the taint once the node is Ready. The garbage collector removes a
        # deleted Pod's token Secret, the Pod GC the Pods of deleted nodes. No other controller is needed.
        self.processes.start(
            "kube-controller-manager",
            [str(b / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--port=0", f"--secure-port={free_port()}",
             "--controllers=nodelifecycle,garbagecollector,podgc"],
        )  # fmt: skip

    def _kubeconfig(self) -> str:
        """An admin kubeconfig that carries the CA itself: a hollow node sees nothing of the host's /tmp."""
        ca = base64.b64encode(self.plane.ca_file.read_bytes()).decode()
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: local\n  cluster: {{server: '{self.plane.url}', certificate-authority-data: '{ca}'}}\n"
            f"users:\n- name: admin\n  user: {{token: '{self.plane.admin_token}'}}\n"
            "contexts:\n- name: local\n  context: {cluster: local, user: admin}\ncurrent-context: local\n"
        )

    def _start_node(self, kubemark: Path, name: str) -> None:
        own = self.directory / name
        own.mkdir()
        (own / "kubeconfig").write_text(self._kubeconfig())
        (own / "kubeconfig").chmod(0o600)
        # Flags of cmd/kubemark/hollow-node.go (v1.20); the read-only port is off, the kubelet port free.
        # Paths as the node sees them: its own directory is its /tmp.
        self.processes.start(
            name,
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _OWN_TMP, str(own),
             str(kubemark), "--morph=kubelet", f"--name={name}", "--kubeconfig=/tmp/kubeconfig",
             f"--kubelet-port={free_port()}", "--kubelet-read-only-port=0",
             f"--node-labels={FLEET_LABEL}={self.fleet_id}"],
        )  # fmt: skip

    def ready_nodes(self) -> list[str]:
        """This fleet's nodes the API server has as Ready."""
        rest = self.plane.rest()
        try:
            listing = rest.get(f"/api/v1/nodes?labelSelector={FLEET_LABEL}={self.fleet_id}")
        except RestError:
            return []
        finally:
            rest.close()
        return sorted(item["metadata"]["name"] for item in listing["items"] if _ready(item))

    def _all_ready(self) -> bool:
        for name, proc in self.processes.started:
            if proc.poll() is not None:  # its log goes with the directory: say here why it ended
                lines = (self.directory / f"{name}.log").read_text(errors="replace").splitlines()
                tail = "\n".join(line for line in lines if not line.startswith(("\t", "goroutine ")))
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{tail[-3000:]}")
        return len(self.ready_nodes()) == len(self.names)

    def stop(self) -> None:
        """Stop every process started, delete the fleet's Node objects (if the API answers) and its directory."""
        for _, proc in self.processes.started:  # all at once: one by one, a hundred nodes take a minute
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        self.processes.stop()
        with contextlib.suppress(Exception):
            rest = self.plane.rest()
            try:
                rest.delete(f"/api/v1/nodes?labelSelector={FLEET_LABEL}={self.fleet_id}")
            finally:
                rest.close()
        shutil.rmtree(self.directory, ignore_errors=True)
