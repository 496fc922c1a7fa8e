"""Messages from workers, for the leader: Heartbeat (registration, liveness) and Claimed (an Assign
taken, accepted or refused)."""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import Message

from orchestrator.job_sync import JobSync
from orchestrator.outbox import WorkerInfo
from runplane.adapters.bus import Delivery
from runplane.basics.stamps import Stamp
from runplane.v1 import bus_pb2

log = logging.getLogger(__name__)


class Inbox(JobSync):
    async def on_message(self, message: Message, _delivery: Delivery) -> None:
        if isinstance(message, bus_pb2.Heartbeat):
            info = self.workers.get(message.worker_id)
            if info is not None and info.alive:
                # A live worker's beat decides nothing, so it does not wait for the lock: a long
                # sweep would otherwise delay it, and the claims queued behind it.
                await self._on_live_heartbeat(info, message)
                return
        async with self._lock:
            if isinstance(message, bus_pb2.Heartbeat):
                await self._on_heartbeat(message)
            elif isinstance(message, bus_pb2.Claimed):
                await self._on_claimed(message)
            else:
                log.warning("unexpected message on the orchestrator queue", extra={"type": type(message).__name__})

    async def _on_live_heartbeat(self, info: WorkerInfo, beat: bus_pb2.Heartbeat) -> None:
        info.last_seen = self.monotonic.now()
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = beat.owned_digest
        # Only while the row says alive: a burial that got in first stays a burial.
        await self.store.beat(beat.worker_id, beat.jobs_owned, info.owned_digest)

    async def _on_heartbeat(self, beat: bus_pb2.Heartbeat) -> None:
        """A beat from a worker not known to be alive (the caller holds the lock)."""
        worker_id = beat.worker_id
        info = self.workers.get(worker_id)
        if info is not None and info.alive:
            await self._on_live_heartbeat(info, beat)  # registered while this one waited
            return
        if not beat.registering:
            # Declared dead (or unknown to us): whatever it holds was given to others.
            await self._drop_all(worker_id)
            return
        now = self.monotonic.now()
        info = WorkerInfo(True, now, now)
        self.workers[worker_id] = info
        log.info("queuer worker registered", extra={"worker_id": worker_id})
        # Jobs may be waiting for workers: assign them once the workers starting together are in.
        asyncio.get_running_loop().call_later(self.settings.orchestrator.heartbeat_interval, self._full_sync.set)
        info.jobs_owned = beat.jobs_owned
        info.owned_digest = beat.owned_digest
        await self.store.heartbeat(worker_id, beat.jobs_owned, info.owned_digest)

    async def _drop_all(self, worker_id: str) -> None:
        stamp = self.clock.tick()
        log.warning("telling a worker declared dead to drop everything", extra={"worker_id": worker_id})
        await self.bus.publish(self.topology.worker(worker_id), bus_pb2.Revoke(stamp=stamp.to_proto(), drop_all=True))

    async def _on_claimed(self, claimed: bus_pb2.Claimed) -> None:
        claimer = claimed.worker_id
        job_ids = list(claimed.job_ids)
        stamp = Stamp.from_proto(claimed.stamp)
        if not self._is_alive(claimer):
            # Refused: what a dead worker took from the shared queue goes out again to the others.
            rows = await self.store.ownership(job_ids)
            unclaimed = [r["job_id"] for r in rows if r["worker_id"] is None and Stamp(r["term"], r["clock"]) == stamp]
            if unclaimed:
                await self._resend(unclaimed, None)
            return
        # Accepted: what is still pending under this very Assign, for this worker or the shared queue.
        accepted = await self.store.claim(claimer, job_ids, stamp)
        if len(accepted) < len(job_ids):
            taken = {r["job_id"] for r in accepted}
            rest = [job_id for job_id in job_ids if job_id not in taken]
            rows = await self.store.ownership(rest)
            # A job it holds already is a duplicate or older claim; any other was deleted,
            # deactivated or given to another worker since, and the claimer must let it go.
            holds = {r["job_id"] for r in rows if r["worker_id"] == claimer}
            refused = [job_id for job_id in rest if job_id not in holds]
            if refused:
                await self._revoke(claimer, refused)
        # An update that arrived while the claim was pending goes to the owner now.
        behind = [r["job_id"] for r in accepted if r["job_version"] is not None and r["job_version"] != r["version"]]
        if behind:
            fresh = await self.store.job_states(behind)
            await self._publish_assigns(await self._sync_locked(fresh))
