"""``python -m bench.rest_api``: the REST API (dbt Cloud v2) of one ``runplane api`` process.

- trigger latency: ``POST .../jobs/{id}/run/`` until the answer (the run is queued and committed),
  one request at a time, p50/p99;
- GetRun polling: 50 concurrent clients each polling ``GET .../runs/{id}/`` as fast as answers come,
  requests/s; from that, how many Airflow-style tasks (one poll every ``POLL_INTERVAL`` s) one API
  process holds.

The load generator runs on the same machine and takes CPU from the server: the figures are a floor.
Prints JSON, then a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from api.admin import create_account
from bench.sandbox import temporary_database, wait_until
from bench.services import RunplaneServices
from runplane.basics.settings import Settings
from tests.support.ports import free_port

POLL_INTERVAL = 5.0  # seconds between polls of one waiting Airflow task (DbtCloudRunJobOperator's check_interval)


async def _trigger_latencies(http: httpx.AsyncClient, base: str, job_id: int, count: int) -> list[float]:
    out: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        response = await http.post(f"{base}/jobs/{job_id}/run/", json={"cause": "bench"})
        out.append(time.perf_counter() - started)
        response.raise_for_status()
    return out


async def _poll_rate(http: httpx.AsyncClient, base: str, run_id: int, clients: int, seconds: float) -> float:
    done = 0
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            response = await http.get(f"{base}/runs/{run_id}/")
            response.raise_for_status()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.perf_counter() - started)


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def _measure(
    rest_port: int, token: str, account_id: int, job_id: int, args: argparse.Namespace
) -> dict[str, float]:
    base = f"/api/v2/accounts/{account_id}"
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_port}", headers={"Authorization": f"Token {token}"}, limits=limits, timeout=30
    ) as http:
        await _trigger_latencies(http, base, job_id, 10)  # warm up
        latencies = await _trigger_latencies(http, base, job_id, args.triggers)
        run_id = (await http.get(f"{base}/runs/", params={"limit": 1})).json()["data"][0]["id"]
        rate = await _poll_rate(http, base, run_id, args.clients, args.seconds)
    return {
        "trigger_p50_ms": round(_percentile(latencies, 50) * 1000, 1),
        "trigger_p99_ms": round(_percentile(latencies, 99) * 1000, 1),
        "triggers": len(latencies),
        "getrun_requests_per_s": round(rate, 1),
        "clients": args.clients,
        "poll_interval_s": POLL_INTERVAL,
        "airflow_tasks_held": int(rate * POLL_INTERVAL),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rest_api", description=__doc__)
    parser.add_argument("--triggers", type=int, default=300)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
        rest_port = free_port()
        with RunplaneServices(
            url, Path(logs), RUNPLANE_API__PORT=str(free_port()), RUNPLANE_API__REST_PORT=str(rest_port)
        ) as services:
            services.start("api", "api")
            settings = Settings(database_url=url)
            account_id, token = asyncio.run(create_account(settings, name="bench", run_slots=1, memory_mb=512))
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'b', 'adhoc', %s) RETURNING id",
                    (account_id, ["true"]),
                ).fetchone()
            assert row is not None
            if not wait_until(lambda: _answers(rest_port), 60):
                services.check_alive()
                raise RuntimeError("the REST API did not answer")
            result = asyncio.run(_measure(rest_port, token, account_id, int(row[0]), args))
    print(json.dumps(result, indent=2))
    print()
    print("| figure | value |\n| --- | --- |")
    for key, value in result.items():
        print(f"| {key} | {value} |")


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    main()
