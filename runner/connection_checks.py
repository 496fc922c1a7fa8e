"""An environment's "test connection": whether the warehouse accepts the environment's credentials.

It is asked where a run would ask it, never from the control plane: the runner writes the
environment's profile as for a run (``runner.profile``) beside a project of one file that names it,
and runs ``dbt debug --connection`` as a step (``runner.steps``: the run's confinement, deadline and
memory limit), so the warehouse sees the runner, with the run's privileges. The answer is ok, or
the adapter's own words: the ``Database Error`` (or other dbt error header) and the line under it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from runner.dbt_env import dbt_step_environment
from runner.dbt_errors import ErrorLines
from runner.profile import ProjectError, write_profile
from runner.steps import Limits, StepControl, StepEnd, run_step
from runplane.basics.secrets import mask
from runplane.dbt.context import DbtContext

PROFILE_NAME = "connection_test"
MAX_OUTPUT = 256 * 1024  # enough of dbt debug's output for its error; the rest is dropped
# dbt debug quotes the adapter's error under "The database returned the following error:", each of
# its lines indented and the header marked with ">".
_QUOTED = re.compile(r"^(\s*)>\s*", re.MULTILINE)


@dataclass(frozen=True)
class ConnectionResult:
    ok: bool
    message: str  # "" when ok; else the adapter's error line, or why the test could not ask


async def check_warehouse(
    context: DbtContext,
    *,
    dbt_bin: Path,
    directory: Path,
    base_env: Mapping[str, str],
    control: StepControl,
    limits: Limits,
) -> ConnectionResult:
    """``dbt debug --connection`` with the environment's profile; ``directory`` (new, private, outside
    any repository) holds the profile and the one-file project while it runs."""
    project = directory / "project"
    project.mkdir(parents=True, mode=0o700)
    document = {"name": PROFILE_NAME, "version": "1.0", "config-version": 2, "profile": PROFILE_NAME}
    (project / "dbt_project.yml").write_text(yaml.safe_dump(document), encoding="utf-8")
    try:
        profile = write_profile(context, project, directory / "profile")
    except ProjectError as exc:
        return ConnectionResult(False, str(exc))
    env = dbt_step_environment(
        base_env,
        context,
        dbt_bin=dbt_bin,
        profiles_dir=profile.directory,
        profile_environment=profile.environment,
        sha="",
        branch="",
    )
    command = shlex.join(["dbt", "debug", "--connection", "--project-dir", str(project)])
    output = bytearray()

    def keep(chunk: bytes) -> None:
        output.extend(chunk[: MAX_OUTPUT - len(output)])

    result = await run_step(command, cwd=str(project), env=env, on_output=keep, control=control, limits=limits)
    text = mask(output.decode(errors="replace"), context.secrets())
    if result.end is StepEnd.EXITED and result.exit_code == 0:
        return ConnectionResult(True, "")
    if result.end is not StepEnd.EXITED:
        ended = f" ({result.end_reason})" if result.end_reason else ""
        return ConnectionResult(False, f"the connection test did not finish: {result.end.value}{ended}")
    return ConnectionResult(
        False, adapter_error(text) or f"dbt debug --connection failed: exit code {result.exit_code}"
    )


def adapter_error(output: str) -> str | None:
    """The adapter's error in ``dbt debug`` output: ``Database Error: connection to server … failed: …``."""
    lines = ErrorLines()
    lines.feed(_QUOTED.sub(r"\1", output))
    lines.end()
    return lines.found
