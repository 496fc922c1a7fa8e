"""Term and clock ordering: receivers apply only what is newer, and never an older term."""

from __future__ import annotations

import random

from runplane.basics.stamps import LogicalClock, Stamp, StampGate


def test_stamps_order_by_term_then_clock() -> None:
    assert Stamp(1, 99) < Stamp(2, 0) < Stamp(2, 1)
    clock = LogicalClock(term=3)
    assert [clock.tick(), clock.tick()] == [Stamp(3, 1), Stamp(3, 2)]


def test_gate_applies_only_newer_stamps_per_job() -> None:
    gate = StampGate()
    assert gate.admit(1, Stamp(1, 5))
    assert not gate.admit(1, Stamp(1, 5))  # duplicate
    assert not gate.admit(1, Stamp(1, 4))  # older
    assert gate.admit(2, Stamp(1, 1))  # another job has its own order
    assert gate.admit(1, Stamp(2, 1))  # a new term wins over any clock of the old one
    assert not gate.admit(2, Stamp(1, 7))  # an older term is dropped, even for another job


def test_shuffled_duplicated_messages_end_at_the_newest_stamp() -> None:
    rng = random.Random(7)
    messages = [(job, Stamp(term, clock)) for job in range(20) for term in (1, 2) for clock in range(1, 8)]
    messages = messages * 2
    rng.shuffle(messages)
    gate = StampGate()
    state: dict[int, Stamp] = {}
    for job, stamp in messages:
        if gate.admit(job, stamp):
            state[job] = stamp
    newest_term_seen = max(s.term for _, s in messages)
    assert gate.newest_term == newest_term_seen
    # Whatever the order, every job ends at the newest stamp sent for it.
    assert state == {job: Stamp(2, 7) for job in range(20)}


def test_voiding_refuses_older_stamps_of_every_job_even_unseen_ones() -> None:
    gate = StampGate()
    assert gate.admit(1, Stamp(1, 3))
    assert gate.void_before(Stamp(1, 10))
    assert not gate.admit(1, Stamp(1, 9))  # held before
    assert not gate.admit(2, Stamp(1, 5))  # never seen: an Assign sent before the voiding
    assert not gate.admit(3, Stamp(1, 10))
    assert gate.admit(2, Stamp(1, 11))  # sent after it
    assert not gate.void_before(Stamp(0, 99))  # an older term voids nothing
    assert gate.floor == Stamp(1, 10)
