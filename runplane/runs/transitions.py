"""Every status transition of a run, by name: the statements of ``transitions.sql``.

The parts that move a run load them from here (the API queues and cancels, queuer workers queue
and cancel superseded runs, dispatchers start, runners claim, ``finish``/``relaunch`` end and
requeue), so the whole state machine of a run reads in one file.
"""

from __future__ import annotations

from runplane.sql import load_queries

TRANSITIONS = load_queries("runplane.runs", "transitions.sql")
