"""A small command-line client of the API, printing JSON.

    RUNPLANE_TOKEN=... python -m api.client create-job --name nightly --step 'dbt build' --cron '0 2 * * *'
    RUNPLANE_TOKEN=... python -m api.client trigger 1 --follow

The server address comes from RUNPLANE_API__HOST / RUNPLANE_API__PORT (the server's own settings).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from runplane.settings import Settings
from runplane.types import TERMINAL_STATUSES
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, projects_pb2, projects_pb2_grpc, runs_pb2, runs_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


if TYPE_CHECKING:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
else:  # the classes are not generic at run time
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add("authorization", f"Bearer {token}")
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# grpc files a channel interceptor under the first call kind it implements, so each kind needs
# its own object.
class _UnaryToken(_UnaryUnary):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(_with_token(client_call_details, self._token), request)


class _StreamToken(_UnaryStream):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(_with_token(client_call_details, self._token), request)


def channel(target: str, token: str | None) -> grpc.aio.Channel:
    """A channel to the API that sends ``token`` with every call (none when None)."""
    return grpc.aio.insecure_channel(
        target,
        interceptors=[_UnaryToken(token), _StreamToken(token)] if token is not None else None,  # type: ignore[list-item]
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
    )


def to_json(message: Message) -> str:
    return json_format.MessageToJson(message, indent=2)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m api.client", description="runplane API client")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-job", help="create a deploy job")
    create.add_argument("--name", required=True)
    create.add_argument("--step", action="append", required=True, help="a command; repeat for several")
    create.add_argument("--cron", help="five-field cron expression")
    create.add_argument("--timezone", default="UTC", help="IANA time zone of the cron expression")
    create.add_argument("--environment", type=int, default=0, help="run dbt steps in this environment")
    project = sub.add_parser("create-project", help="add a dbt project (a git repository)")
    project.add_argument("--name", required=True)
    project.add_argument("--url", required=True, help="https://, ssh://, git@host:path, file:// or a local path")
    project.add_argument("--subdirectory", default="", help="where dbt_project.yml is")
    secret = project.add_mutually_exclusive_group()
    secret.add_argument("--token-env", help="variable holding an https token for the repository")
    secret.add_argument("--ssh-key-file", type=Path, help="a deploy key (private key file)")
    env = sub.add_parser("create-environment", help="add an environment to a project (postgres connection)")
    env.add_argument("--project", type=int, required=True)
    env.add_argument("--name", required=True)
    env.add_argument("--type", choices=["deployment", "development"], default="deployment")
    env.add_argument("--dbt-version", required=True, help="one the runners know (RUNPLANE_RUNNER__DBT_VERSIONS)")
    env.add_argument("--branch", default="", help="default: the repository's default branch")
    env.add_argument("--field", action="append", default=[], metavar="NAME=VALUE", help="host, port, user, dbname…")
    env.add_argument("--password-env", help="variable holding the warehouse password")
    env.add_argument("--target", default="default")
    env.add_argument("--schema", required=True)
    env.add_argument("--threads", type=int, default=4)
    trigger = sub.add_parser("trigger", help="trigger a run of a job")
    trigger.add_argument("job_id", type=int)
    trigger.add_argument("--follow", action="store_true", help="print the logs until the run ends")
    trigger.add_argument("--idempotency-key", default="")
    get_run = sub.add_parser("get-run", help="show a run")
    get_run.add_argument("run_id", type=int)
    list_runs = sub.add_parser("list-runs", help="list runs, newest first")
    list_runs.add_argument("--job", type=int, default=0)
    cancel = sub.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", type=int)
    logs = sub.add_parser("logs", help="print a run's log")
    logs.add_argument("run_id", type=int)
    artifacts = sub.add_parser("artifacts", help="list a run's artifacts, per step")
    artifacts.add_argument("run_id", type=int)
    artifact = sub.add_parser("artifact", help="write an artifact to stdout")
    artifact.add_argument("run_id", type=int)
    artifact.add_argument("path", help="e.g. target/run_results.json, logs/dbt.log")
    artifact.add_argument("--step", type=int, help="the step that wrote it (default: the last one)")
    return parser


def _project_request(args: argparse.Namespace) -> projects_pb2.CreateProjectRequest:
    request = projects_pb2.CreateProjectRequest(name=args.name, repository_url=args.url, subdirectory=args.subdirectory)
    if args.token_env:
        request.git_credential_kind = projects_pb2.GIT_CREDENTIAL_KIND_TOKEN
        request.git_credential = os.environ.get(args.token_env, "")
    elif args.ssh_key_file:
        request.git_credential_kind = projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY
        request.git_credential = args.ssh_key_file.read_text()
    return request


def _environment_request(args: argparse.Namespace) -> projects_pb2.CreateEnvironmentRequest:
    fields = dict(field.split("=", 1) for field in args.field if "=" in field)
    secrets = {"password": os.environ.get(args.password_env, "")} if args.password_env else {}
    return projects_pb2.CreateEnvironmentRequest(
        project_id=args.project,
        name=args.name,
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT
        if args.type == "deployment"
        else projects_pb2.ENVIRONMENT_TYPE_DEVELOPMENT,
        dbt_version=args.dbt_version,
        git_branch=args.branch,
        connection=projects_pb2.Connection(adapter_type="postgres", fields=fields, secret_fields=secrets),
        target_name=args.target,
        schema=args.schema,
        threads=args.threads,
    )


async def _run(args: argparse.Namespace, target: str, token: str) -> int:
    async with channel(target, token) as chan:
        jobs = jobs_pb2_grpc.JobServiceStub(chan)
        runs = runs_pb2_grpc.RunServiceStub(chan)
        projects = projects_pb2_grpc.ProjectServiceStub(chan)
        match args.command:
            case "create-project":
                print(to_json(await projects.CreateProject(_project_request(args))))
            case "create-environment":
                print(to_json(await projects.CreateEnvironment(_environment_request(args))))
            case "logs":
                async for chunk in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=args.run_id)):
                    print(chunk.text, end="")
            case "artifacts":
                listed = await runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=args.run_id))
                for item in listed.artifacts:
                    print(f"step {item.step_index}  {item.size_bytes:>10}  {item.path}")
            case "artifact":
                get = runs_pb2.GetArtifactRequest(run_id=args.run_id, path=args.path)
                if args.step is not None:
                    get.step_index = args.step
                sys.stdout.buffer.write((await runs.GetArtifact(get)).content)
            case "create-job":
                request = jobs_pb2.CreateJobRequest(
                    name=args.name, job_type=common_pb2.JOB_TYPE_DEPLOY, steps=args.step
                )
                if args.environment:
                    # Settings sent whole: the grace of missed fires keeps its default (-1).
                    request.settings.CopyFrom(
                        jobs_pb2.JobSettings(environment_id=args.environment, missed_run_grace_seconds=-1)
                    )
                if args.cron:
                    request.triggers.schedule.CopyFrom(jobs_pb2.CronSchedule(cron=args.cron, timezone=args.timezone))
                print(to_json(await jobs.CreateJob(request)))
            case "trigger":
                run = await runs.TriggerRun(
                    runs_pb2.TriggerRunRequest(job_id=args.job_id, idempotency_key=args.idempotency_key)
                )
                if not args.follow:
                    print(to_json(run))
                    return 0
                return await _follow(runs, run.id)
            case "get-run":
                print(to_json(await runs.GetRun(runs_pb2.GetRunRequest(run_id=args.run_id))))
            case "list-runs":
                print(to_json(await runs.ListRuns(runs_pb2.ListRunsRequest(job_id=args.job))))
            case "cancel":
                print(to_json(await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=args.run_id))))
    return 0


async def _follow(runs: runs_pb2_grpc.RunServiceAsyncStub, run_id: int) -> int:
    """Print log chunks until the run ends (resuming if the server drops the stream), then the run."""
    after_seq = 0
    while True:
        async for chunk in runs.StreamRunLogs(
            runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True, after_seq=after_seq)
        ):
            print(chunk.text, end="" if chunk.text.endswith("\n") else "\n", file=sys.stderr, flush=True)
            after_seq = chunk.seq
        run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        if run.status in {s.value for s in TERMINAL_STATUSES}:
            print(to_json(run))
            return 0 if run.status == common_pb2.RUN_STATUS_SUCCESS else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    token = os.environ.get("RUNPLANE_TOKEN", "")
    if not token:
        print("set RUNPLANE_TOKEN to an API token (runplane admin create-token --account ID)", file=sys.stderr)
        return 2
    settings = Settings()
    target = f"{settings.api.host}:{settings.api.port}"
    try:
        return asyncio.run(_run(args, target, token))
    except grpc.aio.AioRpcError as exc:
        print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
