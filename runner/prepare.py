"""Preparing a dbt run before its first step: checkout, profile, dbt packages; timed part by part.

:func:`prepared_run` is an async context manager: on entry the project is checked out at the run's
commit (recorded through ``on_checkout``) from the host's repository cache, the profile written and
the packages installed, from the host's package cache when it holds the project's lock
(``runner.package_cache``: ``dbt deps`` is skipped) or by ``dbt deps``, whose result the host then
keeps. On exit the profile is removed (the clone goes with the run's directory). ``on_part`` is
awaited as each part starts (``checkout``, ``profile``, ``deps``): the runner runs them as the run's
setup steps, what ``say`` and ``on_output`` write going to the part's log.

Every way a part can fail ends in :class:`PrepareError` with a message safe to show (credentials
masked) that names the part: git's own words, a file the run could not write (permissions, a full
disk, a temporary directory closed to run users), a dbt version the host lacks, ``dbt deps``'s
failure, and a cancel or the run's timeout arriving during any part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from runner.artifacts import ArtifactCollector, dbt_output_directories
from runner.cache_keeper import CacheError, PrepCache
from runner.checkout import CheckoutError, Repository, check_out, git_config_value, local_trust
from runner.dbt_env import DbtNotInstalled, dbt_bin_directory, dbt_step_environment
from runner.macros import add_drop_schema_macro
from runner.package_cache import (
    LOCK_FILE,
    git_package_urls,
    has_packages,
    install_path,
    package_key,
    unpinned_package,
)
from runner.profile import ProjectError, project_directory, write_profile
from runner.steps import Limits, StepControl, StepEnd, run_step
from runplane.basics.errors import RunplaneError
from runplane.basics.secrets import mask
from runplane.dbt.context import DbtContext

T = TypeVar("T")


class PrepareError(RunplaneError):
    """The run cannot start its steps; the message is for the run's status and log.

    ``end`` says how: EXITED for a failure, CANCELLED / TIMED_OUT when a cancel or the run's
    timeout stopped the part named by ``part``, ABANDONED when the runner lost its lease."""

    def __init__(self, message: str, *, part: str, end: StepEnd = StepEnd.EXITED) -> None:
        super().__init__(message)
        self.part = part
        self.end = end


@dataclass
class PreparedRun:
    project: Path  # the steps' working directory (where dbt_project.yml is)
    env: dict[str, str]
    collector: ArtifactCollector
    sha: str
    branch: str
    cloned: bool
    timings: dict[str, float] = field(default_factory=dict)  # checkout, profile, deps seconds


@contextlib.contextmanager
def _part(name: str, secrets: list[str]) -> Iterator[None]:
    """Turn what a part raises into a PrepareError that names the part."""
    try:
        yield
    except PrepareError:
        raise
    except (CheckoutError, ProjectError) as exc:  # their messages say what failed
        raise PrepareError(mask(str(exc), secrets), part=name) from exc
    except CacheError as exc:
        raise PrepareError(f"{name}: {mask(str(exc), secrets)}", part=name) from exc
    except OSError as exc:
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        raise PrepareError(f"{name}: {mask(what, secrets)}", part=name) from exc


async def _bounded(name: str, work: Awaitable[T], control: StepControl, limits: Limits) -> T:
    """``work``, stopped when the run is cancelled, times out or loses its lease meanwhile."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=limits.sample_interval)
            if done:
                return task.result()
            if control.abandoned:
                raise PrepareError(f"lease lost during {name}", part=name, end=StepEnd.ABANDONED)
            if control.cancel_requested:
                raise PrepareError(f"cancelled by request during {name}", part=name, end=StepEnd.CANCELLED)
            if limits.deadline is not None and time.monotonic() >= limits.deadline:
                raise PrepareError(f"timed out during {name}", part=name, end=StepEnd.TIMED_OUT)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


@contextlib.asynccontextmanager
async def prepared_run(
    context: DbtContext,
    *,
    base_env: Mapping[str, str],
    cache: PrepCache,
    work_dir: Path,
    dbt_versions: Mapping[str, str],
    on_checkout: Callable[[str], Awaitable[None]],
    on_part: Callable[[str], Awaitable[None]],
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    control: StepControl,
    limits: Limits,
) -> AsyncIterator[PreparedRun]:
    secrets = context.secrets()
    repository = Repository(context.repository_url, context.git_credential_kind, context.git_credential)
    await on_part("checkout")
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        with _part("checkout", secrets):
            checkout = await _bounded(
                "checkout",
                cache.checkout(
                    repository,
                    account_id=context.account_id,
                    branch=context.git_branch,
                    sha=context.git_sha,
                    dest=work_dir / "repository",
                ),
                control,
                limits,
            )
            await _bounded("checkout", check_out(checkout), control, limits)
        timings = {"checkout": round(time.monotonic() - started, 4)}
        await on_checkout(checkout.sha)
        how = "cloned" if checkout.cloned else "from this host's cache"
        say(f"checked out {checkout.sha} ({checkout.branch or 'detached'}, {how}) in {timings['checkout']:.2f} s")

        await on_part("profile")
        started = time.monotonic()
        try:
            dbt_bin = dbt_bin_directory(context.dbt_version, dbt_versions)
        except DbtNotInstalled as exc:
            raise PrepareError(str(exc), part="dbt version") from exc
        with _part("profile", secrets):
            profile_dir = Path(tempfile.mkdtemp(prefix=f"runplane-profile-{context.run_id}-"))
            stack.callback(shutil.rmtree, profile_dir, True)
            project = project_directory(checkout.path, context.subdirectory)
            profile = write_profile(context, project, profile_dir)
            if context.drop_schema:
                add_drop_schema_macro(project)
        env = dbt_step_environment(
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

        await on_part("deps")
        started = time.monotonic()
        if has_packages(project):
            await _packages(context, project, env, cache=cache, say=say, on_output=on_output, control=control,
                            limits=limits)  # fmt: skip
        else:
            say("no dbt packages to install: dbt deps skipped")
        timings["deps"] = round(time.monotonic() - started, 4)
        say(
            f"prepared in {sum(timings.values()):.3f} s (checkout {timings['checkout']:.3f} s, "
            f"profile {timings['profile']:.3f} s, deps {timings['deps']:.3f} s)"
        )

        target, logs = dbt_output_directories("dbt", project, env)
        yield PreparedRun(
            project, env, ArtifactCollector(target, logs), checkout.sha, checkout.branch, checkout.cloned, timings
        )


@contextlib.contextmanager
def _trusting_local_packages(project: Path, env: Mapping[str, str]) -> Iterator[Mapping[str, str]]:
    """``env`` for ``dbt deps``, with git trusting the local repositories the project's ``git:`` packages
    name. A run's uid owns none of them, and git refuses to clone a repository another user owns
    ("dubious ownership") unless a configuration it trusts (the global one) names it; the run's own
    configuration, for this one command, includes any the run's variables set."""
    trust = "".join(local_trust(url) for url in git_package_urls(project))
    if not trust:
        yield env
        return
    own = env.get("GIT_CONFIG_GLOBAL")
    if own and "\n" not in own:
        trust += f"[include]\n\tpath = {git_config_value(own)}\n"
    fd, config_path = tempfile.mkstemp(prefix="runplane-packages-gitconfig-")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(trust)
        yield {**env, "GIT_CONFIG_GLOBAL": config_path}
    finally:
        os.unlink(config_path)


async def _packages(
    context: DbtContext,
    project: Path,
    env: Mapping[str, str],
    *,
    cache: PrepCache,
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    control: StepControl,
    limits: Limits,
) -> None:
    """The project's dbt packages: linked from the host's cache when it holds this lock, else
    installed by ``dbt deps`` and then kept by the host for the next run."""
    secrets = context.secrets()
    install_dir = install_path(project)
    unpinned = unpinned_package(project)
    key = None
    if install_dir is not None and unpinned is not None:
        say(f"dbt packages not cached by this host: no {LOCK_FILE} and {mask(unpinned, secrets)} "
            f"(commit the {LOCK_FILE} dbt deps writes, or pin a commit, for the cache to serve them)")  # fmt: skip
    elif install_dir is not None:
        key = package_key(project, account_id=context.account_id, dbt_version=context.dbt_version,
                          install_dir=install_dir)  # fmt: skip
        with _part("dbt packages", secrets):
            if await _bounded("dbt packages", cache.restore_packages(key, project, install_dir), control, limits):
                say(f"dbt packages from this host's cache ({install_dir}, entry {key[:12]}): dbt deps skipped")
                return
    say("dbt deps")
    with _trusting_local_packages(project, env) as deps_env:
        result = await run_step(
            "dbt deps", cwd=str(project), env=deps_env, on_output=on_output, control=control, limits=limits
        )
    match result.end:
        case StepEnd.EXITED if result.exit_code == 0:
            pass
        case StepEnd.EXITED:
            raise PrepareError(f"dbt deps failed ({result.end_reason or f'exit code {result.exit_code}'})",
                               part="dbt deps")  # fmt: skip
        case StepEnd.MEMORY_LIMIT:
            raise PrepareError("dbt deps went over the run's memory limit", part="dbt deps", end=StepEnd.MEMORY_LIMIT)
        case StepEnd.DISK_QUOTA:
            raise PrepareError("dbt deps filled the run's scratch space", part="dbt deps", end=StepEnd.DISK_QUOTA)
        case StepEnd.CANCELLED:
            raise PrepareError("cancelled by request during dbt deps", part="dbt deps", end=StepEnd.CANCELLED)
        case StepEnd.TIMED_OUT:
            raise PrepareError(f"timed out during dbt deps ({result.end_reason})", part="dbt deps",
                               end=StepEnd.TIMED_OUT)  # fmt: skip
        case StepEnd.ABANDONED:
            raise PrepareError("lease lost during dbt deps", part="dbt deps", end=StepEnd.ABANDONED)
    if unpinned is not None:
        return
    if key is None or install_dir is None:
        say("dbt packages not kept by this host: packages-install-path is not one plain directory of the project")
        return
    try:  # the packages are installed: a cache that cannot keep them costs the next run, not this one
        reason = await _bounded("dbt packages", cache.store_packages(key, project, install_dir), control, limits)
    except (CacheError, OSError) as exc:
        reason = mask(str(exc), secrets)
    say(f"dbt packages kept by this host for the next runs (entry {key[:12]})" if not reason else
        f"dbt packages not kept by this host: {reason}")  # fmt: skip
