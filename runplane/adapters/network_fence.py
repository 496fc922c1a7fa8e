"""What a local run may reach on the network: nftables rules keyed by the socket owner's uid.

Every local run executes as a uid of its own (``runner.run_user``), so the kernel can tell a step's
packets from the control plane's by the uid that owns the socket (``meta skuid``). One table,
``inet runplane_fence``, shared by every runplane install on the machine, holds:

- ``fenced_uids``: the run uid ranges (each dispatcher adds its own);
- ``control_plane4/6``: the control plane's servers (Postgres, Redis, RabbitMQ, the public APIs):
  refused to a run uid first, whatever else allows it, on this machine or elsewhere;
- ``reach4/6``: ``uid . address . port`` a run may reach on this machine: the runner API and the
  warehouses its environment names, added for the run's uid when it starts (as root) and taken
  away when the uid is leased again;
- anything else on this machine (whatever leaves through ``lo``: loopback and the host's own
  addresses) is refused to a run uid, port 53 included; the rest of the network stays open, as a
  Kubernetes NetworkPolicy leaves a Pod its warehouses. DNS is the resolver ``/etc/resolv.conf``
  names (``resolvers``): one elsewhere is reached like the rest of the network; one on this
  machine (systemd-resolved's 127.0.0.53, a dnsmasq) only when the operator lets runs reach it
  (``runner.local_resolver``), then in ``reach`` for each run's uid like the runner API;
- ``local_connections``: how many connections each run uid has open to this machine, counted by
  conntrack (``ct count``); a new one past ``LOCAL_CONNECTIONS`` is reset, so one run cannot hold
  thousands of connections to the runner API (which shares its process with the public APIs) or a
  warehouse here while other runs wait.

Packets without a full socket (the kernel's own resets, time-wait acks) carry no owner and are
never matched, so the rules cannot touch anything but the runs' own connections.

Changes go through libnftables, the library the ``nft`` command is made of, called in the process
(``ctypes``): a run's rules are one call of its runner, not a fork and exec of ``nft`` per run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import ipaddress
import json
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TABLE = "runplane_fence"
# Connections a run may have open at once to this machine (the runner API, a warehouse or trace
# collector here): its runner's few, and a warehouse's pool of dbt's largest thread counts.
LOCAL_CONNECTIONS = 128
# The sets are declared (kept when they exist), then both chains are emptied and written again in
# the same transaction: every install on the machine gets the rules of the newest one started.
RULES = f"""
table inet {TABLE} {{
  set fenced_uids {{ type uid; flags interval; auto-merge; }}
  set control_plane4 {{ type ipv4_addr . inet_service; }}
  set control_plane6 {{ type ipv6_addr . inet_service; }}
  set reach4 {{ type uid . ipv4_addr . inet_service; }}
  set reach6 {{ type uid . ipv6_addr . inet_service; }}
  set local_connections {{ type uid; flags dynamic; size 65535; }}
  chain output {{ type filter hook output priority filter; policy accept; }}
  chain fence {{ }}
}}
flush chain inet {TABLE} output
flush chain inet {TABLE} fence
table inet {TABLE} {{
  chain output {{
    meta skuid @fenced_uids jump fence
  }}
  chain fence {{
    meta l4proto {{ tcp, udp }} ip daddr . th dport @control_plane4 reject with icmpx port-unreachable
    meta l4proto {{ tcp, udp }} ip6 daddr . th dport @control_plane6 reject with icmpx port-unreachable
    oifname != "lo" accept
    meta l4proto tcp ct state new add @local_connections {{ meta skuid ct count over {LOCAL_CONNECTIONS} }} \
      reject with tcp reset
    meta l4proto {{ tcp, udp }} meta skuid . ip daddr . th dport @reach4 accept
    meta l4proto {{ tcp, udp }} meta skuid . ip6 daddr . th dport @reach6 accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx port-unreachable
  }}
}}
"""
RESOLV_CONF = Path("/etc/resolv.conf")
DNS_PORT = 53
# Held while the table is made, so two dispatchers starting together make it once.
INSTALL_LOCK = Path("/run/runplane-fence.lock")


class FenceError(RuntimeError):
    """nftables refused a change."""


def _load() -> ctypes.CDLL | None:
    """libnftables (Debian's libnftables1, which the ``nftables`` package brings), or None."""
    try:
        library = ctypes.CDLL("libnftables.so.1")
    except OSError:  # another soname: ask the loader's cache (find_library runs ldconfig)
        name = ctypes.util.find_library("nftables")
        if name is None:
            return None
        try:
            library = ctypes.CDLL(name)
        except OSError:
            return None
    library.nft_ctx_new.argtypes = [ctypes.c_uint32]
    library.nft_ctx_new.restype = ctypes.c_void_p
    library.nft_ctx_free.argtypes = [ctypes.c_void_p]
    library.nft_ctx_free.restype = None
    for buffered in (library.nft_ctx_buffer_output, library.nft_ctx_buffer_error):
        buffered.argtypes = [ctypes.c_void_p]
        buffered.restype = ctypes.c_int
    library.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    library.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    library.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    library.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return library


# Loaded once per process at import (the runners' fork server hands it to every runner it forks).
_LIBRARY = _load()


@dataclass(frozen=True, order=True)
class Endpoint:
    address: str  # an IP address, never a name
    port: int

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.address).version

    def element(self, uid: int | None = None) -> str:
        head = f"{uid} . " if uid is not None else ""
        return f"{head}{self.address} . {self.port}"

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if self.family == 6 else f"{self.address}:{self.port}"


def address_endpoints(address: str) -> list[Endpoint]:
    """The endpoints of a ``host:port`` address."""
    host, _, port = address.rpartition(":")
    return resolve(host.strip("[]") or "127.0.0.1", int(port))


def resolve(host: str, port: int) -> list[Endpoint]:
    """Every address ``host`` names (a wildcard or unresolvable name: none), with ``port``."""
    if not host or host.startswith("/"):
        return []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    endpoints = set()
    for _family, _type, _proto, _name, address in found:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
        if not ip.is_unspecified:
            endpoints.add(Endpoint(str(ip), port))
    return sorted(endpoints)


def unavailable() -> str | None:
    """Why this machine cannot fence runs by the network, or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    if _LIBRARY is None:
        return "nftables is not installed (its library, libnftables; apt-get install nftables)"
    return None


def _nft(script: str, *, check: bool = True) -> bool:
    """Run an nft script (what ``nft -f -`` reads) in one transaction; whether nftables took it."""
    if _LIBRARY is None:
        raise FenceError(unavailable() or "nftables is not loaded")
    context = _LIBRARY.nft_ctx_new(0)
    if not context:
        raise FenceError("nftables: no context (out of memory)")
    try:
        _LIBRARY.nft_ctx_buffer_output(context)  # what a "list" prints is not ours to show
        _LIBRARY.nft_ctx_buffer_error(context)
        taken: bool = _LIBRARY.nft_run_cmd_from_buffer(context, script.encode()) == 0
        if check and not taken:
            error = (_LIBRARY.nft_ctx_get_error_buffer(context) or b"").decode(errors="replace")
            raise FenceError(f"nft refused: {error.strip()}")
        return taken
    finally:
        _LIBRARY.nft_ctx_free(context)


def install(uid_first: int, uid_count: int, control_plane: Iterable[Endpoint]) -> None:
    """Make the table (once per machine; its rules written again) and add this install's run uids and
    control-plane servers."""
    with INSTALL_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _nft(RULES)
    lines = [f"add element inet {TABLE} fenced_uids {{ {uid_first}-{uid_first + uid_count - 1} }}"]
    lines += _element_lines("add", "control_plane", control_plane)
    _nft("\n".join(lines) + "\n")


def _element_lines(verb: str, set_prefix: str, endpoints: Iterable[Endpoint], uid: int | None = None) -> list[str]:
    return [
        f"{verb} element inet {TABLE} {set_prefix}{endpoint.family} {{ {endpoint.element(uid)} }}"
        for endpoint in endpoints
    ]


def allow_run(uid: int, endpoints: Iterable[Endpoint], earlier: Iterable[Endpoint] = ()) -> None:
    """Let ``uid`` reach ``endpoints`` on this machine, and no longer what an earlier holder of the
    uid could (``earlier``), in one atomic change."""
    stale = list(earlier)
    # "add" first makes every "delete" valid even when the element is already gone.
    lines = _element_lines("add", "reach", stale, uid) + _element_lines("delete", "reach", stale, uid)
    lines += _element_lines("add", "reach", endpoints, uid)
    if lines:
        _nft("\n".join(lines) + "\n")


def is_control_plane(endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` is one of the control plane's servers in the table."""
    return _nft(f"get element inet {TABLE} control_plane{endpoint.family} {{ {endpoint.element()} }}", check=False)


def resolvers(resolv_conf: Path = RESOLV_CONF) -> list[Endpoint]:
    """The DNS resolvers ``resolv_conf`` names (its ``nameserver`` lines), on port 53."""
    try:
        text = resolv_conf.read_text()
    except OSError:
        return []
    found = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                found.add(Endpoint(str(ipaddress.ip_address(fields[1].split("%", 1)[0])), DNS_PORT))
            except ValueError:
                continue
    return sorted(found)


def local_resolvers(allowed: bool, resolv_conf: Path = RESOLV_CONF) -> list[Endpoint]:
    """The resolvers on this machine a run may reach: those ``resolv_conf`` names, when the operator
    allows it (``allowed``); none otherwise. A resolver elsewhere needs no rule."""
    return [e for e in resolvers(resolv_conf) if is_local(e)] if allowed else []


def is_local(endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` is on this machine (its packets would leave through ``lo``)."""
    ip = ipaddress.ip_address(endpoint.address)
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((endpoint.address, 0))  # only an address of this machine can be bound
        except OSError:
            return False
    return True


def dump(endpoints: Iterable[Endpoint]) -> bytes:
    return json.dumps([[e.address, e.port] for e in endpoints]).encode()


def load(data: bytes) -> list[Endpoint]:
    try:
        return [Endpoint(str(a), int(p)) for a, p in json.loads(data or b"[]")]
    except (ValueError, TypeError):
        return []
