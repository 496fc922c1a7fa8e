"""A ``profiles.yml`` for one run: the environment's connection with the run's target, schema, threads.

It is written outside the repository (the runner's own directory for the run, removed after it),
so nothing of it can be committed, served as an artifact or read by a later run. Secret fields
never enter the file: it names ``DBT_ENV_SECRET_*`` variables that the dbt steps get, which dbt
itself also scrubs from its logs; a secret JSON object that dbt reads only from a file (BigQuery's
service-account key) is a file of its own beside the profile, private to the run's uid.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from runplane.basics.errors import RunplaneError
from runplane.dbt.connections import (
    ConnectionFieldError,
    adapter_fields,
    check_secret_fields,
    secret_env_name,
    typed_profile_fields,
)
from runplane.dbt.context import DbtContext


class ProjectError(RunplaneError):
    """The checkout holds no usable dbt project, or the environment's connection cannot make a profile."""


@dataclass(frozen=True)
class Profile:
    directory: Path  # for DBT_PROFILES_DIR
    name: str
    environment: Mapping[str, str]  # the secret variables the profile refers to


def project_directory(checkout: Path, subdirectory: str) -> Path:
    """Where ``dbt_project.yml`` is; ProjectError when it is not there."""
    project = (checkout / subdirectory).resolve() if subdirectory else checkout
    if not project.is_relative_to(checkout.resolve()):
        raise ProjectError(f"subdirectory {subdirectory!r} is outside the repository")
    if not (project / "dbt_project.yml").is_file():
        where = f"subdirectory {subdirectory!r}" if subdirectory else "the repository's root"
        raise ProjectError(f"no dbt_project.yml in {where}: set the project's subdirectory to where it is")
    return project


def profile_name(project: Path) -> str:
    """The ``profile:`` that ``dbt_project.yml`` asks for."""
    try:
        document = yaml.safe_load((project / "dbt_project.yml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProjectError(f"dbt_project.yml cannot be read: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("profile"), str) or not document["profile"]:
        raise ProjectError("dbt_project.yml names no profile (its 'profile:' key)")
    return str(document["profile"])


def write_profile(context: DbtContext, project: Path, directory: Path) -> Profile:
    """Write ``directory/profiles.yml`` for the run; ``directory`` must be outside the repository."""
    name = profile_name(project)
    try:
        output: dict[str, object] = dict(typed_profile_fields(context.adapter_type, context.connection))
        check_secret_fields(context.adapter_type, context.connection_secrets)
    except ConnectionFieldError as exc:
        raise ProjectError(f"the environment's connection: {exc}") from exc
    schema = adapter_fields(context.adapter_type)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    environment = {}
    for field in sorted(context.connection_secrets):
        value = context.connection_secrets[field]
        if field in schema.file_secrets:  # a JSON object dbt reads from a file of this run's own
            output[schema.file_secrets[field]] = str(_private_file(directory / f"{field}.json", value))
            continue
        variable = secret_env_name(field)
        output[field] = "{{ env_var('" + variable + "') }}"
        environment[variable] = value
    for field, default in schema.profile_defaults.items():
        output.setdefault(field, default)
    output.update(type=context.adapter_type, schema=context.schema, threads=context.threads)
    profiles = {name: {"target": context.target_name, "outputs": {context.target_name: output}}}
    _private_file(directory / "profiles.yml", yaml.safe_dump(profiles, sort_keys=True))
    return Profile(directory, name, environment)


def _private_file(path: Path, text: str) -> Path:
    """``path`` with ``text``, readable by this uid alone from its creation."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
