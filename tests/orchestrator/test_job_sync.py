"""The leader's job sync alone: new jobs assigned on the shared queue, jobs no longer schedulable
revoked from their owners, changed jobs sent to them, notifications collected into one sync."""

from __future__ import annotations

import asyncio

from orchestrator.job_sync import JobSync
from orchestrator.outbox import Outbox
from runplane.v1 import bus_pb2
from tests.orchestrator.sections import Sections, sections
from tests.support.polling import eventually


def _job_sync(s: Sections) -> JobSync:
    return JobSync(s.state, Outbox(s.state))


async def test_new_jobs_wait_for_a_worker_then_go_out_in_one_assign_on_the_shared_queue() -> None:
    s = sections()
    job_sync = _job_sync(s)
    job_ids = [s.job(), s.job(), s.job(None)]  # the last has no schedule
    await job_sync.sync(job_ids)
    assert s.db.ownership == {}
    s.worker("w1")
    await job_sync.sync(job_ids)
    [assign] = await s.received(s.state.topology.assign, 1)
    assert isinstance(assign, bus_pb2.Assign)
    assert [j.job.job_id for j in assign.jobs] == job_ids[:2]
    assert sorted(s.db.ownership) == job_ids[:2]


async def test_a_paused_job_is_revoked_from_its_owner_and_a_changed_one_sent_as_an_update() -> None:
    s = sections()
    job_sync = _job_sync(s)
    s.worker("w1")
    paused, changed = s.job(), s.job()
    stamp = s.state.clock.tick()
    await s.state.store.upsert_pending([paused, changed], [1, 1], "w1", stamp, 0)
    await s.state.store.claim("w1", [paused, changed], stamp)
    s.db.change_job(paused, cron=None)
    s.db.change_job(changed, cron="*/9 * * * *")
    await job_sync.sweep()
    revoke, update = await s.received(s.state.topology.worker("w1"), 2)
    assert isinstance(revoke, bus_pb2.Revoke) and list(revoke.job_ids) == [paused]
    assert isinstance(update, bus_pb2.Update) and update.job.job.job_id == changed
    assert sorted(s.db.ownership) == [changed]
    assert await s.state.store.drift() == []


async def test_notified_changes_are_synced_and_a_requested_sweep_finds_what_was_not_notified() -> None:
    s = sections()
    job_sync = _job_sync(s)
    s.worker("w1")
    unnoticed = s.job()  # created before the leader listened: its notification is lost
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(job_sync.listen(stop))
        group.create_task(job_sync.sync_loop(stop))
        await asyncio.sleep(0)  # both tasks wait: the listener is registered
        notified = s.job()
        await eventually(lambda: notified in s.db.ownership, 5, what="the notified job assigned")
        assert unnoticed not in s.db.ownership
        job_sync.request_sweep()
        await eventually(lambda: unnoticed in s.db.ownership, 5, what="the sweep to assign the other one")
        stop.set()
    assigns = await s.received(s.state.topology.assign, 2)
    assert [[j.job.job_id for j in a.jobs] for a in assigns if isinstance(a, bus_pb2.Assign)] == [
        [notified],
        [unnoticed],
    ]
