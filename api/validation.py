"""Checking what clients send, before anything is written.

Each check raises ``InvalidArgument`` naming the offending field (``steps[2]``,
``settings.environment``, ...). What passes becomes a plain, typed spec that the store writes as is.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from runplane.basics.cron import validate_cron, validate_fires, validate_timezone
from runplane.basics.errors import InvalidArgument, Problems
from runplane.basics.overlap import OVERLAP_FROM_PROTO, OverlapPolicy
from runplane.basics.secrets import is_secret_name
from runplane.basics.types import (
    JOB_TYPE_FROM_PROTO,
    TERMINAL_STATUSES,
    TRIGGER_FROM_PROTO,
    JobId,
    JobType,
    RunStatus,
    Trigger,
)
from runplane.dbt import fields
from runplane.v1 import jobs_pb2, runs_pb2

MAX_NAME = 200
MAX_STEPS = 50
MAX_STEP = 4096
MAX_ENV = 100
MAX_ENV_VALUE = 4096
MAX_TIMEOUT_SECONDS = 86_400
MAX_RETRY_ATTEMPTS = 10
MAX_PRIORITY = 1000
DEFAULT_GRACE_SECONDS = 300
MAX_GRACE_SECONDS = 86_400
MAX_JITTER_SECONDS = 3600
MAX_CATCHUP_WINDOW_SECONDS = 7 * 24 * 3600
MAX_PAUSE_NOTE = 1000
MAX_COMPLETION_TRIGGERS = 20
MAX_CAUSE = 1000
MAX_IDEMPOTENCY_KEY = 200

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_RESERVED_ENV_PREFIX = "RUNPLANE_"
# Branch names reach git's command line: no leading dash, no spaces, no shell metacharacters.
_GIT_BRANCH = re.compile(r"[A-Za-z0-9_.+@][A-Za-z0-9_./+@-]{0,254}")

T = TypeVar("T")

# Which client triggers may start runs of which job types; the rest are internal.
MAX_RUN_AT_PAST = timedelta(minutes=1)  # a clock a little behind the server's is "now"
MAX_RUN_AT_AHEAD = timedelta(days=366)
CLIENT_TRIGGERS = frozenset({Trigger.API, Trigger.MANUAL, Trigger.CI, Trigger.MERGE})


def text(value: str, name: str, *, max_length: int, single_line: bool = True, required: bool = False) -> str:
    """``value`` if it is short enough and holds nothing Postgres or a terminal would choke on."""
    if required and not value.strip():
        raise InvalidArgument(name, "must not be empty")
    if len(value) > max_length:
        raise InvalidArgument(name, f"must be at most {max_length} characters (got {len(value)})")
    if "\x00" in value:
        raise InvalidArgument(name, "must not contain NUL characters")
    if single_line and any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidArgument(name, "must not contain control characters")
    return value


def checked_idempotency_key(value: str | None, name: str) -> str | None:
    """A client's idempotency key, checked as text; None when it sent none (or only blanks)."""
    return text(value or "", name, max_length=MAX_IDEMPOTENCY_KEY).strip() or None


def bounded(value: int, name: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(name, f"must be between {low} and {high} (got {value})")
    return value


def positive_id(value: int, name: str) -> int:
    if value <= 0:
        raise InvalidArgument(name, f"must be a positive id (got {value})")
    return value


@dataclass(frozen=True)
class CompletionTriggerSpec:
    upstream_job_id: JobId
    statuses: tuple[RunStatus, ...]


@dataclass(frozen=True)
class JobSpec:
    """A validated job definition, as stored."""

    name: str
    job_type: JobType
    steps: list[str]
    cron: str | None = None
    kept_cron: str | None = None  # the cron of a schedule trigger turned off (REST keeps it; nothing schedules it)
    timezone: str = "UTC"
    on_completion: list[CompletionTriggerSpec] = field(default_factory=list)
    completion_mode: str = "any"  # all: fan-in
    on_pull_request: bool = False
    on_merge: bool = False
    threads: int = fields.DEFAULT_THREADS
    timeout_seconds: int = 0
    target_name: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # DBT_ENV_SECRET_* to set (plaintext)
    unset_secrets: list[str] = field(default_factory=list)  # DBT_ENV_SECRET_* sent empty: removed
    git_branch: str = ""
    retry_max_attempts: int = 0
    retry_on_step_failure: bool = False
    missed_run_grace_seconds: int = DEFAULT_GRACE_SECONDS
    priority: int = 0
    environment_id: int | None = None  # None: plain commands
    schema: str = ""  # empty: the environment's
    generate_docs: bool = False
    run_source_freshness: bool = False
    defer_to_job_id: int | None = None
    defer_to_environment_id: int | None = None
    run_only_modified: bool = False
    overlap_policy: OverlapPolicy = OverlapPolicy.SERIAL
    jitter_seconds: int = 0
    catchup_window_seconds: int = 0
    catchup_all: bool = False


def job_spec(request: jobs_pb2.CreateJobRequest | jobs_pb2.UpdateJobRequest) -> JobSpec:
    """Validate a job definition. A request without ``settings`` gets every default. Every refused
    field is named in one ``InvalidArgument`` (``InvalidArguments`` for several)."""
    problems = Problems()
    name = problems.check(lambda: text(request.name.strip(), "name", max_length=MAX_NAME, required=True), "")
    job_type = JOB_TYPE_FROM_PROTO.get(request.job_type)
    if job_type is None:
        problems.found.append(InvalidArgument("job_type", "must be deploy, ci, merge or adhoc"))
    steps = problems.check(lambda: _steps(list(request.steps), "steps"), list[str]())
    spec = JobSpec(name=name, job_type=job_type or JobType.DEPLOY, steps=steps)
    if request.HasField("triggers") and job_type is not None:  # the triggers a job may have depend on its type
        spec = problems.check(partial(_with_triggers, spec, request.triggers), spec)
    if request.HasField("settings"):
        spec = problems.check(partial(_with_settings, spec, request.settings), spec)
    problems.raise_any()
    return spec


def _steps(steps: list[str], name: str) -> list[str]:
    if not steps:
        raise InvalidArgument(name, "a job needs at least one step")
    if len(steps) > MAX_STEPS:
        raise InvalidArgument(name, f"at most {MAX_STEPS} steps (got {len(steps)})")
    return [
        text(step, f"{name}[{i}]", max_length=MAX_STEP, single_line=False, required=True)
        for i, step in enumerate(steps)
    ]


def _with_triggers(spec: JobSpec, triggers: jobs_pb2.JobTriggers) -> JobSpec:
    cron: str | None = None
    timezone = "UTC"
    problems = Problems()  # every refused trigger named at once
    if triggers.HasField("schedule"):
        if spec.job_type in (JobType.CI, JobType.MERGE):
            problems.found.append(
                InvalidArgument("triggers.schedule", f"{spec.job_type} jobs run on pull requests, not on a schedule")
            )
        cron = problems.check(partial(validate_cron, triggers.schedule.cron, "triggers.schedule.cron"), None)
        timezone = problems.check(
            partial(validate_timezone, triggers.schedule.timezone, "triggers.schedule.timezone"), "UTC"
        )
        if cron is not None and not problems.found:
            problems.check(partial(validate_fires, cron, timezone, "triggers.schedule.cron"), None)
    if triggers.on_pull_request and spec.job_type is not JobType.CI:
        problems.found.append(InvalidArgument("triggers.on_pull_request", "only ci jobs run on pull requests"))
    if triggers.on_merge and spec.job_type is not JobType.MERGE:
        problems.found.append(InvalidArgument("triggers.on_merge", "only merge jobs run on merges"))
    problems.raise_any()
    if len(triggers.on_completion) > MAX_COMPLETION_TRIGGERS:
        raise InvalidArgument("triggers.on_completion", f"at most {MAX_COMPLETION_TRIGGERS} completion triggers")
    completion: list[CompletionTriggerSpec] = []
    seen: set[int] = set()
    for i, trigger in enumerate(triggers.on_completion):
        name = f"triggers.on_completion[{i}]"
        upstream = positive_id(trigger.upstream_job_id, f"{name}.upstream_job_id")
        if upstream in seen:
            raise InvalidArgument(f"{name}.upstream_job_id", f"job {upstream} is listed twice")
        seen.add(upstream)
        completion.append(CompletionTriggerSpec(JobId(upstream), _terminal_statuses(list(trigger.statuses), name)))
    return replace(
        spec,
        cron=cron,
        timezone=timezone,
        on_completion=completion,
        completion_mode=_completion_mode(triggers.completion_mode),
        on_pull_request=triggers.on_pull_request,
        on_merge=triggers.on_merge,
    )


def _completion_mode(value: int) -> str:
    if value in (jobs_pb2.COMPLETION_MODE_UNSPECIFIED, jobs_pb2.COMPLETION_MODE_ANY):
        return "any"
    if value == jobs_pb2.COMPLETION_MODE_ALL:
        return "all"
    raise InvalidArgument("triggers.completion_mode", "must be any or all")


def _terminal_statuses(values: list[int], name: str) -> tuple[RunStatus, ...]:
    if not values:
        raise InvalidArgument(f"{name}.statuses", "name at least one of success, error, cancelled")
    statuses: list[RunStatus] = []
    for value in values:
        if value not in {s.value for s in TERMINAL_STATUSES}:
            raise InvalidArgument(f"{name}.statuses", f"{value} is not a terminal status (success, error, cancelled)")
        if RunStatus(value) not in statuses:
            statuses.append(RunStatus(value))
    return tuple(sorted(statuses))


def _with_settings(spec: JobSpec, settings: jobs_pb2.JobSettings) -> JobSpec:
    problems = Problems()
    if settings.environment_id < 0:
        problems.found.append(InvalidArgument("settings.environment_id", "must be an environment id, or 0 for none"))
    grace = settings.missed_run_grace_seconds
    if grace == -1:
        grace = DEFAULT_GRACE_SECONDS
    # 0 threads on a job with an environment means the environment's default.
    threads = problems.check(partial(fields.threads, settings.threads, "settings.threads"), 0)
    changed: dict[str, Any] = dict(
        threads=threads or (0 if settings.environment_id else fields.DEFAULT_THREADS),
        timeout_seconds=problems.check(
            partial(bounded, settings.timeout_seconds, "settings.timeout_seconds", 0, MAX_TIMEOUT_SECONDS), 0
        ),
        target_name=problems.check(partial(fields.target_name, settings.target_name, "settings.target_name"), ""),
        **problems.check(partial(_variables, dict(settings.environment), "settings.environment"), dict[str, Any]()),
        git_branch=problems.check(partial(git_branch, settings.git_branch, "settings.git_branch"), ""),
        retry_max_attempts=problems.check(
            partial(bounded, settings.retry_max_attempts, "settings.retry_max_attempts", 0, MAX_RETRY_ATTEMPTS), 0
        ),
        retry_on_step_failure=settings.retry_on_step_failure,
        missed_run_grace_seconds=problems.check(
            partial(bounded, grace, "settings.missed_run_grace_seconds", 0, MAX_GRACE_SECONDS), DEFAULT_GRACE_SECONDS
        ),
        priority=problems.check(
            partial(bounded, settings.priority, "settings.priority", -MAX_PRIORITY, MAX_PRIORITY), 0
        ),
        environment_id=settings.environment_id if settings.environment_id > 0 else None,
        schema=problems.check(partial(fields.schema, settings.schema, "settings.schema"), ""),
        generate_docs=settings.generate_docs,
        run_source_freshness=settings.run_source_freshness,
        **problems.check(partial(_deferral, settings), dict[str, Any]()),
        overlap_policy=problems.check(partial(_overlap_policy, settings.overlap_policy), OverlapPolicy.SERIAL),
        jitter_seconds=problems.check(
            partial(bounded, settings.jitter_seconds, "settings.jitter_seconds", 0, MAX_JITTER_SECONDS), 0
        ),
        catchup_window_seconds=problems.check(
            partial(
                bounded,
                settings.catchup_window_seconds,
                "settings.catchup_window_seconds",
                0,
                MAX_CATCHUP_WINDOW_SECONDS,
            ),
            0,
        ),
        catchup_all=settings.catchup_all,
    )
    problems.raise_any()
    return replace(spec, **changed)


def _overlap_policy(value: int) -> OverlapPolicy:
    policy = OVERLAP_FROM_PROTO.get(jobs_pb2.OverlapPolicy.ValueType(value))
    if policy is None:
        names = ", ".join(p.value for p in OverlapPolicy)
        raise InvalidArgument("settings.overlap_policy", f"must be one of {names}")
    return policy


def _variables(env: dict[str, str], name: str) -> dict[str, Any]:
    checked = split_variables(env, name)
    return {"environment": checked.plain, "secrets": checked.secrets, "unset_secrets": checked.unset_secrets}


def _deferral(settings: jobs_pb2.JobSettings) -> dict[str, Any]:
    if settings.defer_to_job_id and settings.defer_to_environment_id:
        raise InvalidArgument("settings.defer_to_job_id", "defer to a job or to an environment, not both")
    if settings.run_only_modified and not (settings.defer_to_job_id or settings.defer_to_environment_id):
        raise InvalidArgument("settings.run_only_modified", "needs a job or an environment to defer to")
    return {
        "defer_to_job_id": positive_id(settings.defer_to_job_id, "settings.defer_to_job_id")
        if settings.defer_to_job_id
        else None,
        "defer_to_environment_id": positive_id(settings.defer_to_environment_id, "settings.defer_to_environment_id")
        if settings.defer_to_environment_id
        else None,
        "run_only_modified": settings.run_only_modified,
    }


def environment(env: dict[str, str], name: str) -> dict[str, str]:
    if len(env) > MAX_ENV:
        raise InvalidArgument(name, f"at most {MAX_ENV} entries (got {len(env)})")
    for key, value in env.items():
        if not _ENV_KEY.fullmatch(key):
            raise InvalidArgument(name, f"{key[:80]!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key.upper().startswith(_RESERVED_ENV_PREFIX):
            raise InvalidArgument(name, f"{key!r}: names starting with {_RESERVED_ENV_PREFIX} are reserved")
        text(value, f"{name}[{key}]", max_length=MAX_ENV_VALUE, single_line=False)
    return env


def plain(env: dict[str, str]) -> dict[str, str]:
    """The variables that are not secrets (secrets are stored apart, encrypted)."""
    return {k: v for k, v in env.items() if not is_secret_name(k)}


@dataclass(frozen=True)
class Variables:
    """Variables as a job or an environment stores them: plain ones in clear, secret ones
    (``DBT_ENV_SECRET_*``) apart and write-only, set one by one: a secret sent with a value is set,
    sent empty is removed, not sent is kept."""

    plain: dict[str, str]
    secrets: dict[str, str] = field(repr=False)  # to set (plaintext)
    unset_secrets: list[str]  # sent empty: removed


def split_variables(env: dict[str, str], name: str) -> Variables:
    """Check variables sent for a job or an environment, and split them as they are stored."""
    checked = environment(env, name)
    return Variables(
        plain=plain(checked),
        secrets={k: v for k, v in checked.items() if is_secret_name(k) and v},
        unset_secrets=sorted(k for k, v in checked.items() if is_secret_name(k) and not v),
    )


def git_branch(value: str, name: str) -> str:
    if value and (not _GIT_BRANCH.fullmatch(value) or ".." in value):
        raise InvalidArgument(name, f"{value[:80]!r} is not a valid branch name")
    return value


@dataclass(frozen=True)
class RunOverridesSpec:
    """Validated per-run overrides; only what the client set.

    ``dbt_version`` runs the run with that dbt (an installed dbt on one machine, a runner image in
    Kubernetes) instead of its environment's; ``generate_docs`` replaces the job's option for this
    run (a job with an environment only).
    """

    steps: list[str] | None = None
    threads: int | None = None
    git_branch: str | None = None
    git_sha: str | None = None
    schema: str | None = None
    timeout_seconds: int | None = None
    pull_request_number: int | None = None
    target_name: str | None = None
    dbt_version: str | None = None
    generate_docs: bool | None = None
    pull_request_provider: str | None = None  # github, gitlab or azure: which id the client gave
    # Set by runplane, never by a client: a rerun from failure (no source freshness first) and the
    # earlier runs' artifacts its steps start from (api/rerunning.py).
    resume: bool | None = None
    state_files: list[dict[str, object]] | None = None

    def as_json(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class TriggerSpec:
    job_id: JobId
    trigger: Trigger
    cause: str
    client_key: str | None
    overrides: RunOverridesSpec
    run_at: datetime | None = None  # None: now
    # A client's key is a retry's: it must come with the same request (api/idempotency.py). False for
    # a key named after an event, whose redelivery may word its cause differently.
    same_request_on_retry: bool = True
    # When a run of the job with the same overrides is queued, starting or running: answer that run.
    reattach: bool = False


def trigger_spec(request: runs_pb2.TriggerRunRequest) -> TriggerSpec:
    """Validate what does not depend on the job; ``triggering`` checks the rest against it."""
    job_id = JobId(positive_id(request.job_id, "job_id"))
    trigger = Trigger.API if request.trigger == 0 else TRIGGER_FROM_PROTO.get(request.trigger)
    if trigger is None or trigger not in CLIENT_TRIGGERS:
        raise InvalidArgument("trigger", "must be api, manual, ci or merge (the others are internal)")
    cause = text(request.cause, "cause", max_length=MAX_CAUSE)
    key = checked_idempotency_key(request.idempotency_key, "idempotency_key")
    overrides = run_overrides(request.overrides) if request.HasField("overrides") else RunOverridesSpec()
    run_at = later_time(request.run_at.ToDatetime(UTC), "run_at") if request.HasField("run_at") else None
    return TriggerSpec(job_id, trigger, cause, key, overrides, run_at, reattach=request.reattach)


def later_time(value: datetime, name: str) -> datetime | None:
    """A time to run at: None when it is now or at most a minute ago; a later one up to a year ahead."""
    now = datetime.now(UTC)
    if value < now - MAX_RUN_AT_PAST:
        raise InvalidArgument(name, f"{value.isoformat()} is in the past")
    if value > now + MAX_RUN_AT_AHEAD:
        raise InvalidArgument(name, f"at most {MAX_RUN_AT_AHEAD.days} days ahead")
    return value if value > now else None


def run_overrides(overrides: runs_pb2.RunOverrides) -> RunOverridesSpec:
    """The overrides of a gRPC trigger (proto3 zero values mean "not set")."""
    return checked_overrides(
        RunOverridesSpec(
            steps=list(overrides.steps) or None,
            threads=overrides.threads or None,
            git_branch=overrides.git_branch or None,
            git_sha=overrides.git_sha or None,
            schema=overrides.schema or None,
            timeout_seconds=overrides.timeout_seconds or None,
            pull_request_number=overrides.pull_request_number or None,
            target_name=overrides.target_name or None,
            dbt_version=overrides.dbt_version or None,
            generate_docs=overrides.generate_docs if overrides.HasField("generate_docs") else None,
        ),
        lambda name: f"overrides.{name}",
    )


def checked_overrides(raw: RunOverridesSpec, field_name: Callable[[str], str]) -> RunOverridesSpec:
    """``raw`` checked field by field, every refusal named at once; ``field_name`` turns a field into the
    client's name for it."""

    problems = Problems()  # every refused field named at once

    def maybe(value: T | None, check: Callable[[T, str], T], name: str) -> T | None:
        return None if value is None else problems.check(partial(check, value, field_name(name)), None)

    checked = RunOverridesSpec(
        steps=maybe(raw.steps, _steps, "steps"),
        threads=maybe(raw.threads, lambda v, n: fields.threads(v, n, unset=False), "threads"),
        git_branch=maybe(raw.git_branch, git_branch, "git_branch"),
        git_sha=maybe(raw.git_sha, fields.git_sha, "git_sha"),
        schema=maybe(raw.schema, fields.schema, "schema"),
        timeout_seconds=maybe(
            raw.timeout_seconds, lambda v, n: bounded(v, n, 0, MAX_TIMEOUT_SECONDS), "timeout_seconds"
        ),
        pull_request_number=maybe(
            raw.pull_request_number, lambda v, n: bounded(v, n, 1, 2**31 - 1), "pull_request_number"
        ),
        target_name=maybe(raw.target_name, fields.target_name, "target_name"),
        dbt_version=maybe(raw.dbt_version, fields.dbt_version, "dbt_version"),
        generate_docs=raw.generate_docs,
        pull_request_provider=raw.pull_request_provider,
    )
    problems.raise_any()
    return checked


def run_statuses(values: list[int], name: str) -> list[RunStatus]:
    known = {s.value for s in RunStatus}
    for value in values:
        if value not in known:
            raise InvalidArgument(name, f"{value} is not a run status")
    return sorted({RunStatus(v) for v in values})
