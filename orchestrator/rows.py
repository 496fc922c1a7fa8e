"""The rows the leader's store port returns, one dataclass per column set of ``orchestrator/queries.sql``.

A field is a column of the query, in the query's order, typed as psycopg reads it (``bigint`` and
``integer`` as ``int``, a nullable column ``X | None``). States stay the stored words: ``'alive'`` or
``'dead'`` for a worker, ``'pending'`` or ``'claimed'`` for an ownership. A query that returns more of
a job than another has its own type, a subclass that adds those columns, so a caller that needs them
says so in its signature.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Worker:
    """A queuer worker the leader knows (``workers``)."""

    worker_id: str
    state: str


@dataclass(frozen=True, slots=True)
class Definition:
    """What an Assign or an Update says of a job (``assign_new``)."""

    job_id: int
    account_id: int
    version: int
    cron: str | None
    timezone: str
    missed_run_grace_seconds: int
    job_type: str
    priority: int
    jitter_seconds: int  # the bound of the job's fixed offset (runplane.basics.jitter)
    catchup_window_seconds: int  # how far back a new owner still queues a missed fire
    catchup_all: bool  # every missed fire within the window, not only the newest


@dataclass(frozen=True, slots=True)
class OwnedDefinition(Definition):
    """A job's definition with the fire time its next owner queues after (``pending_definitions``)."""

    fires_after: int


@dataclass(frozen=True, slots=True)
class StampedDefinition(OwnedDefinition):
    """A job's definition with its ownership's fires_after, the stamp of its Assign and its state
    (``definitions``)."""

    term: int
    clock: int
    state: str


@dataclass(frozen=True, slots=True)
class JobState:
    """What the leader decides on about a job (``job_states``): whether it should be scheduled and who
    has it. A job deleted for good that still has an ownership row has no definition: its job columns
    are None, ``schedulable`` False and ``owned`` True."""

    job_id: int
    account_id: int | None
    version: int | None
    cron: str | None
    timezone: str | None
    missed_run_grace_seconds: int | None
    job_type: str | None
    priority: int | None
    jitter_seconds: int | None
    catchup_window_seconds: int | None
    catchup_all: bool | None
    schedulable: bool
    owned: bool
    worker_id: str | None
    state: str | None
    sent_version: int | None

    def definition(self) -> Definition:
        """The job's definition; only a job that exists has one."""
        account_id, version, timezone = self.account_id, self.version, self.timezone
        grace, job_type, priority, jitter = (
            self.missed_run_grace_seconds,
            self.job_type,
            self.priority,
            self.jitter_seconds,
        )
        if (
            account_id is None
            or version is None
            or timezone is None
            or grace is None
            or job_type is None
            or priority is None
            or jitter is None
            or self.catchup_window_seconds is None
            or self.catchup_all is None
        ):
            raise ValueError(f"job {self.job_id} was deleted: it has no definition")
        return Definition(
            self.job_id,
            account_id,
            version,
            self.cron,
            timezone,
            grace,
            job_type,
            priority,
            jitter,
            self.catchup_window_seconds,
            self.catchup_all,
        )


@dataclass(frozen=True, slots=True)
class Ownership:
    """A job's ownership row with the job's current version, None when the job was deleted for good
    (``ownership``)."""

    job_id: int
    worker_id: str | None
    state: str
    term: int
    clock: int
    version: int
    job_version: int | None


@dataclass(frozen=True, slots=True)
class ClaimTaken:
    """A job a claim took (``claim``): the version its Assign sent and the job's version now (None when
    the job was deleted for good)."""

    job_id: int
    version: int
    job_version: int | None


@dataclass(frozen=True, slots=True)
class StalePending:
    """An Assign nobody claimed in time (``stale_pending``); ``worker_id`` None: on the shared queue."""

    job_id: int
    worker_id: str | None
    term: int
    clock: int


@dataclass(frozen=True, slots=True)
class ClaimedVersion:
    """An ownership row aimed at a worker, or pending on the shared queue (``worker_id`` None), with
    the version it was sent and the stamp of its Assign (``claimed_versions``)."""

    worker_id: str | None
    job_id: int
    version: int
    state: str
    term: int
    clock: int
