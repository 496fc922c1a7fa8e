"""A dbt run's fields have one rule each: what an environment accepts, a job's settings and a run's
overrides accept too, and the other way round."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import assume, example, given
from hypothesis import strategies as st

from api.projects_validation import EnvironmentSpec, environment_spec
from api.validation import RunOverridesSpec, checked_overrides, job_spec
from runplane.basics.errors import InvalidArgument
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles
from runplane.v1 import common_pb2, jobs_pb2, projects_pb2

values = st.text(alphabet=string.ascii_letters + string.digits + "_.:@/+-", min_size=1, max_size=140)


def environment(**fields: str) -> EnvironmentSpec | None:
    """The environment a create with these fields makes, or None when it is refused."""
    request = projects_pb2.CreateEnvironmentRequest(
        project_id=1,
        name="prod",
        environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
        dbt_version="1.10",
        connection=projects_pb2.Connection(
            adapter_type="postgres", fields={"host": "db", "user": "dbt", "dbname": "dw"}
        ),
        schema="analytics",
    )
    for name, value in fields.items():
        setattr(request, name, value)
    try:
        return environment_spec(request, versions=InstalledDbtVersions(), warehouses=WarehouseFiles("/srv/warehouses"))
    except InvalidArgument:
        return None


def override(field: str, value: str) -> RunOverridesSpec:
    """The overrides of a run that sets ``field`` to ``value`` (checked as every door checks them)."""
    fields: dict[str, Any] = {field: value}
    return checked_overrides(replace(RunOverridesSpec(), **fields), str)


@given(values)
@example("ghcr.io/dbt-labs/dbt-postgres:1.9.0")
@example("1.10.0-rc1+build.7")
def test_a_dbt_version_an_environment_accepts_is_accepted_as_a_run_override(version: str) -> None:
    env = environment(dbt_version=version)
    assume(env is not None)
    assert env is not None
    assert override("dbt_version", env.dbt_version).dbt_version == env.dbt_version


def accepts(check: Callable[[], object]) -> bool:
    try:
        check()
    except InvalidArgument:
        return False
    return True


@given(values)
@example("-prod")
def test_a_target_name_and_a_schema_mean_the_same_for_an_environment_a_job_and_a_run(value: str) -> None:
    for field in ("target_name", "schema"):
        job = jobs_pb2.CreateJobRequest(name="nightly", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["dbt build"])
        setattr(job.settings, field, value)
        by_environment = environment(**{field: value}) is not None
        by_job = accepts(functools.partial(job_spec, job))
        by_run = accepts(functools.partial(override, field, value))
        assert (by_job, by_run) == (by_environment, by_environment), (field, value)


def test_a_commit_is_one_rule_in_either_case() -> None:
    assert override("git_sha", "ABCDEF1").git_sha == "abcdef1"
