"""The Dockerfiles as text: their entry points exist in the package, and they run non-root.

The images are built for real (deploy/k8s-local/images.sh) and run in Pods in tests/system/test_kubernetes_pods.py.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from runplane.commands.cli import _parser

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


def test_runner_image_pins_dbt_and_its_command_parses() -> None:
    path = DOCKER / "Dockerfile.runner"
    installs = " ".join(value for key, value in instructions(path) if key == "RUN")
    assert re.search(r'"dbt-core==\d+\.\d+\.\d+"', installs)
    assert re.search(r'"dbt-postgres==\d+\.\d+\.\d+"', installs)
    args = _parser().parse_args(["runner", "--run-id", "42"])  # the command every run Pod runs
    assert (args.command, args.run_id) == ("runner", 42)
    for command in ("api", "orchestrator", "queuer-worker", "scheduler", "dispatcher", "migrate"):
        assert _parser().parse_args([command]).command == command  # what the chart's Deployments run
