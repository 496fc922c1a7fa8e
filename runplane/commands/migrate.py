"""Numbered SQL migrations, applied in order under an advisory lock, then the sealing of secrets.

Safe to run from several processes at once: the first takes the lock and applies what is missing,
the others wait for it and then find nothing to do.

Encrypting needs the secret keys, which SQL never sees, so a secret that an older version stored in
clear is sealed here, after the SQL, under the same lock: each call looks for such values and
encrypts what it finds (nothing, once done). Without keys it refuses to go on when there is one.

Projects saved before the repository rule (``runplane.basics.repository_urls``) may name a
repository it refuses; :func:`refused_repositories` lists them for ``runplane migrate`` to report
(their runs fail at checkout with the same reason until the project is changed).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg.types.json import Jsonb

from runplane.adapters.db import redact
from runplane.basics.errors import FailedPrecondition, ServiceUnavailable
from runplane.basics.repository_urls import RepositoryRule, RepositoryUrlRefused
from runplane.basics.secrets import SECRET_ENV_PREFIX, SecretBox, is_secret_name
from runplane.sql import load_queries

log = logging.getLogger(__name__)

# Any fixed 64-bit number; it names the "migrating" advisory lock.
_MIGRATION_LOCK_KEY = 0x72756E706C616E65  # "runplane"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
Q = load_queries("runplane.sql", "sealing.sql")
REPOSITORIES = load_queries("runplane.sql", "repositories.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    """Every migration shipped with runplane, in order."""
    found: list[Migration] = []
    folder = resources.files("runplane.sql").joinpath("migrations")
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


def migrate(database_url: str, box: SecretBox | None = None, *, until: int | None = None) -> list[int]:
    """Apply missing migrations, then seal secrets stored in clear with ``box``; returns the versions
    applied by this call. ``until`` stops after that version, before any sealing (a schema as an
    older runplane left it)."""
    try:
        conn = psycopg.connect(database_url, autocommit=True)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc
    applied_now: list[int] = []
    with conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            try:
                done: dict[int, str] = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
            except psycopg.errors.UndefinedColumn as exc:
                raise FailedPrecondition(
                    f"{redact(database_url)} was made by an older version of runplane. "
                    "Use a new database (or drop this one) and run `runplane migrate` again."
                ) from exc
            for migration in migrations():
                if until is not None and migration.version > until:
                    break
                if migration.version in done:
                    # An applied migration whose text changed means this schema is not the one the code
                    # expects; going on would fail later, far from the cause.
                    if done[migration.version] != migration.checksum:
                        raise FailedPrecondition(
                            f"migration {migration.version:04d}_{migration.name} differs from the one applied to "
                            f"{redact(database_url)}: the database was made by another version of runplane. "
                            "Use a new database (or drop this one) and run `runplane migrate` again."
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                log.info("applied migration", extra={"version": migration.version, "migration": migration.name})
                applied_now.append(migration.version)
            if until is None:
                seal_environment_secrets(conn, box)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK_KEY,))
    return applied_now


def seal_environment_secrets(conn: psycopg.Connection[tuple[object, ...]], box: SecretBox | None) -> int:
    """Move the secret variables (``DBT_ENV_SECRET_*``) that environments hold in clear to their
    encrypted column (an empty one is dropped: empty means unset); the number of environments changed."""
    with conn.transaction():
        found = conn.execute(Q["environments_with_plaintext_secrets"], {"prefix": SECRET_ENV_PREFIX}).fetchall()
        if found and box is None:
            raise FailedPrecondition(
                f"{len(found)} environments hold secret variables in clear, and encrypting them needs "
                "RUNPLANE_SECRET_KEYS: set it and run `runplane migrate` again"
            )
        for environment_id, variables in found:
            assert box is not None and isinstance(variables, dict)
            secrets = {str(k): str(v) for k, v in variables.items() if is_secret_name(str(k))}
            conn.execute(
                Q["seal_environment_secrets"],
                {
                    "environment_id": environment_id,
                    "names": sorted(secrets),
                    "sealed": Jsonb({name: box.encrypt(value) for name, value in secrets.items() if value}),
                },
            )
    if found:
        log.info("sealed environments' secret variables", extra={"environments": len(found)})
    return len(found)


@dataclass(frozen=True)
class RefusedRepository:
    project_id: int
    account_id: int
    repository_url: str
    reason: str

    def __str__(self) -> str:
        return f"project {self.project_id} of account {self.account_id}: repository_url refused: {self.reason}"


def refused_repositories(database_url: str, rule: RepositoryRule) -> list[RefusedRepository]:
    """Stored projects whose repository the rule refuses from its URL alone (a host name is resolved
    when a run clones it, not here)."""
    try:
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(REPOSITORIES["project_repositories"]).fetchall()
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(database_url)}: {exc}") from exc
    refused: list[RefusedRepository] = []
    for project_id, account_id, url in rows:
        try:
            rule.check(str(url))
        except RepositoryUrlRefused as exc:
            refused.append(RefusedRepository(int(project_id), int(account_id), str(url), str(exc)))
    return refused


def ensure_database(database_url: str) -> bool:
    """Create the database named in the URL if it does not exist; True when it was created."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    name = str(info.get("dbname") or "")
    if not name:
        return False
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists:
                return False
            try:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                return False
            return True
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach Postgres at {redact(admin)}: {exc}") from exc
