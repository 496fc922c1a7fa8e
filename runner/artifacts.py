"""Which files of a run are its artifacts, step by step.

dbt writes its artifacts to its target path and its log to its log path, both relative to the
project directory unless absolute; a step can move them (``--project-dir``, ``--target-path``,
``--log-path``, ``DBT_TARGET_PATH``, ``DBT_LOG_PATH``, ``target-path:`` in ``dbt_project.yml``).
After each step the collector looks wherever the run's dbt steps so far wrote, and names what is new
or changed since it last looked: ``target/<file>`` for dbt's artifacts and ``logs/dbt.log``, the
names the API serves whatever the directory was. A file larger than :data:`ARTIFACT_MAX_BYTES` is
not kept, and the run's log says so.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ARTIFACT_MAX_BYTES = 64 * 1024 * 1024  # per file; a larger one is skipped with a line in the run's log
DBT_TARGET_FILES = (
    "manifest.json",
    "run_results.json",
    "sources.json",
    "catalog.json",
    "semantic_manifest.json",
    "index.html",
)
DBT_LOG_FILE = "dbt.log"


@dataclass(frozen=True)
class Found:
    name: str  # as stored and served: target/run_results.json, logs/dbt.log
    path: Path
    size: int


@dataclass
class Scan:
    limit: int  # bytes: a file larger than this is not kept
    changed: list[Found] = field(default_factory=list)
    too_large: list[Found] = field(default_factory=list)

    def limit_shown(self) -> str:
        mib = 1024 * 1024
        return f"{self.limit // mib} MiB" if self.limit % mib == 0 else f"{self.limit} bytes"


def _option(words: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` in a command line."""
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _configured_target_path(project: Path) -> str | None:
    try:
        document = yaml.safe_load((project / "dbt_project.yml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    value = document.get("target-path") if isinstance(document, dict) else None
    return value if isinstance(value, str) and value else None


def dbt_output_directories(command: str, cwd: Path, env: Mapping[str, str]) -> tuple[Path, Path]:
    """(target directory, log directory) that the dbt step ``command`` run in ``cwd`` writes to."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = []
    project = cwd / (_option(words, "--project-dir") or env.get("DBT_PROJECT_DIR") or ".")
    target = (
        _option(words, "--target-path") or env.get("DBT_TARGET_PATH") or _configured_target_path(project) or "target"
    )
    logs = _option(words, "--log-path") or env.get("DBT_LOG_PATH") or "logs"
    return (project / target).resolve(), (project / logs).resolve()


class ArtifactCollector:
    """Remembers where the run's dbt steps write and what it has already kept."""

    def __init__(self, default_target: Path, default_logs: Path | None = None) -> None:
        self._places: list[tuple[Path, Path | None]] = [(default_target, default_logs)]
        self._seen: dict[Path, tuple[int, int]] = {}

    def watch(self, target: Path, logs: Path | None) -> None:
        if (target, logs) not in self._places:
            self._places.append((target, logs))

    def scan(self) -> Scan:
        """What is new or changed since the last scan."""
        scan = Scan(ARTIFACT_MAX_BYTES)
        for target, logs in self._places:
            candidates = [(f"target/{name}", target / name) for name in DBT_TARGET_FILES]
            others = sorted(p for p in target.glob("*.json") if p.name not in DBT_TARGET_FILES)
            candidates += [(f"target/{p.name}", p) for p in others]
            if logs is not None:
                candidates.append((f"logs/{DBT_LOG_FILE}", logs / DBT_LOG_FILE))
            for name, path in candidates:
                try:
                    stat = path.stat()
                except OSError:
                    continue
                mark = (stat.st_mtime_ns, stat.st_size)
                if self._seen.get(path) == mark:
                    continue
                self._seen[path] = mark
                found = Found(name, path, stat.st_size)
                (scan.too_large if stat.st_size > scan.limit else scan.changed).append(found)
        return scan
