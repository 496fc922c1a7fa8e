"""What a cron fire of a job does while a run of the job is still in progress: the job's overlap
policy, and the record of an occurrence that got no run.

The policies are those of Temporal's ``ScheduleOverlapPolicy`` and Kubernetes' CronJob
``concurrencyPolicy``, plus ``serial``, the dbt Cloud behaviour every job had before (DESIGN.md,
"Overlap policies"). Postgres applies them when it queues a tick (``queue_runs``); the dispatcher's
plan lets ``allow_all`` jobs run concurrently.
"""

from __future__ import annotations

import enum

from runplane.v1 import jobs_pb2


class OverlapPolicy(enum.StrEnum):
    """Stored in ``jobs.overlap_policy``."""

    SERIAL = "serial"  # all wait, one at a time; a newer cron run cancels an older one still queued
    SKIP = "skip"  # no run while one of the job is queued, starting or running
    BUFFER_ONE = "buffer_one"  # at most one waits; a fire while one waits is skipped
    BUFFER_ALL = "buffer_all"  # all wait, one at a time, none cancelled
    CANCEL_OTHER = "cancel_other"  # the new run cancels the job's runs in progress, then runs
    ALLOW_ALL = "allow_all"  # runs at once beside the others, within the account's run slots

    @property
    def concurrent(self) -> bool:
        """Whether runs of such a job may start while another of it is starting or running."""
        return self is OverlapPolicy.ALLOW_ALL


# What each policy does, in the words the job page and form show.
OVERLAP_WORDS = {
    OverlapPolicy.SERIAL: "wait, one at a time; a newer scheduled run cancels an older one still waiting",
    OverlapPolicy.SKIP: "skip the fire",
    OverlapPolicy.BUFFER_ONE: "let one run wait; skip the fire while one waits",
    OverlapPolicy.BUFFER_ALL: "every run waits, one at a time",
    OverlapPolicy.CANCEL_OTHER: "cancel the runs in progress, then run",
    OverlapPolicy.ALLOW_ALL: "run at once beside them, within the run slots",
}

OVERLAP_TO_PROTO: dict[OverlapPolicy, jobs_pb2.OverlapPolicy.ValueType] = {
    OverlapPolicy.SERIAL: jobs_pb2.OVERLAP_POLICY_SERIAL,
    OverlapPolicy.SKIP: jobs_pb2.OVERLAP_POLICY_SKIP,
    OverlapPolicy.BUFFER_ONE: jobs_pb2.OVERLAP_POLICY_BUFFER_ONE,
    OverlapPolicy.BUFFER_ALL: jobs_pb2.OVERLAP_POLICY_BUFFER_ALL,
    OverlapPolicy.CANCEL_OTHER: jobs_pb2.OVERLAP_POLICY_CANCEL_OTHER,
    OverlapPolicy.ALLOW_ALL: jobs_pb2.OVERLAP_POLICY_ALLOW_ALL,
}
OVERLAP_FROM_PROTO = {value: policy for policy, value in OVERLAP_TO_PROTO.items()}
OVERLAP_FROM_PROTO[jobs_pb2.OVERLAP_POLICY_UNSPECIFIED] = OverlapPolicy.SERIAL


class SkipReason(enum.StrEnum):
    """Why an occurrence got no run (``skipped_occurrences.reason``)."""

    OVERLAP = "overlap"  # the job's overlap policy (skip, buffer_one)
    MISSED = "missed"  # missed while runplane or the account was down, beyond the catch-up window


# What a skipped occurrence tells the user (``skipped_occurrences.detail``); the query appends the
# id of the run that was in the way.
SKIPPED_DETAILS = {
    "overlap_skip": "Skipped: overlap policy skip, and run ",
    "overlap_buffer_one": "Skipped: overlap policy buffer_one, and one run already waits: run ",
    "overlap_same_tick": "Skipped: overlap policy, and an earlier occurrence of this job was queued in the same tick",
}
OVERLAP_REPLACED = "Cancelled: overlap policy cancel_other, replaced by the newer scheduled run "
