"""Messages from workers, for the leader: Heartbeat (registration, liveness) and Claimed (an Assign
taken, accepted or refused)."""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import Message

from orchestrator.decisions import (
    Beat,
    WorkerInfo,
    claim_refused,
    claimed_by_another,
    judge_beat,
    registered,
    revoke_stamps,
)
from orchestrator.job_sync import JobSync
from orchestrator.outbox import Outbox
from orchestrator.rows import Ownership
from orchestrator.state import LeaderState
from runplane.adapters.bus import Delivery
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)


class Inbox:
    """The handler of the orchestrator queue."""

    def __init__(self, state: LeaderState, outbox: Outbox, job_sync: JobSync) -> None:
        self.state = state
        self.outbox = outbox
        self.job_sync = job_sync

    async def on_message(self, message: Message, _delivery: Delivery) -> None:
        """Act on one message from a worker (the bus acks it once this returns)."""
        if isinstance(message, bus_pb2.Heartbeat):
            info = self.state.workers.get(message.worker_id)
            if info is not None and info.alive:
                # A live worker's beat decides nothing, so it does not wait for the lock: a long
                # sweep would otherwise delay it, and the claims queued behind it.
                await self._on_live_heartbeat(info, message)
                return
        async with self.state.lock:
            if isinstance(message, bus_pb2.Heartbeat):
                await self._on_heartbeat(message)
            elif isinstance(message, bus_pb2.Claimed) and message.released:
                await self._on_released(message)
            elif isinstance(message, bus_pb2.Claimed):
                await self._on_claimed(message)
            else:
                log.warning("unexpected message on the orchestrator queue", extra={"type": type(message).__name__})

    async def _on_live_heartbeat(self, info: WorkerInfo, beat: bus_pb2.Heartbeat) -> None:
        info.last_seen = self.state.monotonic.now()
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = beat.owned_digest
        info.heard = Stamp.from_proto(beat.applied)
        # Only while the row says alive: a burial that got in first stays a burial.
        await self.state.store.beat(beat.worker_id, beat.jobs_owned, info.owned_digest)

    async def _on_heartbeat(self, beat: bus_pb2.Heartbeat) -> None:
        """A beat from a worker not known to be alive (the caller holds the lock)."""
        worker_id = beat.worker_id
        info = self.state.workers.get(worker_id)
        verdict = judge_beat(info, beat)
        if verdict is Beat.LIVE:
            assert info is not None
            await self._on_live_heartbeat(info, beat)  # registered while this one waited
            return
        if verdict is Beat.DROP_ALL:
            # Declared dead (or unknown to us): whatever it holds was given to others.
            await self._drop_all(worker_id)
            return
        info, revokes = registered(info, self.state.monotonic.now())
        self.state.workers[worker_id] = info
        log.info("queuer worker registered", extra={"worker_id": worker_id})
        for revoke_stamp, revoked in revokes:
            await self.outbox.revoke(worker_id, revoked, revoke_stamp)
        # Jobs may be waiting for workers: assign them once the workers starting together are in.
        interval = self.state.settings.orchestrator.heartbeat_interval
        asyncio.get_running_loop().call_later(interval, self.job_sync.request_sweep)
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = beat.owned_digest
        info.heard = Stamp.from_proto(beat.applied)
        await self.state.store.heartbeat(worker_id, beat.jobs_owned, info.owned_digest)

    async def _drop_all(self, worker_id: str) -> None:
        """Tell a worker declared dead (or unknown) to drop everything it was given before now.

        Every beat it sends before it hears this is answered, so several may be on the way; all carry
        the stamp of the first. A worker that applied one, re-registered and claimed new Assigns keeps
        them when a later copy arrives: with a newer stamp per copy, that copy would drop jobs it owns
        (they were never fired again, until the ownership digest's repair).
        """
        now = self.state.monotonic.now()
        info = self.state.workers.setdefault(worker_id, WorkerInfo(False, now, now))
        if info.drop_stamp is None:
            info.drop_stamp = info.floor = self.state.clock.tick()
        log.warning("telling a worker declared dead to drop everything", extra={"worker_id": worker_id})
        revoke = bus_pb2.Revoke(stamp=info.drop_stamp.to_proto(), drop_all=True)
        await self.state.bus.publish(self.state.topology.worker(worker_id), revoke)

    async def _refuse_claim(self, claimer: str, job_ids: list[int], rows: list[Ownership], stamp: Stamp) -> None:
        """The claimer lets go of what it claimed, and what it took from the shared queue goes out again.

        Each Revoke is stamped below any Assign of its jobs the claimer may take from the shared queue
        (``decisions.revoke_stamps``): a Revoke stamped after one would make it drop jobs it then owns (a
        Revoke kept for a dead claimer is sent when it re-registers, later than the Assign).
        ``rows``: the ownership rows of the jobs it claimed (none for a job deleted since)."""
        unclaimed = [r.job_id for r in rows if r.worker_id is None and Stamp(r.term, r.clock) == stamp]
        plan = revoke_stamps(rows, job_ids, stamp, self.state.clock)
        if self.state.is_alive(claimer):
            owns = {r.job_id for r in rows if r.worker_id == claimer and r.state == "claimed"}
            for revoke_stamp, revoked in sorted(plan.items()):
                if kept := [job_id for job_id in revoked if job_id not in owns]:
                    await self.outbox.revoke(claimer, kept, revoke_stamp)
        else:
            now = self.state.monotonic.now()
            info = self.state.workers.setdefault(claimer, WorkerInfo(False, now, now))
            for revoke_stamp, revoked in plan.items():
                info.refused.update(dict.fromkeys(revoked, revoke_stamp))
        if unclaimed:
            await self.outbox.resend(unclaimed, None)

    async def _on_claimed(self, claimed: bus_pb2.Claimed) -> None:
        claimer = claimed.worker_id
        job_ids = list(claimed.job_ids)
        stamp = Stamp.from_proto(claimed.stamp)
        info = self.state.workers.get(claimer)
        if claim_refused(info, stamp):
            # What it took from the shared queue goes out again to the others; it lets go once it
            # hears its queue.
            rows = await self.state.store.ownership(job_ids)
            await self._refuse_claim(claimer, job_ids, rows, stamp)
            await self._reassign_doubled(claimed_by_another(rows, claimer, stamp))
            return
        # Accepted: what is still pending under this very Assign, for this worker or the shared queue.
        # Only when some of it is not (rarely) are the rows read again.
        accepted = await self.state.store.claim(claimer, job_ids, stamp)
        if len(accepted) < len(job_ids):
            taken = {r.job_id for r in accepted}
            rest = [job_id for job_id in job_ids if job_id not in taken]
            rows = await self.state.store.ownership(rest)
            # A job it holds already is a duplicate or older claim; any other was deleted,
            # deactivated or given to another worker since, and the claimer must let it go.
            holds = {r.job_id for r in rows if r.worker_id == claimer}
            refused = [job_id for job_id in rest if job_id not in holds]
            for revoke_stamp, revoked in sorted(revoke_stamps(rows, refused, stamp, self.state.clock).items()):
                await self.outbox.revoke(claimer, revoked, revoke_stamp)
            await self._reassign_doubled(claimed_by_another(rows, claimer, stamp))
        # An update that arrived while the claim was pending goes to the owner now.
        behind = [r.job_id for r in accepted if r.job_version is not None and r.job_version != r.version]
        if behind:
            fresh = await self.state.store.job_states(behind)
            await self.outbox.publish_assigns(await self.job_sync.sync_locked(fresh))

    async def _on_released(self, released: bus_pb2.Claimed) -> None:
        """The claimer let go of an Assign whose Claimed got no confirm: what this leader recorded of
        that very claim goes out again (revoked from it first, in case it took that Assign again)."""
        stamp = Stamp.from_proto(released.stamp)
        rows = await self.state.store.ownership(list(released.job_ids))
        recorded = [
            r
            for r in rows
            if r.worker_id == released.worker_id and r.state == "claimed" and Stamp(r.term, r.clock) == stamp
        ]
        await self._reassign_doubled(recorded)

    async def _reassign_doubled(self, rows: list[Ownership]) -> None:
        """Take back from their owners the jobs of an Assign another worker claimed too, and assign them
        again on the shared queue (after the second claimer's Revoke, stamped before it).

        The broker gives an Assign out again only when its taker did not ack it: its Claimed could not
        be published, so it holds none of it, yet that Claimed may have reached the leader (no confirm
        came, but the message was routed) and made it the owner of jobs it does not hold. Or the
        delivery was doubled and both hold it. Either way, neither owner is sure: the owner is revoked
        and the jobs go out under a new stamp, to whichever worker takes them."""
        by_owner: dict[str, list[int]] = {}
        for row in rows:
            by_owner.setdefault(str(row.worker_id), []).append(row.job_id)
        for owner, job_ids in sorted(by_owner.items()):
            definitions = await self.state.store.definitions(job_ids, owner, claimed=True)
            if not definitions:
                continue
            log.info("an Assign claimed twice goes out again", extra={"worker_id": owner, "jobs": len(job_ids)})
            fires_after = {r.job_id: r.fires_after for r in definitions}
            await self.outbox.move(definitions, owner, to=None, fires_after=fires_after)
