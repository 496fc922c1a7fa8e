"""The command-line client of the API: jobs with their settings, triggers with overrides and CI,
runs, logs, artifacts and webhooks. One line per object, or everything as JSON with ``--json``.

    RUNPLANE_TOKEN=... python -m client create-job --name nightly --step 'dbt build' --cron '0 2 * * *'
    RUNPLANE_TOKEN=... python -m client trigger 1 --threads 8 --schema dbt_alice --follow
    RUNPLANE_TOKEN=... python -m client --json logs 42

The gRPC address comes from RUNPLANE_API__HOST / RUNPLANE_API__PORT (the server's own variables);
webhooks go over the REST API at RUNPLANE_REST_URL (default http://HOST:RUNPLANE_API__REST_PORT).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from client.address import grpc_target
from client.webhooks import add_webhook_commands, run_webhook_command
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, projects_pb2, projects_pb2_grpc, runs_pb2, runs_pb2_grpc

# Artifacts travel whole; the server sends up to 64 MiB in one message.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
TERMINAL_STATUSES = frozenset(
    {common_pb2.RUN_STATUS_SUCCESS, common_pb2.RUN_STATUS_ERROR, common_pb2.RUN_STATUS_CANCELLED}
)

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
    # grpc-stubs leave the type of a client interceptor open (a placeholder that asks for a cast).
    interceptors = [_UnaryToken(token), _StreamToken(token)] if token is not None else None
    return grpc.aio.insecure_channel(
        target,
        interceptors=cast("list[grpc.aio.ClientInterceptor] | None", interceptors),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
    )


def to_json(message: Message) -> str:
    return json_format.MessageToJson(message, indent=2)


# dbt's prefix of secret variables: write-only, so an update sends one empty to unset it.
SECRET_PREFIX = "DBT_ENV_SECRET_"
JOB_TYPES = {
    "deploy": common_pb2.JOB_TYPE_DEPLOY,
    "ci": common_pb2.JOB_TYPE_CI,
    "merge": common_pb2.JOB_TYPE_MERGE,
    "adhoc": common_pb2.JOB_TYPE_ADHOC,
}
COMPLETION_MODES = {"any": jobs_pb2.COMPLETION_MODE_ANY, "all": jobs_pb2.COMPLETION_MODE_ALL}
OVERLAP_POLICIES = {
    name.removeprefix("OVERLAP_POLICY_").lower(): value
    for name, value in jobs_pb2.OverlapPolicy.items()
    if value != jobs_pb2.OVERLAP_POLICY_UNSPECIFIED
}
STATUSES = {
    "success": common_pb2.RUN_STATUS_SUCCESS,
    "error": common_pb2.RUN_STATUS_ERROR,
    "cancelled": common_pb2.RUN_STATUS_CANCELLED,
}
TRIGGERS = {"api": common_pb2.TRIGGER_API, "manual": common_pb2.TRIGGER_MANUAL, "ci": common_pb2.TRIGGER_CI,
            "merge": common_pb2.TRIGGER_MERGE}  # fmt: skip


def _job_options(parser: argparse.ArgumentParser, *, create: bool) -> None:
    """The job's settings as options. For an update every one is optional and only those given change
    (the parser's ``argument_default`` is ``SUPPRESS``: an option not given is not in the namespace)."""

    def default(value: object) -> object:
        return value if create else argparse.SUPPRESS

    flag = argparse.BooleanOptionalAction
    parser.add_argument("--name", required=create)
    parser.add_argument("--type", choices=JOB_TYPES, default=default("deploy"), help="job type (default deploy)")
    parser.add_argument("--step", action="append", required=create, help="a command; repeat for several (replaces)")
    parser.add_argument("--cron", help="five-field cron expression; an update with '' removes the schedule")
    parser.add_argument("--timezone", default=default("UTC"), help="IANA time zone of the cron expression")
    parser.add_argument("--on-pull-request", action=flag, default=default(False), help="ci jobs: run on pull requests")
    parser.add_argument(
        "--on-merge", action=flag, default=default(False), help="merge jobs: run on merged pull requests"
    )
    parser.add_argument("--threads", type=int, default=default(0))
    parser.add_argument("--timeout", type=int, default=default(0), help="seconds; 0: none")
    parser.add_argument("--target-name", default=default(""))
    parser.add_argument(
        "--env", action="append", default=default([]), metavar="KEY=VALUE", help="repeat for several; KEY= unsets"
    )
    parser.add_argument("--git-branch", default=default(""))
    parser.add_argument("--retries", type=int, default=default(0), help="retries after a failure")
    parser.add_argument("--retry-on-step-failure", action=flag, default=default(False))
    parser.add_argument("--priority", type=int, default=default(0))
    parser.add_argument(
        "--overlap-policy",
        choices=OVERLAP_POLICIES,
        default=default("serial"),
        help="what a fire does while a run of the job is in progress",
    )
    parser.add_argument("--jitter", type=int, default=default(0), help="seconds: fires come a fixed offset later")
    parser.add_argument("--environment", type=int, default=default(0), help="run dbt steps in this environment")
    parser.add_argument("--schema", default=default(""), help="default: the environment's schema")
    parser.add_argument(
        "--missed-run-grace", type=int, default=default(-1), help="seconds; 0 skips missed fires (default 300)"
    )
    parser.add_argument(
        "--generate-docs", action=flag, default=default(False), help="dbt jobs: dbt docs generate after the steps"
    )
    parser.add_argument(
        "--source-freshness",
        action=flag,
        default=default(False),
        help="dbt jobs: dbt source freshness before the steps",
    )
    defer = parser.add_mutually_exclusive_group()
    defer.add_argument(
        "--defer-to-job", type=int, default=default(0), help="dbt jobs: defer to this job's latest success; 0: none"
    )
    defer.add_argument(
        "--defer-to-environment", type=int, default=default(0), help="dbt jobs: defer to its deploy jobs; 0: none"
    )
    parser.add_argument(
        "--run-only-modified",
        action=flag,
        default=default(False),
        help="Slim CI: steps without a selection build state:modified+",
    )
    parser.add_argument(
        "--on-completion",
        action="append",
        default=default([]),
        metavar="JOB[:STATUSES]",
        help="run when that job ends with one of the statuses (success, error, cancelled; default success); "
        "repeat (an update's replace the job's)",
    )
    parser.add_argument(
        "--completion-mode",
        choices=COMPLETION_MODES,
        default=default("any"),
        help="all: one run once every upstream ran",
    )
    if create:
        parser.add_argument(
            "--idempotency-key", default="", help="a retry with the same key returns the job the first one made"
        )
    else:
        parser.add_argument(
            "--expected-version",
            type=int,
            help="refuse the update unless the job is at this version (default: "
            "the version read just before, so a change made meanwhile is not overwritten)",
        )


def _step_number(text: str) -> int:
    """A step as runs number them: 1 the first."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"steps count from 1 (the run's first step), not {text!r}")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m client", description="runplane API client")
    parser.add_argument("--json", action="store_true", help="print whole objects as JSON")
    sub = parser.add_subparsers(dest="command", required=True)
    _job_options(sub.add_parser("create-job", help="create a job"), create=True)
    update = sub.add_parser(
        "update-job", help="change a job: only the settings given", argument_default=argparse.SUPPRESS
    )
    update.add_argument("job_id", type=int)
    _job_options(update, create=False)
    for name, text in (
        ("get-job", "show a job"),
        ("delete-job", "delete a job"),
        ("pause-job", "pause a job: nothing automatic queues it; run now still does"),
        ("unpause-job", "unpause a job"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("job_id", type=int)
        if name == "pause-job":
            command.add_argument("--note", default="", help="why: kept with who paused it, shown with the job")
    sub.add_parser("list-jobs", help="list jobs")
    project = sub.add_parser("create-project", help="add a dbt project (a git repository)")
    project.add_argument("--name", required=True)
    project.add_argument("--url", required=True, help="https://, ssh://, git@host:path, file:// or a local path")
    project.add_argument("--subdirectory", default="", help="where dbt_project.yml is")
    secret = project.add_mutually_exclusive_group()
    secret.add_argument("--token-env", help="variable holding an https token for the repository")
    secret.add_argument("--ssh-key-file", type=Path, help="a deploy key (private key file)")
    env = sub.add_parser("create-environment", help="add an environment to a project and its warehouse connection")
    env.add_argument("--project", type=int, required=True)
    env.add_argument("--name", required=True)
    env.add_argument("--type", choices=["deployment", "development"], default="deployment")
    env.add_argument("--dbt-version", required=True, help="one the runners know (RUNPLANE_RUNNER__DBT_VERSIONS)")
    env.add_argument("--branch", default="", help="default: the repository's default branch")
    env.add_argument(
        "--adapter",
        default="postgres",
        help="the warehouse: postgres (default), redshift, snowflake, bigquery, databricks or duckdb",
    )
    env.add_argument(
        "--field", action="append", default=[], metavar="NAME=VALUE", help="the adapter's profile fields: host, port…"
    )
    env.add_argument("--password-env", help="variable holding the warehouse password")
    env.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="NAME=VARIABLE",
        help="a secret field (token, private_key, keyfile_json…) read from this environment variable",
    )
    env.add_argument("--target", default="default")
    env.add_argument("--schema", required=True)
    env.add_argument("--threads", type=int, default=4)
    trigger = sub.add_parser("trigger", help="trigger a run of a job")
    trigger.add_argument("job_id", type=int)
    trigger.add_argument("--follow", action="store_true", help="print the logs until the run ends")
    trigger.add_argument("--idempotency-key", default="")
    trigger.add_argument("--cause", default="")
    trigger.add_argument(
        "--as", dest="trigger", choices=TRIGGERS, default="api", help="api, manual (run now), ci, merge"
    )
    trigger.add_argument("--ci", action="store_const", const="ci", dest="trigger", help="same as --as ci")
    trigger.add_argument("--pull-request", type=int, default=0, help="pull request number (ci runs need one)")
    trigger.add_argument("--step", action="append", default=[], help="override the job's steps; repeat")
    trigger.add_argument("--threads", type=int, default=0)
    trigger.add_argument("--schema", default="")
    trigger.add_argument("--target-name", default="", help="dbt's target name for this run")
    trigger.add_argument("--dbt-version", default="", help="run with this dbt instead of the environment's")
    trigger.add_argument("--git-branch", default="")
    trigger.add_argument("--git-sha", default="")
    trigger.add_argument("--timeout", type=int, default=0)
    docs = trigger.add_mutually_exclusive_group()
    docs.add_argument("--generate-docs", action="store_true", default=None, help="override the job's setting")
    docs.add_argument("--no-generate-docs", action="store_false", dest="generate_docs")
    trigger.add_argument("--run-at", type=_moment, help="a later time, ISO 8601 with its offset: queue it for then")
    trigger.add_argument(
        "--reattach", action="store_true", help="answer the job's run in progress with the same overrides, if any"
    )
    get_run = sub.add_parser("get-run", help="show a run")
    get_run.add_argument("run_id", type=int)
    list_runs = sub.add_parser("list-runs", help="list runs, newest first")
    list_runs.add_argument("--job", type=int, default=0)
    list_runs.add_argument("--status", type=int, action="append", default=[], help="a status code; repeat")
    cancel = sub.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", type=int)
    rerun = sub.add_parser("rerun", help="rerun a failed run from its failed step")
    rerun.add_argument("run_id", type=int)
    rerun.add_argument("--follow", action="store_true", help="print the logs until the run ends")
    close = sub.add_parser("close-pull-request", help="drop a closed pull request's schemas (by runs)")
    close.add_argument("pull_request", type=int)
    close.add_argument("--job", type=int, default=0, help="only this ci job (default: every one)")
    logs = sub.add_parser("logs", help="print a run's logs")
    logs.add_argument("run_id", type=int)
    logs.add_argument("--follow", action="store_true", help="until the run ends")
    sub.add_parser("artifacts", help="list a run's artifacts").add_argument("run_id", type=int)
    artifact = sub.add_parser("artifact", help="download one artifact of a run")
    artifact.add_argument("run_id", type=int)
    artifact.add_argument("path")
    artifact.add_argument("-o", "--output", help="file to write (default: standard output)")
    artifact.add_argument(
        "--step", type=_step_number, help="the step that wrote it, 1 the first (default: the last one)"
    )
    add_webhook_commands(sub)
    return parser


def _job_request(args: argparse.Namespace, request: Any) -> Any:
    """Set on ``request`` (a create, or an update holding the job as it is) the settings in ``args``:
    all of them for a create, those given for an update."""
    given = vars(args)
    if "name" in given:
        request.name = args.name
    if "type" in given:
        request.job_type = JOB_TYPES[args.type]
    if "step" in given:
        del request.steps[:]
        request.steps.extend(args.step)
    triggers = request.triggers
    if given.get("cron"):
        triggers.schedule.CopyFrom(jobs_pb2.CronSchedule(cron=args.cron, timezone=triggers.schedule.timezone))
    elif "cron" in given:  # none for a create, '' for an update: no schedule
        triggers.ClearField("schedule")
    if "timezone" in given and triggers.HasField("schedule"):
        triggers.schedule.timezone = args.timezone
    for option, field in (("on_pull_request", "on_pull_request"), ("on_merge", "on_merge")):
        if option in given:
            setattr(triggers, field, given[option])
    if "on_completion" in given:
        del triggers.on_completion[:]
        triggers.on_completion.extend(_completion_trigger(value) for value in args.on_completion)
    if "completion_mode" in given:
        triggers.completion_mode = COMPLETION_MODES[args.completion_mode]
    settings = request.settings
    for key, _, value in (item.partition("=") for item in given.get("env", [])):
        if value or key.startswith(SECRET_PREFIX):
            settings.environment[key] = value  # a secret sent empty is unset by the server
        else:
            settings.environment.pop(key, None)
    for option, field in (
        ("threads", "threads"), ("timeout", "timeout_seconds"), ("target_name", "target_name"),
        ("git_branch", "git_branch"), ("retries", "retry_max_attempts"),
        ("retry_on_step_failure", "retry_on_step_failure"), ("missed_run_grace", "missed_run_grace_seconds"),
        ("priority", "priority"), ("environment", "environment_id"), ("schema", "schema"),
        ("generate_docs", "generate_docs"), ("source_freshness", "run_source_freshness"),
        ("run_only_modified", "run_only_modified"), ("jitter", "jitter_seconds"),
    ):  # fmt: skip
        if option in given:
            setattr(settings, field, given[option])
    if "overlap_policy" in given:
        settings.overlap_policy = OVERLAP_POLICIES[args.overlap_policy]
    for option, field, other in (
        ("defer_to_job", "defer_to_job_id", "defer_to_environment_id"),
        ("defer_to_environment", "defer_to_environment_id", "defer_to_job_id"),
    ):
        if option in given:
            setattr(settings, field, given[option])
            if given[option]:
                setattr(settings, other, 0)  # one or the other
    return request


def _update_request(job: jobs_pb2.Job, args: argparse.Namespace) -> jobs_pb2.UpdateJobRequest:
    """The job as it is, with the settings given changed; checked against the version read, unless
    another is given."""
    request = jobs_pb2.UpdateJobRequest(
        job_id=job.id, name=job.name, job_type=job.job_type, steps=job.steps, triggers=job.triggers,
        settings=job.settings, expected_version=job.version,
    )  # fmt: skip
    request.settings.ClearField("secret_names")  # output only: secrets not sent are kept
    if getattr(args, "expected_version", None) is not None:
        request.expected_version = args.expected_version
    _job_request(args, request)
    return request


def _completion_trigger(value: str) -> jobs_pb2.CompletionTrigger:
    """``12`` or ``12:success,error``: the upstream job and the statuses that count (the server checks them)."""
    job, _, names = value.partition(":")
    unknown = [n for n in names.split(",") if n and n not in STATUSES]
    if not job.isdigit() or unknown:
        raise SystemExit(f"--on-completion {value!r}: give JOB or JOB:success,error,cancelled")
    statuses = [STATUSES[n] for n in names.split(",") if n] or [common_pb2.RUN_STATUS_SUCCESS]
    return jobs_pb2.CompletionTrigger(upstream_job_id=int(job), statuses=statuses)


def _moment(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time with its offset, e.g. 2030-01-01T06:00:00+00:00")
    return moment


def _line(message: Message) -> str:
    """One line for a job, run or artifact."""
    if isinstance(message, jobs_pb2.Job):
        job_type = common_pb2.JobType.Name(message.job_type).removeprefix("JOB_TYPE_").lower()
        return f"job {message.id}\t{message.name}\t{job_type}"
    if isinstance(message, runs_pb2.Run):
        status = common_pb2.RunStatus.Name(message.status).removeprefix("RUN_STATUS_").lower()
        return f"run {message.id}\tjob {message.job_id}\t{status}\t{message.status_message}".rstrip()
    if isinstance(message, runs_pb2.Artifact):
        return f"{message.path}\tstep {message.step_index + 1}\t{message.size_bytes} bytes"
    return to_json(message)


def _show(args: argparse.Namespace, message: Message, items: list[Message] | None = None) -> None:
    if args.json:
        print(to_json(message))
    else:
        for item in items if items is not None else [message]:
            print(_line(item))


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
    for named in args.secret_env:
        name, _, variable = named.partition("=")
        if not variable or variable not in os.environ:
            raise SystemExit(f"--secret-env {named}: name a secret field and a set variable (NAME=VARIABLE)")
        secrets[name] = os.environ[variable]
    return projects_pb2.CreateEnvironmentRequest(
        project_id=args.project,
        name=args.name,
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT
        if args.type == "deployment"
        else projects_pb2.ENVIRONMENT_TYPE_DEVELOPMENT,
        dbt_version=args.dbt_version,
        git_branch=args.branch,
        connection=projects_pb2.Connection(adapter_type=args.adapter, fields=fields, secret_fields=secrets),
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
            case "create-job":
                request = _job_request(args, jobs_pb2.CreateJobRequest(idempotency_key=args.idempotency_key))
                _show(args, await jobs.CreateJob(request))
            case "update-job":
                current = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=args.job_id))
                _show(args, await jobs.UpdateJob(_update_request(current, args)))
            case "get-job":
                _show(args, await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=args.job_id)))
            case "list-jobs":
                listed = await jobs.ListJobs(jobs_pb2.ListJobsRequest())
                _show(args, listed, list(listed.jobs))
            case "delete-job":
                _show(args, await jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=args.job_id)), [])
            case "pause-job":
                _show(args, await jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id=args.job_id, note=args.note)))
            case "unpause-job":
                _show(args, await jobs.UnpauseJob(jobs_pb2.UnpauseJobRequest(job_id=args.job_id)))
            case "trigger":
                overrides = runs_pb2.RunOverrides(
                    steps=args.step, threads=args.threads, schema=args.schema, git_branch=args.git_branch,
                    git_sha=args.git_sha, timeout_seconds=args.timeout, pull_request_number=args.pull_request,
                    generate_docs=args.generate_docs, target_name=args.target_name, dbt_version=args.dbt_version,
                )  # fmt: skip
                request = runs_pb2.TriggerRunRequest(
                    job_id=args.job_id, idempotency_key=args.idempotency_key, cause=args.cause,
                    trigger=TRIGGERS[args.trigger], overrides=overrides, reattach=args.reattach,
                )  # fmt: skip
                if args.run_at is not None:
                    request.run_at.FromDatetime(args.run_at)
                run = await runs.TriggerRun(request)
                if not args.follow:
                    _show(args, run)
                    return 0
                return await _follow(args, runs, run.id)
            case "get-run":
                _show(args, await runs.GetRun(runs_pb2.GetRunRequest(run_id=args.run_id)))
            case "list-runs":
                listed_runs = await runs.ListRuns(runs_pb2.ListRunsRequest(job_id=args.job, statuses=args.status))
                _show(args, listed_runs, list(listed_runs.runs))
            case "cancel":
                _show(args, await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=args.run_id)))
            case "rerun":
                rerun = await runs.RerunRun(runs_pb2.RerunRunRequest(run_id=args.run_id))
                if not args.follow:
                    _show(args, rerun)
                    return 0
                return await _follow(args, runs, rerun.id)
            case "close-pull-request":
                request = runs_pb2.ClosePullRequestRequest(pull_request_number=args.pull_request, job_id=args.job)
                closed = await runs.ClosePullRequest(request)
                _show(args, closed, list(closed.drop_runs))
            case "logs":
                if args.follow:
                    return await _follow(args, runs, args.run_id)
                async for chunk in runs.StreamRunLogs(runs_pb2.StreamRunLogsRequest(run_id=args.run_id)):
                    print(to_json(chunk) if args.json else chunk.text, end="" if not args.json else "\n")
            case "artifacts":
                listed_artifacts = await runs.ListArtifacts(runs_pb2.ListArtifactsRequest(run_id=args.run_id))
                _show(args, listed_artifacts, list(listed_artifacts.artifacts))
            case "artifact":
                get = runs_pb2.GetArtifactRequest(run_id=args.run_id, path=args.path)
                if args.step is not None:
                    get.step_index = args.step - 1
                content = await runs.GetArtifact(get)
                if args.output:
                    await asyncio.to_thread(Path(args.output).write_bytes, content.content)
                else:
                    sys.stdout.buffer.write(content.content)
    return 0


async def _follow(args: argparse.Namespace, runs: runs_pb2_grpc.RunServiceAsyncStub, run_id: int) -> int:
    """Print log chunks until the run ends (resuming if the server drops the stream), then the run.

    Chunks are printed as they are: a chunk ends where the runner flushed, not where a line ends.
    """
    after_seq = 0
    line_open = False  # the last chunk printed did not end its line
    while True:
        async for chunk in runs.StreamRunLogs(
            runs_pb2.StreamRunLogsRequest(run_id=run_id, follow=True, after_seq=after_seq)
        ):
            print(chunk.text, end="", file=sys.stderr, flush=True)
            if chunk.text:
                line_open = not chunk.text.endswith("\n")
            after_seq = chunk.seq
        run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        if run.status in TERMINAL_STATUSES:
            if line_open:
                print(file=sys.stderr, flush=True)
            _show(args, run)
            return 0 if run.status == common_pb2.RUN_STATUS_SUCCESS else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    token = os.environ.get("RUNPLANE_TOKEN", "")
    if not token:
        print("set RUNPLANE_TOKEN to an API token (runplane admin create-token --account ID)", file=sys.stderr)
        return 2
    if args.command.startswith("webhook"):
        return run_webhook_command(args, token)
    target = grpc_target()
    try:
        return asyncio.run(_run(args, target, token))
    except grpc.aio.AioRpcError as exc:
        print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
