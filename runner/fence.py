"""A local run fenced like a Pod: what the runner does as root between its claim and the switch to the run's uid.

1. The network (``runplane.network_fence``): the run's uid may reach the runner API, the
   warehouses its environment names on this machine and, when the operator allows it, the DNS
   resolver of this machine, nothing else here, and only so many connections at once; a warehouse that is one of
   the control plane's own servers is refused, loudly (on one machine its Postgres trusts local
   clients: reaching the port is a superuser login).
2. A cgroup (``runner.run_cgroup``) with the run's memory (plus the runner's own), its pids (the
   dispatcher's share of the machine for one run: ``runplane.local_capacity``) and its CPU weight
   and cap, joined by the runner so everything the run starts is counted and killed at its end.
3. A Landlock domain of the run's own (``runplane.landlock``), entered by the thread that starts
   every process of the run: abstract Unix sockets, which nftables does not see, are reachable only
   when the run made them.
4. The switch to the uid (``runner.run_user``), and the namespaces every step of the run gets
   (``runner.sandbox``), whose shared writable places are directories of the run's size-capped
   scratch space (``runplane.run_scratch``), mounted when the uid was leased.
5. The open-files limit of the run (``runner.local_open_files``), soft and hard, for the runner and
   every step, instead of the dispatcher's.

What this machine cannot offer (``runplane.local_fence``: not root, no nftables, no bubblewrap, no
memory or pids controller, no Landlock scopes) is said at start by the dispatcher and ``runplane up``; a run then goes
without it.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from runner import run_cgroup, sandbox, warehouse_directory
from runner.control_plane import RunSpec
from runner.run_user import RunUser, switch_to
from runplane.adapters import cgroups, landlock, local_fence, network_fence, run_scratch
from runplane.adapters.network_fence import Endpoint
from runplane.basics.settings import Settings

log = logging.getLogger(__name__)

# Warehouse adapters whose profile names a host and port, with their default port.
# OTLP over gRPC, the exporter runplane uses, by the endpoint's scheme when it names no port.
_OTLP_PORTS = {"http": 4317, "https": 4317}
WAREHOUSE_PORTS = {"postgres": 5432, "redshift": 5439, "materialize": 6875, "mysql": 3306, "sqlserver": 1433}


@dataclass(frozen=True)
class Fence:
    confinement: tuple[str, ...] = ()  # the argv prefix of every step (runner.steps.Limits)
    cgroup: run_cgroup.RunCgroup | None = None
    refusal: str = ""  # why the run may not start (said in its log and outcome)
    keeper: int = field(default=-1, repr=False)  # held until the runner exits
    work_root: Path | None = None  # where the run's checkout is made (None: the temporary directory)
    scratch: Path | None = None  # the run's size-capped scratch space (``runplane.run_scratch``), if mounted
    disk: Path | None = None  # the run's size-capped HOME and checkout (``runner.run_user``), if mounted

    def scratch_full(self) -> bool:
        """Whether the run's scratch space or disk is out of room: a write of the run's failed for its quota."""
        return bool(self.filled())

    def filled(self) -> str:
        """Which of the run's size-capped places is out of room, said for its outcome; "" when none is."""
        if self.scratch is not None and run_scratch.full(self.scratch):
            return "the run's scratch space (/tmp and the other shared places, runner.local_scratch_mb)"
        if self.disk is not None and run_scratch.full(self.disk):
            return "the run's HOME and checkout (runner.local_disk_mb)"
        return ""


def warehouse_endpoints(spec: RunSpec) -> list[Endpoint]:
    """The addresses of the warehouse the run's environment names."""
    if not spec.HasField("dbt"):
        return []
    connection = spec.dbt.connection
    host = connection.get("host", "")
    default = WAREHOUSE_PORTS.get(spec.dbt.adapter_type)
    try:
        port = int(connection.get("port") or default or 0)
    except ValueError:
        return []
    return network_fence.resolve(host, port) if port > 0 else []


def _traces(settings: Settings) -> list[Endpoint]:
    """Where the runner exports its traces (``otlp_endpoint``), which it does as the run's uid. A step
    reaching it too can only add spans: a collector takes telemetry and holds no credential."""
    endpoint = settings.otlp_endpoint
    url = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")  # a URL, or host:port as gRPC takes it
    if not url.hostname:
        return []
    return network_fence.resolve(url.hostname, url.port or _OTLP_PORTS.get(url.scheme, 4317))


def enter(settings: Settings, user: RunUser, spec: RunSpec) -> Fence:
    """As root: fence the run, then switch to its uid for good."""
    # Set for the run, not inherited from the dispatcher (whose limit grows with its capacity).
    open_files = settings.runner.local_open_files
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    groups, refusal = warehouse_directory.prepare_shared(settings.runner, spec)
    if not settings.runner.local_fence:
        switch_to(user, groups)
        return Fence(refusal=refusal, work_root=user.work, scratch=user.scratch, disk=user.disk)
    if network_fence.unavailable() is None:
        warehouse = [e for e in warehouse_endpoints(spec) if network_fence.is_local(e)]
        owned = [e for e in warehouse if network_fence.is_control_plane(e)]
        if owned:
            refusal = refusal or (
                f"the warehouse {', '.join(map(str, owned))} is a server of runplane's own control plane; a run "
                "may not reach it (its clients on this machine need no password): give the environment a "
                "warehouse of its own"
            )
            warehouse = []
        earlier = network_fence.load(os.pread(user.lease_fd, 65536, 0))
        resolvers = network_fence.local_resolvers(settings.runner.local_resolver)
        reach = sorted(
            {*network_fence.address_endpoints(settings.runner.api_address), *warehouse, *_traces(settings), *resolvers}
        )
        network_fence.allow_run(user.uid, reach, earlier)
        record = network_fence.dump(reach)  # for the next holder of the uid to take away
        os.ftruncate(user.lease_fd, 0)
        os.pwrite(user.lease_fd, record, 0)
    cgroup = None
    keeper = -1
    if cgroups.unavailable() is None:
        memory = spec.memory_mb * 1024 * 1024 + run_cgroup.RUNNER_ALLOWANCE
        cgroup = run_cgroup.create(
            user.uid,
            memory_bytes=memory,
            pids_max=settings.runner.local_pids_max,  # the dispatcher's share of the machine for a run
            cpu_weight=spec.cpu_weight or settings.runner.local_cpu_weight,  # the account's, else the operator's
            cpu_max=spec.cpu_max or settings.runner.local_cpu_max,
        )
        keeper = run_cgroup.join(cgroup, user.lease_fd, user.scratch, user.disk)
    confinement: tuple[str, ...] = ()
    if local_fence.sandbox_unavailable() is None:
        dbt_installs = [str(Path(bin_dir).parent) for bin_dir in settings.runner.dbt_versions.values()]
        confinement = sandbox.confinement(user.tmp.parent, settings.runner.local_hidden_paths, dbt_installs)
    if landlock.unavailable() is None:
        landlock.scope_abstract_unix_sockets()  # as root: no need for no_new_privs
    switch_to(user, groups)
    return Fence(confinement, cgroup, refusal, keeper, user.work, user.scratch, user.disk)
