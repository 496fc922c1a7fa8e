"""Where a benchmark's CPU goes: per service process, and per Postgres backend by its client and statement.

A thread samples, every ``interval`` seconds, the CPU time (user + system) of the given processes
(with their children) and of every Postgres backend connected to one database, as ``psutil`` reads
it from ``/proc``: so Postgres must run on this machine (otherwise only the processes are counted).
A backend is named by its client's ``application_name`` (the bench starts each service with
``PGAPPNAME``) and the statement it ran most often in the samples: the noop launcher's claim and a
dispatcher's pass are told apart even when one process holds both connections. The machine's own
total over the same window shows what the rest of it (other tenants, the kernel) took.
"""

from __future__ import annotations

import collections
import contextlib
import re
import threading
import time
from typing import Any

import psutil
import psycopg

# The statement of a backend, by the first comment-free words that tell the statements apart.
_WORDS = re.compile(r"\s+")


def statement_label(query: str) -> str:
    lines = [line for line in query.splitlines() if line.strip() and not line.lstrip().startswith("--")]
    return _WORDS.sub(" ", " ".join(lines)).strip()[:48]


def _cpu(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


class CpuProfile:
    """Samples CPU seconds per process and per backend of ``database`` between ``start`` and ``stop``."""

    def __init__(self, database_url: str, processes: dict[str, int], interval: float = 0.2) -> None:
        self._url = database_url
        self._processes = processes
        self._named = set(processes.values())  # their children are counted apart from them
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._owner: dict[int, str] = {}
        self._statements: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-profile", daemon=True)
        self._machine_start: Any = None
        self._started = 0.0
        self._elapsed = 0.0

    def start(self) -> CpuProfile:
        self._started = time.monotonic()
        self._machine_start = psutil.cpu_times()
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._elapsed = time.monotonic() - self._started
        return self._report(psutil.cpu_times())

    def _see(self, pid: int, owner: str) -> None:
        seconds = _cpu(pid)
        if seconds is None:
            return
        self._first.setdefault(pid, seconds)
        self._last[pid] = seconds
        self._owner[pid] = owner

    def _run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            own = conn.info.backend_pid
            while True:
                for name, pid in self._processes.items():
                    self._see(pid, name)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        for child in psutil.Process(pid).children(recursive=True):
                            if child.pid not in self._named:
                                self._see(child.pid, f"{name} (child {child.name()})")
                rows = conn.execute(
                    """SELECT pid, coalesce(nullif(application_name, ''), backend_type), query, state
                         FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s""",
                    (own,),
                ).fetchall()
                for pid, app, query, state in rows:
                    self._see(pid, f"postgres: {app}")
                    if state == "active" and query:
                        self._statements[pid][statement_label(query)] += 1
                if self._stop.wait(self._interval):
                    return

    def _report(self, machine_end: Any) -> dict[str, Any]:
        by_owner: dict[str, float] = collections.defaultdict(float)
        by_statement: dict[str, float] = collections.defaultdict(float)
        for pid, owner in self._owner.items():
            used = self._last[pid] - self._first[pid]
            by_owner[owner] += used
            if owner.startswith("postgres: "):
                common = self._statements[pid].most_common(1)
                by_statement[f"{owner} | {common[0][0] if common else '(idle in the samples)'}"] += used
        busy_start = self._machine_start.user + self._machine_start.system + self._machine_start.nice
        busy_end = machine_end.user + machine_end.system + machine_end.nice
        counted = sum(by_owner.values())
        return {
            "seconds": round(self._elapsed, 2),
            "machine_cpu_s": round(busy_end - busy_start, 2),
            "counted_cpu_s": round(counted, 2),
            "by_process": {k: round(v, 2) for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1])},
            "postgres_by_statement": {
                k: round(v, 2) for k, v in sorted(by_statement.items(), key=lambda kv: -kv[1]) if v >= 0.05
            },
        }
