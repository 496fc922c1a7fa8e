"""Files a test runs as another uid, wherever the checkout sits.

A checkout may be in a directory only its owner enters (``mktemp -d`` makes one): a program run as
a run's uid, or as nobody, cannot read a file there. ``readable_by_all`` gives it a copy it can,
outside the temporary directories (a fenced run's steps see a ``/tmp`` of their own).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def directory_for_all(prefix: str = "runplane-readable-") -> Path:
    """A new directory every user can enter, outside the temporary directories (removed when the
    test process exits, or earlier by its caller)."""
    shared = "/run" if os.access("/run", os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=shared))
    directory.chmod(0o755)
    atexit.register(shutil.rmtree, directory, True)
    return directory


def readable_by_all(source: Path) -> Path:
    """A copy of ``source`` every user can read, in a directory of its own every user can enter
    (removed when the test process exits)."""
    directory = directory_for_all()
    copy = directory / source.name
    shutil.copyfile(source, copy)
    copy.chmod(0o644)
    return copy
