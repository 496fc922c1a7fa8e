"""A real Kubernetes v1.20 control plane, and a real node, on this machine's loopback.

The binaries come from ``make k8s`` (``deploy/k8s-local/build.sh``: built from Debian's source
package, cached outside the clone). ``ControlPlane`` is etcd + kube-apiserver with a fresh CA, a
static admin token and RBAC on, on free ports in a private directory. ``Node`` adds a private
dockerd (its own socket, data root and bridge; the runc wrapper as its default runtime, since this
kernel refuses a negative ``oom_score_adj``), the scheduler, the controller-manager and a kubelet.

Both stop only the processes they started (by their own handles), unmount what the kubelet mounted
under their directory, remove the bridge they made, and delete their directory.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import urllib3

from dispatcher.kubernetes.api import without_client_retries
from tests.support import polling
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "k8s-local" / "build.sh"
RUNC_WRAP = ROOT / "deploy" / "k8s-local" / "runc-wrap"
ETCD = Path("/usr/bin/etcd")
PAUSE_IMAGE = "k8s.gcr.io/pause:3.2"
BUSYBOX_IMAGE = "local/busybox:1"


class ClusterError(Exception):
    """A part of the local cluster did not start."""


class RestError(Exception):
    """The API server answered a ``Rest`` call with an error status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status
        self.body = body


class Rest:
    """Plain JSON calls to a real API server, for arranging and asserting in tests (no typed models)."""

    def __init__(self, url: str, ca_file: Path, token: str) -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._http = urllib3.PoolManager(ca_certs=str(ca_file), cert_reqs="CERT_REQUIRED", retries=False)

    def request(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> Any:
        text = self.text(method, path, body, content_type)
        return json.loads(text) if text else None

    def text(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> str:
        """The answer's body as text (a container's log), raising ``RestError`` on an error status."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self._http.request(method, self._url + path, body=data, headers=headers, timeout=30)
        text = response.data.decode(errors="replace")
        if response.status >= 400:
            raise RestError(response.status, text)
        return text

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: object) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def merge_patch(self, path: str, body: object) -> Any:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def pod_names(self, namespace: str, selector: str = "", *, terminating: bool = True) -> list[str]:
        """The Pods' names; without ``terminating``, not those whose deletion was asked for (the API
        server removes such a Pod once its kubelet confirms the containers are gone, which a loaded
        node can take a minute or more to do)."""
        query = f"?labelSelector={selector}" if selector else ""
        listing = self.get(f"/api/v1/namespaces/{namespace}/pods{query}")
        return sorted(
            item["metadata"]["name"]
            for item in listing["items"]
            if terminating or not item["metadata"].get("deletionTimestamp")
        )

    def close(self) -> None:
        self._http.clear()


def k8s_bin() -> Path:
    """The cached Kubernetes binaries (``make k8s``), or ``$RUNPLANE_K8S_BIN``; fails clearly when not built."""
    if os.environ.get("RUNPLANE_K8S_BIN"):
        return Path(os.environ["RUNPLANE_K8S_BIN"])
    done = subprocess.run([str(BUILD), "--locate"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"Kubernetes binaries are not built: run `make k8s` ({done.stderr.strip()})")
    return Path(done.stdout.strip())


def wait_for(condition: Callable[[], bool], timeout: float, what: str, logs: Path | None = None) -> None:
    """Poll ``condition`` until it holds; on timeout fail with the tail of ``logs``."""
    try:
        polling.wait_for(condition, timeout, interval=0.1, what=what)
    except AssertionError as exc:
        tail = ""
        if logs is not None and logs.exists():
            tail = "\n" + "\n".join(logs.read_text(errors="replace").splitlines()[-30:])
        raise ClusterError(f"{what} not ready after {timeout:.0f} s{tail}") from exc


@dataclass
class Processes:
    """The processes one fixture started, each in its own process group, stopped in reverse order."""

    directory: Path
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("ab")
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
        finally:
            log.close()
        self.started.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.started:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}: see {self.directory / (name + '.log')}")

    def stop(self, name: str | None = None, grace: float = 10.0) -> None:
        for entry in reversed(list(self.started)):
            proc_name, proc = entry
            if name is not None and proc_name != name:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)  # its group: the process and what it spawned
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
            self.started.remove(entry)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(pki: Path, admin_token: str) -> None:
    pki.mkdir(parents=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=runplane-test-ca", cwd=pki)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=pki)  # fmt: skip
    names = "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1"
    (pki / "ext.cnf").write_text(f"subjectAltName={names}\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "30", "-extfile", "ext.cnf", cwd=pki)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "tokens.csv").write_text(f'{admin_token},admin,admin,"system:masters"\n')


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback. ``configuration()`` is an admin client configuration."""

    directory: Path
    bin: Path
    api_port: int
    admin_token: str
    processes: Processes
    _etcd_url: str = ""
    _extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        return self.directory / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    def configuration(self, token: str | None = None) -> kubernetes.client.Configuration:
        """A client configuration for this API server, as admin or with ``token`` (a ServiceAccount's)."""
        config = kubernetes.client.Configuration(host=self.url)
        config.ssl_ca_cert = str(self.ca_file)
        config.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return without_client_retries(config)

    def rest(self, token: str | None = None) -> Rest:
        """Plain JSON calls, as admin or with ``token``."""
        return Rest(self.url, self.ca_file, token or self.admin_token)

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default", *, server: str = "") -> Path:
        """A kubeconfig for this API server as ``token``, reached at ``server`` (a proxy's address) if given."""
        path.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{server or self.url}", certificate-authority: "{self.ca_file}"}}
users:
- name: user
  user: {{token: "{token}"}}
contexts:
- name: local
  context: {{cluster: local, user: user, namespace: "{namespace}"}}
current-context: local
"""
        )
        path.chmod(0o600)
        return path

    def ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    @classmethod
    def start(
        cls,
        directory: Path | None = None,
        *,
        bin_dir: Path | None = None,
        extra_args: list[str] | None = None,
        timeout: float = 90.0,
    ) -> ControlPlane:
        """Start etcd and kube-apiserver (with ``extra_args``) and wait until the API server is ready."""
        directory = directory or Path(tempfile.mkdtemp(prefix="rpk-cp-"))
        bin_dir = bin_dir or k8s_bin()
        admin_token = secrets.token_hex(16)
        _make_pki(directory / "pki", admin_token)
        processes = Processes(directory)
        plane = cls(directory, bin_dir, free_port(), admin_token, processes)
        try:
            plane._start_processes(extra_args or [])
            wait_for(plane._ready_or_dead, timeout, "kube-apiserver", directory / "kube-apiserver.log")
        except BaseException:
            plane.stop()
            raise
        plane.write_kubeconfig(plane.kubeconfig, admin_token)
        return plane

    def _ready_or_dead(self) -> bool:
        self.processes.check_alive()
        return self.ready()

    def _start_processes(self, extra_args: list[str]) -> None:
        d = self.directory
        etcd_port, peer_port = free_port(), free_port()
        self._etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._extra_args = extra_args
        self.processes.start(
            "etcd",
            [str(ETCD), "--name", "test", "--data-dir", str(d / "etcd"),
             "--listen-client-urls", self._etcd_url, "--advertise-client-urls", self._etcd_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"test={peer_url}", "--unsafe-no-fsync"],
        )  # fmt: skip
        self.start_api_server()

    def start_api_server(self, timeout: float = 0.0) -> None:
        """(Re)start kube-apiserver on its port, on the same etcd; with ``timeout``, wait until ready."""
        pki = self.directory / "pki"
        self.processes.start(
            "kube-apiserver",
            [str(self.bin / "kube-apiserver"), f"--etcd-servers={self._etcd_url}",
             "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
             f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
             f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
             "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
             f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
             "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
             # Pods name no token Secret (they do not mount one), so no ServiceAccount admission.
             "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true", *self._extra_args],
        )  # fmt: skip
        if timeout:
            wait_for(self._ready_or_dead, timeout, "kube-apiserver", self.directory / "kube-apiserver.log")

    def stop_api_server(self) -> None:
        """Stop kube-apiserver only (SIGTERM): the cluster's API is down, its etcd keeps the state."""
        self.processes.stop("kube-apiserver")

    def stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _unused_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no interface of this machine uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for third in range(os.getpid() % 200, os.getpid() % 200 + 250):
        net = ipaddress.IPv4Network(f"10.213.{third % 250}.0/24")
        if f" {net.network_address + 1}/" not in used:
            return net
    raise ClusterError("no free /24 in 10.213.0.0/16 for the node's bridge")


def _image_tar(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


@dataclass
class Node:
    """A real single node on a ``ControlPlane``: dockerd, scheduler, controller-manager, kubelet."""

    plane: ControlPlane
    directory: Path
    bridge: str
    subnet: ipaddress.IPv4Network
    processes: Processes
    name: str = "localhost"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.directory / 'docker.sock'}"

    @property
    def host_ip(self) -> str:
        """The node's address on its bridge: how a Pod reaches a server on this machine."""
        return str(self.subnet.network_address + 1)

    def docker(self, *args: str, stdin: bytes | None = None, timeout: float = 600) -> str:
        argv = ["docker", "--host", self.docker_host, *args]
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise ClusterError(f"docker {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return done.stdout.decode(errors="replace")

    @classmethod
    def start(cls, plane: ControlPlane, *, timeout: float = 120.0) -> Node:
        directory = Path(tempfile.mkdtemp(prefix="rpk-n-"))  # short: dockerd's socket paths must fit 108 bytes
        node = cls(plane, directory, f"rpk{os.getpid() % 100000}{secrets.token_hex(2)}", _unused_subnet(),
                   Processes(directory))  # fmt: skip
        try:
            node._start_docker()
            node._import_base_images()
            node._start_kubernetes()
            wait_for(node._ready_or_dead, timeout, "node", directory / "kubelet.log")
        except BaseException:
            node.stop()
            raise
        return node

    def _start_docker(self) -> None:
        d = self.directory
        subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        wrap = d / "runc-wrap"
        shutil.copy(RUNC_WRAP, wrap)
        wrap.chmod(0o755)
        self.processes.start(
            "dockerd",
            ["dockerd", "--host", self.docker_host, "--data-root", str(d / "docker"), "--exec-root", str(d / "x"),
             "--pidfile", str(d / "dockerd.pid"), "--bridge", self.bridge, "--iptables=false", "--ip-masq=false",
             "--add-runtime", f"clamp={wrap}", "--default-runtime", "clamp"],
        )  # fmt: skip

        def docker_up() -> bool:
            self.processes.check_alive()
            info = subprocess.run(["docker", "--host", self.docker_host, "info"], capture_output=True, check=False)
            return info.returncode == 0

        wait_for(docker_up, 60, "dockerd", d / "dockerd.log")

    def _import_base_images(self) -> None:
        pause = (self.plane.bin / "pause").read_bytes()
        self.docker("import", "--change", 'ENTRYPOINT ["/pause"]', "-", PAUSE_IMAGE,
                    stdin=_image_tar({"pause": (pause, 0o755)}, {}))  # fmt: skip
        busybox = Path("/bin/busybox").read_bytes()
        links = {f"bin/{tool}": "busybox" for tool in ("sh", "echo", "sleep", "cat", "ls", "env", "head", "dd")}
        self.docker("import", "-", BUSYBOX_IMAGE, stdin=_image_tar({"bin/busybox": (busybox, 0o755)}, links))

    def _start_kubernetes(self) -> None:
        d, b, pki, kubeconfig = self.directory, self.plane.bin, self.plane.directory / "pki", self.plane.kubeconfig
        self.processes.start(
            "kube-scheduler",
            [str(b / "kube-scheduler"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--port=0", f"--secure-port={free_port()}"],
        )  # fmt: skip
        self.processes.start(
            "kube-controller-manager",
            [str(b / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--port=0", f"--secure-port={free_port()}",
             f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
             "--controllers=*,-nodeipam"],
        )  # fmt: skip
        (d / "kubelet").mkdir()
        self.processes.start(
            "kubelet",
            [str(b / "kubelet"), f"--kubeconfig={kubeconfig}", f"--hostname-override={self.name}",
             "--address=127.0.0.1", f"--port={free_port()}", "--read-only-port=0",
             "--healthz-bind-address=127.0.0.1", f"--healthz-port={free_port()}",
             f"--root-dir={d / 'kubelet'}", f"--cert-dir={d / 'kubelet' / 'pki'}",
             "--container-runtime=docker", f"--docker-endpoint={self.docker_host}",
             f"--container-runtime-endpoint=unix://{d / 'dockershim.sock'}",
             f"--experimental-dockershim-root-directory={d / 'dockershim'}",
             f"--pod-infra-container-image={PAUSE_IMAGE}", "--oom-score-adj=0", "--cgroup-driver=cgroupfs",
             "--fail-swap-on=false", "--cgroups-per-qos=false", "--enforce-node-allocatable=",
             "--anonymous-auth=true", "--authorization-mode=AlwaysAllow",
             "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--eviction-hard=",
             "--resolv-conf=/etc/resolv.conf", "--sync-frequency=2s"],
        )  # fmt: skip

    def _ready_or_dead(self) -> bool:
        self.processes.check_alive()
        rest = self.plane.rest()
        try:
            node = rest.get(f"/api/v1/nodes/{self.name}")
        except RestError:
            return False
        finally:
            rest.close()
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        self.processes.stop("kubelet")
        with contextlib.suppress(Exception):
            ids = self.docker("ps", "-aq", timeout=30).split()
            if ids:
                self.docker("rm", "-f", *ids, timeout=120)
        self.processes.stop()
        self._unmount()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _unmount(self) -> None:
        prefix = str(self.directory) + "/"
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def service_account_token(rest: Rest, namespace: str, name: str) -> str:
    """A token for ServiceAccount ``namespace/name`` from the TokenRequest API (created if missing)."""
    with contextlib.suppress(RestError):
        rest.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    answer = rest.post(path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": 3600}})  # fmt: skip
    return str(answer["status"]["token"])
