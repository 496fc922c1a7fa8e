"""Preparing a dbt run before its first step: checkout, profile, ``dbt deps``; timed part by part.

:func:`prepared_run` is an async context manager: on entry the project is checked out at the run's
commit (recorded through ``on_checkout``), the profile written and packages installed; on exit the
worktree and the profile are removed. A failing part raises :class:`PrepareError` whose message is
safe to show (credentials masked).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.artifacts import ArtifactCollector, dbt_output_directories
from runner.checkout import CheckoutError, Repository, RepositoryCache
from runner.dbt_env import DbtNotInstalled, dbt_bin_directory, step_environment
from runner.macros import add_drop_schema_macro
from runner.profile import ProjectError, project_directory, write_profile
from runner.steps import Limits, StepControl, StepEnd, run_step
from runplane.basics.errors import RunplaneError
from runplane.basics.secrets import mask
from runplane.dbt.context import DbtContext

PACKAGE_FILES = ("packages.yml", "dependencies.yml")


class PrepareError(RunplaneError):
    """The run cannot start its steps; the message is for the run's status and log."""


@dataclass
class PreparedRun:
    project: Path  # the steps' working directory (where dbt_project.yml is)
    env: dict[str, str]
    collector: ArtifactCollector
    sha: str
    branch: str
    cloned: bool
    timings: dict[str, float] = field(default_factory=dict)  # checkout, profile, deps seconds


@contextlib.asynccontextmanager
async def prepared_run(
    context: DbtContext,
    *,
    base_env: Mapping[str, str],
    cache: RepositoryCache,
    work_dir: Path,
    dbt_versions: Mapping[str, str],
    on_checkout: Callable[[str], Awaitable[None]],
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    control: StepControl,
    limits: Limits,
) -> AsyncIterator[PreparedRun]:
    secrets = context.secrets()
    try:
        dbt_bin = dbt_bin_directory(context.dbt_version, dbt_versions)
    except DbtNotInstalled as exc:
        raise PrepareError(str(exc)) from exc
    repository = Repository(context.repository_url, context.git_credential_kind, context.git_credential)
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        try:
            checkout = await stack.enter_async_context(
                cache.checkout(repository, branch=context.git_branch, sha=context.git_sha, dest=work_dir / "repository")
            )
        except CheckoutError as exc:
            raise PrepareError(mask(str(exc), secrets)) from exc
        timings = {"checkout": round(time.monotonic() - started, 4)}
        await on_checkout(checkout.sha)
        how = "cloned" if checkout.cloned else "from this host's cache"
        say(f"checked out {checkout.sha} ({checkout.branch or 'detached'}, {how}) in {timings['checkout']:.2f} s")

        started = time.monotonic()
        profile_dir = Path(tempfile.mkdtemp(prefix=f"runplane-profile-{context.run_id}-"))
        stack.callback(shutil.rmtree, profile_dir, True)
        try:
            project = project_directory(checkout.path, context.subdirectory)
            profile = write_profile(context, project, profile_dir)
            if context.drop_schema:
                add_drop_schema_macro(project)
        except ProjectError as exc:
            raise PrepareError(mask(str(exc), secrets)) from exc
        env = step_environment(
            base_env,
            context,
            dbt_bin=dbt_bin,
            profiles_dir=profile.directory,
            profile_environment=profile.environment,
            sha=checkout.sha,
            branch=checkout.branch,
        )
        timings["profile"] = round(time.monotonic() - started, 4)
        say(
            f"profile {profile.name!r}: target {context.target_name!r}, schema {context.schema!r}, "
            f"threads {context.threads}, dbt {context.dbt_version} ({dbt_bin})"
        )

        started = time.monotonic()
        if any((project / name).is_file() for name in PACKAGE_FILES):
            say("dbt deps")
            result = await run_step(
                "dbt deps", cwd=str(project), env=env, on_output=on_output, control=control, limits=limits
            )
            if result.end is not StepEnd.EXITED or result.exit_code != 0:
                raise PrepareError(f"dbt deps failed ({result.end_reason or f'exit code {result.exit_code}'})")
        timings["deps"] = round(time.monotonic() - started, 4)
        say(
            f"prepared in {sum(timings.values()):.3f} s (checkout {timings['checkout']:.3f} s, "
            f"profile {timings['profile']:.3f} s, deps {timings['deps']:.3f} s)"
        )

        target, logs = dbt_output_directories("dbt", project, env)
        yield PreparedRun(
            project, env, ArtifactCollector(target, logs), checkout.sha, checkout.branch, checkout.cloned, timings
        )
