"""Writing an earlier run's artifact (``RunSpec.state_files``) where the run's steps expect it."""

from __future__ import annotations

from pathlib import Path

from runplane.basics.errors import RunplaneError


class StateFileError(RunplaneError):
    """A state file's destination is not inside the steps' working directory."""


def place_state_file(cwd: Path, dest: str, content: bytes) -> Path:
    """Write ``content`` to ``cwd/dest`` (a relative path inside ``cwd``); the path written."""
    path = (cwd / dest).resolve()
    if not dest or Path(dest).is_absolute() or not path.is_relative_to(cwd.resolve()):
        raise StateFileError(f"{dest!r} is not a path inside the working directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path
