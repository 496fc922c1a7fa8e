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

from runplane.basics import logs
from runplane.basics.errors import RunplaneError
from runplane.basics.process_privacy import make_undumpable
from runplane.basics.settings import Settings

Serve = Callable[[Settings, asyncio.Event], Coroutine[Any, Any, None]]

SERVICES = ("api", "orchestrator", "queuer-worker", "scheduler", "dispatcher")


def _service(command: str) -> Serve:
    """The ``serve(settings, stop)`` of the service a command runs, imported only then."""
    match command:
        case "api":
            from api.process import serve
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
    from runplane.adapters.telemetry import setup_metrics
    from runplane.adapters.tracing import setup_tracing, shutdown_tracing
    from runplane.basics.supervise import run_until_stopped

    serve = _service(command)
    make_undumpable()  # steps that share this user must not read this process's environment
    logs.configure(command, fmt=settings.log_format, level=settings.log_level)
    setup_metrics(command, settings.metrics_port)
    setup_tracing(command, settings.otlp_endpoint)

    async def with_probes(stop: asyncio.Event) -> None:
        if not settings.probe_port:
            await serve(settings, stop)
            return
        from runplane.adapters.readiness import serve_probes

        probes = asyncio.create_task(serve_probes(settings.probe_port, stop), name=f"{command}:probes")
        try:
            await serve(settings, stop)
        finally:
            probes.cancel()

    try:
        asyncio.run(run_until_stopped(command, with_probes, drain_seconds=settings.drain_seconds))
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
    which = runner.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", type=int)
    which.add_argument(
        "--pool", action="store_true", help="a warm pool Pod: wait on the runner API for a run; the token is the Pod's"
    )
    runner.add_argument(
        "--token-file", default="-", help="file holding the run's token (a mounted Secret); '-': read it from stdin"
    )
    node_cache = sub.add_parser(
        "node-cache", help="keep this node's dbt packages for the run Pods on it, served on a Unix socket"
    )
    node_cache.add_argument("--socket", required=True, help="the socket's path (its directory is mounted into Pods)")
    node_cache.add_argument("--root", required=True, help="the node's cache directory (never mounted into Pods)")
    node_cache.add_argument("--max-entry-mb", type=int, default=1024, help="the largest entry a run may store")
    node_cache.add_argument(
        "--max-cache-mb",
        type=int,
        default=10240,
        help="the node's cache size past which the least recently used entries are removed; 0: no limit",
    )
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
    token.add_argument("--name", default="", help="what the token is for")
    token.add_argument(
        "--scope",
        action="append",
        choices=["read_only", "job_admin", "account_admin"],
        help="read_only, job_admin or account_admin (default); repeatable",
    )
    token.add_argument("--expires-in-days", type=int, default=None, help="default: never")
    account_settings = admin.add_parser("set-account", help="change an account's settings; prints them")
    account_settings.add_argument("--account", type=int, required=True)
    account_settings.add_argument(
        "--deactivate-after-failures",
        type=int,
        default=None,
        help="deactivate a job after this many consecutive failed runs (default 100; 0: never)",
    )
    account_settings.add_argument(
        "--pull-request-schema-max-age-days",
        type=int,
        default=None,
        help="drop a pull request's schema this many days after its last CI run (default 14; 0: never)",
    )
    account_settings.add_argument(
        "--run-retention-days",
        type=int,
        default=None,
        help="delete finished runs, their logs and artifacts after this many days (default 0: never)",
    )
    revoke = admin.add_parser("revoke-token", help="revoke an API token: it fails from the next call on")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=int, help="the token's id")
    which.add_argument("--token", help="the token itself")

    for name, text in (
        ("plan", "show what `apply` would change of jobs' runplane settings (time zone, fan-in, priority, retries)"),
        ("apply", "set jobs' runplane settings from a file (RUNPLANE_TOKEN; idempotent)"),
    ):
        as_code = sub.add_parser(name, help=text)
        as_code.add_argument("file", help="YAML: jobs: {identifier: {timezone, completion_mode, priority, ...}}")
        as_code.add_argument(
            "--delete", action="store_true", help="put back the defaults of jobs with an identifier the file leaves out"
        )

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
            from runplane.basics.repository_urls import RepositoryRule
            from runplane.basics.secrets import box_from_settings, parse_keys
            from runplane.commands.migrate import ensure_database, migrate, refused_repositories

            logs.configure("migrate", fmt=settings.log_format, level=settings.log_level)
            ensure_database(settings.database_url)
            keys = parse_keys(settings.secret_keys.get_secret_value())
            applied = migrate(settings.database_url, box_from_settings(settings) if keys else None)
            print(f"migrations applied: {applied}" if applied else "schema is up to date")
            refused = refused_repositories(settings.database_url, RepositoryRule(settings.repositories))
            for project in refused:
                print(f"runplane: {project}", file=sys.stderr)
            if refused:
                print(
                    f"runplane: {len(refused)} projects name a repository their runs will refuse to clone: "
                    "change their repository_url (or the repositories.* settings)",
                    file=sys.stderr,
                )
            return 0
        case "plan" | "apply":
            return _job_settings(args)
        case "check-services":
            from runplane.commands.preflight import ensure_services

            problems = ensure_services(settings)
            for problem in problems:
                print(f"runplane: {problem}", file=sys.stderr)
            if not problems:
                print("Postgres, Redis and RabbitMQ answer")
            return 1 if problems else 0
        case "runner":
            from runplane.adapters.tracing import setup_tracing, shutdown_tracing

            logs.configure("runner", fmt=settings.log_format, level=settings.log_level)
            setup_tracing("runner", settings.otlp_endpoint)
            from runner.run_user import lease_for_run
            from runner.service import read_token, run, wait_and_run

            token = read_token(args.token_file)
            try:
                if args.pool:
                    return asyncio.run(wait_and_run(settings, token))
                run_user = lease_for_run(settings.runner, args.run_id)
                return asyncio.run(run(settings, args.run_id, token, run_user=run_user))
            finally:
                shutdown_tracing()
        case "node-cache":
            from pathlib import Path

            from runner.node_cache import NodeCacheKeeper
            from runplane.basics.supervise import run_until_stopped

            logs.configure("node-cache", fmt=settings.log_format, level=settings.log_level)
            keeper = NodeCacheKeeper(
                Path(args.socket),
                Path(args.root),
                settings.runner.api_address,
                max_entry_bytes=args.max_entry_mb << 20,
                max_cache_bytes=args.max_cache_mb << 20,
            )
            asyncio.run(run_until_stopped("node-cache", keeper.serve, drain_seconds=settings.drain_seconds))
            return 0
        case "up":
            from runplane.commands.up import up

            make_undumpable()
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
            from runplane.commands.status import main as status

            return status(settings, args.once, args.json)
        case command if command in SERVICES:
            return _serve(command, settings)
    raise AssertionError(f"unhandled command {args.command}")


def _admin(args: argparse.Namespace, settings: Settings) -> int:
    from api.admin import create_account, create_token, revoke_token, update_account_settings

    if args.admin_command == "create-account":
        account_id, token = asyncio.run(
            create_account(settings, name=args.name, run_slots=args.run_slots, memory_mb=args.memory_mb)
        )
        print(json.dumps({"account_id": account_id, "token": token}))
        return 0
    if args.admin_command == "set-account":
        changed = asyncio.run(
            update_account_settings(
                settings,
                account_id=args.account,
                deactivate_after_failures=args.deactivate_after_failures,
                pull_request_schema_max_age_days=args.pull_request_schema_max_age_days,
                run_retention_days=args.run_retention_days,
            )
        )
        print(json.dumps(changed))
        return 0
    if args.admin_command == "revoke-token":
        account_id = asyncio.run(revoke_token(settings, token_id=args.id, token=args.token))
        print(json.dumps({"account_id": account_id, "revoked": True}))
        return 0
    token = asyncio.run(
        create_token(
            settings,
            account_id=args.account,
            name=args.name,
            scopes=tuple(args.scope or ["account_admin"]),
            expires_in_days=args.expires_in_days,
        )
    )
    print(json.dumps({"account_id": args.account, "token": token}))
    return 0


def _job_settings(args: argparse.Namespace) -> int:
    """``runplane plan`` / ``apply``: through the public gRPC API, with the account's token."""
    import os
    from pathlib import Path

    import grpc

    from client.address import grpc_target
    from client.cli import channel
    from client.job_settings import SettingsFileError, run
    from runplane.v1 import jobs_pb2_grpc

    token = os.environ.get("RUNPLANE_TOKEN", "")
    if not token:
        print("runplane: set RUNPLANE_TOKEN to an API token of the account", file=sys.stderr)
        return 2

    async def go() -> list[str]:
        async with channel(grpc_target(), token) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            return await run(stub, Path(args.file), apply=args.command == "apply", delete=args.delete)

    try:
        lines = asyncio.run(go())
    except (SettingsFileError, OSError) as exc:
        print(f"runplane: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"runplane: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
