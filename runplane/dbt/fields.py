"""The rules of a dbt run's fields — target name, schema, dbt version, git SHA, threads — one each,
for a job's settings, an environment, a run's overrides and what a runner reports alike, so a value
one of them accepts is never refused by another.

Each check takes the value as sent ("" or 0: not set, left to the caller's default) and the name the
caller's client knows the field by, and returns the value to store or raises ``InvalidArgument``.
"""

from __future__ import annotations

import re

from runplane.basics.errors import InvalidArgument

MAX_THREADS = 64
DEFAULT_THREADS = 4  # when neither the run, the job nor the environment says
DEFAULT_TARGET_NAME = "default"
MAX_DBT_VERSION = 128

# A SQL identifier as Postgres keeps it whole (63 bytes); dbt quotes nothing else into DDL.
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_TARGET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# A dbt version as the runners know it (RUNPLANE_RUNNER__DBT_VERSIONS), or a runner image tag.
_DBT_VERSION = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:@/+-]{{0,{MAX_DBT_VERSION - 1}}}")
_GIT_SHA = re.compile(r"[0-9a-f]{7,64}")


def schema(value: str, name: str = "schema") -> str:
    return _matching(value, name, _SCHEMA, "a SQL identifier of at most 63 characters")


def target_name(value: str, name: str = "target_name") -> str:
    return _matching(value, name, _TARGET_NAME, "up to 64 letters, digits, _ . - not starting with . or -")


def dbt_version(value: str, name: str = "dbt_version") -> str:
    return _matching(value, name, _DBT_VERSION, "a version or image tag: letters, digits, _ . : @ / + -")


def git_sha(value: str, name: str = "git_sha") -> str:
    """A commit as git names it: 7 to 64 hex digits, kept in lower case."""
    return _matching(value.lower(), name, _GIT_SHA, "7 to 64 hex digits")


def threads(value: int, name: str = "threads", *, unset: bool = True) -> int:
    """1 to ``MAX_THREADS``; or 0, not set, where the caller has a default (``unset``)."""
    low = 0 if unset else 1
    if not low <= value <= MAX_THREADS:
        raise InvalidArgument(name, f"must be between {low} and {MAX_THREADS} (got {value})")
    return value


def _matching(value: str, name: str, pattern: re.Pattern[str], allowed: str) -> str:
    if value and not pattern.fullmatch(value):
        raise InvalidArgument(name, f"{value[:80]!r} is not valid ({allowed})")
    return value
