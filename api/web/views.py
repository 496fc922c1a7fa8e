"""What a page shows of a row: the delays of DESIGN.md, durations in words, statuses by name, times
in the viewer's time zone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfoNotFoundError

from cron_descriptor import Options, get_description
from jinja2 import pass_context
from jinja2.runtime import Context
from markupsafe import Markup

from api.rows import Environment, Job, Run, RunListing, RunStep
from runplane.basics import cron
from runplane.basics.run_overrides import run_override
from runplane.basics.types import JobType, RunStatus, WaitingReason
from runplane.dbt import fields
from runplane.dbt.context import effective_schema

ZONE_COOKIE = "runplane_tz"

WAITING_WORDS = {
    WaitingReason.NONE: "due: waiting for the scheduler",
    WaitingReason.NO_RUN_SLOT: "waiting for a free run slot",
    WaitingReason.JOB_ALREADY_RUNNING: "waiting for this job's running run (serial execution)",
    WaitingReason.MERGE_IN_PROGRESS: "waiting for this job's merge run in progress",
    WaitingReason.LAUNCH_BACKOFF: "launch failed; trying again after a backoff",
}


# The on-time page's buckets of run delay (DESIGN.md: on time when ≤ 60 s), as the runs filter names them.
DELAY_WORDS = {
    "within_25s": "started ≤ 25 s after their time",
    "within_60s": "started 25–60 s after their time",
    "late": "started more than 60 s late",
    "late_own": "late because they waited for the account's own run slots or their job's previous run",
    "late_platform": "late because of the platform (trigger lag and prep time over 60 s)",
}


# Whose limit a queued run waits for: the account's own (run slots, serial execution) or the platform's.
OWN_WAITS = frozenset({WaitingReason.NO_RUN_SLOT, WaitingReason.JOB_ALREADY_RUNNING, WaitingReason.MERGE_IN_PROGRESS})


def status_name(code: int) -> str:
    return RunStatus(code).name.lower()


def seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max(0.0, (later - earlier).total_seconds())


def duration(value: float | None) -> str:
    """``0.42 s``, ``12.3 s``, ``4 m 05 s``, ``2 h 07 m``; an em dash for no value."""
    if value is None:
        return "—"
    if value < 10:
        return f"{value:.2f} s"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} m {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} m"


def viewer_zone(name: str | None) -> tzinfo:
    """The zone the viewer asked for (an IANA name from the cookie), UTC for none or an unknown one."""
    if not name:
        return UTC
    try:
        return cron.zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return UTC


def _zoned(value: datetime, zone: tzinfo) -> str:
    return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


@pass_context
def when(context: Context, value: datetime | None) -> Markup:
    """A time in the viewer's zone, its UTC time in the title and the machine-readable instant."""
    if value is None:
        return Markup("—")
    zone = context.get("zone", UTC)
    utc = value.astimezone(UTC)
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        utc.strftime("%Y-%m-%dT%H:%M:%SZ"), _zoned(utc, UTC), _zoned(utc, zone)
    )


def step_status(step: RunStep, run_terminal: bool) -> str:
    """A step's status by name; one that never started in a finished run was skipped."""
    if step.skipped_in(run_terminal):
        return "skipped"
    return status_name(step.status)


@dataclass(frozen=True)
class RunTimes:
    """The delays of one run (DESIGN.md, "Timestamps on a run"); None until both stamps exist."""

    trigger_lag: float | None
    wait: float | None
    prep: float | None
    run_delay: float | None
    duration: float | None

    @classmethod
    def of(cls, row: Run | RunListing, now: datetime) -> RunTimes:
        started, finished = row.started_at, row.finished_at
        return cls(
            trigger_lag=seconds(row.queued_at, row.scheduled_at),
            wait=seconds(row.dispatched_at or (now if row.status == RunStatus.QUEUED else None), row.queued_at),
            prep=seconds(started, row.dispatched_at),
            run_delay=seconds(started, row.scheduled_at),
            duration=seconds(finished or (now if started and not RunStatus(row.status).is_terminal else None), started),
        )


def schema_of(row: RunListing) -> str:
    """The schema the run builds in, as its dbt profile names it (``runplane.dbt.context``)."""
    overrides = row.overrides if isinstance(row.overrides, dict) else {}
    schema = effective_schema(
        JobType(row.job_type), row.run_schema, overrides, row.job_schema, row.environment_schema or ""
    )
    return schema if row.environment_id is not None or row.job_type == JobType.CI else ""


def sha_of(row: RunListing) -> str:
    """The commit the run checked out, or the one its trigger asked for before it has."""
    overrides = row.overrides if isinstance(row.overrides, dict) else {}
    return row.git_sha or str(run_override(overrides, "git_sha") or "")


def waiting_words(row: Run | RunListing) -> str:
    if row.status != RunStatus.QUEUED:
        return ""
    return reason_words(row.waiting_reason)


def reason_words(waiting_reason: str) -> str:
    """Why a queued run waits, in words; a reason this version does not know, as it is stored."""
    try:
        return WAITING_WORDS[WaitingReason(waiting_reason)]
    except ValueError:
        return waiting_reason


@dataclass(frozen=True)
class Schedule:
    cron: str
    timezone: str
    words: str
    next_fires: list[tuple[str, str]]  # (in the job's zone, in UTC)


def schedule(expr: str | None, timezone: str, now: float, count: int = 5) -> Schedule | None:
    """The job's cron in words and its next ``count`` fire times, from runplane's own cron maths."""
    if not expr:
        return None
    options = Options()
    options.use_24hour_time_format = True
    words = get_description(expr, options)
    zone = cron.zone(timezone or "UTC")
    fires: list[tuple[str, str]] = []
    after = now
    for _ in range(count):
        try:
            fire = cron.next_fire(expr, timezone or "UTC", after)
        except cron.NeverFires:
            break
        at = datetime.fromtimestamp(fire, UTC)
        fires.append((at.astimezone(zone).strftime("%a %Y-%m-%d %H:%M %Z"), at.strftime("%H:%M UTC")))
        after = fire
    return Schedule(expr, timezone or "UTC", words, fires)


@dataclass(frozen=True)
class Setting:
    """One of a job's run settings as its runs get it: the value and whose it is (the job's, the
    environment's, runplane's default)."""

    name: str
    value: str
    source: str


def job_settings(job: Job, environment: Environment | None) -> list[Setting]:
    """What a run of the job gets without overrides (as ``runplane.dbt.context`` decides it)."""
    if environment is None:
        return [
            Setting("Environment", "none: plain commands", ""),
            Setting("Timeout", duration(job.timeout_seconds) if job.timeout_seconds else "none", "the job's"),
        ]
    own = "the job's"
    env = "the environment's"
    target = (job.target_name, own) if job.target_name else (environment.target_name or "default", env)
    threads = (job.threads, own) if job.threads else (environment.threads or fields.DEFAULT_THREADS, env)
    schema = (job.schema_name, own) if job.schema_name else (environment.schema_name, env)
    return [
        Setting("Environment", f"{environment.name} ({environment.environment_type}, {environment.adapter_type})", ""),
        Setting("dbt version", environment.dbt_version, env),
        Setting("Target name", target[0], target[1]),
        Setting("Threads", str(threads[0]), threads[1]),
        Setting("Schema", schema[0], schema[1]),
        Setting("Timeout", duration(job.timeout_seconds) if job.timeout_seconds else "none", own),
    ]


NODE_PILLS = {
    "success": "success",
    "pass": "success",
    "error": "error",
    "fail": "error",
    "runtime error": "error",
    "skipped": "skipped",
    "warn": "queued",
}


# dbt's node statuses (models, seeds, snapshots: success, error, skipped; tests: pass, warn, fail,
# error, skipped) counted as dbt Cloud's run summary counts them.
SUMMARY_OF_STATUS = {
    "success": "pass",
    "pass": "pass",
    "warn": "warn",
    "error": "error",
    "fail": "error",
    "runtime error": "error",
    "skipped": "skip",
}
SUMMARY_ORDER = {"error": 0, "warn": 1}  # failed nodes first, then warnings, then the rest as dbt ran them


@dataclass(frozen=True)
class ModelResult:
    """One node of a dbt step's ``run_results.json``: what dbt Cloud lists per model."""

    unique_id: str
    status: str
    seconds: float | None
    rows: int | None
    message: str
    started_at: datetime | None = None  # when its execution began and ended (run_results' ``timing``)
    finished_at: datetime | None = None

    @property
    def outcome(self) -> str:
        """pass, warn, error or skip (dbt Cloud's summary); a status dbt adds later counts as itself."""
        return SUMMARY_OF_STATUS.get(self.status, self.status)

    @property
    def pill(self) -> str:
        """The status pill's class: dbt's node statuses by what they mean."""
        return NODE_PILLS.get(self.status, "cancelled")


MAX_MODELS = 2000


def model_results(content: bytes) -> list[ModelResult] | None:
    """The nodes of a ``run_results.json`` (at most MAX_MODELS); None when it cannot be read."""
    try:
        results = json.loads(content)["results"]
    except (ValueError, KeyError, TypeError):
        return None
    out = []
    for result in results[:MAX_MODELS] if isinstance(results, list) else []:
        if not isinstance(result, dict):
            continue
        response = result.get("adapter_response") or {}
        rows = response.get("rows_affected") if isinstance(response, dict) else None
        seconds = result.get("execution_time")
        began, ended = _execute_timing(result.get("timing"))
        out.append(
            ModelResult(
                unique_id=str(result.get("unique_id", "")),
                status=str(result.get("status", "")),
                seconds=float(seconds) if isinstance(seconds, int | float) else None,
                rows=rows if isinstance(rows, int) else None,
                message=str(result.get("message") or ""),
                started_at=began,
                finished_at=ended,
            )
        )
    return sorted(out, key=lambda m: SUMMARY_ORDER.get(m.outcome, 2))


def _execute_timing(timing: object) -> tuple[datetime | None, datetime | None]:
    """When a node's work began and ended: the span of its ``timing`` entries (compile, execute)."""
    stamps: list[datetime] = []
    for entry in timing if isinstance(timing, list) else []:
        if not isinstance(entry, dict):
            continue
        for key in ("started_at", "completed_at"):
            try:
                stamp = datetime.fromisoformat(str(entry.get(key)).replace("Z", "+00:00"))
            except ValueError:
                continue
            stamps.append(stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC))
    return (min(stamps), max(stamps)) if stamps else (None, None)


@dataclass(frozen=True)
class RunSummary:
    """dbt Cloud's run summary over every dbt step: the nodes by outcome, the failed ones first."""

    counts: dict[str, int]
    failed: list[tuple[int, ModelResult]]  # (step index, node) of every error and warning, errors first

    @classmethod
    def of(cls, models: dict[int, list[ModelResult] | None]) -> RunSummary | None:
        nodes = [(step, m) for step, results in sorted(models.items()) for m in results or []]
        if not nodes:
            return None
        counts = {"pass": 0, "warn": 0, "error": 0, "skip": 0}
        for _, m in nodes:
            counts[m.outcome] = counts.get(m.outcome, 0) + 1
        failed = [(step, m) for step, m in nodes if m.outcome in SUMMARY_ORDER]
        return cls(counts, sorted(failed, key=lambda found: SUMMARY_ORDER[found[1].outcome]))


TIMING_BARS = 100  # the longest nodes of a step a timing chart draws; the table lists them all


@dataclass(frozen=True)
class TimingBar:
    """One node on a step's model timing chart: where its bar starts and how wide it is (% of the step)."""

    node: ModelResult
    left: float
    width: float


def model_timing(results: list[ModelResult]) -> list[TimingBar]:
    """dbt Cloud's model timing: each node's bar from when it began to when it ended, in the order it
    began (threads show as overlapping bars); the TIMING_BARS longest. Without dbt's timing, a bar is
    its execution time alone."""
    spans: list[tuple[ModelResult, float, float]] = []
    stamped = [(m, m.started_at, m.finished_at) for m in results if m.started_at and m.finished_at]
    if stamped:
        origin = min(began for _, began, _ in stamped)
        spans = [(m, (began - origin).total_seconds(), (ended - began).total_seconds()) for m, began, ended in stamped]
    else:
        spans = [(m, 0.0, m.seconds) for m in results if m.seconds is not None]
    spans = sorted(spans, key=lambda span: span[2], reverse=True)[:TIMING_BARS]
    if not spans:
        return []
    first = min(start for _, start, _ in spans)
    whole = max(start + took for _, start, took in spans) - first or 1.0
    spans.sort(key=lambda span: (span[1], -span[2]))
    return [TimingBar(m, 100 * (start - first) / whole, max(0.3, 100 * took / whole)) for m, start, took in spans]


def readable_text(content: bytes, limit: int, *, pretty: bool) -> str:
    """An artifact as text for a page: JSON indented when ``pretty``; cut at ``limit`` bytes."""
    text = content[:limit].decode("utf-8", errors="replace")
    if pretty and len(content) <= limit:
        try:
            return json.dumps(json.loads(content), indent=2, ensure_ascii=False)
        except ValueError:
            return text
    return text


CHART_WIDTH, CHART_HEIGHT, CHART_BAR_GAP = 600, 120, 2


def duration_chart(runs: list[RunListing]) -> Markup:
    """An SVG bar chart of the runs' durations, oldest left, each bar a link to its run."""
    timed = [(r, seconds(r.finished_at, r.started_at)) for r in reversed(runs)]
    bars = [(r, took) for r, took in timed if took is not None]
    if not bars:
        return Markup("")
    longest = max(took for _, took in bars) or 1.0
    width = CHART_WIDTH / len(bars)
    parts = [
        Markup(
            '<svg id="duration-chart" viewBox="0 0 {w} {h}" width="100%" height="{h}" '
            'preserveAspectRatio="none" aria-labelledby="duration-chart-title">'
            '<title id="duration-chart-title">Duration of the last {n} finished runs, oldest first; '
            "the longest took {longest}</title>"
        ).format(w=CHART_WIDTH, h=CHART_HEIGHT + 14, n=len(bars), longest=duration(longest))
    ]
    for i, (run, took) in enumerate(bars):
        height = max(1.0, CHART_HEIGHT * took / longest)
        name = status_name(run.status)
        parts.append(
            Markup(
                '<a href="/ui/runs/{id}"><rect class="bar-{name}" x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" '
                'height="{bh:.1f}"><title>run #{id}: {name}, {took}</title></rect></a>'
            ).format(
                id=run.id,
                name=name,
                x=i * width,
                y=CHART_HEIGHT - height,
                bw=max(1.0, width - CHART_BAR_GAP),
                bh=height,
                took=duration(took),
            )
        )
    parts.append(
        Markup('<text x="0" y="{y}" class="axis">longest {longest}</text></svg>').format(
            y=CHART_HEIGHT + 12, longest=duration(longest)
        )
    )
    return Markup("").join(parts)
