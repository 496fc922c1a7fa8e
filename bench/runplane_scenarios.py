"""Adapters for runplane's own scenario modules, looked up by name when they exist:

- ``bench.queuer_burst.run(n, workers=2) -> dict``: the burst on runplane's queuer workers;
- ``bench.dispatch_throughput.run(...) -> dict``: noop-launcher throughput and local prep time.

Each call runs in a child process (``python -m bench.runplane_scenarios``) in its own process group,
so that a run past its cap is stopped with everything it started. A returned dict becomes
measurements by this convention: a number under a key is a metric whose unit comes from the key's
suffix (``_s`` seconds, ``_ms``, ``_per_s`` per second, ``_bytes``, ``_ratio``, ``_count``);
``{"value": v, "unit": u}`` states the unit; other nested dicts are flattened as ``key.sub``;
anything else, and the parameters ``n``/``workers``/``accounts``, is not a metric.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.records import Measurement, Unavailable
from bench.sandbox import child_env, log_tail, start, stop, wait_until

QUEUER_BURST = "bench.queuer_burst"
DISPATCH_THROUGHPUT = "bench.dispatch_throughput"

PARAMETERS = frozenset({"n", "workers", "accounts", "quick", "seconds", "duration", "rate", "system", "scenario"})
_UNITS = (
    ("_per_s", "1/s"),
    ("_per_second", "1/s"),
    ("_rps", "1/s"),
    ("_ms", "ms"),
    ("_seconds", "s"),
    ("_s", "s"),
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


def measure_queuer_burst(n: int, cap: float) -> list[Measurement]:
    """runplane's burst with 2 queuer workers."""
    return to_measurements(call_in_child(QUEUER_BURST, {"n": n, "workers": 2}, cap))


def dispatch_kwargs(quick: bool) -> dict[str, Any]:
    """Arguments for ``dispatch_throughput.run``, passed only where its signature names them."""
    require_dispatch_throughput()
    wanted: dict[str, Any] = {"quick": quick, "accounts": 1000, "rate": 10, "seconds": 15 if quick else 60}
    wanted["duration"] = wanted["seconds"]
    parameters = inspect.signature(importlib.import_module(DISPATCH_THROUGHPUT).run).parameters
    return {name: value for name, value in wanted.items() if name in parameters}


def measure_dispatch(quick: bool, cap: float) -> dict[str, list[Measurement]]:
    """Throughput (noop launcher) and prep time (local launcher), split by metric name."""
    measurements = to_measurements(call_in_child(DISPATCH_THROUGHPUT, dispatch_kwargs(quick), cap))
    split: dict[str, list[Measurement]] = {"throughput": [], "prep_time": []}
    for m in measurements:
        split["prep_time" if ("prep" in m.metric or "delay" in m.metric) else "throughput"].append(m)
    return split


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


def to_measurements(result: dict[str, Any], prefix: str = "") -> list[Measurement]:
    """The numeric entries of a scenario's dict, with units from their names (see module doc)."""
    out: list[Measurement] = []
    for key, value in result.items():
        name = f"{prefix}{key}"
        if key in PARAMETERS and not prefix:
            continue
        if isinstance(value, bool):
            out.append(Measurement(name, float(value), "bool"))
        elif isinstance(value, int | float):
            out.append(Measurement(name, float(value), unit_of(name)))
        elif isinstance(value, dict) and isinstance(value.get("value"), int | float):
            out.append(Measurement(name, float(value["value"]), str(value.get("unit", unit_of(name)))))
        elif isinstance(value, dict):
            out.extend(to_measurements(value, prefix=f"{name}."))
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
