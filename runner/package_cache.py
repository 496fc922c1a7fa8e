"""Installed dbt packages kept by the runner host, so ``dbt deps`` runs once per lock, not once per run.

An entry is keyed by the account, the dbt version, the packages' install path and the exact bytes
of ``packages.yml``/``dependencies.yml`` and ``package-lock.yml`` (dbt's lock): a changed lock is a
new entry, and one account's packages (private git packages included) never reach another's run.

The first run of a key runs ``dbt deps`` in its own project; the host then takes a copy of what it
installed (``tar`` run as the run's uid, so it reads only what the run could read; each member
checked before it is extracted, so nothing in it is a device, runs setuid or points outside the
project)
into a staging directory renamed into place when complete. Later runs get the entry hard-linked
into their project: the files stay the host's (read-only to the run), the directories are the run's.
The cache's root is the host's alone (0700): a run reaches only the entries linked into its project.

The host side (:class:`PackageCache`) runs as the cache's owner: the runner's own uid, or, when runs
have uids of their own, the root process that keeps the caches for them (``runner.cache_keeper``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

import yaml

from runplane.basics.errors import RunplaneError

PACKAGE_FILES = ("packages.yml", "dependencies.yml")
LOCK_FILE = "package-lock.yml"
DEFAULT_INSTALL_PATH = "dbt_packages"
_KEY = re.compile(r"[0-9a-f]{64}")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TarStream(Protocol):
    """Where a tar stream is read from or written to (tarfile's ``r|`` and ``w|`` modes use only
    ``read`` or ``write``): a pipe from ``tar``, or a socket's packets (``runner.node_cache``)."""

    def read(self, size: int, /) -> bytes: ...
    def write(self, data: bytes, /) -> object: ...
    def tell(self) -> int: ...
    def seek(self, pos: int, /) -> object: ...
    def close(self) -> object: ...


class PackageCacheError(RunplaneError):
    """An entry could not be linked into a run."""


class _Refused(Exception):
    """Something installed that an entry must not hold (the packages stay uncached)."""


def has_packages(project: Path) -> bool:
    return any((project / name).is_file() for name in PACKAGE_FILES)


def install_path(project: Path) -> str | None:
    """Where dbt installs the project's packages (``packages-install-path``), when it is one plain
    directory name of the project; None when it is anything else (templated, nested, outside): such
    a project runs ``dbt deps`` every time."""
    try:
        document = yaml.safe_load((project / "dbt_project.yml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    value = document.get("packages-install-path", DEFAULT_INSTALL_PATH) if isinstance(document, dict) else None
    if not isinstance(value, str) or not _PLAIN_NAME.fullmatch(value) or value in (".", ".."):
        return None
    return value


def package_key(project: Path, *, account_id: int, dbt_version: str, install_dir: str) -> str:
    """The entry of a project's packages: its account, dbt version, install path and package files."""
    digest = hashlib.sha256(f"{account_id}\0{dbt_version}\0{install_dir}\0".encode())
    for name in (*PACKAGE_FILES, LOCK_FILE):
        try:
            content = (project / name).read_bytes()
        except FileNotFoundError:
            digest.update(f"{name}\0absent\0".encode())
            continue
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


_COMMIT = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
_EXACT_VERSION = re.compile(r"=?\s*v?\d+(\.\d+)*([-+][0-9A-Za-z.-]+)?")


def unpinned_package(project: Path) -> str | None:
    """Why the project's packages cannot be cached by their files, or None when they can.

    An entry is keyed by the package files' bytes. Without a ``package-lock.yml`` those bytes do not
    say what ``dbt deps`` installs when a package names a branch, a tag or a version range: the
    branch moves, and a cached entry would go on serving what it pointed to before. Such a project
    installs its packages every run (``dbt deps`` writes the lock: committing it brings the cache
    back); a commit or an exact version needs no lock.
    """
    if (project / LOCK_FILE).is_file():
        return None
    for name in PACKAGE_FILES:
        try:
            document = yaml.safe_load((project / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return f"{name} cannot be read before dbt renders it"
        packages = document.get("packages") if isinstance(document, dict) else None
        for package in packages if isinstance(packages, list) else []:
            if isinstance(package, dict) and (reason := _unpinned(package)) is not None:
                return reason
    return None


def git_package_urls(project: Path) -> list[str]:
    """The ``git:`` URLs the project's package files name as written (unrendered; unreadable files name none)."""
    urls: list[str] = []
    for name in PACKAGE_FILES:
        try:
            document = yaml.safe_load((project / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        packages = document.get("packages") if isinstance(document, dict) else None
        for package in packages if isinstance(packages, list) else []:
            if isinstance(package, dict) and isinstance(package.get("git"), str):
                urls.append(package["git"])
    return urls


def _unpinned(package: dict[object, object]) -> str | None:
    for source in ("git", "private"):
        if source in package:
            revision = package.get("revision")
            if isinstance(revision, str) and _COMMIT.fullmatch(revision.strip()):
                return None
            where = f"{revision!r}" if isinstance(revision, str) else "its default branch"
            return f"{source} package {str(package[source])[:200]!r} follows {where}, not a commit"
    if "package" in package:
        version = package.get("version")
        if isinstance(version, str) and _EXACT_VERSION.fullmatch(version.strip()):
            return None
        return f"package {str(package['package'])[:200]!r} names a version range ({str(version)[:80]!r})"
    return None


class PackageCache:
    """The host's entries under ``root``; ``owner`` is the uid of the run a call serves (None: the
    run is this process's own uid)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def entry(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise PackageCacheError(f"not a package cache key: {key[:80]!r}")
        return self._root / key

    def restore(self, key: str, project: Path, install_dir: str, owner: int | None) -> bool:
        """Link the entry ``key`` into ``project/install_dir`` (replacing what is there); False when
        the host has no complete entry for it."""
        tree = self.entry(key) / "tree"
        if not tree.is_dir():
            return False
        _check_install_dir(install_dir)
        project_fd = os.open(project, _DIRECTORY_FLAGS)
        try:
            if owner is not None and os.fstat(project_fd).st_uid != owner:
                raise PackageCacheError(f"{project} is not the run's own directory")
            _remove(install_dir, project_fd)
            os.mkdir(install_dir, 0o755, dir_fd=project_fd)
            target = os.open(install_dir, _DIRECTORY_FLAGS, dir_fd=project_fd)
            try:
                _link_tree(tree, target, owner)
                if owner is not None:
                    os.fchown(target, owner, owner)
            finally:
                os.close(target)
        finally:
            os.close(project_fd)
        return True

    def store(self, key: str, project: Path, install_dir: str, owner: int | None) -> str:
        """Keep what ``dbt deps`` installed in ``project/install_dir`` as the entry ``key``; "" when
        the entry is there (made now or by another run), else why it is not."""
        return self._keep(key, install_dir, lambda tree: _copy_as(owner, project, install_dir, tree))

    def store_archive(self, key: str, archive: TarStream, project_roots: Sequence[str], install_dir: str) -> str:
        """Keep a tar stream of a run's ``install_dir`` as the entry ``key``, each member checked as
        :meth:`store` checks them; ``project_roots``: the absolute paths of the run's project, as it
        names them, which absolute links may point into. "" or why it was not kept."""
        roots = [PurePosixPath(root) for root in project_roots]
        if not roots or not all(root.is_absolute() for root in roots):
            raise PackageCacheError("the project's paths must be absolute")
        return self._keep(key, install_dir, lambda tree: _extract_checked(archive, roots, install_dir, tree))

    def write_archive(self, key: str, out: TarStream) -> bool:
        """Write the entry ``key`` to ``out`` as a tar stream; False (nothing written) when there is none."""
        tree = self.entry(key) / "tree"
        if not tree.is_dir():
            return False
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            archive.add(tree, arcname=".")
        return True

    def _keep(self, key: str, install_dir: str, fill: Callable[[Path], str]) -> str:
        """Make the entry ``key`` in a staging directory (``fill`` copies the packages into its tree and
        says why it could not), renamed into place when complete; "" or why it was not kept."""
        final = self.entry(key)
        _check_install_dir(install_dir)
        if final.is_dir():
            return ""
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=self._root))
        try:
            tree = staging / "tree"
            tree.mkdir(mode=0o755)
            reason = fill(tree)
            if reason:
                return reason
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            return ""
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already after the rename


def _check_install_dir(install_dir: str) -> None:
    if not _PLAIN_NAME.fullmatch(install_dir) or install_dir in (".", ".."):
        raise PackageCacheError(f"not a plain directory name: {install_dir[:80]!r}")


def _remove(name: str, parent_fd: int) -> None:
    """Remove ``name`` in the directory ``parent_fd`` whatever it is (a symlink is not followed)."""
    try:
        found = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(found.st_mode):
        shutil.rmtree(name, dir_fd=parent_fd)
    else:
        os.unlink(name, dir_fd=parent_fd)


def _link_tree(source: Path, target_fd: int, owner: int | None) -> None:
    """``source``'s content into the directory ``target_fd``: files hard-linked (copied across file
    systems), symlinks and directories made anew, every new name created relative to a directory
    descriptor and never through a symlink."""
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), entry.name, dir_fd=target_fd)
                if owner is not None:
                    os.chown(entry.name, owner, owner, dir_fd=target_fd, follow_symlinks=False)
            elif entry.is_dir(follow_symlinks=False):
                os.mkdir(entry.name, 0o755, dir_fd=target_fd)
                child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=target_fd)
                try:
                    _link_tree(Path(entry.path), child, owner)
                    if owner is not None:
                        os.fchown(child, owner, owner)
                finally:
                    os.close(child)
            elif entry.is_file(follow_symlinks=False):
                try:
                    os.link(entry.path, entry.name, dst_dir_fd=target_fd, follow_symlinks=False)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    _copy_file(Path(entry.path), entry.name, target_fd)


def _copy_file(source: Path, name: str, target_fd: int) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=target_fd)
    with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst)


def _copy_as(owner: int | None, project: Path, install_dir: str, tree: Path) -> str:
    """Copy ``project/install_dir`` into ``tree``, read as ``owner``; "" or why not."""
    tar = subprocess.Popen(
        ["tar", "-C", str(project / install_dir), "-cf", "-", "."],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        user=owner,
        group=owner,
        extra_groups=[] if owner is not None else None,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        cwd="/",
    )
    assert tar.stdout is not None and tar.stderr is not None
    try:
        reason = _extract_checked(tar.stdout, project_roots(project), install_dir, tree)
    finally:
        tar.stdout.close()
        error = tar.stderr.read().decode(errors="replace").strip()
        tar.stderr.close()
        code = tar.wait()
    if code != 0:
        return f"reading the installed packages failed: {error or f'tar exit code {code}'}"
    return reason


def project_roots(project: Path) -> list[str]:
    """The paths a run's absolute links into its project may start with: as named, and resolved."""
    return [str(project), str(project.resolve())]


def extract_entry(archive: TarStream, project: Path, install_dir: str) -> None:
    """An entry's tar stream into ``project/install_dir`` (replacing what is there), each member
    checked as it was when the entry was kept; raises :class:`PackageCacheError` when one is refused."""
    _check_install_dir(install_dir)
    target = project / install_dir
    project_fd = os.open(project, _DIRECTORY_FLAGS)
    try:
        _remove(install_dir, project_fd)
        os.mkdir(install_dir, 0o755, dir_fd=project_fd)
    finally:
        os.close(project_fd)
    reason = _extract_checked(archive, project_roots(project), install_dir, target)
    if reason:
        raise PackageCacheError(reason)


def _extract_checked(archive: TarStream, roots: Sequence[str | PurePosixPath], install_dir: str, tree: Path) -> str:
    """Extract a tar stream of ``install_dir`` into ``tree``, each member checked first; "" or why not."""
    try:
        with tarfile.open(fileobj=archive, mode="r|") as stream:
            installed = _InstalledMember(roots, install_dir, tree)
            for member in stream:  # a stream: each member is checked, then extracted, in order
                stream.extract(installed.checked(member), tree)
    except _Refused as exc:
        return str(exc)
    except tarfile.TarError as exc:
        return f"the installed packages cannot be copied: {exc}"
    return ""


class _InstalledMember:
    """What an entry may hold of what ``dbt deps`` installed: directories, regular files and symlinks,
    inside the tree, owned by nobody in particular, with no setuid, setgid or sticky bit and nothing
    writable by others (tarfile's ``data`` filter, written out: Debian bookworm's Python 3.11.2, the
    runner image's, predates it). dbt links a ``local:`` package by its absolute path in this run's
    project; the entry keeps such a link relative, so it points into every later run's own project. A
    member that is anything else, or a link that leaves the project, refuses the whole entry."""

    def __init__(self, roots: Sequence[str | PurePosixPath], install_dir: str, tree: Path) -> None:
        self._roots = [PurePosixPath(root) for root in roots]
        self._install_dir = install_dir
        self._tree = os.path.realpath(tree)

    def checked(self, member: tarfile.TarInfo) -> tarfile.TarInfo:
        name = PurePosixPath(member.name)
        if name.is_absolute() or ".." in name.parts:
            raise _Refused(f"{self._install_dir}/{member.name} is outside the packages' directory")
        # Through a symlink extracted before it, a member could still land outside the tree.
        if os.path.commonpath([os.path.realpath(os.path.join(self._tree, member.name)), self._tree]) != self._tree:
            raise _Refused(f"{self._install_dir}/{member.name} is reached through a link")
        if not (member.isfile() or member.isdir() or member.issym()):
            raise _Refused(f"{self._install_dir}/{member.name} is not a file, a directory or a symlink")
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        member.mode = (member.mode | (0o755 if member.isdir() else 0o644)) & 0o755
        if member.issym():
            member.linkname = self._link_target(member)
        return member

    def _link_target(self, member: tarfile.TarInfo) -> str:
        where = PurePosixPath(self._install_dir, member.name).parent  # relative to the project
        target = member.linkname
        if os.path.isabs(target):
            inside = next(
                (_relative(PurePosixPath(target), root) for root in self._roots if _within(target, root)), None
            )
            if inside is None:
                raise _Refused(f"{self._install_dir}/{member.name} links outside the project ({target})")
            target = os.path.relpath(inside, where)
        if os.path.normpath(os.path.join(where, target)).startswith(".."):
            raise _Refused(f"{self._install_dir}/{member.name} links outside the project ({member.linkname})")
        return target


def _within(path: str, root: PurePosixPath) -> bool:
    return PurePosixPath(path).is_relative_to(root)


def _relative(path: PurePosixPath, root: PurePosixPath) -> str:
    return str(path.relative_to(root)) or "."
