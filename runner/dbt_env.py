"""What a run with a dbt environment adds to a step's environment, and finding the dbt to use.

``dbt_step_environment``: on top of what every step gets (``runner.service.step_environment``: the
host's allow-list, the run's identity, the job's variables): the environment's variables (secret ones decrypted), dbt
Cloud's run variables (none of them empty), the profile's secret variables, and a PATH that starts
with the environment's dbt.
``dbt …`` steps and plain commands of such a run get the same environment and run in the project's
directory.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from runplane.basics.errors import RunplaneError
from runplane.dbt.context import DbtContext


class DbtNotInstalled(RunplaneError):
    """The environment's dbt version is not installed where the run executes."""


def dbt_bin_directory(version: str, installed: Mapping[str, str]) -> Path:
    """The directory holding the ``dbt`` executable of ``version`` (the runner's ``dbt_versions``)."""
    directory = installed.get(version)
    if directory is None:
        known = ", ".join(sorted(installed)) or "none"
        raise DbtNotInstalled(f"dbt version {version!r} is not installed on this runner (installed: {known})")
    path = Path(directory)
    if not (path / "dbt").is_file():
        raise DbtNotInstalled(f"dbt version {version!r}: no dbt executable in {path}")
    return path


def is_dbt_step(command: str) -> bool:
    """Whether a step runs dbt: its first word is ``dbt``."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return bool(words) and words[0] == "dbt"


def dbt_cloud_identity(
    *, run_id: int, job_id: int, account_id: int, cause: str, pull_request_number: int | None
) -> dict[str, str]:
    """The dbt Cloud run variables every run's steps get, with or without a dbt environment: the run,
    job and account, the run's reason, and its pull request when it has one."""
    identity = {
        "DBT_CLOUD_RUN_ID": str(run_id),
        "DBT_CLOUD_JOB_ID": str(job_id),
        "DBT_CLOUD_ACCOUNT_ID": str(account_id),
        "DBT_CLOUD_RUN_REASON": cause,
    }
    if pull_request_number:
        identity["DBT_CLOUD_PR_ID"] = str(pull_request_number)
    return identity


def dbt_cloud_variables(context: DbtContext, *, sha: str, branch: str) -> dict[str, str]:
    """dbt Cloud's run variables, as dbt Cloud names them, for a run with a dbt environment: its
    identity (``dbt_cloud_identity``) and the rest; a variable without a value is left out."""
    values = {
        **dbt_cloud_identity(
            run_id=context.run_id,
            job_id=context.job_id,
            account_id=context.account_id,
            cause=context.cause,
            pull_request_number=context.pull_request_number,
        ),
        "DBT_CLOUD_PROJECT_ID": str(context.project_id),
        "DBT_CLOUD_ENVIRONMENT_ID": str(context.environment_id),
        "DBT_CLOUD_ENVIRONMENT_TYPE": context.environment_type,
        "DBT_CLOUD_RUN_REASON_CATEGORY": context.run_reason_category(),
        "DBT_CLOUD_GIT_SHA": sha,
        "DBT_CLOUD_GIT_BRANCH": branch,
        "DBT_CLOUD_INVOCATION_CONTEXT": context.invocation_context(),
    }
    return {name: value for name, value in values.items() if value}


def dbt_step_environment(
    base: Mapping[str, str],
    context: DbtContext,
    *,
    dbt_bin: Path,
    profiles_dir: Path,
    profile_environment: Mapping[str, str],
    sha: str,
    branch: str,
) -> dict[str, str]:
    """``base`` (what every step gets) with the dbt environment's additions on top."""
    env = dict(base)
    env.update(context.variables)
    env.update(context.secret_variables)
    env.update(profile_environment)
    env.update(dbt_cloud_variables(context, sha=sha, branch=branch))
    env["PATH"] = os.pathsep.join([str(dbt_bin), env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    env["DBT_PROFILES_DIR"] = str(profiles_dir)
    # dbt's own knobs that the run decides: no anonymous usage pings from customers' runs, colour off
    # (logs are stored, not shown on a terminal).
    env.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
    env.setdefault("DBT_USE_COLORS", "false")
    return env
