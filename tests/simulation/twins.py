"""In-memory twins of the Postgres ports, for the deterministic simulator.

``MemoryDatabase`` holds the rows the scheduling protocol touches (jobs, job_ownership,
queuer_workers, runs, orchestrator_term); ``MemoryOwnershipStore`` and ``MemoryRunsStore`` answer
each port method the way its SQL does, with the same compare-and-set (a claim takes only what is
pending under exactly its stamp) and uniqueness rules (one ownership row per job, one run per
idempotency key). ``test_store_conformance`` runs the same checks on these and on real Postgres.

Every statement runs at once, with no await inside: in the simulation a statement is atomic, as it
is in Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from orchestrator import rows
from orchestrator.leadership import LeadershipLost
from queuer_worker.firing import PreparedTick, TickResult
from queuer_worker.heap import MissedFire
from runplane.basics.stamps import Stamp
from runplane.basics.types import schedule_idempotency_key

# A definition's columns in their order: job_id, account_id, version, cron, timezone,
# missed_run_grace_seconds, job_type, priority, jitter_seconds (the rows that say more of a job start
# with them).
DefinitionColumns = tuple[int, int, int, str | None, str, int, str, int, int, int, bool]


@dataclass
class JobRow:
    id: int
    account_id: int
    cron: str | None
    timezone: str = "UTC"
    missed_run_grace_seconds: int = 300
    job_type: str = "deploy"
    priority: int = 0
    jitter_seconds: int = 0
    catchup_window_seconds: int = 0
    catchup_all: bool = False
    version: int = 1
    deleted: bool = False
    deactivated: bool = False
    paused: bool = False

    @property
    def schedulable(self) -> bool:
        return not (self.deleted or self.deactivated or self.paused) and self.cron is not None

    def definition(self) -> rows.Definition:
        return rows.Definition(*self.definition_columns())

    def definition_columns(self) -> DefinitionColumns:
        return (
            self.id,
            self.account_id,
            self.version,
            self.cron,
            self.timezone,
            self.missed_run_grace_seconds,
            self.job_type,
            self.priority,
            self.jitter_seconds,
            self.catchup_window_seconds,
            self.catchup_all,
        )


@dataclass
class OwnershipRow:
    job_id: int
    worker_id: str | None
    state: str
    term: int
    clock: int
    version: int
    fires_after: int
    assigned_at: float


@dataclass
class WorkerRow:
    state: str
    jobs_owned: int = 0
    owned_digest: int = 0


@dataclass(frozen=True)
class ScheduleRow:
    """A row of ``job_schedules``: the schedule in force from ``valid_from`` on."""

    valid_from: float
    cron: str | None
    timezone: str
    fires: bool


@dataclass(frozen=True)
class RunRow:
    job_id: int
    account_id: int
    fire_ts: int
    queued_at: float
    queued_by: str


@dataclass
class MemoryDatabase:
    """The rows, and the database's own clock (``now()`` in SQL)."""

    now: Callable[[], float]
    jobs: dict[int, JobRow] = field(default_factory=dict)
    ownership: dict[int, OwnershipRow] = field(default_factory=dict)
    workers: dict[str, WorkerRow] = field(default_factory=dict)
    runs: dict[str, RunRow] = field(default_factory=dict)
    missed: set[str] = field(default_factory=set)  # keys of occurrences recorded as skipped, reason missed
    schedules: dict[int, list[ScheduleRow]] = field(default_factory=dict)
    term: int = 0
    _listeners: list[asyncio.Queue[tuple[str, int]]] = field(default_factory=list)
    _next_job_id: int = 1

    def bump_term(self) -> int:
        self.term += 1
        return self.term

    def add_job(self, account_id: int, cron: str | None, *, missed_run_grace_seconds: int = 300) -> JobRow:
        job = JobRow(self._next_job_id, account_id, cron, missed_run_grace_seconds=missed_run_grace_seconds)
        self._next_job_id += 1
        self.jobs[job.id] = job
        self.schedules[job.id] = [ScheduleRow(float("-inf"), job.cron, job.timezone, job.schedulable)]
        self.notify(job.id)
        return job

    def change_job(self, job_id: int, **fields: object) -> None:
        """Change a job the way the API does: the version is bumped in the same statement, and a
        change of its schedule is recorded in its history (the trigger ``jobs_schedule_history``)."""
        job = self.jobs[job_id]
        for name, value in fields.items():
            setattr(job, name, value)
        job.version += 1
        history = self.schedules[job_id]
        now = ScheduleRow(self.now(), job.cron, job.timezone, job.schedulable)
        last = history[-1]
        if (last.cron, last.timezone, last.fires) != (now.cron, now.timezone, now.fires):
            if last.valid_from == now.valid_from:
                history.pop()
            history.append(now)
        self.notify(job_id)

    def schedule_at(self, job_id: int, instant: float) -> ScheduleRow | None:
        """The schedule in force at ``instant`` (None: the job did not exist)."""
        in_force = None
        for row in self.schedules.get(job_id, []):
            if row.valid_from > instant:
                break
            in_force = row
        return in_force

    def notify(self, job_id: int) -> None:
        for listener in self._listeners:
            listener.put_nowait(("job", job_id))

    def listen(self) -> asyncio.Queue[tuple[str, int]]:
        queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        self._listeners.append(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue[tuple[str, int]]) -> None:
        if queue in self._listeners:
            self._listeners.remove(queue)


class MemoryOwnershipStore:
    """``OwnershipStore`` on a ``MemoryDatabase``: each method does what its query does."""

    def __init__(self, db: MemoryDatabase, term: int) -> None:
        self.db = db
        self.term = term

    def _fence(self) -> None:
        """Every write of a leader is refused once a newer term was elected (the query ``fence``)."""
        if self.db.term != self.term:
            raise LeadershipLost(f"term {self.term} is over: a newer leader was elected")

    async def workers(self) -> list[rows.Worker]:
        return [rows.Worker(w, row.state) for w, row in self.db.workers.items()]

    async def heartbeat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        self._fence()
        self.db.workers[worker_id] = WorkerRow("alive", jobs_owned, owned_digest)

    async def beat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        self._fence()
        row = self.db.workers.get(worker_id)
        if row is not None and row.state == "alive":
            row.jobs_owned, row.owned_digest = jobs_owned, owned_digest

    async def mark_dead(self, worker_id: str) -> None:
        self._fence()
        row = self.db.workers.get(worker_id)
        if row is not None:
            row.state = "dead"

    async def job_states(self, job_ids: list[int]) -> list[rows.JobState]:
        found: list[rows.JobState] = []
        for job_id in job_ids:
            job = self.db.jobs.get(job_id)
            own = self.db.ownership.get(job_id)
            if job is None:
                if own is not None:
                    no_job = (None,) * 10
                    found.append(rows.JobState(job_id, *no_job, False, True, own.worker_id, own.state, own.version))
                continue
            found.append(
                rows.JobState(
                    *job.definition_columns(),
                    job.schedulable,
                    own is not None,
                    own.worker_id if own else None,
                    own.state if own else None,
                    own.version if own else None,
                )
            )
        return found

    async def assign_new(self, job_ids: list[int], stamp: Stamp, now: int) -> list[rows.Definition]:
        self._fence()
        found: list[rows.Definition] = []
        for job_id in job_ids:
            job = self.db.jobs.get(job_id)
            if job is None or not job.schedulable or job_id in self.db.ownership:
                continue
            self.db.ownership[job_id] = OwnershipRow(
                job_id, None, "pending", stamp.term, stamp.clock, job.version, now, self.db.now()
            )
            found.append(job.definition())
        return found

    async def drift(self) -> list[int]:
        drifted: set[int] = set()
        for job in self.db.jobs.values():
            own = self.db.ownership.get(job.id)
            if own is None:
                wrong = job.schedulable
            else:
                wrong = not job.schedulable or (own.state == "claimed" and own.version != job.version)
            if wrong:
                drifted.add(job.id)
        drifted.update(job_id for job_id in self.db.ownership if job_id not in self.db.jobs)
        return sorted(drifted)

    async def account_jobs(self, account_id: int) -> list[int]:
        return [j.id for j in self.db.jobs.values() if j.account_id == account_id]

    def _owned(self, job_ids: list[int], worker_id: str | None) -> list[tuple[OwnershipRow, JobRow]]:
        found = []
        for job_id in job_ids:
            own = self.db.ownership.get(job_id)
            job = self.db.jobs.get(job_id)
            if own is not None and job is not None and own.worker_id == worker_id:
                found.append((own, job))
        return found

    async def definitions(
        self, job_ids: list[int], worker_id: str | None, *, claimed: bool
    ) -> list[rows.StampedDefinition]:
        return [
            rows.StampedDefinition(*job.definition_columns(), own.fires_after, own.term, own.clock, own.state)
            for own, job in self._owned(job_ids, worker_id)
            if not claimed or own.state == "claimed"
        ]

    async def pending_definitions(self, job_ids: list[int], worker_id: str | None) -> list[rows.OwnedDefinition]:
        return [
            rows.OwnedDefinition(*job.definition_columns(), own.fires_after)
            for own, job in self._owned(job_ids, worker_id)
            if own.state == "pending"
        ]

    async def upsert_pending(
        self, job_ids: list[int], versions: list[int], worker_id: str | None, stamp: Stamp, now: int
    ) -> None:
        self._fence()
        for job_id, version in zip(job_ids, versions, strict=True):
            own = self.db.ownership.get(job_id)
            fires_after = now if own is None else own.fires_after
            self.db.ownership[job_id] = OwnershipRow(
                job_id, worker_id, "pending", stamp.term, stamp.clock, version, fires_after, self.db.now()
            )

    async def ownership(self, job_ids: list[int]) -> list[rows.Ownership]:
        found: list[rows.Ownership] = []
        for job_id in job_ids:
            own = self.db.ownership.get(job_id)
            if own is None:
                continue
            job = self.db.jobs.get(job_id)
            job_version = job.version if job else None
            found.append(
                rows.Ownership(job_id, own.worker_id, own.state, own.term, own.clock, own.version, job_version)
            )
        return found

    async def claim(self, worker_id: str, job_ids: list[int], stamp: Stamp) -> list[rows.ClaimTaken]:
        self._fence()
        taken: list[rows.ClaimTaken] = []
        for job_id in dict.fromkeys(job_ids):
            own = self.db.ownership.get(job_id)
            if (
                own is None
                or own.state != "pending"
                or (own.term, own.clock) != (stamp.term, stamp.clock)
                or own.worker_id not in (None, worker_id)
            ):
                continue
            own.state, own.worker_id = "claimed", worker_id
            job = self.db.jobs.get(job_id)
            taken.append(rows.ClaimTaken(job_id, own.version, job.version if job else None))
        return taken

    async def sent_versions(self, job_ids: list[int], versions: list[int], now: int) -> None:
        self._fence()
        for job_id, version in zip(job_ids, versions, strict=True):
            own = self.db.ownership.get(job_id)
            if own is not None:
                own.version, own.fires_after = version, max(own.fires_after, now)

    async def delete_ownership(self, job_ids: list[int]) -> None:
        self._fence()
        for job_id in job_ids:
            self.db.ownership.pop(job_id, None)

    async def owned_by(self, worker_id: str) -> list[int]:
        return [o.job_id for o in self.db.ownership.values() if o.worker_id == worker_id]

    async def owners(self) -> list[str]:
        return sorted({o.worker_id for o in self.db.ownership.values() if o.worker_id is not None})

    async def stale_pending(self, timeout: float) -> list[rows.StalePending]:
        before = self.db.now() - timeout
        return [
            rows.StalePending(o.job_id, o.worker_id, o.term, o.clock)
            for o in self.db.ownership.values()
            if o.state == "pending" and o.assigned_at < before
        ]

    async def pending_count(self) -> int:
        return sum(o.state == "pending" for o in self.db.ownership.values())

    async def claimed_by_worker(self) -> dict[str, list[int]]:
        owned: dict[str, list[int]] = {}
        for o in sorted(self.db.ownership.values(), key=lambda o: o.job_id):
            if o.state == "claimed":
                owned.setdefault(str(o.worker_id), []).append(o.job_id)
        return owned

    async def claimed_versions(self) -> list[rows.ClaimedVersion]:
        return [
            rows.ClaimedVersion(o.worker_id, o.job_id, o.version, o.state, o.term, o.clock)
            for o in self.db.ownership.values()
            if o.worker_id is not None or o.state == "pending"
        ]

    async def claimed_counts(self) -> dict[str, int]:
        return {w: len(jobs) for w, jobs in (await self.claimed_by_worker()).items()}

    async def changes(self, stop: asyncio.Event) -> AsyncIterator[tuple[str, int]]:
        queue = self.db.listen()
        try:
            while not stop.is_set():
                try:
                    yield await asyncio.wait_for(queue.get(), 0.5)
                except TimeoutError:
                    continue
        finally:
            self.db.unlisten(queue)


class MemoryRunsStore:
    """``RunsStore`` on a ``MemoryDatabase``: one run per idempotency key, only for jobs schedulable now
    whose schedule in force at the fire is the one the fire was computed from."""

    def __init__(self, db: MemoryDatabase, queued_by: str) -> None:
        self.db = db
        self.queued_by = queued_by

    async def queue_runs(self, tick: PreparedTick) -> TickResult:
        queued = 0
        accounts: set[int] = set()
        for job_id, fire_ts, cron, timezone, _ in tick.due:
            job = self.db.jobs.get(job_id)
            key = schedule_idempotency_key(job_id, fire_ts)
            if job is None or not job.schedulable or key in self.db.runs or key in self.db.missed:
                continue
            in_force = self.db.schedule_at(job_id, fire_ts)
            if in_force is None or not in_force.fires or (in_force.cron, in_force.timezone) != (cron, timezone):
                continue
            self.db.runs[key] = RunRow(job_id, job.account_id, fire_ts, self.db.now(), self.queued_by)
            queued += 1
            accounts.add(job.account_id)
        return TickResult(queued, 0, frozenset(accounts))

    async def record_missed(self, missed: list[MissedFire]) -> int:
        recorded = 0
        for job_id, fire_ts, cron, timezone, _ in missed:
            job = self.db.jobs.get(job_id)
            key = schedule_idempotency_key(job_id, fire_ts)
            if job is None or not job.schedulable or key in self.db.runs or key in self.db.missed:
                continue
            in_force = self.db.schedule_at(job_id, fire_ts)
            if in_force is None or not in_force.fires or (in_force.cron, in_force.timezone) != (cron, timezone):
                continue
            self.db.missed.add(key)
            recorded += 1
        return recorded

    async def deactivate_never_fires(self, job_id: int, version: int, cron: str, timezone: str) -> bool:
        job = self.db.jobs.get(job_id)
        if job is None or job.version != version or job.deleted or job.deactivated:
            return False
        self.db.change_job(job_id, deactivated=True)
        return True

    async def worker_state(self, worker_id: str) -> str | None:
        row = self.db.workers.get(worker_id)
        return row.state if row is not None else None
