"""Running the planned cases: repetitions, a time budget, failures recorded rather than fatal, and
the records, table and plots written at the end."""

from __future__ import annotations

import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.records import Sample, Unavailable, aggregate
from bench.scenarios import Case

Say = Callable[[str], None]

ALIGN_SLACK = 4.0  # seconds of waiting for a minute boundary not worth running another case for


@dataclass
class Outcome:
    by_case: dict[int, list[Sample]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, case: Case, sample: Sample) -> None:
        self.by_case.setdefault(id(case), []).append(sample)

    @property
    def samples(self) -> list[Sample]:
        """Every sample, case after case in the order they were planned (not the order of rounds)."""
        return [sample for samples in self.by_case.values() for sample in samples]


def run_cases(cases: Sequence[Case], budget: float, say: Say = print) -> Outcome:
    """Run every case once, then again in rounds up to its repeats.

    When the time budget runs short, later repetitions are dropped rather than whole scenarios: a
    repetition the remaining budget cannot hold is recorded as skipped, and cases marked ``late``
    run last in each round. What a repetition needs is the case's estimate until it has run once,
    then the longest it took so far (plus a tenth). A case that is unavailable, fails or hits its
    cap is not run again.
    """
    outcome = Outcome(by_case={id(case): [] for case in cases})
    deadline = time.monotonic() + budget
    active: list[Case] = []
    for case in cases:
        if case.note:
            outcome.notes.append(f"{_where(case)}: {case.note}")
        try:
            case.check()  # before any budget is spent on it
        except Unavailable as exc:
            outcome.add(case, _note_sample(case, "unavailable", str(exc)))
            say(f"{_where(case)}: UNAVAILABLE: {exc}")
            continue
        active.append(case)
    took: dict[int, float] = {}

    def needs(case: Case) -> float:
        return took[id(case)] * 1.1 if id(case) in took else case.estimate

    for index in range(max((case.repeats for case in active), default=0)):
        queue = sorted((c for c in active if index < c.repeats), key=lambda c: c.late)
        while queue:
            case = next_case(queue, needs)
            queue.remove(case)
            remaining = deadline - time.monotonic()
            if remaining < needs(case):
                reason = (
                    f"run {index + 1} of {case.repeats} skipped: {remaining:.0f} s of the time budget left,"
                    f" a run may need {needs(case):.0f} s"
                )
                outcome.add(case, _note_sample(case, "skipped", reason))
                say(f"{_where(case)}: {reason}")
                active.remove(case)
                continue
            began = time.monotonic()
            repeat = _run_once(case, index, outcome, say)
            took[id(case)] = max(took.get(id(case), 0.0), time.monotonic() - began)
            if not repeat:
                active.remove(case)
    return outcome


def next_case(queue: Sequence[Case], needs: Callable[[Case], float], now: Callable[[], float] = time.time) -> Case:
    """The case to run next, in queue order, except around minute boundaries: a case that measures
    at one starts when the next boundary is about its ``minute_lead`` away. Until then, other cases
    run: first one that fits in the time left before that moment, else any, so the wait is spent
    measuring. Only when nothing else is left does a case wait for its boundary."""
    aligned = [c for c in queue if c.minute_lead is not None]
    others = [c for c in queue if c.minute_lead is None]
    if not aligned:
        return queue[0]

    def wait(case: Case) -> float:  # seconds until its ideal start
        return (-(now() + (case.minute_lead or 0.0))) % 60.0

    soonest = min(aligned, key=wait)
    if wait(soonest) <= ALIGN_SLACK or not others:
        return soonest
    fitting = [c for c in others if needs(c) <= wait(soonest)]
    return (fitting or others)[0]


def _run_once(case: Case, index: int, outcome: Outcome, say: Say) -> bool:
    """One repetition into ``outcome``; False when the case must not be repeated."""
    where = _where(case)
    say(f"{where}: run {index + 1} of {case.repeats}")
    began = time.monotonic()
    try:
        measurements = case.measure()
    except Unavailable as exc:
        outcome.add(case, _note_sample(case, "unavailable", str(exc)))
        say(f"{where}: UNAVAILABLE: {exc}")
        return False
    except TimeoutError as exc:
        outcome.add(case, Sample(case.scenario, case.system, case.n, "timed_out", 1.0, "runs", _first_line(exc)))
        say(f"{where}: timed out: {exc}")
        return False
    except Exception as exc:
        outcome.add(case, _note_sample(case, "error", f"{type(exc).__name__}: {_first_line(exc)}"))
        say(f"{where}: FAILED:\n{traceback.format_exc()}")
        return False
    for m in measurements:
        outcome.add(case, Sample(m.scenario or case.scenario, case.system, case.n, m.metric, m.value, m.unit, m.note))
    say(f"{where}: {_summary(measurements)} ({time.monotonic() - began:.0f} s)")
    if any(m.metric == "timed_out" and m.value for m in measurements):
        if index + 1 < case.repeats:
            outcome.notes.append(f"{where}: hit its time cap on run {index + 1}, not repeated")
        return False
    return True


def with_ceiling_ratio(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add, for every per-second throughput figure, its ratio to Postgres's own insert rate."""
    ceiling = next(
        (r for r in records if r["scenario"] == "ceiling" and r["unit"] == "1/s" and r["value"]),
        None,
    )
    if ceiling is None:
        return records
    out = list(records)
    for r in records:
        if r["scenario"] == "throughput" and r["unit"] == "1/s" and r["value"] is not None:
            out.append(
                {
                    "scenario": "throughput",
                    "system": r["system"],
                    "n": r["n"],
                    "metric": f"{r['metric']}_vs_ceiling",
                    "value": r["value"] / ceiling["value"],
                    "unit": "ratio",
                    "min": r["min"] / ceiling["value"],
                    "max": r["max"] / ceiling["value"],
                    "runs": r["runs"],
                    "note": f"against the median Postgres ceiling of {ceiling['value']:,.0f}/s",
                }
            )
    return out


def preamble(quick: bool, started: datetime, finished: datetime, notes: Sequence[str]) -> str:
    """What the table is: when, where, which mode; and what to keep in mind reading it."""
    load = os.getloadavg()
    lines = [
        f"# Benchmark results ({'quick' if quick else 'full'} run)",
        "",
        f"{started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC on {platform.node()} ({os.cpu_count()} cores, "
        f"Python {platform.python_version()}); load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}.",
        "Value is the median over runs, with min and max. Other work on the machine makes figures noisy.",
        "Lags are measured from the real due time; 'all_done' is the time from it until the last job was",
        "queued (runplane, single loop) or started (Celery beat, APScheduler).",
    ]
    if notes:
        lines += ["", "Notes:", *[f"- {note}" for note in notes]]
    return "\n".join(lines)


def finish(outcome: Outcome, quick: bool, started: datetime, out_dir: Path, say: Say = print) -> list[dict[str, Any]]:
    """Aggregate, write latest.json / latest.md / plots, print the table; returns the records."""
    from bench.plots import write_plots
    from bench.report import markdown_table, write_results

    records = with_ceiling_ratio(aggregate(outcome.samples))
    text = preamble(quick, started, datetime.now(UTC), outcome.notes)
    json_path, md_path = write_results(records, out_dir, text)
    plots = write_plots(records, out_dir)
    say("")
    say(text)
    say("")
    say(markdown_table(records))
    say(f"wrote {json_path}, {md_path}" + "".join(f", {p}" for p in plots))
    return records


def _where(case: Case) -> str:
    return f"{case.scenario} / {case.system} / n={case.n:,}"


def _note_sample(case: Case, metric: str, note: str) -> Sample:
    return Sample(case.scenario, case.system, case.n, metric, None, "", note)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _summary(measurements: Sequence[Any]) -> str:
    shown = [f"{m.metric}={m.value:.3g}{m.unit and ' ' + m.unit}" for m in measurements if m.value is not None][:6]
    return ", ".join(shown) or "no figures"
