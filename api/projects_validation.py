"""Checking projects and environments before anything is written.

Each check raises ``InvalidArgument`` naming the offending field; what passes becomes a plain spec
with its secrets still in clear text, which only the service encrypts before the store sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath

from api.validation import MAX_NAME, Variables, git_branch, positive_id, split_variables, text
from runplane.basics.errors import InvalidArgument, Problems
from runplane.basics.repository_urls import MAX_URL, RepositoryRule, RepositoryUrlRefused
from runplane.dbt import fields
from runplane.dbt.connections import (
    ConnectionFieldError,
    adapter_fields,
    check_secret_fields,
    profile_field_problems,
)
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles, WarehousePathRefused, is_file
from runplane.v1 import projects_pb2

MAX_CREDENTIAL = 16 * 1024
MAX_SUBDIRECTORY = 1024
MAX_FIELD_VALUE = 1024

CREDENTIAL_KINDS = {
    projects_pb2.GIT_CREDENTIAL_KIND_UNSPECIFIED: "none",
    projects_pb2.GIT_CREDENTIAL_KIND_TOKEN: "token",
    projects_pb2.GIT_CREDENTIAL_KIND_SSH_KEY: "ssh_key",
}
ENVIRONMENT_TYPES = {
    projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT: "deployment",
    projects_pb2.ENVIRONMENT_TYPE_DEVELOPMENT: "development",
}


@dataclass(frozen=True)
class ProjectSpec:
    name: str
    repository_url: str
    subdirectory: str
    credential_kind: str
    credential: str = field(repr=False)


@dataclass(frozen=True)
class CredentialsValues:
    """A project's warehouse credentials as stored: ``secrets`` hold ciphertext."""

    project_id: int
    adapter_type: str
    details: dict[str, str]
    secrets: dict[str, str] = field(repr=False)
    schema_name: str
    threads: int
    target_name: str


@dataclass(frozen=True)
class EnvironmentExtras:
    """What dbt Cloud's environments carry besides runplane's: a description, production or staging
    (or None), and the connection and credentials the environment was made from (None: inline)."""

    description: str = ""
    deployment_type: str | None = None
    connection_id: int | None = None
    credentials_id: int | None = None


@dataclass(frozen=True)
class EnvironmentSpec:
    project_id: int
    name: str
    environment_type: str
    dbt_version: str
    git_branch: str
    adapter_type: str
    connection: dict[str, str]
    connection_secrets: dict[str, str] = field(repr=False)
    target_name: str
    schema: str
    threads: int
    variables: Variables  # plain ones stored in clear, secret ones set and unset apart
    warehouse_directory: str = ""  # the environment's own directory holding its warehouse file, if any


def repository_url(value: str, name: str, rule: RepositoryRule) -> str:
    """A repository the rule allows (``runplane.basics.repository_urls``), judged from the URL alone;
    :func:`reachable_repository` then checks what its host resolves to."""
    value = text(value.strip(), name, max_length=MAX_URL, required=True)
    try:
        rule.check(value)
    except RepositoryUrlRefused as exc:
        raise InvalidArgument(name, str(exc)) from exc
    return value


async def reachable_repository(rule: RepositoryRule, url: str, name: str = "repository_url") -> None:
    """Refuse a repository whose host resolves, now, to an address the rule refuses."""
    try:
        await rule.reachable(url)
    except RepositoryUrlRefused as exc:
        raise InvalidArgument(name, str(exc)) from exc


def project_spec(
    request: projects_pb2.CreateProjectRequest | projects_pb2.UpdateProjectRequest,
    rule: RepositoryRule,
    *,
    stored_kind: str | None = None,
) -> ProjectSpec:
    """The project a create (or, with the ``stored_kind`` of its credential, an update) asks for.

    On an update an empty credential of the stored kind keeps the stored credential: the spec's
    ``credential`` is then empty and the caller keeps what is stored.
    """
    problems = Problems()
    name = problems.check(lambda: text(request.name.strip(), "name", max_length=MAX_NAME, required=True), "")
    url = problems.check(lambda: repository_url(request.repository_url, "repository_url", rule), "")
    subdirectory = problems.check(lambda: _subdirectory(request.subdirectory), "")
    kind = CREDENTIAL_KINDS.get(request.git_credential_kind)
    if kind is None:
        problems.found.append(InvalidArgument("git_credential_kind", "must be unspecified (none), token or ssh_key"))
    else:
        problems.check(lambda: _credential(request.git_credential, kind, url, stored_kind), None)
    problems.raise_any()
    assert kind is not None
    credential = request.git_credential
    return ProjectSpec(name, url, subdirectory, kind, credential)


def _subdirectory(value: str) -> str:
    subdirectory = text(value.strip().strip("/"), "subdirectory", max_length=MAX_SUBDIRECTORY)
    if subdirectory and (PurePosixPath(subdirectory).is_absolute() or ".." in PurePosixPath(subdirectory).parts):
        raise InvalidArgument("subdirectory", "must be a relative path inside the repository")
    return subdirectory


def _credential(value: str, kind: str, url: str, stored_kind: str | None) -> None:
    """A credential of its kind, for a repository it works with; empty keeps a stored one of the kind."""
    credential = text(value, "git_credential", max_length=MAX_CREDENTIAL, single_line=False)
    if kind == "none" and credential:
        raise InvalidArgument("git_credential", "is set but git_credential_kind is not: say token or ssh_key")
    keeps = stored_kind == kind and not credential
    if kind != "none" and not credential.strip() and not keeps:
        raise InvalidArgument("git_credential", f"must be set for git_credential_kind {kind}")
    if kind == "token" and url and not url.startswith(("https://", "http://")):
        raise InvalidArgument("git_credential_kind", "a token works with https:// repositories only")
    if kind == "ssh_key" and not keeps and "BEGIN" not in credential:
        raise InvalidArgument("git_credential", "must be a private key in OpenSSH or PEM format")


def environment_spec(
    request: projects_pb2.CreateEnvironmentRequest | projects_pb2.UpdateEnvironmentRequest,
    *,
    versions: InstalledDbtVersions,
    warehouses: WarehouseFiles,
    project_id: int = 0,
) -> EnvironmentSpec:
    """The environment a create asks for, or an update of one in ``project_id``, whose dbt version is
    one of the installed ``versions`` (any when they name none) and whose warehouse file, if it names
    one, is where ``warehouses`` lets runs keep it. Every refused field is named in one
    ``InvalidArgument`` (``InvalidArguments`` for several)."""
    problems = Problems()
    directory = ""
    if isinstance(request, projects_pb2.CreateEnvironmentRequest):
        project_id = problems.check(lambda: positive_id(request.project_id, "project_id"), 0)
    name = problems.check(lambda: text(request.name.strip(), "name", max_length=MAX_NAME, required=True), "")
    environment_type = ENVIRONMENT_TYPES.get(request.environment_type, "")
    if not environment_type:
        problems.found.append(InvalidArgument("environment_type", "must be deployment or development"))
    dbt_version = problems.check(
        lambda: fields.dbt_version(
            text(request.dbt_version.strip(), "dbt_version", max_length=fields.MAX_DBT_VERSION, required=True)
        ),
        "",
    )
    problems.check(lambda: versions.check(dbt_version, "dbt_version"), None)  # a malformed one is refused above
    connection = request.connection
    if not request.HasField("connection"):
        problems.found.append(InvalidArgument("connection", "is required"))
    adapter_type = connection.adapter_type.strip()
    profile_fields = {
        k: problems.check(partial(text, v, f"connection.fields[{k}]", max_length=MAX_FIELD_VALUE), "")
        for k, v in connection.fields.items()
    }
    secrets = {
        k: problems.check(
            partial(text, v, f"connection.secret_fields[{k}]", max_length=MAX_CREDENTIAL, single_line=False), ""
        )
        for k, v in connection.secret_fields.items()
    }
    if request.HasField("connection"):
        try:
            refused = profile_field_problems(adapter_type, profile_fields)
            check_secret_fields(adapter_type, secrets)
        except ConnectionFieldError as exc:
            refused = [exc]
        problems.found.extend(InvalidArgument(f"connection.{exc.field}", exc.reason) for exc in refused)
        if not refused:
            directory = problems.check(lambda: _warehouse_directory(adapter_type, profile_fields, warehouses), "")
    schema = problems.check(
        lambda: fields.schema(text(request.schema.strip(), "schema", max_length=63, required=True)), ""
    )
    target_name = problems.check(
        lambda: fields.target_name(request.target_name.strip() or fields.DEFAULT_TARGET_NAME),
        fields.DEFAULT_TARGET_NAME,
    )
    threads = problems.check(lambda: fields.threads(request.threads), 0) or fields.DEFAULT_THREADS
    branch = problems.check(lambda: git_branch(request.git_branch.strip(), "git_branch"), "")
    variables = problems.check(lambda: split_variables(dict(request.variables), "variables"), Variables({}, {}, []))
    problems.raise_any()
    return EnvironmentSpec(
        project_id=project_id,
        name=name,
        environment_type=environment_type,
        dbt_version=dbt_version,
        git_branch=branch,
        adapter_type=adapter_type,
        connection=profile_fields,
        connection_secrets={k: v for k, v in secrets.items() if v},
        target_name=target_name,
        schema=schema,
        threads=threads,
        variables=variables,
        warehouse_directory=directory,
    )


def _warehouse_directory(adapter_type: str, profile_fields: dict[str, str], warehouses: WarehouseFiles) -> str:
    """The directory of the environment's warehouse file ("" when it names none), where runs keep it."""
    for name in sorted(adapter_fields(adapter_type).file_paths):
        path = profile_fields.get(name, "")
        if not is_file(path):
            continue
        try:
            return warehouses.directory(path)
        except WarehousePathRefused as exc:
            raise InvalidArgument(f"connection.fields[{name}]", str(exc)) from exc
    return ""
