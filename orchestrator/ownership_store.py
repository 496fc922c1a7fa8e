"""The leader's port to the system of record: which worker owns which job (``job_ownership``),
the queuer workers it knows (``queuer_workers``) and the jobs it schedules.

``OwnershipStore`` is what the leader's decisions need, one method per named query of
``orchestrator/queries.sql``; ``PostgresOwnershipStore`` is the real adapter. The deterministic
simulator runs the same leader against an in-memory twin that follows the same compare-and-set and
uniqueness rules, proved by a conformance test that runs the same checks on both.

Rows are returned as the dataclasses of ``orchestrator/rows.py``, one per column set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from orchestrator.leadership import LeadershipLost
from orchestrator.rows import (
    ClaimedVersion,
    ClaimTaken,
    Definition,
    JobState,
    OwnedDefinition,
    Ownership,
    StalePending,
    StampedDefinition,
    Worker,
)
from runplane.adapters.db import Connection, RowT, connect, fetch_all
from runplane.basics.stamps import Stamp
from runplane.sql import load_queries

QUERIES = load_queries("orchestrator")


class OwnershipStore(Protocol):
    """Ownership of jobs by queuer workers, and the workers' registry, as the leader changes them."""

    async def workers(self) -> list[Worker]:
        """Every worker row: worker_id, state ('alive' or 'dead')."""
        ...

    async def heartbeat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        """Register (or revive) a worker as alive."""
        ...

    async def beat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        """Note a live worker's beat; a worker marked dead stays dead."""
        ...

    async def mark_dead(self, worker_id: str) -> None: ...

    async def job_states(self, job_ids: list[int]) -> list[JobState]:
        """Whether each job should be scheduled and who has it (jobs deleted for good included)."""
        ...

    async def assign_new(self, job_ids: list[int], stamp: Stamp, now: int) -> list[Definition]:
        """Record as pending on the shared queue those of ``job_ids`` that are schedulable and have no
        ownership row; returns their definitions. A job recorded by someone else meanwhile is left out."""
        ...

    async def drift(self) -> list[int]:
        """Every job whose ownership does not match what the job says."""
        ...

    async def account_jobs(self, account_id: int) -> list[int]: ...

    async def definitions(self, job_ids: list[int], worker_id: str | None, *, claimed: bool) -> list[StampedDefinition]:
        """Definitions of those of ``job_ids`` owned by ``worker_id`` (None: pending on the shared
        queue), only claimed ones when ``claimed``; with fires_after, term and clock."""
        ...

    async def pending_definitions(self, job_ids: list[int], worker_id: str | None) -> list[OwnedDefinition]: ...

    async def upsert_pending(
        self, job_ids: list[int], versions: list[int], worker_id: str | None, stamp: Stamp, now: int
    ) -> None:
        """Record an Assign stamped ``stamp``: pending until claimed; a job that had an owner keeps
        its fires_after, a new one starts at ``now``."""
        ...

    async def ownership(self, job_ids: list[int]) -> list[Ownership]: ...

    async def claim(self, worker_id: str, job_ids: list[int], stamp: Stamp) -> list[ClaimTaken]:
        """Compare-and-set: take what is still pending under exactly ``stamp``, unowned or aimed at
        ``worker_id``; returns job_id, version (sent) and job_version (now) of each taken."""
        ...

    async def sent_versions(self, job_ids: list[int], versions: list[int], now: int) -> None: ...

    async def delete_ownership(self, job_ids: list[int]) -> None: ...

    async def owned_by(self, worker_id: str) -> list[int]: ...

    async def owners(self) -> list[str]:
        """Every worker that owns or has a pending Assign for at least one job."""
        ...

    async def stale_pending(self, timeout: float) -> list[StalePending]:
        """Pending Assigns older than ``timeout`` seconds: job_id, worker_id, term, clock."""
        ...

    async def pending_count(self) -> int: ...

    async def claimed_by_worker(self) -> dict[str, list[int]]: ...

    async def claimed_versions(self) -> list[ClaimedVersion]:
        """worker_id, job_id, version, state of every row aimed at a worker."""
        ...

    async def claimed_counts(self) -> dict[str, int]: ...

    def changes(self, stop: asyncio.Event) -> AsyncIterator[tuple[str, int]]:
        """Job and account changes as they happen, ("job", job_id) or ("account", account_id), until
        ``stop`` is set."""
        ...


class PostgresOwnershipStore:
    """``OwnershipStore`` on Postgres: each method is one named query of ``orchestrator/queries.sql``."""

    def __init__(self, pool: AsyncConnectionPool[Connection], database_url: str, term: int) -> None:
        self.pool = pool
        self.database_url = database_url
        self.term = term

    @contextlib.asynccontextmanager
    async def _fenced(self) -> AsyncIterator[Connection]:
        """A transaction for one write of the leader of ``term``, taken only while that term is the newest.

        The term's row is read FOR SHARE in the write's transaction: a standby's election (which
        bumps the term) waits for writes under way, and every write after it is refused. A leader
        that stood still past losing its lock (a paused VM) and runs again before its watch notices
        is deposed at its first write, and the message it was handling goes back to the queue for
        the new leader: it never records a claim or an Assign that the new leader does not know of.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(QUERIES["fence"], {"term": self.term})
            if await cur.fetchone() is None:
                raise LeadershipLost(f"term {self.term} is over: a newer leader was elected")
            yield conn

    async def _write(self, name: str, params: dict[str, object]) -> None:
        async with self._fenced() as conn:
            await conn.execute(QUERIES[name], params)

    async def _write_returning(self, name: str, params: dict[str, object], row: type[RowT]) -> list[RowT]:
        async with self._fenced() as conn:
            return await fetch_all(conn, QUERIES[name], params, row)

    async def _fetch(self, name: str, params: dict[str, object], row: type[RowT]) -> list[RowT]:
        async with self.pool.connection() as conn:
            return await fetch_all(conn, QUERIES[name], params, row)

    async def _values(self, name: str, params: dict[str, object]) -> list[tuple[Any, ...]]:
        """The rows of a query of one or two columns, as tuples."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(QUERIES[name], params)
            return await cur.fetchall()

    async def workers(self) -> list[Worker]:
        return await self._fetch("workers", {}, Worker)

    async def heartbeat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        params = {"worker_id": worker_id, "jobs_owned": jobs_owned, "owned_digest": owned_digest}
        await self._write("heartbeat", params)

    async def beat(self, worker_id: str, jobs_owned: int, owned_digest: int) -> None:
        await self._write("beat", {"worker_id": worker_id, "jobs_owned": jobs_owned, "owned_digest": owned_digest})

    async def mark_dead(self, worker_id: str) -> None:
        await self._write("mark_dead", {"worker_id": worker_id})

    async def job_states(self, job_ids: list[int]) -> list[JobState]:
        return await self._fetch("job_states", {"job_ids": job_ids}, JobState)

    async def assign_new(self, job_ids: list[int], stamp: Stamp, now: int) -> list[Definition]:
        params = {"job_ids": job_ids, "term": stamp.term, "clock": stamp.clock, "now": now}
        return await self._write_returning("assign_new", params, Definition)

    async def drift(self) -> list[int]:
        return [job_id for (job_id,) in await self._values("drift", {})]

    async def account_jobs(self, account_id: int) -> list[int]:
        return [job_id for (job_id,) in await self._values("account_jobs", {"account_id": account_id})]

    async def definitions(self, job_ids: list[int], worker_id: str | None, *, claimed: bool) -> list[StampedDefinition]:
        params: dict[str, object] = {"job_ids": job_ids, "worker_id": worker_id, "claimed": claimed}
        return await self._fetch("definitions", params, StampedDefinition)

    async def pending_definitions(self, job_ids: list[int], worker_id: str | None) -> list[OwnedDefinition]:
        return await self._fetch("pending_definitions", {"job_ids": job_ids, "worker_id": worker_id}, OwnedDefinition)

    async def upsert_pending(
        self, job_ids: list[int], versions: list[int], worker_id: str | None, stamp: Stamp, now: int
    ) -> None:
        params: dict[str, object] = {
            "job_ids": job_ids,
            "versions": versions,
            "worker_id": worker_id,
            "term": stamp.term,
            "clock": stamp.clock,
            "now": now,
        }
        await self._write("upsert_pending", params)

    async def ownership(self, job_ids: list[int]) -> list[Ownership]:
        return await self._fetch("ownership", {"job_ids": job_ids}, Ownership)

    async def claim(self, worker_id: str, job_ids: list[int], stamp: Stamp) -> list[ClaimTaken]:
        params = {"worker_id": worker_id, "job_ids": job_ids, "term": stamp.term, "clock": stamp.clock}
        return await self._write_returning("claim", params, ClaimTaken)

    async def sent_versions(self, job_ids: list[int], versions: list[int], now: int) -> None:
        await self._write("sent_versions", {"job_ids": job_ids, "versions": versions, "now": now})

    async def delete_ownership(self, job_ids: list[int]) -> None:
        await self._write("delete_ownership", {"job_ids": job_ids})

    async def owned_by(self, worker_id: str) -> list[int]:
        return [job_id for (job_id,) in await self._values("owned_by", {"worker_id": worker_id})]

    async def owners(self) -> list[str]:
        return [str(worker_id) for (worker_id,) in await self._values("owners", {})]

    async def stale_pending(self, timeout: float) -> list[StalePending]:
        return await self._fetch("stale_pending", {"timeout": timeout}, StalePending)

    async def pending_count(self) -> int:
        rows = await self._values("pending_count", {})
        return int(rows[0][0]) if rows else 0

    async def claimed_by_worker(self) -> dict[str, list[int]]:
        return {str(worker_id): list(job_ids) for worker_id, job_ids in await self._values("claimed_by_worker", {})}

    async def claimed_versions(self) -> list[ClaimedVersion]:
        return await self._fetch("claimed_versions", {}, ClaimedVersion)

    async def claimed_counts(self) -> dict[str, int]:
        return {str(worker_id): int(n) for worker_id, n in await self._values("claimed_counts", {})}

    async def changes(self, stop: asyncio.Event) -> AsyncIterator[tuple[str, int]]:
        conn = await connect(self.database_url)
        try:
            await conn.execute("LISTEN runplane_jobs")
            await conn.execute("LISTEN runplane_accounts")
            while not stop.is_set():
                async for notify in conn.notifies(timeout=0.5):
                    try:
                        payload = json.loads(notify.payload)
                    except ValueError:
                        continue
                    if notify.channel == "runplane_jobs":
                        yield ("job", int(payload["job_id"]))
                    else:
                        yield ("account", int(payload["account_id"]))
        finally:
            await conn.close()
