"""Checking out a run's project: a cache of repositories per runner host, a worktree per run.

The first run of a repository on a host clones it once (``git clone --mirror``) into the cache;
later runs fetch into that clone (or skip the fetch when the pinned commit is already there) and
add a detached worktree for the run, so a run never pays for a full clone again. The cache is
shared by the runs of one host under a file lock.

The commit is the run's SHA if given, else the head of its branch, else the head of the
repository's default branch. Whatever git says on failure comes back in :class:`CheckoutError`
with the credentials masked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from runplane.basics.errors import RunplaneError
from runplane.basics.secrets import mask

GIT_TIMEOUT_SECONDS = 300.0


class CheckoutError(RunplaneError):
    """The project could not be checked out; the message is git's, with secrets masked."""


@dataclass(frozen=True)
class Repository:
    url: str
    credential_kind: str = "none"  # none | token | ssh_key
    credential: str = ""

    def secrets(self) -> list[str]:
        if not self.credential:
            return []
        if self.credential_kind == "token":
            basic = base64.b64encode(f"x-access-token:{self.credential}".encode()).decode()
            return [self.credential, basic]
        return [self.credential]


@dataclass(frozen=True)
class Checkout:
    path: Path  # the run's worktree (the repository's root)
    sha: str
    branch: str  # the branch checked out, or the one the SHA was asked on; the default branch's name otherwise
    cloned: bool  # False: the cache had the repository (fetched, or had the commit already)


class RepositoryCache:
    """Bare mirrors of the repositories this host has run, under ``root``."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def mirror_path(self, url: str) -> Path:
        return self._root / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")

    @contextlib.asynccontextmanager
    async def checkout(self, repo: Repository, *, branch: str, sha: str, dest: Path) -> AsyncIterator[Checkout]:
        """A worktree of ``repo`` at the run's commit in ``dest``, removed on exit."""
        mirror = self.mirror_path(repo.url)
        self._root.mkdir(parents=True, exist_ok=True)
        with _git_auth(repo) as env:
            async with _locked(mirror.with_suffix(".lock")):
                cloned = not mirror.exists()
                if cloned:
                    await _clone(repo, mirror, env)
                elif not (sha and await _has_commit(mirror, sha, env)):
                    await _git(repo, ["--git-dir", str(mirror), "fetch", "--prune", "--quiet", "origin"], env)
                resolved, branch_name = await _resolve(repo, mirror, branch=branch, sha=sha, env=env)
                await _git(
                    repo, ["--git-dir", str(mirror), "worktree", "add", "--detach", "--quiet", str(dest), resolved], env
                )
        try:
            yield Checkout(dest, resolved, branch_name, cloned)
        finally:
            async with _locked(mirror.with_suffix(".lock")):
                with contextlib.suppress(CheckoutError):
                    await _git(repo, ["--git-dir", str(mirror), "worktree", "remove", "--force", str(dest)], {})
                with contextlib.suppress(CheckoutError):
                    await _git(repo, ["--git-dir", str(mirror), "worktree", "prune"], {})


async def _clone(repo: Repository, mirror: Path, env: Mapping[str, str]) -> None:
    """Clone into a temporary name and rename, so a failed clone leaves no half repository."""
    partial = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
    try:
        await _git(repo, ["clone", "--mirror", "--quiet", "--", repo.url, str(partial)], env, action="clone")
        os.rename(partial, mirror)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already after the rename


async def _has_commit(mirror: Path, sha: str, env: Mapping[str, str]) -> bool:
    code, _ = await _run_git(["--git-dir", str(mirror), "cat-file", "-e", f"{sha}^{{commit}}"], env)
    return code == 0


async def _resolve(repo: Repository, mirror: Path, *, branch: str, sha: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(commit, branch name) for the run."""
    git_dir = ["--git-dir", str(mirror)]
    if not branch:
        code, out = await _run_git([*git_dir, "symbolic-ref", "--short", "HEAD"], env)
        branch = out.strip() if code == 0 else ""
    if sha:
        code, out = await _run_git([*git_dir, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"], env)
        if code != 0:
            raise CheckoutError(f"commit {sha} not found in {_shown(repo)}")
        return out.strip(), branch
    if not branch:
        raise CheckoutError(f"{_shown(repo)} has no default branch: set the environment's branch")
    code, out = await _run_git([*git_dir, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], env)
    if code != 0:
        raise CheckoutError(f"branch {branch!r} not found in {_shown(repo)}")
    return out.strip(), branch


def _shown(repo: Repository) -> str:
    return mask(repo.url, repo.secrets())


async def _git(repo: Repository, args: Sequence[str], env: Mapping[str, str], *, action: str = "") -> str:
    code, out = await _run_git(args, env)
    if code != 0:
        what = action or (args[2] if args[0] == "--git-dir" else args[0])
        message = mask(out.strip(), repo.secrets()) or f"exit code {code}"
        raise CheckoutError(f"git {what} of {_shown(repo)} failed: {message}")
    return out


async def _run_git(args: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        env={**_base_env(), **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=GIT_TIMEOUT_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        await process.wait()
        return 124, f"no answer within {GIT_TIMEOUT_SECONDS:.0f} s"
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


def _base_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    return env


@contextlib.contextmanager
def _git_auth(repo: Repository) -> Iterator[dict[str, str]]:
    """Environment that makes git authenticate: never on its command line, never in the cache's config."""
    if repo.credential_kind == "token" and repo.credential:
        basic = base64.b64encode(f"x-access-token:{repo.credential}".encode()).decode()
        yield {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        }
    elif repo.credential_kind == "ssh_key" and repo.credential:
        fd, key_path = tempfile.mkstemp(prefix="runplane-deploy-key-")
        try:
            with os.fdopen(fd, "w") as handle:  # mkstemp makes it 0600
                handle.write(repo.credential.rstrip("\n") + "\n")
            yield {
                "GIT_SSH_COMMAND": (
                    f"ssh -i {key_path} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new"
                )
            }
        finally:
            os.unlink(key_path)
    elif config := local_trust(repo.url):
        fd, config_path = tempfile.mkstemp(prefix="runplane-gitconfig-")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(config)
            yield {"GIT_CONFIG_GLOBAL": config_path}
        finally:
            os.unlink(config_path)
    else:
        yield {}


def local_trust(url: str) -> str:
    """Git configuration that lets a run read a local repository (``file://`` or a path) of another
    user; empty for any other repository.

    A run executes as a uid of its own, and git refuses a repository another user owns ("dubious
    ownership") unless ``safe.directory`` names it in a configuration git trusts: the global one
    (the command line's does not reach the ``upload-pack`` a clone runs).
    """
    path = urlsplit(url).path if url.startswith("file://") else url if url.startswith("/") else ""
    path = path.rstrip("/")
    if not path or "\n" in path:
        return ""
    quoted = [_config_value(d) for d in (path, f"{path}/.git")]
    return "[safe]\n" + "".join(f"\tdirectory = {value}\n" for value in quoted)


def _config_value(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextlib.asynccontextmanager
async def _locked(lock_path: Path) -> AsyncIterator[None]:
    """An exclusive lock on the cache entry, shared with the other runs of this host."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock
