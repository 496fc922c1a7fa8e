"""A dbt run's setup as steps of its own: the prep's parts (``runner.prepare``) become the run's
first steps, each with its status, duration and log, as dbt Cloud lists them ("Clone git
repository", "Create profile from connection …", "Invoke dbt deps"). How many there are comes from
the claim (``RunSpec.setup_steps``); with none, the prep writes into the first step's log.
"""

from __future__ import annotations

from runner.control_plane import RunnerApi
from runner.run_logs import RunLogs
from runplane.basics.types import RunStatus

PARTS = ("checkout", "profile", "deps")  # in the order of the setup steps


class SetupSteps:
    def __init__(self, api: RunnerApi, logs: RunLogs, count: int) -> None:
        self._api = api
        self._logs = logs
        self._count = min(count, len(PARTS))
        self._open: int | None = None  # the setup step that is running
        self._last = 0  # where the prep's lines go: the running setup step, else the last one

    def say(self, line: str) -> None:
        self._logs.write(self._last, f"runplane: {line}\n".encode())

    def output(self, data: bytes) -> None:
        self._logs.write(self._last, data)

    async def part(self, name: str) -> None:
        """The prep starts part ``name``: the step before it succeeded, the part's step starts."""
        index = PARTS.index(name)
        if index >= self._count:
            return
        await self._end(RunStatus.SUCCESS)
        await self._api.step_started(index)
        self._open = self._last = index

    async def done(self) -> None:
        """The prep is over: its last step succeeded."""
        await self._end(RunStatus.SUCCESS)

    async def failed(self, message: str, status: RunStatus = RunStatus.ERROR) -> None:
        """The prep ended the run: the running setup step ends with ``status`` and ``message`` in
        its log, every step after it (the job's commands too) is skipped."""
        self.say(message)
        if self._open is None:
            self._logs.end_step(self._last)
            await self._api.steps_skipped(0)
            return
        index = self._open
        await self._end(status)
        await self._api.steps_skipped(index + 1)

    async def _end(self, status: RunStatus) -> None:
        if self._open is None:
            return
        index, self._open = self._open, None
        self._logs.end_step(index)
        await self._api.step_finished(index, int(status), None)
