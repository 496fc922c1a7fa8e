"""The Dockerfiles as text: their entry points exist in the package, and they run non-root.

The images are built for real (deploy/k8s-local/images.sh) and run in Pods in tests/system/test_kubernetes_pods.py.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from runplane.commands.cli import _parser
from runplane.dbt.connections import ADAPTERS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def last(path: Path, keyword: str) -> str:
    values = [value for key, value in instructions(path) if key == keyword]
    assert values, f"{path.name} has no {keyword}"
    return values[-1]


def exec_form(value: str) -> list[str]:
    assert value.startswith("["), "exec form, so signals reach runplane"
    return [part.strip().strip('"') for part in value.strip("[]").split(",")]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.runner"])
def test_images_run_the_runplane_console_script_as_non_root(name: str) -> None:
    path = DOCKER / name
    assert exec_form(last(path, "ENTRYPOINT")) == ["runplane"]
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts["runplane"] == "runplane.commands.cli:main"
    user = last(path, "USER").split(":")[0]
    assert user not in ("root", "0") and int(user) >= 1000


def test_control_plane_image_is_python_311_slim_by_default_and_installs_every_package() -> None:
    path = DOCKER / "Dockerfile"
    args = dict(value.split("=", 1) for key, value in instructions(path) if key == "ARG" and "=" in value)
    assert (
        args["PYTHON_IMAGE"] == "python:3.11-slim"
    )  # the images built here replace it (tests/system/test_kubernetes_pods.py)
    froms = [value for key, value in instructions(path) if key == "FROM"]
    assert all(value.split()[0] == "${PYTHON_IMAGE}" for value in froms)
    copied = {shlex.split(value)[0] for key, value in instructions(path) if key == "COPY" and "--from" not in value}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied


def make_variable(name: str) -> str:
    """A ``NAME := value`` of the Makefile, with the ``$(OTHER)`` it names expanded."""
    makefile = (ROOT / "Makefile").read_text()
    found = re.search(rf"^{name} := (.+)$", makefile, re.MULTILINE)
    assert found, f"the Makefile sets no {name}"
    return re.sub(r"\$\((\w+)\)", lambda m: make_variable(m.group(1)), found.group(1).strip())


def in_build_context(path: str) -> bool:
    """Whether .dockerignore lets ``path`` into the build context: the last pattern matching it or a
    folder above it decides, a ``!`` pattern letting it in."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for pattern in (p for p in patterns if p and not p.startswith("#")):
        if any(fnmatch.fnmatchcase(prefix, pattern.lstrip("!")) for prefix in prefixes):
            included = pattern.startswith("!")
    return included


def test_runner_image_installs_the_dbt_requirements_make_installs_and_its_command_parses() -> None:
    path = DOCKER / "Dockerfile.runner"
    # One list of dbt and its adapters for a run on one machine (`make .venv-dbt`) and in a Pod.
    requirements = make_variable("DBT_REQUIREMENTS")
    dbt_version = make_variable("DBT_VERSION")
    args = dict(value.split("=", 1) for key, value in instructions(path) if key == "ARG" and "=" in value)
    assert args["DBT_VERSION"] == dbt_version
    copies = [shlex.split(v) for k, v in instructions(path) if k == "COPY" and "--from" not in v]
    (source, dest), *_ = [c for c in copies if "dbt" in c[0]]
    assert source.replace("${DBT_VERSION}", args["DBT_VERSION"]) == requirements
    assert (ROOT / requirements).is_file() and in_build_context(requirements)
    assert not in_build_context("tests/conftest.py") and in_build_context("runner/__init__.py")
    installs = " ".join(value for key, value in instructions(path) if key == "RUN")
    assert f"pip install --no-cache-dir -r {dest}" in installs
    assert "dbt-core" not in installs  # no second list beside the file
    pins = [line.strip() for line in (ROOT / requirements).read_text().splitlines() if line.strip()[:1] not in "#"]
    assert all(re.fullmatch(r"dbt-[a-z]+~=\d+\.\d+\.\d+", pin) for pin in pins), pins
    # Every adapter runplane writes profiles for, beside dbt-core.
    assert {pin.split("~=")[0] for pin in pins} == {"dbt-core", *(f"dbt-{adapter}" for adapter in ADAPTERS)}
    # The runner in a Pod finds that dbt by the environment's dbt version.
    env = dict(word.split("=", 1) for word in shlex.split(last(path, "ENV")))
    versions = json.loads(env["RUNPLANE_RUNNER__DBT_VERSIONS"].replace("${DBT_VERSION}", args["DBT_VERSION"]))
    assert versions == {dbt_version: "/opt/dbt/bin"} and "/opt/dbt/bin" in env["PATH"].split(":")
    parsed = _parser().parse_args(["runner", "--run-id", "42"])  # the command every run Pod runs
    assert (parsed.command, parsed.run_id) == ("runner", 42)
    for command in ("api", "orchestrator", "queuer-worker", "scheduler", "dispatcher", "migrate"):
        assert _parser().parse_args([command]).command == command  # what the chart's Deployments run
