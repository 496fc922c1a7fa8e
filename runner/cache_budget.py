"""The node's packages cache within a size budget: when it grows past it, the entries least recently
stored or restored go first, whichever account they are of.

Without a budget a node's cache grows with every lock its runs saw, and one account's runs, each
with a new lock, could fill the node's disk under everyone's Pods. The choice is a pure function
(:func:`to_evict`); :class:`CacheBudget` keeps the sizes and last uses of the entries under the
keeper's root (read once at start, then kept as the keeper stores and restores) and removes what
it chose: renamed out of place first, so a later request finds it gone at once, then deleted.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    path: Path  # <root>/<account id>/<key>
    size: int  # bytes of its files
    used: float  # when it was last stored or restored (seconds since the epoch)


def to_evict(entries: Iterable[Entry], budget: int, keep: Path) -> list[Path]:
    """The entries to remove, least recently used first, until the rest fits ``budget`` bytes;
    never ``keep`` (the entry just stored)."""
    chosen: list[Path] = []
    listed = sorted(entries, key=lambda entry: entry.used)
    total = sum(entry.size for entry in listed)
    for entry in listed:
        if total <= budget:
            break
        if entry.path != keep:
            chosen.append(entry.path)
            total -= entry.size
    return chosen


def entry_size(path: Path) -> int:
    """The bytes of an entry's files."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_size
    return total


class CacheBudget:
    """The entries under ``root`` kept within ``max_bytes`` (0: no budget). Thread-safe: the keeper
    serves connections in threads."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self._root = root
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: dict[Path, Entry] = {}
        if max_bytes and root.is_dir():
            for account in root.iterdir():
                if account.is_dir() and not account.name.startswith("."):
                    for path in account.iterdir():
                        if (path / "tree").is_dir():  # staging directories have none until renamed
                            self._entries[path] = Entry(path, entry_size(path), path.stat().st_mtime)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._entries.values())

    def restored(self, path: Path) -> None:
        """``path`` was served: it is the most recently used."""
        if not self._max_bytes:
            return
        with self._lock:
            found = self._entries.get(path)
            if found is not None:
                self._entries[path] = Entry(path, found.size, time.time())

    def stored(self, path: Path) -> list[Path]:
        """``path`` is in place (made now, or found there); removes what no longer fits, which it returns."""
        if not self._max_bytes:
            return []
        size = entry_size(path)
        with self._lock:
            self._entries[path] = Entry(path, size, time.time())
            evicted = to_evict(self._entries.values(), self._max_bytes, keep=path)
            for gone in evicted:
                del self._entries[gone]
        for gone in evicted:
            self._remove(gone)
        return evicted

    def _remove(self, path: Path) -> None:
        trash = Path(tempfile.mkdtemp(prefix=".evicted-", dir=self._root))
        try:
            os.rename(path, trash / "entry")
        except FileNotFoundError:
            pass
        finally:
            shutil.rmtree(trash, ignore_errors=True)
        log.info("dbt packages entry evicted", extra={"entry": str(path.relative_to(self._root))})
