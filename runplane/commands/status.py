"""``runplane status``: what operators watch, read from Postgres.

Queue depth and the oldest queued run, the on-time split (run delay ≤ 25 s, 25–60 s, > 60 s), p50/p99
of trigger lag, wait time, prep time and run delay over the last minutes, the orchestrator's term,
workers with their job counts and heartbeat age, dispatchers, why accounts' runs wait, the accounts
least on time, and how many bus messages sit in the dead-letter queue.
``--once --json`` prints the same figures once, for scripts.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from runplane.adapters.bus import Topology, dead_letter_count
from runplane.adapters.db import redact
from runplane.basics import on_time
from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import ForecastSettings, Settings
from runplane.demand.forecast import MINUTE, minute_of
from runplane.sql import load_queries

QUERIES = load_queries("runplane.sql", "status.sql")
WORST_ACCOUNTS = 10
DEMAND_MINUTES_BACK = 5
STATUS_NAMES = {1: "queued", 2: "starting", 3: "running", 10: "success", 20: "error", 30: "cancelled"}


@dataclass(frozen=True, slots=True)
class _AccountOnTime:
    """An account's runs considered for being on time over the window, and how many were (``accounts_on_time``)."""

    account_id: int
    account_name: str
    considered: int
    on_time: int


@dataclass(frozen=True, slots=True)
class _DemandMinute:
    """Cron runs of one minute: forecast, due and started (``demand``)."""

    minute: int
    forecast: int
    due: int
    started: int


def snapshot(database_url: str, window_seconds: float = 900.0, *, bus: Settings | None = None) -> dict[str, Any]:
    """Every figure of the status view, as plain JSON-ready values (with ``bus``, the bus's too)."""
    try:
        conn = psycopg.connect(database_url, row_factory=dict_row, autocommit=True)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc
    params = {"window_seconds": window_seconds}
    with conn:
        queue = conn.execute(QUERIES["queue"]).fetchone() or {}
        slots_total = conn.execute(QUERIES["slots_total"]).fetchone() or {}
        delays = conn.execute(QUERIES["delays"], params).fetchone() or {}
        finished = {STATUS_NAMES[r["status"]]: r["runs"] for r in conn.execute(QUERIES["finished"], params)}
        orchestrator = conn.execute(QUERIES["orchestrator"]).fetchone() or {}
        workers = conn.execute(QUERIES["workers"]).fetchall()
        dispatchers = conn.execute(QUERIES["dispatchers"]).fetchall()
        waiting = conn.execute(QUERIES["waiting"]).fetchall()
        with conn.cursor(row_factory=class_row(_AccountOnTime)) as accounts_cur:
            accounts = accounts_cur.execute(
                QUERIES["accounts_on_time"], {**params, "on_time_seconds": on_time.ON_TIME_SECONDS}
            ).fetchall()
        with conn.cursor(row_factory=class_row(_DemandMinute)) as demand_cur:
            demand = demand_cur.execute(
                QUERIES["demand"], _demand_params(bus.forecast if bus is not None else ForecastSettings(), time.time())
            ).fetchall()
        pools = conn.execute(QUERIES["pools"]).fetchall()
    started = int(delays.get("started") or 0)

    def share(n: Any) -> float | None:
        return round(int(n or 0) / started, 4) if started else None

    return {
        "window_seconds": window_seconds,
        "queue": {**{k: _plain(v) for k, v in queue.items()}, "slots_total": int(slots_total.get("slots_total", 0))},
        "on_time": {
            "started": started,
            "le_25s": share(delays.get("on_time_25")),
            "25s_to_60s": share(delays.get("on_time_60")),
            "gt_60s": share(delays.get("late")),
        },
        "delays_seconds": {k: _plain(v) for k, v in delays.items() if k.endswith(("_p50", "_p99"))},
        "finished": finished,
        "orchestrator": {k: _plain(v) for k, v in orchestrator.items()},
        "workers": [{k: _plain(v) for k, v in w.items()} for w in workers],
        "dispatchers": [{k: _plain(v) for k, v in d.items()} for d in dispatchers],
        "waiting": [{k: _plain(v) for k, v in w.items()} for w in waiting],
        "worst_on_time": _worst_on_time(accounts),
        "demand": [{**asdict(row), "minute": _minute_text(row.minute)} for row in demand],
        "pools": [{k: _plain(v) for k, v in p.items()} for p in pools],
        **({"dead_letters": _dead_letters(bus)} if bus is not None else {}),
    }


def _demand_params(forecast: ForecastSettings, now: float) -> dict[str, float]:
    """The minutes the status view sets forecast beside what happened: a few back, the forecast's ahead."""
    current = minute_of(now)
    return {
        "from_minute": current - DEMAND_MINUTES_BACK * MINUTE,
        "to_minute": current + (forecast.minutes - 1) * MINUTE,
        "stale_after": forecast.stale_after,
    }


def _minute_text(minute: int) -> str:
    return datetime.fromtimestamp(minute, UTC).strftime("%H:%M")


def _worst_on_time(rows: list[_AccountOnTime], count: int = WORST_ACCOUNTS) -> list[dict[str, Any]]:
    """The ``count`` accounts with the lowest on-time ratio (the fewest runs first among equals)."""

    def ratio(r: _AccountOnTime) -> float:
        return round(on_time.ratio(r.on_time, r.considered), 4)

    worst = sorted(rows, key=lambda r: (ratio(r), -r.considered, r.account_id))[:count]
    return [
        {
            "account_id": r.account_id,
            "account_name": r.account_name,
            "considered": r.considered,
            "on_time_ratio": ratio(r),
        }
        for r in worst
    ]


def _dead_letters(settings: Settings) -> dict[str, Any]:
    """The dead-letter queue's depth: messages no handler could process (see ``runplane.adapters.bus``)."""
    topology = Topology(settings.bus_prefix)
    try:
        count = asyncio.run(dead_letter_count(settings.amqp_url, topology))
    except ServiceUnavailable as exc:
        return {"queue": topology.dead_letter, "messages": None, "error": str(exc)}
    return {"queue": topology.dead_letter, "messages": count}


def _plain(value: object) -> object:
    if isinstance(value, float):
        return round(value, 4)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _render(snap: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    def fmt(v: object, unit: str = "") -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}{unit}"
        return f"{v}{unit}"

    q = snap["queue"]
    head = Table(title=f"runplane — last {int(snap['window_seconds'] // 60)} min", show_header=True)
    for column in ("queued", "due", "oldest queued", "starting", "running", "slots in use", "term"):
        head.add_column(column)
    head.add_row(
        fmt(q.get("queued")), fmt(q.get("queued_due")), fmt(q.get("oldest_queued_age_seconds"), " s"),
        fmt(q.get("starting")), fmt(q.get("running")), f"{q.get('slots_in_use')}/{q.get('slots_total')}",
        fmt(snap["orchestrator"].get("term")),
    )  # fmt: skip
    on_time = snap["on_time"]
    delays = Table(title=f"on time ({on_time['started']} started)")
    for column in ("≤ 25 s", "25–60 s", "> 60 s"):
        delays.add_column(column)
    delays.add_row(
        *(fmt(on_time[k] * 100 if on_time[k] is not None else None, " %") for k in ("le_25s", "25s_to_60s", "gt_60s"))
    )
    pct = Table(title="delays (seconds)")
    for column in ("", "p50", "p99"):
        pct.add_column(column)
    d = snap["delays_seconds"]
    for name in ("trigger_lag", "wait_time", "prep_time", "run_delay"):
        pct.add_row(name.replace("_", " "), fmt(d.get(f"{name}_p50")), fmt(d.get(f"{name}_p99")))
    workers = Table(title="queuer workers")
    for column in ("worker", "state", "jobs", "heartbeat age"):
        workers.add_column(column)
    for w in snap["workers"]:
        workers.add_row(w["worker_id"], w["state"], fmt(w["jobs_owned"]), fmt(w["heartbeat_age_seconds"], " s"))
    dispatchers = Table(title="dispatchers")
    for column in ("dispatcher", "cluster", "launcher", "dispatched", "last seen"):
        dispatchers.add_column(column)
    for x in snap["dispatchers"]:
        dispatchers.add_row(
            x["dispatcher_id"], x["cluster"], x["launcher"], fmt(x["dispatched"]), fmt(x["last_seen_age_seconds"], " s")
        )
    waiting = Table(title="queued runs per account")
    for column in ("account", "waiting reason", "runs"):
        waiting.add_column(column)
    for x in snap["waiting"]:
        waiting.add_row(f"{x['account_id']} {x['account_name']}", x["waiting_reason"] or "(due soon)", fmt(x["runs"]))
    worst = Table(title="accounts least on time")
    for column in ("account", "runs", "on time"):
        worst.add_column(column)
    for x in snap["worst_on_time"]:
        ratio = fmt(x["on_time_ratio"] * 100, " %")
        worst.add_row(f"{x['account_id']} {x['account_name']}", fmt(x["considered"]), ratio)
    demand = Table(title="cron runs per minute (UTC): forecast, due, started")
    for column in ("minute", "forecast", "due", "started"):
        demand.add_column(column)
    for x in snap["demand"]:
        demand.add_row(x["minute"], fmt(x["forecast"]), fmt(x["due"]), fmt(x["started"]))
    pools = Table(title="warm pools")
    for column in ("cluster", "pool", "waiting or starting", "given a run"):
        pools.add_column(column)
    for x in snap["pools"]:
        pools.add_row(x["cluster"], x["pool"], fmt(x["idle"]), fmt(x["given"]))
    parts: list[Any] = [head, delays, pct, demand, pools, workers, dispatchers, waiting, worst]
    if "dead_letters" in snap:
        dead = Table(title="bus")
        dead.add_column("dead-letter queue")
        dead.add_column("messages")
        dead.add_row(snap["dead_letters"]["queue"], fmt(snap["dead_letters"]["messages"]))
        parts.append(dead)
    return Group(*parts)


def main(settings: Settings, once: bool, as_json: bool, *, interval: float = 2.0) -> int:
    if once:
        snap = snapshot(settings.database_url, bus=settings)
        if as_json:
            print(json.dumps(snap, indent=2, default=str))
        else:
            from rich.console import Console

            Console().print(_render(snap))
        return 0
    from rich.live import Live

    with Live(_render(snapshot(settings.database_url, bus=settings)), refresh_per_second=2, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(_render(snapshot(settings.database_url, bus=settings)))
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Settings(), "--once" in sys.argv, "--json" in sys.argv))
