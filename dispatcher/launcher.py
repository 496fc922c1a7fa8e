"""The launcher interface: how a dispatched run gets a runner.

A dispatcher moves a run queued → starting in Postgres (issuing the run's token, stored hashed),
commits, then calls ``launch`` with the token. The runner it starts claims the run through the
runner API with that token (starting → running, compare-and-set), so launching twice is harmless.
A launcher hands the token over without putting it in an environment variable. Implementations:
``local`` (a process on this machine), ``noop`` (benchmarks) and ``kubernetes`` (a Pod per run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from runplane.basics.types import AccountId, JobId, RunId


@dataclass(frozen=True)
class LaunchRequest:
    run_id: RunId
    job_id: JobId
    account_id: AccountId
    attempt: int  # launch attempt, 1-based; part of a Pod's deterministic name
    memory_mb: int  # the account's memory limit per run
    timeout_seconds: int  # 0: none
    token: str = field(default="", repr=False)  # the run's token: the runner's only credential
    dbt_version: str = ""  # the environment's dbt version: picks the runner image; empty for plain commands


@dataclass(frozen=True)
class LaunchResult:
    cluster: str
    pod_name: str = ""  # where the runner lives (a Pod name, or "pid:1234" locally)
    warm: bool = False  # a started runner of a warm pool was waiting and took the run


class Launcher(Protocol):
    name: str

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start a runner for the run; raise ``runplane.basics.errors.LaunchError`` when it cannot."""
        ...

    async def close(self) -> None: ...
