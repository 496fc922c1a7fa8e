"""runplane's real services as OS processes (``python -m runplane <command>``) for the scale and
failover scenarios: each on its own database, bus prefix and Redis prefix, always stopped and
cleaned up afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import subprocess
from pathlib import Path

import psycopg

from bench.records import Unavailable
from bench.sandbox import child_env, delete_prefixed_keys, kill_hard, log_tail, start, stop, unique_name
from runplane.adapters.bus import AmqpBus, Topology
from runplane.basics.settings import Settings

ENTRY_POINTS = {"orchestrator": "orchestrator.service", "queuer-worker": "queuer_worker.service"}


def require_services(*commands: str) -> None:
    """Unavailable unless every named service is implemented in this checkout."""
    for command in commands:
        module = ENTRY_POINTS[command]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise Unavailable(f"runplane's {command} is not implemented here ({module} is missing)")


class RunplaneServices:
    """Start, kill and clean up runplane service processes sharing one database and prefix."""

    def __init__(self, database_url: str, log_dir: Path, **settings: str) -> None:
        self.database_url = database_url
        self.prefix = unique_name("rpbench")
        self.log_dir = log_dir
        self.env = child_env(
            RUNPLANE_DATABASE_URL=database_url,
            RUNPLANE_BUS_PREFIX=self.prefix,
            RUNPLANE_REDIS_PREFIX=self.prefix,
            RUNPLANE_LOG_FORMAT="text",
            RUNPLANE_LOG_LEVEL="WARNING",
            RUNPLANE_METRICS_PORT="0",
            **settings,
        )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> RunplaneServices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, command: str, name: str, *args: str) -> subprocess.Popen[bytes]:
        proc = start(["-m", "runplane", command, *args], self.env, self.log_path(name))
        self.processes[name] = proc
        return proc

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def kill_hard(self, name: str) -> None:
        kill_hard(self.processes[name])

    def check_alive(self) -> None:
        """Raise with the log of any service that exited on its own."""
        for name, proc in self.processes.items():
            code = proc.poll()
            if code is not None and code != -9:
                raise RuntimeError(f"runplane {name} exited {code}:\n{log_tail(self.log_path(name))}")

    def close(self) -> None:
        for proc in self.processes.values():
            stop(proc, grace=25.0)
        worker_ids: list[str] = []
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.database_url, autocommit=True) as conn:
            worker_ids = [row[0] for row in conn.execute("SELECT worker_id FROM queuer_workers")]
        asyncio.run(_delete_queues(self.prefix, worker_ids))
        delete_prefixed_keys(self.prefix)


async def _delete_queues(prefix: str, worker_ids: list[str]) -> None:
    topology = Topology(prefix)
    bus = await AmqpBus.connect(Settings().amqp_url)
    try:
        for queue in (topology.assign, topology.orchestrator, topology.pickup, *map(topology.worker, worker_ids)):
            await bus.delete(queue)
    finally:
        await bus.close()
