"""What a form sends, read as the APIs' requests expect it, and the APIs' errors put back next to the
field that caused them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from runplane.basics.errors import InvalidArgument, InvalidArguments, Problems
from runplane.basics.secrets import is_secret_name
from runplane.dbt.connections import adapter_fields

_CONNECTION_FIELD = re.compile(r"connection\.(?:secret_)?fields\[(\w+)\]")


def lines(value: str) -> list[str] | None:
    """The non-empty lines of a text area, stripped; None for none."""
    out = [line.strip() for line in value.splitlines() if line.strip()]
    return out or None


def number(value: str, name: str) -> int | None:
    """A whole number typed into a field; None when it was left empty."""
    if not value.strip():
        return None
    if not re.fullmatch(r"-?\d{1,18}", value.strip()):
        raise InvalidArgument(name, f"{value.strip()[:20]!r} is not a whole number")
    return int(value)


def checked_number(value: str, name: str, problems: Problems) -> int:
    """A whole number typed into a field (0 when empty); a refusal is kept in ``problems`` (and 0 used),
    so that the form's other fields are checked too."""
    return problems.check(lambda: number(value, name), None) or 0


def variables(value: str, name: str) -> dict[str, str]:
    """``NAME=value`` lines (empty lines skipped); the value may hold further ``=`` signs."""
    out: dict[str, str] = {}
    for i, line in enumerate(value.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, rest = line.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(name, f"line {i} is not NAME=value")
        out[key.strip()] = rest
    return out


def without_secret_lines(value: str) -> str:
    """A variables text area without its secret (``DBT_ENV_SECRET_*``) lines: what a refused form
    shows again, so that a secret typed is never sent back."""
    return "\n".join(line for line in value.splitlines() if not is_secret_name(line.strip()))


def secret_lines(value: str) -> list[str]:
    """The names of the secret variables a text area sets to a value (unsetting lines excluded)."""
    names = []
    for line in value.splitlines():
        key, sep, rest = line.partition("=")
        if sep and is_secret_name(key.strip()) and rest:
            names.append(key.strip())
    return names


def field_of(api_field: str) -> str:
    """The form field an API error names: ``settings.threads`` → ``threads``, ``steps[2]`` → ``steps``,
    ``connection.fields[host]`` → ``conn_host``."""
    connection = _CONNECTION_FIELD.fullmatch(api_field)
    if connection:
        return f"conn_{connection.group(1)}"
    return api_field.split("[", 1)[0].rsplit(".", 1)[-1]


@dataclass
class FormErrors:
    """The errors of one submitted form: by field when the form has it, else for the whole form."""

    fields: dict[str, str] = field(default_factory=dict)
    general: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, exc: InvalidArgument, known: set[str], aliases: dict[str, str] | None = None) -> FormErrors:
        """Every field the refusal names (``InvalidArguments``: several at once) at its field when the form
        has it; ``aliases`` maps the API's name of a field to the form's where they differ."""
        errors = cls()
        for problem in exc.problems if isinstance(exc, InvalidArguments) else [exc]:
            name = field_of(problem.field)
            name = (aliases or {}).get(name, name)
            message = str(problem).removeprefix(f"{problem.field}: ")
            if name in known and name not in errors.fields:
                errors.fields[name] = message
            else:
                errors.general.append(f"{problem.field}: {message}")
        return errors


@dataclass(frozen=True)
class ConnectionInput:
    """One field of an environment's warehouse connection on its form (``conn_<field>``)."""

    field: str
    kind: str  # text, number, choice, secret, secret_file
    required: bool
    options: tuple[tuple[str, str], ...] = ()
    is_set: bool = False  # a secret the environment holds (never shown)

    @property
    def name(self) -> str:
        return f"conn_{self.field}"

    @property
    def label(self) -> str:
        return _LABELS.get(self.field) or self.field.replace("_", " ").capitalize()


_LABELS = {
    "dbname": "Database",
    "sslmode": "SSL mode",
    "sslrootcert": "SSL root certificate",
    "http_path": "HTTP path",
    "keyfile_json": "Service account key file (JSON)",
    "motherduck_token": "MotherDuck token",
    "iam_profile": "IAM profile",
    "ra3_node": "RA3 node",
}


def connection_inputs(adapter_type: str, secrets_set: Iterable[str]) -> list[ConnectionInput]:
    """The form's inputs for an adapter's connection, from the one description of its profile fields:
    required ones first, then the rest by name, then the secrets (write-only)."""
    schema = adapter_fields(adapter_type)
    held = set(secrets_set)
    plain = sorted(schema.strings | schema.integers | schema.booleans, key=lambda f: (f not in schema.required, f))
    inputs = []
    for name in plain:
        choices = schema.choices.get(name)
        if name in schema.booleans:
            choices = frozenset({"true", "false"})
        if choices:
            options = (("", "default"), *((c, c) for c in sorted(choices)))
            inputs.append(ConnectionInput(name, "choice", name in schema.required, options))
        else:
            kind = "number" if name in schema.integers else "text"
            inputs.append(ConnectionInput(name, kind, name in schema.required))
    for name in sorted(schema.secrets):
        kind = "secret_file" if name in schema.file_secrets else "secret"
        inputs.append(ConnectionInput(name, kind, name in schema.required_secrets, is_set=name in held))
    return inputs
