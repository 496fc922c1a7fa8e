"""Nothing of a run outlives it: a local runner still alive after its run ended is killed whole.

A run ends without its runner when the reaper finds its lease expired ("runner lost": the runner
froze, starved or lost the API) or when a cancel is recorded for it by someone else; its runner
only learns that on its next call to the runner API, which a stuck runner never makes. Every
``CHECK_INTERVAL`` the local launcher's dispatcher reads which of the runs its live runners hold have
ended more than ``GRACE`` seconds ago (a runner that wrote its own outcome exits well within that),
and kills each such runner's run cgroup (``cgroup.kill``: the runner, its steps and whatever they
left behind, at once; a runner without a cgroup is killed through its pidfd, and its steps die with
it, see ``runner.steps``). The run cgroup's keeper, which holds the run uid's lease, releases it
only once the cgroup is empty (``runner.run_cgroup``), so the uid goes to another run only then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

from dispatcher.local_launcher import LocalLauncher
from runplane.adapters import cgroups
from runplane.adapters.db import Connection, fetch_values
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.supervise import sleep_or_stop
from runplane.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("dispatcher")

CHECK_INTERVAL = 1.0
GRACE = 2.0
KILL_TIMEOUT = 10.0  # how long the processes of a killed run cgroup may take to end


async def end_runners_of_ended_runs(
    pool: AsyncConnectionPool[Connection], launcher: LocalLauncher, stop: asyncio.Event
) -> None:
    """Until ``stop``: kill the runners whose runs ended without them."""
    while not await sleep_or_stop(stop, CHECK_INTERVAL):
        run_ids = launcher.runs_alive()
        if not run_ids:
            continue
        try:
            async with pool.connection() as conn:
                ended = await fetch_values(conn, Q["ended_runs"], {"run_ids": run_ids, "grace": GRACE}, int)
        except ServiceUnavailable as exc:
            log.warning("ended runs not read", extra={"error": str(exc)})
            continue
        for run_id in ended:
            opened = launcher.end_runner(run_id)
            if opened is None:
                continue  # it exited meanwhile
            where = ", ".join(str(directory) for directory, _ in opened) or "no run cgroup: the runner"
            log.warning("the runner of an ended run was still alive; killed: %s", where, extra={"run_id": run_id})
            if opened:
                await asyncio.to_thread(_empty, run_id, opened)


def _empty(run_id: int, opened: list[tuple[Path, int]]) -> None:
    """Kill and remove the run cgroups ``opened`` names, then close their descriptors."""
    deadline = time.monotonic() + KILL_TIMEOUT
    for directory, fd in opened:
        try:
            cgroups.kill(directory, deadline, opened=fd)
        except OSError as exc:
            log.error("a run cgroup was not emptied", extra={"run_id": run_id, "error": str(exc)})
        finally:
            os.close(fd)
