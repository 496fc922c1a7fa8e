"""A run's DbtContext: precedence of run, job and environment, a CI run's schema, the message."""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.dbt_env import dbt_cloud_variables
from runplane.basics.types import AccountId, JobId, JobType, RunId, Trigger
from runplane.dbt.context import ContextRow, context_from_row, from_proto, to_proto

ROW = ContextRow(
    run_id=RunId(7), job_id=JobId(3), account_id=AccountId(1), job_type="deploy", trigger="schedule", cause="",
    overrides={}, run_schema="", pull_request_number=None,
    job_schema="", job_target_name="", job_threads=0, job_git_branch="",
    environment_id=5, environment_type="deployment", dbt_version="1.10", environment_git_branch="main",
    adapter_type="postgres", connection={"host": "db"}, connection_secrets={"password": "enc:pw"},
    environment_target_name="prod", environment_schema="analytics", environment_threads=4,
    variables={"DBT_X": "1"}, secret_variables={"DBT_ENV_SECRET_KEY": "enc:k3y"},
    project_id=2, repository_url="file:///repo", subdirectory="", git_credential_kind="token",
    git_credential="enc:s3cr3t-t0k",
)  # fmt: skip


def row(**changes: Any) -> ContextRow:
    return dataclasses.replace(ROW, **changes)


def decrypt(token: str) -> str:
    return token.removeprefix("enc:")


def test_the_environment_gives_the_defaults_and_secrets_are_decrypted() -> None:
    context = context_from_row(row(), decrypt)
    assert (context.target_name, context.schema, context.threads, context.git_branch) == (
        "prod",
        "analytics",
        4,
        "main",
    )
    assert context.secrets() == ["s3cr3t-t0k", "pw", "k3y"]
    assert not any(secret in repr(context) for secret in context.secrets())
    assert (context.cause, context.run_reason_category(), context.invocation_context()) == (
        "Scheduled",
        "scheduled",
        "prod",
    )


def test_a_job_setting_beats_the_environment_and_a_run_override_beats_both() -> None:
    job = row(job_schema="job_schema", job_target_name="job_target", job_threads=2, job_git_branch="dev")
    context = context_from_row(job, decrypt)
    assert (context.target_name, context.schema, context.threads, context.git_branch) == (
        "job_target",
        "job_schema",
        2,
        "dev",
    )
    overrides = {
        "targetName": "run_target",
        "schema": "run_schema",
        "threads": 8,
        "git_branch": "hotfix",
        "git_sha": "abc1234",
        "dbtVersion": "1.9",
    }
    context = context_from_row(dataclasses.replace(job, overrides=overrides), decrypt)
    assert (context.target_name, context.schema, context.threads) == ("run_target", "run_schema", 8)
    assert (context.git_branch, context.git_sha) == ("hotfix", "abc1234")
    assert context.dbt_version == "1.9"
    assert context_from_row(job, decrypt).dbt_version == "1.10"


def test_a_ci_run_builds_in_its_pull_requests_schema_whatever_it_asks() -> None:
    ci = row(
        job_type="ci", trigger="ci", run_schema="dbt_cloud_pr_3_9", pull_request_number=9,
        overrides={"schema": "analytics"}, job_schema="analytics",
    )  # fmt: skip
    context = context_from_row(ci, decrypt)
    assert context.schema == "dbt_cloud_pr_3_9"
    assert (context.invocation_context(), context.run_reason_category()) == ("ci", "github_pull_request")
    variables = dbt_cloud_variables(context, sha="f" * 40, branch="feature")
    assert variables["DBT_CLOUD_PR_ID"] == "9" and all(variables.values())


def test_variables_without_a_value_are_left_out() -> None:
    context = context_from_row(row(trigger="api", cause="  "), decrypt)
    variables = dbt_cloud_variables(context, sha="f" * 40, branch="")
    assert "DBT_CLOUD_PR_ID" not in variables and "DBT_CLOUD_GIT_BRANCH" not in variables
    assert variables["DBT_CLOUD_RUN_REASON"] == "Triggered via API" and all(variables.values())


def test_the_message_carries_everything() -> None:
    for changes in ({}, {"job_type": "ci", "trigger": "ci", "pull_request_number": 4, "run_schema": "s"}):
        context = context_from_row(row(**changes), decrypt)
        assert from_proto(to_proto(context)) == context
    assert from_proto(to_proto(context_from_row(row(), decrypt))).job_type is JobType.DEPLOY
    assert from_proto(to_proto(context_from_row(row(), decrypt))).trigger is Trigger.SCHEDULE
