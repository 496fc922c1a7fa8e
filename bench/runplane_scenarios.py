"""Adapters for runplane's own scenario modules, looked up by name when they exist:

- ``bench.queuer_burst.run(n, workers=2) -> dict``: the burst on runplane's queuer workers;
- ``bench.dispatch_throughput.run(quick=...) -> dict``: noop-launcher throughput over 1,000
  accounts and local-launcher prep time at a steady rate.

Each call runs in a child process (``python -m bench.runplane_scenarios``) in its own process group,
so that a run past its cap is stopped with everything it started. The returned dict becomes
measurements: the keys these modules return are mapped onto the names the other systems use
(``lag_p99``, ``all_done``...); any other number is kept under its own name (``a.b`` when nested),
with a unit read from its suffix (``_s``/``_seconds``, ``_ms``, ``_per_s``/``_per_second``,
``_bytes``, ``_mib``, ``_ratio``, ``_runs``, ``_jobs``); ``{"value": v, "unit": u}`` states its
unit. Parameters, targets and per-worker breakdowns are not metrics.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.records import Measurement, Unavailable
from bench.sandbox import child_env, log_tail, start, stop, wait_until

QUEUER_BURST = "bench.queuer_burst"
DISPATCH_THROUGHPUT = "bench.dispatch_throughput"

# key in the returned dict -> (scenario, metric, unit); scenario "" keeps the case's own.
QUEUER_BURST_METRICS: dict[str, tuple[str, str, str]] = {
    "runs_queued": ("", "completed", "jobs"),
    "trigger_lag_p50_s": ("", "lag_p50", "s"),
    "trigger_lag_p99_s": ("", "lag_p99", "s"),
    "trigger_lag_max_s": ("", "lag_max", "s"),
    "all_queued_seconds": ("", "all_done", "s"),
    "assign_seconds": ("", "assign_all", "s"),
    "bytes_per_owned_job": ("", "memory_per_job", "B"),
    "duplicate_runs": ("", "duplicate_runs", "runs"),
}
DISPATCH_METRICS: dict[str, tuple[str, str, str]] = {
    "throughput_noop.runs_per_second": ("throughput", "runs_per_s", "1/s"),
    "throughput_noop.runs": ("throughput", "runs", "runs"),
    "throughput_noop.runs_started": ("throughput", "runs_started", "runs"),
    "throughput_noop.seconds": ("throughput", "duration", "s"),
    "throughput_noop.relaunched": ("throughput", "relaunched", "runs"),
    "prep_time_local.runs": ("prep_time", "runs", "runs"),
    "prep_time_local.succeeded": ("prep_time", "succeeded", "runs"),
    "prep_time_local.prep_time_p50": ("prep_time", "prep_time_p50", "s"),
    "prep_time_local.prep_time_p99": ("prep_time", "prep_time_p99", "s"),
    "prep_time_local.prep_time_max": ("prep_time", "prep_time_max", "s"),
    "prep_time_local.run_delay_p50": ("prep_time", "run_delay_p50", "s"),
    "prep_time_local.run_delay_p99": ("prep_time", "run_delay_p99", "s"),
    "prep_time_local_unfenced.prep_time_p50": ("prep_time", "prep_time_p50_unfenced", "s"),
    "prep_time_local_unfenced.prep_time_p99": ("prep_time", "prep_time_p99_unfenced", "s"),
    "prep_time_local_unfenced.run_delay_p99": ("prep_time", "run_delay_p99_unfenced", "s"),
}
NOT_METRICS = frozenset(
    {"n", "workers", "accounts", "dispatchers", "quick", "rate_per_second", "jobs_owned", "load_average"}
)

_UNITS = (
    ("_per_s", "1/s"),
    ("_per_second", "1/s"),
    ("_rps", "1/s"),
    ("_ms", "ms"),
    ("_seconds", "s"),
    ("_s", "s"),
    (".seconds", "s"),
    ("_bytes", "B"),
    ("_kib", "KiB"),
    ("_mib", "MiB"),
    ("_ratio", "ratio"),
    ("_count", "count"),
    ("_jobs", "jobs"),
    ("_runs", "runs"),
)


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def require_queuer_burst() -> None:
    if not module_exists(QUEUER_BURST):
        raise Unavailable(f"{QUEUER_BURST} does not exist yet")


def require_dispatch_throughput() -> None:
    if not module_exists(DISPATCH_THROUGHPUT):
        raise Unavailable(f"{DISPATCH_THROUGHPUT} does not exist yet")


def queuer_burst_lead(n: int) -> float:
    """Seconds from the start of a burst repetition to the minute boundary it fires at, when it is
    started that long before one: the child's start, the database and the workers (about 3.5 s; 6
    with a margin), then the lead it leaves itself to insert and assign the jobs."""
    from bench.queuer_burst import fire_lead

    return 6.0 + fire_lead(n)


def measure_queuer_burst(n: int, cap: float) -> list[Measurement]:
    """runplane's burst with 2 queuer workers."""
    return to_measurements(call_in_child(QUEUER_BURST, {"n": n, "workers": 2}, cap), QUEUER_BURST_METRICS)


def measure_dispatch(quick: bool, cap: float, part: str | None = None) -> list[Measurement]:
    """Throughput (noop launcher) and prep time (local launcher), each under its own scenario;
    ``part`` ("throughput" or "prep_time") runs only that one."""
    kwargs = dispatch_kwargs(quick)
    if part is not None:
        kwargs["parts"] = [part]
    measured = to_measurements(call_in_child(DISPATCH_THROUGHPUT, kwargs, cap), DISPATCH_METRICS)
    return [
        m
        if m.scenario
        else Measurement(
            m.metric,
            m.value,
            m.unit,
            m.note,
            "prep_time" if "prep" in m.metric or "delay" in m.metric else "throughput",
        )
        for m in measured
    ]


def dispatch_kwargs(quick: bool) -> dict[str, Any]:
    """Arguments for ``dispatch_throughput.run``, passed only where its signature names them."""
    require_dispatch_throughput()
    wanted: dict[str, Any] = {"quick": quick, "accounts": 1000, "rate": 10, "seconds": 15 if quick else 60}
    parameters = inspect.signature(importlib.import_module(DISPATCH_THROUGHPUT).run).parameters
    return {name: value for name, value in wanted.items() if name in parameters}


def call_in_child(module: str, kwargs: dict[str, Any], cap: float) -> dict[str, Any]:
    """``module.run(**kwargs)`` in a child process; its dict, or an error after ``cap`` seconds."""
    if not module_exists(module):
        raise Unavailable(f"{module} does not exist yet")
    with tempfile.TemporaryDirectory(prefix="bench-runplane-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "child.log"
        proc = start(["-m", "bench.runplane_scenarios", module, json.dumps(kwargs), str(out)], child_env(), log)
        try:
            finished = wait_until(lambda: proc.poll() is not None, cap, interval=0.2)
        finally:
            stop(proc)
        if not finished:
            raise TimeoutError(f"{module}.run did not return within {cap:.0f} s:\n{log_tail(log)}")
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{module}.run failed (exit {proc.returncode}):\n{log_tail(log)}")
        result = json.loads(out.read_text())
    if not isinstance(result, dict):
        raise RuntimeError(f"{module}.run returned {type(result).__name__}, not a dict")
    return result


def to_measurements(
    result: Mapping[str, Any], known: Mapping[str, tuple[str, str, str]] | None = None, prefix: str = ""
) -> list[Measurement]:
    """The numeric entries of a scenario's dict, named and united by ``known`` or by the key's suffix."""
    known = known or {}
    out: list[Measurement] = []
    for key, value in result.items():
        path = f"{prefix}{key}"
        if key in NOT_METRICS or key.startswith("target_") or value is None:
            continue
        if path in known and isinstance(value, int | float):
            scenario, metric, unit = known[path]
            out.append(Measurement(metric, float(value), unit, scenario=scenario))
        elif isinstance(value, bool):
            out.append(Measurement(path, float(value), "bool"))
        elif isinstance(value, int | float):
            out.append(Measurement(path, float(value), unit_of(path)))
        elif isinstance(value, Mapping) and isinstance(value.get("value"), int | float):
            out.append(Measurement(path, float(value["value"]), str(value.get("unit", unit_of(path)))))
        elif isinstance(value, Mapping):
            out.extend(to_measurements(value, known, prefix=f"{path}."))
    return out


def unit_of(metric: str) -> str:
    lowered = metric.lower()
    for suffix, unit in _UNITS:
        if lowered.endswith(suffix):
            return unit
    return ""


def _child(module: str, kwargs_json: str, out: str) -> int:
    began = time.monotonic()
    result = importlib.import_module(module).run(**json.loads(kwargs_json))
    print(f"{module}.run returned after {time.monotonic() - began:.1f} s", flush=True)
    Path(out).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(*sys.argv[1:4]))
