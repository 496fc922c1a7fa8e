"""runplane's own job settings as code: ``runplane plan FILE`` and ``runplane apply FILE``.

dbt Cloud's job format (and dbt-jobs-as-code's YAML) cannot say a schedule's time zone, fan-in,
priority, retries or missed-run grace. A file names them per job, the job found by the identifier
dbt-jobs-as-code writes into its name (``[[nightly]]``) or by ``id``::

    jobs:
      nightly:
        timezone: Europe/Amsterdam
        completion_mode: all
        priority: 10
        retry_max_attempts: 2
        retry_on_step_failure: true
        missed_run_grace_seconds: 600

``plan`` prints what ``apply`` would change, setting by setting; ``apply`` changes only that (each
job saved once, checked against the version it read), so a second apply changes nothing. A
setting a job's entry leaves out is not touched. Jobs the file does not name are left as they are,
unless ``--delete``: then every other job with an identifier gets these settings back at their
defaults. The file's jobs must exist (dbt-jobs-as-code or the API makes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runplane.v1 import jobs_pb2, jobs_pb2_grpc

IDENTIFIER = re.compile(r"\[\[(?:[*a-zA-Z0-9_-]+:)?([a-zA-Z0-9_-]+)\]\]")
COMPLETION_MODES = {"any": jobs_pb2.COMPLETION_MODE_ANY, "all": jobs_pb2.COMPLETION_MODE_ALL}
# Each setting the file may name, with its default (what --delete puts back).
DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "completion_mode": "any",
    "priority": 0,
    "retry_max_attempts": 0,
    "retry_on_step_failure": False,
    "missed_run_grace_seconds": 300,
}


class SettingsFileError(ValueError):
    """The file is not a list of jobs' settings runplane knows."""


@dataclass(frozen=True)
class Change:
    job_id: int
    job: str
    setting: str
    old: Any
    new: Any


def read_file(path: Path) -> dict[str, dict[str, Any]]:
    """The file's jobs: key (an identifier, or anything with ``id``) -> settings."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    jobs = loaded.get("jobs") if isinstance(loaded, dict) else None
    if not isinstance(jobs, dict):
        raise SettingsFileError(f"{path}: expected a mapping 'jobs:' of job identifiers to settings")
    for key, settings in jobs.items():
        if not isinstance(settings, dict):
            raise SettingsFileError(f"{path}: jobs.{key} is not a mapping")
        unknown = set(settings) - set(DEFAULTS) - {"id"}
        if unknown:
            raise SettingsFileError(
                f"{path}: jobs.{key}: {', '.join(sorted(unknown))} not one of {', '.join(DEFAULTS)}, id"
            )
        if "completion_mode" in settings and settings["completion_mode"] not in COMPLETION_MODES:
            raise SettingsFileError(f"{path}: jobs.{key}.completion_mode must be any or all")
    return {str(k): v for k, v in jobs.items()}


def current(job: jobs_pb2.Job) -> dict[str, Any]:
    """A job's values of the settings the file names."""
    grace = job.settings.missed_run_grace_seconds
    return {
        "timezone": job.triggers.schedule.timezone or "UTC",
        "completion_mode": "all" if job.triggers.completion_mode == jobs_pb2.COMPLETION_MODE_ALL else "any",
        "priority": job.settings.priority,
        "retry_max_attempts": job.settings.retry_max_attempts,
        "retry_on_step_failure": job.settings.retry_on_step_failure,
        "missed_run_grace_seconds": DEFAULTS["missed_run_grace_seconds"] if grace < 0 else grace,
    }


def identifier(name: str) -> str | None:
    found = IDENTIFIER.search(name)
    return found.group(1) if found else None


def plan(wanted: dict[str, dict[str, Any]], jobs: list[jobs_pb2.Job], *, delete: bool = False) -> list[Change]:
    """What applying ``wanted`` to ``jobs`` changes, job by job, setting by setting."""
    by_identifier = {ident: job for job in jobs if (ident := identifier(job.name))}
    by_id = {job.id: job for job in jobs}
    changes: list[Change] = []
    named: set[int] = set()
    for key, settings in wanted.items():
        job = by_id.get(int(settings["id"])) if "id" in settings else by_identifier.get(key)
        if job is None:
            raise SettingsFileError(f"jobs.{key}: no job with id {settings['id']}" if "id" in settings else
                                    f"jobs.{key}: no job named with [[{key}]]")  # fmt: skip
        named.add(job.id)
        changes += _differences(job, {k: v for k, v in settings.items() if k != "id"})
    if delete:
        for _, job in sorted(by_identifier.items()):
            if job.id not in named:
                changes += _differences(job, DEFAULTS)
    return changes


def _differences(job: jobs_pb2.Job, settings: dict[str, Any]) -> list[Change]:
    have = current(job)
    out = []
    for setting, value in settings.items():
        if setting == "timezone" and not job.triggers.HasField("schedule"):
            if value not in ("UTC", ""):
                raise SettingsFileError(f"job {job.id} ({job.name}) has no schedule to give a time zone")
            continue
        if have[setting] != value:
            out.append(Change(job.id, job.name, setting, have[setting], value))
    return out


def update_request(job: jobs_pb2.Job, changes: list[Change]) -> jobs_pb2.UpdateJobRequest:
    """The job as read, with ``changes`` made; refused by the API if the job was saved since."""
    request = jobs_pb2.UpdateJobRequest(
        job_id=job.id,
        name=job.name,
        job_type=job.job_type,
        steps=job.steps,
        triggers=job.triggers,
        settings=job.settings,
        expected_version=job.version,
    )
    request.settings.ClearField("secret_names")  # output only: the secrets not sent are kept
    for change in changes:
        match change.setting:
            case "timezone":
                request.triggers.schedule.timezone = "" if change.new == "UTC" else str(change.new)
            case "completion_mode":
                request.triggers.completion_mode = COMPLETION_MODES[change.new]
            case "priority" | "retry_max_attempts" | "missed_run_grace_seconds":
                setattr(request.settings, change.setting, int(change.new))
            case "retry_on_step_failure":
                request.settings.retry_on_step_failure = bool(change.new)
            case _:
                raise SettingsFileError(f"unknown setting {change.setting}")
    return request


async def all_jobs(stub: jobs_pb2_grpc.JobServiceAsyncStub) -> list[jobs_pb2.Job]:
    jobs: list[jobs_pb2.Job] = []
    token = ""
    while True:
        page = await stub.ListJobs(jobs_pb2.ListJobsRequest(page_size=500, page_token=token))
        jobs += page.jobs
        token = page.next_page_token
        if not token:
            return jobs


async def run(stub: jobs_pb2_grpc.JobServiceAsyncStub, path: Path, *, apply: bool, delete: bool) -> list[str]:
    """Plan (or apply) ``path``; the lines to print."""
    wanted = read_file(path)
    jobs = await all_jobs(stub)
    changes = plan(wanted, jobs, delete=delete)
    lines = [f"job {c.job_id} ({c.job}): {c.setting}: {c.old!r} -> {c.new!r}" for c in changes]
    if not changes:
        return ["no changes"]
    if apply:
        by_id = {job.id: job for job in jobs}
        for job_id in sorted({c.job_id for c in changes}):
            await stub.UpdateJob(update_request(by_id[job_id], [c for c in changes if c.job_id == job_id]))
        lines.append(f"applied {len(changes)} changes to {len({c.job_id for c in changes})} jobs")
    else:
        lines.append(f"{len(changes)} changes; `runplane apply {path}` makes them")
    return lines
