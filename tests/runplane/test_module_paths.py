"""Every module path the documentation names exists: a file path (``runner/fence.py``) or a dotted
module (``runplane.basics.backoff``, with an optional name defined in it) in a docstring of the
project's code, in DESIGN.md or in README.md. A renamed or removed module leaves no stale pointer."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from runplane.basics.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "client", "orchestrator", "queuer_worker", "scheduler", "dispatcher", "runner", "runplane")
TOP = (*PACKAGES, "proto", "tests", "deploy", "bench")
FILE_PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*\w\.(?:py|sql|proto|md|yaml|yml|toml|txt|sh|json))(?![\w/])"
)
DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)(?![\w/(-])")
METRIC_NAME = re.compile(r'"(runplane\.[\w.]+)"')


def _documents() -> Iterator[tuple[str, Path, str]]:
    """(where, its folder, text) of DESIGN.md, README.md and every docstring of the project's code and
    tests; a docstring may name a path from its own folder, as api/__init__.py does."""
    for name in ("DESIGN.md", "README.md"):
        yield name, ROOT, (ROOT / name).read_text()
    for top in (*PACKAGES, "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts[:2]:
                continue  # generated protobuf code
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    docstring = ast.get_docstring(node, clean=False)
                    if docstring:
                        yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", path.parent, docstring


@cache
def _metric_names() -> frozenset[str]:
    """Instrument names (``runplane.orchestrator.term``) read like dotted modules; they are not."""
    text = (ROOT / "runplane/adapters/instruments.py").read_text()
    return frozenset(METRIC_NAME.findall(text))


def _module_file(dotted: str) -> Path | None:
    base = ROOT / dotted.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


@cache
def _setting_names() -> frozenset[str]:
    """``runner.local_uid`` and the like: a settings group and one of its fields (``RUNPLANE_RUNNER__LOCAL_UID``)."""
    names: set[str] = set()
    for group, info in Settings.model_fields.items():
        fields = getattr(info.annotation, "model_fields", {})
        names.update(f"{group}.{name}" for name in fields)
    return frozenset(names)


@cache
def _proto_names() -> frozenset[str]:
    """The services and messages of ``runplane.v1`` (``runplane.v1.RunnerService``)."""
    found: set[str] = set()
    for path in (ROOT / "proto/runplane/v1").glob("*.proto"):
        found.update(re.findall(r"^(?:service|message|enum)\s+(\w+)", path.read_text(), re.MULTILINE))
    return frozenset(found)


def stale_dotted(dotted: str) -> str | None:
    """Why ``dotted`` names nothing (None: it names a module, or a name defined in one, or is not
    a module path at all: a metric's name, a setting, a REST field of the ``runplane`` object)."""
    parts = dotted.rstrip(".").split(".")
    if dotted in _metric_names() or ".".join(parts[:2]) in _setting_names():
        return None
    if parts[:2] == ["runplane", "v1"]:
        return None if len(parts) == 2 or parts[2] in _proto_names() else f"runplane.v1 has no {parts[2]!r}"
    if parts[0] == "runplane" and not (ROOT / "runplane" / parts[1]).is_dir():
        return None  # ``runplane.version``: the REST API's ``runplane`` object, or a metric's prefix
    for length in range(len(parts), 1, -1):
        module = _module_file(".".join(parts[:length]))
        if module is None:
            continue
        rest = parts[length:]
        if not rest or rest[0] in _top_level_names(module):
            return None
        return f"{'.'.join(parts[:length])} defines no {rest[0]!r}"
    return f"no module {'.'.join(parts[:2])}"


# It parses every module of the project: a few seconds of CPU alone, several times that on a machine
# busy with other test processes (the default timeout is for tests that wait, not ones that compute).
@pytest.mark.timeout(120)
def test_every_module_path_in_the_documentation_exists() -> None:
    stale: list[str] = []
    for where, folder, text in _documents():
        for path in FILE_PATH.findall(text):
            if not any((base / path).exists() for base in (folder, *folder.parents) if base.is_relative_to(ROOT)):
                stale.append(f"{where}: {path} does not exist")
        for dotted in DOTTED.findall(text):
            reason = stale_dotted(dotted)
            if reason is not None:
                stale.append(f"{where}: {dotted}: {reason}")
    assert not stale, "\n".join(stale)


def test_the_check_tells_a_stale_path_from_a_real_one() -> None:
    assert stale_dotted("runplane.basics.backoff") is None
    assert stale_dotted("runplane.basics.backoff.ceiling") is None
    assert stale_dotted("runplane.basics.no_such_module") is not None
    assert stale_dotted("runplane.basics.backoff.no_such_name") is not None
    assert FILE_PATH.findall("see `runner/fence.py` and orchestrator/decisions.py.") == [
        "runner/fence.py",
        "orchestrator/decisions.py",
    ]
