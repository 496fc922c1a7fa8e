"""The ``runplane`` command: one entry point for every service and the admin tasks.

This is the composition root: it imports each service's ``serve`` (and the runner, and the admin
tasks of ``api.admin``) when its command runs, so a command loads only what it starts. The
import-linter contract "the shared package does not depend on any service" in pyproject.toml names
each of these imports as an exception, with this reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from runplane import logs
from runplane.errors import RunplaneError
from runplane.settings import Settings

Serve = Callable[[Settings, asyncio.Event], Coroutine[Any, Any, None]]

SERVICES = ("api", "orchestrator", "queuer-worker", "scheduler", "dispatcher")


def _service(command: str) -> Serve:
    """The ``serve(settings, stop)`` of the service a command runs, imported only then."""
    match command:
        case "api":
            from api.server import serve
        case "orchestrator":
            from orchestrator.service import serve
        case "queuer-worker":
            from queuer_worker.service import serve
        case "scheduler":
            from scheduler.loop import serve
        case "dispatcher":
            from dispatcher.service import serve
        case _:
            raise AssertionError(f"no service {command!r}")
    return serve


def _serve(command: str, settings: Settings) -> int:
    from runplane.supervise import run_until_stopped
    from runplane.telemetry import setup_metrics
    from runplane.tracing import setup_tracing, shutdown_tracing

    serve = _service(command)
    logs.configure(command, fmt=settings.log_format, level=settings.log_level)
    setup_metrics(command, settings.metrics_port)
    setup_tracing(command, settings.otlp_endpoint)
    try:
        asyncio.run(
            run_until_stopped(command, lambda stop: serve(settings, stop), drain_seconds=settings.drain_seconds)
        )
    finally:
        shutdown_tracing()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runplane", description="A distributed job scheduler for data pipelines.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply database migrations (safe to run concurrently)")
    sub.add_parser("check-services", help="check Postgres, Redis and RabbitMQ; start stopped local ones")
    for name in SERVICES:
        sub.add_parser(name, help=f"run the {name} service")
    runner = sub.add_parser("runner", help="execute one run")
    runner.add_argument("--run-id", type=int, required=True)
    up = sub.add_parser("up", help="start the whole system on this machine")
    up.add_argument("--demo", action="store_true", help="migrate and create a demo account and jobs first")
    up.add_argument("--queuer-workers", type=int, default=2)
    up.add_argument("--dispatchers", type=int, default=2)
    up.add_argument("--launcher", default=None, help="local (default) or noop")

    admin = sub.add_parser("admin", help="accounts and tokens").add_subparsers(dest="admin_command", required=True)
    account = admin.add_parser("create-account", help="create an account; prints its id and a new token")
    account.add_argument("--name", required=True)
    account.add_argument("--run-slots", type=int, required=True)
    account.add_argument("--memory-mb", type=int, default=1024)
    token = admin.add_parser("create-token", help="create a new API token for an account")
    token.add_argument("--account", type=int, required=True)

    status = sub.add_parser("status", help="live view of queues, delays, workers and dispatchers")
    status.add_argument("--once", action="store_true")
    status.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = Settings()
    try:
        return _run(args, settings)
    except RunplaneError as exc:
        print(f"runplane: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, settings: Settings) -> int:
    match args.command:
        case "migrate":
            from runplane.migrate import ensure_database, migrate

            logs.configure("migrate", fmt=settings.log_format, level=settings.log_level)
            ensure_database(settings.database_url)
            applied = migrate(settings.database_url)
            print(f"migrations applied: {applied}" if applied else "schema is up to date")
            return 0
        case "check-services":
            from runplane.preflight import ensure_services

            problems = ensure_services(settings)
            for problem in problems:
                print(f"runplane: {problem}", file=sys.stderr)
            if not problems:
                print("Postgres, Redis and RabbitMQ answer")
            return 1 if problems else 0
        case "runner":
            from runplane.tracing import setup_tracing, shutdown_tracing

            logs.configure("runner", fmt=settings.log_format, level=settings.log_level)
            setup_tracing("runner", settings.otlp_endpoint)
            from runner.service import run

            try:
                return asyncio.run(run(settings, args.run_id))
            finally:
                shutdown_tracing()
        case "up":
            from runplane.up import up

            return up(
                settings,
                demo=args.demo,
                queuer_workers=args.queuer_workers,
                dispatchers=args.dispatchers,
                launcher=args.launcher,
            )
        case "admin":
            return _admin(args, settings)
        case "status":
            from runplane.status import main as status

            return status(settings, args.once, args.json)
        case command if command in SERVICES:
            return _serve(command, settings)
    raise AssertionError(f"unhandled command {args.command}")


def _admin(args: argparse.Namespace, settings: Settings) -> int:
    from api.admin import create_account, create_token

    if args.admin_command == "create-account":
        account_id, token = asyncio.run(
            create_account(settings, name=args.name, run_slots=args.run_slots, memory_mb=args.memory_mb)
        )
        print(json.dumps({"account_id": account_id, "token": token}))
        return 0
    token = asyncio.run(create_token(settings, account_id=args.account))
    print(json.dumps({"account_id": args.account, "token": token}))
    return 0
