"""What a step's environment holds of dbt Cloud's run variables: every run its identity, a run with
a dbt environment the rest too, named in one place (``runner.dbt_env``)."""

from __future__ import annotations

from runner.dbt_env import dbt_cloud_identity
from runner.service import step_environment
from runplane.v1 import runner_pb2


def test_every_step_gets_the_runs_dbt_cloud_identity() -> None:
    spec = runner_pb2.RunSpec(run_id=11, job_id=22, account_id=33, cause="nightly", environment={"X": "1"})
    env = step_environment(spec)
    assert {k: v for k, v in env.items() if k.startswith("DBT_CLOUD_")} == {
        "DBT_CLOUD_RUN_ID": "11",
        "DBT_CLOUD_JOB_ID": "22",
        "DBT_CLOUD_ACCOUNT_ID": "33",
        "DBT_CLOUD_RUN_REASON": "nightly",
    }
    assert env["X"] == "1" and env["RUNPLANE_RUN_ID"] == "11"


def test_a_pull_request_run_also_gets_its_pull_request() -> None:
    identity = dbt_cloud_identity(run_id=1, job_id=2, account_id=3, cause="PR", pull_request_number=9)
    assert identity["DBT_CLOUD_PR_ID"] == "9"
    assert step_environment(runner_pb2.RunSpec(run_id=1, pull_request_number=9))["DBT_CLOUD_PR_ID"] == "9"
