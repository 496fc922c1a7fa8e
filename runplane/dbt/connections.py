"""Warehouse connections: which profile fields each adapter takes, their types, and which are secret.

One home for the shape of a connection: the API validates an environment's connection with
:func:`typed_profile_fields` (a wrong type is ``INVALID_ARGUMENT`` naming the field), and the runner
turns the same stored text into the typed values of ``profiles.yml`` with it.

The field names are the adapters' own profile fields (dbt's setup page of each adapter, and the
``Credentials`` class of the installed adapter, which a test holds every name here against). The
secret ones — passwords, Snowflake's private key and its passphrase, BigQuery's service-account key
file JSON, Databricks' and MotherDuck's tokens, AWS secret keys — are stored encrypted, never
returned, and reach dbt only as ``DBT_ENV_SECRET_*`` variables that dbt scrubs from its logs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from runplane.basics.errors import RunplaneError
from runplane.dbt.warehouse_files import unkept_reason


class ConnectionFieldError(RunplaneError):
    """A connection field that is unknown, missing or of the wrong type; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


@dataclass(frozen=True)
class AdapterFields:
    required: frozenset[str]
    strings: frozenset[str]
    integers: frozenset[str]
    booleans: frozenset[str]
    secrets: frozenset[str]  # encrypted at rest; reach dbt as DBT_ENV_SECRET_* variables
    required_secrets: frozenset[str]
    choices: Mapping[str, frozenset[str]]
    profile_defaults: Mapping[str, str | int] = field(default_factory=dict)  # what the adapter insists on
    # A secret JSON object given to dbt as a file (0600, beside the run's profile): secret field ->
    # the profile field that names the file.
    file_secrets: Mapping[str, str] = field(default_factory=dict)
    # Fields naming a database file on the runner host, which every run of the environment must find
    # (``runplane.dbt.warehouse_files``).
    file_paths: frozenset[str] = frozenset()


_SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})

ADAPTERS: Mapping[str, AdapterFields] = {
    "postgres": AdapterFields(
        required=frozenset({"host", "user", "dbname"}),
        strings=frozenset({"host", "user", "dbname", "search_path", "role", "sslmode", "sslrootcert"}),
        integers=frozenset({"port", "connect_timeout", "keepalives_idle", "retries"}),
        booleans=frozenset(),
        secrets=frozenset({"password"}),
        required_secrets=frozenset(),
        choices={"sslmode": _SSL_MODES},
        # dbt-postgres requires the key even where the server trusts its clients.
        profile_defaults={"password": "", "port": 5432},
    ),
    "redshift": AdapterFields(
        required=frozenset({"host", "user", "dbname"}),
        strings=frozenset(
            {"host", "user", "dbname", "method", "sslmode", "cluster_id", "iam_profile", "region", "role"}
        ),
        integers=frozenset({"port", "connect_timeout", "retries"}),
        booleans=frozenset({"autocreate", "ra3_node", "is_serverless", "autocommit"}),
        secrets=frozenset({"password", "secret_access_key"}),
        required_secrets=frozenset(),
        choices={"method": frozenset({"database", "iam"}), "sslmode": _SSL_MODES},
        profile_defaults={"port": 5439},
    ),
    "snowflake": AdapterFields(
        required=frozenset({"account", "user", "database", "warehouse"}),
        strings=frozenset(
            {"account", "user", "database", "warehouse", "role", "authenticator", "query_tag", "host", "protocol"}
        ),
        integers=frozenset({"connect_retries", "connect_timeout", "port"}),
        booleans=frozenset({"client_session_keep_alive", "retry_on_database_errors", "retry_all", "reuse_connections"}),
        # Key-pair authentication: the PEM private key itself (not a path on some host) and its passphrase.
        secrets=frozenset({"password", "private_key", "private_key_passphrase", "token", "oauth_client_secret"}),
        required_secrets=frozenset(),
        choices={},
    ),
    "bigquery": AdapterFields(
        # The dataset is the environment's schema (dbt's ``schema``, of which ``dataset`` is another name).
        required=frozenset({"project"}),
        strings=frozenset({"project", "location", "priority", "execution_project", "impersonate_service_account"}),
        integers=frozenset(
            {"job_execution_timeout_seconds", "job_creation_timeout_seconds", "job_retries", "maximum_bytes_billed"}
        ),
        booleans=frozenset(),
        # A run has no gcloud login: it authenticates with the service account's key file JSON, which
        # dbt reads from a file (an object it does not take from a variable).
        secrets=frozenset({"keyfile_json"}),
        required_secrets=frozenset({"keyfile_json"}),
        choices={"priority": frozenset({"interactive", "batch"})},
        profile_defaults={"method": "service-account"},
        file_secrets={"keyfile_json": "keyfile"},
    ),
    "databricks": AdapterFields(
        required=frozenset({"host", "http_path"}),
        strings=frozenset({"host", "http_path", "catalog", "auth_type", "client_id"}),
        integers=frozenset({"connect_retries", "connect_timeout"}),
        booleans=frozenset(),
        secrets=frozenset({"token", "client_secret"}),
        required_secrets=frozenset(),
        choices={"auth_type": frozenset({"oauth"})},
    ),
    "duckdb": AdapterFields(
        # The database file; one per environment, on the runner host (or md:… for MotherDuck).
        required=frozenset({"path"}),
        strings=frozenset({"path", "database"}),
        integers=frozenset(),
        booleans=frozenset({"keep_open", "disable_transactions"}),
        secrets=frozenset({"motherduck_token"}),
        required_secrets=frozenset(),
        choices={},
        file_paths=frozenset({"path"}),
    ),
}

_TRUE = {"true", "1", "yes"}
# Integer fields with a narrower range than a 32-bit count: a TCP port is 1 to 65535 for every adapter.
INTEGER_RANGES = {"port": (1, 65535)}
_FALSE = {"false", "0", "no"}


def adapter_fields(adapter_type: str) -> AdapterFields:
    try:
        return ADAPTERS[adapter_type]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise ConnectionFieldError("adapter_type", f"{adapter_type!r} is not supported (supported: {known})") from None


def typed_profile_fields(adapter_type: str, fields: Mapping[str, str]) -> dict[str, str | int | bool]:
    """The non-secret fields with their profile types; raises ConnectionFieldError on bad input (the
    first of :func:`profile_field_problems`)."""
    problems = profile_field_problems(adapter_type, fields)
    if problems:
        raise problems[0]
    return typed_fields(adapter_type, fields)


def typed_fields(adapter_type: str, fields: Mapping[str, str]) -> dict[str, str | int | bool]:
    """Some of the non-secret fields (a required one may be missing) with their profile types;
    raises ConnectionFieldError on a bad one."""
    schema = adapter_fields(adapter_type)
    return {name: _typed(schema, adapter_type, name, value) for name, value in fields.items()}


def profile_field_problems(adapter_type: str, fields: Mapping[str, str]) -> list[ConnectionFieldError]:
    """Every refused non-secret field, each named, so that a form can show them all at once."""
    schema = adapter_fields(adapter_type)
    problems = []
    for name, value in fields.items():
        try:
            _typed(schema, adapter_type, name, value)
        except ConnectionFieldError as exc:
            problems.append(exc)
    problems.extend(
        ConnectionFieldError(f"fields[{name}]", "is required") for name in sorted(schema.required - set(fields))
    )
    return problems


def _typed(schema: AdapterFields, adapter_type: str, name: str, value: str) -> str | int | bool:
    field = f"fields[{name}]"
    if name in schema.secrets:
        raise ConnectionFieldError(field, "is a secret: send it in secret_fields")
    if name in schema.integers:
        try:
            number = int(value.strip())
        except ValueError:
            raise ConnectionFieldError(field, f"must be an integer (got {value[:40]!r})") from None
        low, high = INTEGER_RANGES.get(name, (0, 2**31 - 1))
        if not low <= number <= high:
            raise ConnectionFieldError(field, f"must be between {low} and {high} (got {number})")
        return number
    if name in schema.booleans:
        if value.lower() not in _TRUE | _FALSE:
            raise ConnectionFieldError(field, f"must be true or false (got {value[:40]!r})")
        return value.lower() in _TRUE
    if name in schema.strings:
        allowed = schema.choices.get(name)
        if allowed is not None and value not in allowed:
            raise ConnectionFieldError(field, f"must be one of {', '.join(sorted(allowed))}")
        if name in schema.file_paths and (reason := unkept_reason(value)) is not None:
            raise ConnectionFieldError(field, reason)
        return value
    known = ", ".join(sorted(schema.strings | schema.integers | schema.booleans))
    raise ConnectionFieldError(field, f"is not a {adapter_type} field (known: {known})")


def check_secret_fields(adapter_type: str, secrets: Mapping[str, str]) -> None:
    schema = adapter_fields(adapter_type)
    for name in secrets:
        if name not in schema.secrets:
            raise ConnectionFieldError(
                f"secret_fields[{name}]",
                f"is not a secret field of {adapter_type} (known: {', '.join(sorted(schema.secrets))})",
            )
    for name in sorted(schema.required_secrets - set(secrets)):
        raise ConnectionFieldError(f"secret_fields[{name}]", "is required")
    for name in sorted(set(schema.file_secrets) & set(secrets)):
        try:
            document = json.loads(secrets[name])
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise ConnectionFieldError(f"secret_fields[{name}]", "must be a JSON object (the key file's content)")


def secret_env_name(field: str) -> str:
    """The variable that carries a secret field to dbt; dbt scrubs ``DBT_ENV_SECRET_*`` from its logs."""
    return f"DBT_ENV_SECRET_RUNPLANE_{field.upper()}"
