"""The environment's warehouse directory, made ready by the runner before the run's first step.

A DuckDB file lives in ``<root>/<directory>/`` (``runplane.dbt.warehouse_files``). A run with a uid of
its own cannot keep it in a directory of its uid (the next run has another), so, as root before the
switch, the runner makes the directory root's, of the environment's own group, mode 2770 (new files
take the group), and gives the run that group as its one supplementary group (``runner.run_user``);
the run's umask of 007 keeps what it writes there group-writable. Every run of the environment, on
whatever uid, then reads and writes what the last one wrote; a run of any other environment is not
in the group and cannot enter the directory, and the root (0711, root's) lists no directory names.

What an earlier run left there is given to root and the group again, group-writable (a file a run
made keeps its uid as owner, and that uid goes to other accounts' runs later): each entry is opened
without following a link and changed through its descriptor, so a link a run planted there makes
root change nothing outside. A directory whose group is not the environment's belongs to another
environment (or to none of runplane's making): the run is refused, never let in.

A runner that does not switch uids (not root, or ``runner.local_uid`` -1) has one user for every
run: it only checks the path and makes the directory, private to that user.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from runner.control_plane import RunSpec
from runplane.basics.settings import RunnerSettings
from runplane.dbt.connections import ConnectionFieldError, adapter_fields
from runplane.dbt.warehouse_files import WarehouseFiles, WarehousePathRefused, environment_gid, is_file

ROOT_MODE = 0o711  # runs pass through to their directory; none lists the others
DIRECTORY_MODE = 0o2770  # the environment's group, and new entries take that group
FILE_MODE = 0o660  # every file there: read and write for root and the group, nothing else


def warehouse_directory(runner: RunnerSettings, spec: RunSpec) -> str:
    """The environment's warehouse directory of the run ("" when its connection names no file);
    raises :class:`WarehousePathRefused` when runs may not keep a file where it says."""
    if not spec.HasField("dbt"):
        return ""
    dbt = spec.dbt
    try:
        paths = [dbt.connection.get(name, "") for name in sorted(adapter_fields(dbt.adapter_type).file_paths)]
    except ConnectionFieldError:  # an adapter this runner does not know: the profile step says so
        return ""
    rule = WarehouseFiles.of_root(runner.local_warehouse_root)
    for path in paths:
        if path and is_file(path):
            return rule.directory(path)
    return ""


def prepare_shared(runner: RunnerSettings, spec: RunSpec) -> tuple[tuple[int, ...], str]:
    """As root, for a run with a uid of its own: the groups the run joins and why it may not start
    ("" when it may)."""
    try:
        directory = warehouse_directory(runner, spec)
        if not directory:
            return (), ""
        gid = environment_gid(runner.local_warehouse_gid, spec.dbt.environment_id)
        _root(posixpath.dirname(directory))
        _environment_directory(directory, gid)
        _regroup(directory, gid)
    except WarehousePathRefused as exc:
        return (), f"the environment's DuckDB path {exc}"
    except OSError as exc:
        return (), f"the warehouse directory cannot be made ready: {exc.strerror or exc} ({exc.filename})"
    return (gid,), ""


def prepare_own(runner: RunnerSettings, spec: RunSpec) -> str:
    """For a run on the runner's own user: why it may not start ("" when it may); the directory is made."""
    try:
        directory = warehouse_directory(runner, spec)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
    except WarehousePathRefused as exc:
        return f"the environment's DuckDB path {exc}"
    except OSError as exc:
        return f"the warehouse directory cannot be made: {exc.strerror or exc} ({exc.filename})"
    return ""


def _root(root: str) -> None:
    """The warehouse root, root's, 0711 (made so when missing); refused when it is another user's."""
    os.makedirs(root, mode=ROOT_MODE, exist_ok=True)
    found = os.lstat(root)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0:
        raise WarehousePathRefused(
            f"is under {root}, which is not a directory of root's: the operator must give the warehouse root to root"
        )
    if stat.S_IMODE(found.st_mode) != ROOT_MODE:
        os.chmod(root, ROOT_MODE)


def _environment_directory(directory: str, gid: int) -> None:
    """``directory``, root's, of ``gid``, 2770: made when missing, refused when it is another's."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    else:
        os.chown(directory, 0, gid)
        os.chmod(directory, DIRECTORY_MODE)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0 or found.st_gid != gid:
        raise WarehousePathRefused(
            f"is in {directory}, which belongs to another environment: give this environment a directory of its own"
        )
    if stat.S_IMODE(found.st_mode) != DIRECTORY_MODE:
        os.chmod(directory, DIRECTORY_MODE)


def _regroup(directory: str, gid: int) -> None:
    """Everything under ``directory`` root's and ``gid``'s, open to the group; links are left alone."""
    for _, directories, files, parent in os.fwalk(directory, follow_symlinks=False):
        for name in (*directories, *files):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT):  # a link, a socket, gone meanwhile
                    continue
                raise
            try:
                found = os.fstat(fd)
                if stat.S_ISDIR(found.st_mode):
                    mode = DIRECTORY_MODE
                elif stat.S_ISREG(found.st_mode):
                    mode = FILE_MODE
                else:
                    continue
                if found.st_uid != 0 or found.st_gid != gid:
                    os.fchown(fd, 0, gid)  # clears any set-id bit
                if stat.S_IMODE(found.st_mode) != mode or found.st_uid != 0:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)
