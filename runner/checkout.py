"""Checking out a run's project: a cache of repositories per runner host, a private clone per run.

The first run of a repository on a host clones it once (``git clone --mirror``) into the cache;
later runs fetch into that mirror (or skip the fetch when the pinned commit is already there). A
run gets a clone of its own made from the mirror with ``git clone --local``: the objects are hard
links to the mirror's (read-only, the host's), everything else is the run's; the run checks its
commit out in it itself (:func:`check_out`), so the work tree is its own. The cache is the host's
alone (0700, shared by its runs under a file lock) and keyed by account and URL: a run never reads
a mirror that another account's credentials fetched. A mirror's name is a keyed hash of both under
a secret of the host's, and a run's clone names the project's URL as its remote, not the mirror:
where another account's mirror lies cannot be worked out from what a run sees.

Every clone and fetch applies the repository rule again (``runplane.basics.repository_urls``: the
project's URL, its host's addresses now), so a project saved before the rule, or written into the
database by other means, fails its run with the rule's reason.

When runs have uids of their own, a root process keeps the cache for them (``runner.cache_keeper``)
and hands each run's clone over to its uid (``owner``); otherwise the runner keeps it itself. The
root keeper never runs git as root: every git command of the cache runs as the cache's own
unprivileged uid (``git_uid``), which owns the cache and nothing else, so a local repository only
root may read is not cloned whatever the URL rule allows. A run's clone is made in the cache (by
that uid) and moved to the run's directory by root: copied, objects included, when that is the run's
size-capped disk (``runner.run_user``), so what the clone takes counts in the run's room.

The commit is the run's SHA if given, else the head of its branch, else the head of the
repository's default branch. Whatever git says on failure comes back in :class:`CheckoutError`
with the credentials masked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fcntl
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from runplane.basics.errors import RunplaneError
from runplane.basics.repository_urls import (
    ReachableRepository,
    RepositoryRule,
    RepositoryUrlRefused,
    without_credentials,
)
from runplane.basics.secrets import mask

GIT_TIMEOUT_SECONDS = 300.0
MIRROR_KEY_FILE = "mirror-names.key"


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
    """Bare mirrors of the repositories this host has run, under ``root``; only repositories ``rule``
    allows, checked again (and their host resolved again) just before each clone or fetch."""

    def __init__(self, root: Path, rule: RepositoryRule, git_uid: int | None = None) -> None:
        self._root = root
        self._rule = rule
        self._git_uid = git_uid  # None: git runs as this process's own uid (not root's: see git_uid_for)

    def mirror_path(self, account_id: int, url: str) -> Path:
        """The mirror of ``url`` for ``account_id``: named by a keyed hash whose key is this host's
        secret, so knowing an account's id and URL does not tell where its mirror is."""
        digest = hmac.new(self._host_key(), f"{account_id}\0{url}".encode(), hashlib.sha256).hexdigest()
        return self._root / (digest[:32] + ".git")

    def _host_key(self) -> bytes:
        """This cache's secret (made once, readable by its owner alone)."""
        path = self._root / MIRROR_KEY_FILE
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._git_uid is not None:
            closed = [str(p) for p in self._root.parents if not p.stat().st_mode & stat.S_IXOTH]
            if closed:
                raise CheckoutError(
                    f"the repository cache {self._root} is out of reach of uid {self._git_uid}, which runs git for "
                    f"it: {', '.join(closed)} may not be entered by other users (runner.repository_cache)"
                )
            if self._root.stat().st_uid != self._git_uid:
                os.chown(self._root, self._git_uid, self._git_uid)  # git (as its uid) makes the mirrors in it
                self._root.chmod(0o700)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        partial = Path(tempfile.mkstemp(prefix=MIRROR_KEY_FILE + ".", dir=self._root)[1])
        try:
            partial.write_bytes(secrets.token_bytes(32))
            with contextlib.suppress(FileExistsError):  # another run made it first: theirs is the key
                os.link(partial, path)
        finally:
            partial.unlink()
        return path.read_bytes()

    async def clone_for_run(
        self, repo: Repository, *, account_id: int, branch: str, sha: str, dest: Path, owner: int | None
    ) -> Checkout:
        """A clone of ``repo`` in ``dest`` (new), nothing checked out yet, the run's commit resolved;
        given to uid ``owner`` when the run is not this process's own uid. Its remote is the project's
        URL, never the mirror's path."""
        try:
            reachable = await self._rule.reachable(repo.url)
        except RepositoryUrlRefused as exc:
            raise CheckoutError(f"repository {_shown(repo)} refused: {exc}") from exc
        mirror = self.mirror_path(account_id, repo.url)
        uid = self._git_uid
        with contextlib.ExitStack() as made:
            # The clone is made where the cache's uid may write, then moved to ``dest``.
            target = dest if uid is None else made.enter_context(_staging(self._root, uid)) / "clone"
            with _git_auth(repo, _transport_config(reachable), uid) as env:
                async with _locked(mirror.with_suffix(".lock")):
                    cloned = not mirror.exists()
                    if cloned:
                        await _clone(repo, mirror, env, uid)
                    elif not (sha and await _has_commit(mirror, sha, env, uid)):
                        await _git(repo, ["--git-dir", str(mirror), "fetch", "--prune", "--quiet", "origin"], env, uid)
                    resolved, branch_name = await _resolve(repo, mirror, branch=branch, sha=sha, env=env, uid=uid)
                    # Under the lock: a fetch's repack must not remove objects while they are linked.
                    clone = ["clone", "--local", "--no-checkout", "--quiet", "--", str(mirror), str(target)]
                    await _git(repo, clone, {}, uid)
            await _git(repo, ["-C", str(target), "remote", "set-url", "origin", without_credentials(repo.url)], {}, uid)
            shutil.rmtree(target / ".git" / "logs", ignore_errors=True)  # "clone: from <the mirror>" in every entry
            if target != dest:
                _move(target, dest)
        if owner is not None:
            hand_over(dest, owner)
        return Checkout(dest, resolved, branch_name, cloned)

    async def reach(self, repo: Repository) -> str:
        """Whether git reaches ``repo`` with its credentials now (a project's "test connection"): the
        rule applied again and the host resolved again as for a clone, then ``git ls-remote`` of its
        default branch, which reads no objects. Answers the line git gives for ``HEAD``; CheckoutError
        with the rule's refusal or git's own words (secrets masked) otherwise."""
        try:
            reachable = await self._rule.reachable(repo.url)
        except RepositoryUrlRefused as exc:
            raise CheckoutError(f"repository {_shown(repo)} refused: {exc}") from exc
        with _git_auth(repo, _transport_config(reachable), self._git_uid) as env:
            out = await _git(repo, ["ls-remote", "--symref", "--", repo.url, "HEAD"], env, self._git_uid)
        return mask(out.strip().splitlines()[0], repo.secrets()) if out.strip() else "an empty repository"


def _move(clone: Path, dest: Path) -> None:
    """The clone made in the cache to ``dest``: renamed on the cache's file system (the objects stay
    hard links to the mirror's), copied to another (a run's size-capped disk: they count in its room)."""
    try:
        os.rename(clone, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copytree(clone, dest, symlinks=True)


def hand_over(clone: Path, owner: int) -> None:
    """Give a run's new clone to its uid, except the object files it shares with the mirror (hard
    links: they stay the host's, read-only). Only this process has written there yet."""
    for directory, _, files in os.walk(clone):
        os.lchown(directory, owner, owner)
        for name in files:
            path = os.path.join(directory, name)
            found = os.lstat(path)
            if not (stat.S_ISREG(found.st_mode) and found.st_nlink > 1):
                os.lchown(path, owner, owner)


async def check_out(checkout: Checkout) -> None:
    """Check the run's commit out in its own clone, as the run's uid (the work tree is its own)."""
    args = ["-C", str(checkout.path), "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach"]
    code, out = await _run_git([*args, checkout.sha], {})
    if code != 0:
        raise CheckoutError(f"git checkout of {checkout.sha} failed: {out.strip() or f'exit code {code}'}")


def git_uid_for(local_uid: int) -> int:
    """The uid a root cache keeper runs git as: the one just below the runs' (``runner.local_uid``),
    root's never (a clone as root reads whatever root may)."""
    uid = local_uid - 1
    if uid <= 0:
        raise CheckoutError(f"runner.local_uid {local_uid} leaves no uid for the repository cache below it")
    return uid


@contextlib.contextmanager
def _staging(root: Path, uid: int) -> Iterator[Path]:
    """A new directory in the cache that ``uid`` owns, removed with what is left in it."""
    path = Path(tempfile.mkdtemp(prefix="run-clone.", dir=root))
    try:
        os.chown(path, uid, uid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _clone(repo: Repository, mirror: Path, env: Mapping[str, str], uid: int | None) -> None:
    """Clone into a temporary name and rename, so a failed clone leaves no half repository."""
    partial = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
    try:
        if uid is not None:
            os.chown(partial, uid, uid)
        await _git(repo, ["clone", "--mirror", "--quiet", "--", repo.url, str(partial)], env, uid, action="clone")
        os.rename(partial, mirror)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already after the rename


async def _has_commit(mirror: Path, sha: str, env: Mapping[str, str], uid: int | None) -> bool:
    code, _ = await _run_git(["--git-dir", str(mirror), "cat-file", "-e", f"{sha}^{{commit}}"], env, uid)
    return code == 0


async def _resolve(
    repo: Repository, mirror: Path, *, branch: str, sha: str, env: Mapping[str, str], uid: int | None
) -> tuple[str, str]:
    """(commit, branch name) for the run."""
    git_dir = ["--git-dir", str(mirror)]
    if not branch:
        code, out = await _run_git([*git_dir, "symbolic-ref", "--short", "HEAD"], env, uid)
        branch = out.strip() if code == 0 else ""
    if sha:
        code, out = await _run_git([*git_dir, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"], env, uid)
        if code != 0:
            raise CheckoutError(f"commit {sha} not found in {_shown(repo)}")
        return out.strip(), branch
    if not branch:
        raise CheckoutError(f"{_shown(repo)} has no default branch: set the environment's branch")
    code, out = await _run_git(
        [*git_dir, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], env, uid
    )
    if code != 0:
        raise CheckoutError(f"branch {branch!r} not found in {_shown(repo)}")
    return out.strip(), branch


def _shown(repo: Repository) -> str:
    return mask(repo.url, repo.secrets())


async def _git(
    repo: Repository, args: Sequence[str], env: Mapping[str, str], uid: int | None = None, *, action: str = ""
) -> str:
    code, out = await _run_git(args, env, uid)
    if code != 0:
        what = action or (args[2] if args[0] == "--git-dir" else args[0])
        message = mask(out.strip(), repo.secrets()) or f"exit code {code}"
        raise CheckoutError(f"git {what} of {_shown(repo)} failed: {message}")
    return out


async def _run_git(args: Sequence[str], env: Mapping[str, str], uid: int | None = None) -> tuple[int, str]:
    """git with ``args``, as ``uid`` (with no groups and the cache's uid's HOME: none) when given."""
    as_uid: dict[str, object] = {}
    base = _base_env()
    if uid is not None:
        as_uid = {"user": uid, "group": uid, "extra_groups": []}
        base["HOME"] = "/nonexistent"  # not root's: git reads no configuration of root's
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        env={**base, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        **as_uid,  # type: ignore[arg-type]
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=GIT_TIMEOUT_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        await process.wait()
        return 124, f"no answer within {GIT_TIMEOUT_SECONDS:.0f} s"
    except BaseException:  # cancelled (the run's timeout or a cancel): git stops with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


def _base_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    return env


def _transport_config(reachable: ReachableRepository) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(environment, configuration) that keep git to the checked repository: its transport alone, no
    redirect elsewhere, and over http(s) the addresses just checked (a DNS answer that changes before
    git connects changes nothing)."""
    location = reachable.location
    env = {"GIT_ALLOW_PROTOCOL": location.scheme}
    config = [("http.followRedirects", "false")]
    if location.scheme in ("https", "http") and reachable.addresses:
        pinned = ",".join(f"[{a}]" if a.version == 6 else str(a) for a in reachable.addresses)
        config.append(("http.curloptResolve", f"{location.host}:{location.port}:{pinned}"))
    return env, config


def _config_env(config: Sequence[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(config))}
    for index, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


@contextlib.contextmanager
def _git_auth(
    repo: Repository, transport: tuple[dict[str, str], list[tuple[str, str]]], uid: int | None = None
) -> Iterator[dict[str, str]]:
    """Environment that makes git authenticate (never on its command line, never in the cache's
    config) and keeps it to ``transport``; the files it names are ``uid``'s (git's) when given."""
    env, config = transport
    if repo.credential_kind == "token" and repo.credential:
        basic = base64.b64encode(f"x-access-token:{repo.credential}".encode()).decode()
        yield {**env, **_config_env([*config, ("http.extraHeader", f"Authorization: Basic {basic}")])}
    elif repo.credential_kind == "ssh_key" and repo.credential:
        fd, key_path = tempfile.mkstemp(prefix="runplane-deploy-key-")
        try:
            with os.fdopen(fd, "w") as handle:  # mkstemp makes it 0600
                handle.write(repo.credential.rstrip("\n") + "\n")
                if uid is not None:
                    os.fchown(handle.fileno(), uid, uid)
            yield {
                **env,
                **_config_env(config),
                "GIT_SSH_COMMAND": (
                    f"ssh -i {key_path} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new"
                ),
            }
        finally:
            os.unlink(key_path)
    elif trust := local_trust(repo.url):
        fd, config_path = tempfile.mkstemp(prefix="runplane-gitconfig-")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(trust)
                if uid is not None:
                    os.fchown(handle.fileno(), uid, uid)
            yield {**env, **_config_env(config), "GIT_CONFIG_GLOBAL": config_path}
        finally:
            os.unlink(config_path)
    else:
        yield {**env, **_config_env(config)}


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
    quoted = [git_config_value(d) for d in (path, f"{path}/.git")]
    return "[safe]\n" + "".join(f"\tdirectory = {value}\n" for value in quoted)


def git_config_value(value: str) -> str:
    """``value`` quoted for a git configuration file."""
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
