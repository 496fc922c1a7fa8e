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

from api.rows import Run, RunListing, RunStep
from runplane.basics import cron
from runplane.basics.types import RunStatus, WaitingReason

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


NODE_PILLS = {
    "success": "success",
    "pass": "success",
    "error": "error",
    "fail": "error",
    "runtime error": "error",
    "skipped": "skipped",
    "warn": "queued",
}


@dataclass(frozen=True)
class ModelResult:
    """One node of a dbt step's ``run_results.json``: what dbt Cloud lists per model."""

    unique_id: str
    status: str
    seconds: float | None
    rows: int | None
    message: str

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
        out.append(
            ModelResult(
                unique_id=str(result.get("unique_id", "")),
                status=str(result.get("status", "")),
                seconds=float(seconds) if isinstance(seconds, int | float) else None,
                rows=rows if isinstance(rows, int) else None,
                message=str(result.get("message") or ""),
            )
        )
    return out


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
