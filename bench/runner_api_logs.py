"""Log append throughput through the runner API: lines per second for 1 run and for 50 concurrent runs.

``python -m bench.runner_api_logs [--runs 1 50] [--seconds 10]``: starts a real ``runplane api``
process on a fresh database, claims ``runs`` runs with their tokens, and has one runner client
(:class:`runner.control_plane.RunnerApi`, as a runner uses it) per run append batches of log lines
for ``seconds`` — each call one chunk of ``lines_per_call`` 80-character lines, the shape a chatty
step produces between two flushes. Prints JSON: lines/s, calls/s and call latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.sandbox import temporary_database
from runner.control_plane import RunnerApi
from runplane.basics.tokens import new_run_token, token_hash
from tests.support.ports import free_port

LINE = "x" * 79 + "\n"


def _starting_runs(url: str, count: int) -> list[tuple[int, str]]:
    runs = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO accounts (name, run_slots) VALUES ('bench', 1000)")
        for i in range(count):
            token = new_run_token()
            row = conn.execute(
                """WITH job AS (INSERT INTO jobs (account_id, name, job_type, steps)
                                VALUES (1, %s, 'adhoc', ARRAY['echo']) RETURNING id)
                   INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, status,
                                     scheduled_at, dispatched_at, runner_token_hash)
                   SELECT 1, id, 'adhoc', 'api', %s, true, 2, clock_timestamp(), clock_timestamp(), %s FROM job
                   RETURNING id""",
                (f"job {i}", f"bench:logs:{i}", token_hash(token)),
            ).fetchone()
            assert row is not None
            runs.append((int(row[0]), token))
    return runs


async def _append_for(api: RunnerApi, seconds: float, lines_per_call: int) -> tuple[int, list[float]]:
    text = LINE * lines_per_call
    latencies: list[float] = []
    seq = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seq += 1
        started = time.perf_counter()
        await api.append_logs([(seq, 0, text)])
        latencies.append(time.perf_counter() - started)
    return seq * lines_per_call, latencies


async def _measure(address: str, runs: list[tuple[int, str]], seconds: float, lines_per_call: int) -> dict[str, Any]:
    apis = [RunnerApi(address, token, run_id) for run_id, token in runs]
    try:
        for api in apis:
            assert await api.claim() is not None
        started = time.monotonic()
        results = await asyncio.gather(*(_append_for(api, seconds, lines_per_call) for api in apis))
        elapsed = time.monotonic() - started
    finally:
        for api in apis:
            await api.close()
    lines = sum(r[0] for r in results)
    latencies = sorted(latency for r in results for latency in r[1])
    return {
        "runs": len(runs),
        "seconds": round(elapsed, 2),
        "lines_per_call": lines_per_call,
        "lines_per_second": round(lines / elapsed),
        "calls_per_second": round(len(latencies) / elapsed, 1),
        "call_p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "call_p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
    }


def run(run_counts: list[int], seconds: float, lines_per_call: int) -> list[dict[str, Any]]:
    out = []
    for count in run_counts:
        with temporary_database() as url, tempfile.TemporaryDirectory() as logs:
            runner_port = free_port()
            env = {
                **os.environ,
                "RUNPLANE_DATABASE_URL": url,
                "RUNPLANE_API__PORT": str(free_port()),
                "RUNPLANE_API__RUNNER_PORT": str(runner_port),
                "RUNPLANE_LOG_LEVEL": "WARNING",
            }
            with (Path(logs) / "api.log").open("ab") as log:
                api = subprocess.Popen([sys.executable, "-m", "runplane", "api"], env=env, stdout=log, stderr=log)
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", runner_port), timeout=0.2).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RuntimeError("the API did not start") from None
                        time.sleep(0.1)
                runs = _starting_runs(url, count)
                out.append(asyncio.run(_measure(f"127.0.0.1:{runner_port}", runs, seconds, lines_per_call)))
            finally:
                api.terminate()
                api.wait(timeout=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lines-per-call", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(run(args.runs, args.seconds, args.lines_per_call), indent=2))


if __name__ == "__main__":
    main()
