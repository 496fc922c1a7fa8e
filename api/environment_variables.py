"""A project's environment variables at dbt Cloud's three levels: project default, environment
value, job override.

runplane keeps an environment's values on the environment and a job's overrides on the job, where
the runs read them; project defaults are the project's (``project_variables``). What dbt Cloud's
v3 calls add is an id for each value (``environment_variable_ids``), given to a name at a level the
first time it is shown or set. ``DBT_ENV_SECRET_*`` values are encrypted, never answered: they show
as ``**********`` at every level, to every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.store import Store
from api.validation import environment
from runplane.adapters.db import Connection, fetch_all, fetch_one
from runplane.basics.errors import InvalidArgument, NotFound
from runplane.basics.secrets import SecretBox, is_secret_name
from runplane.basics.types import AccountId
from runplane.sql import load_queries

Q = load_queries("api", "environment_variables.sql")
LEVELS = ("project", "environment", "job")
HIDDEN = "**********"
NAME_PREFIX = "DBT_"


@dataclass(frozen=True, slots=True)
class VariableId:
    id: int
    project_id: int
    name: str
    level: str
    scope_id: int


@dataclass(frozen=True)
class Value:
    """One value of a variable as an answer shows it (a secret's hidden)."""

    id: int
    value: str


@dataclass(frozen=True)
class SavedVariable:
    """A value just set: dbt Cloud's answer to a create or an update."""

    id: int
    account_id: AccountId
    project_id: int
    name: str
    type: str
    environment_id: int | None
    job_definition_id: int | None
    display_value: str


@dataclass(frozen=True, slots=True)
class _NewId:
    id: int


@dataclass(frozen=True, slots=True)
class _ProjectVariable:
    name: str
    value: str
    secret: bool


@dataclass(frozen=True, slots=True)
class _Environment:
    id: int
    name: str
    variables: dict[str, Any]
    secret_variables: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Job:
    id: int
    environment_id: int
    environment: dict[str, Any]
    secret_environment: dict[str, Any]
    environment_variables: dict[str, Any]
    environment_secret_variables: dict[str, Any]


def checked_name(name: str) -> str:
    if not name.startswith(NAME_PREFIX) or name.upper() != name:
        raise InvalidArgument("name", f"{name[:80]!r}: a variable's name starts with DBT_ and is upper case")
    environment({name: ""}, "name")
    return name


class EnvironmentVariables:
    def __init__(self, store: Store, box: SecretBox | None) -> None:
        self._store = store
        self._box = box

    async def by_environment(
        self, account_id: AccountId, project_id: int
    ) -> tuple[list[str], dict[str, dict[str, Value]]]:
        """Every variable of the project with its default and its value in each environment (by name)."""
        async with self._store.transaction() as conn:
            await self._project(conn, account_id, project_id)
            variables = await self._project_defaults(conn, account_id, project_id)
            environments = await self._environments(conn, account_id, project_id)
            for env in environments:
                for name, value, secret in _values(env.variables, env.secret_variables):
                    variables.setdefault(name, {})[env.name] = await self._value(
                        conn,
                        account_id=account_id,
                        project_id=project_id,
                        name=name,
                        level="environment",
                        scope_id=env.id,
                        value=value,
                        secret=secret,
                    )
        return ["project", *(e.name for e in environments)], dict(sorted(variables.items()))

    async def of_job(self, account_id: AccountId, project_id: int, job_id: int) -> dict[str, dict[str, Value]]:
        """Every variable a job of the project sees, with its default, its environment's value and the
        job's override, each where it is set."""
        async with self._store.transaction() as conn:
            await self._project(conn, account_id, project_id)
            job = await self._job(conn, account_id, project_id, job_id)
            variables = await self._project_defaults(conn, account_id, project_id)
            levels = (
                ("environment", job.environment_id, job.environment_variables, job.environment_secret_variables),
                ("job", job.id, job.environment, job.secret_environment),
            )
            for level, scope_id, plain, secret in levels:
                for name, value, is_secret in _values(plain, secret):
                    variables.setdefault(name, {})[level] = await self._value(
                        conn,
                        account_id=account_id,
                        project_id=project_id,
                        name=name,
                        level=level,
                        scope_id=scope_id,
                        value=value,
                        secret=is_secret,
                    )
        return dict(sorted(variables.items()))

    async def set(
        self,
        account_id: AccountId,
        project_id: int,
        *,
        name: str,
        level: str,
        scope_id: int,
        value: str,
    ) -> SavedVariable:
        """Set ``name`` at ``level`` (the environment's or job's id in ``scope_id``; 0 for the project)."""
        name = checked_name(name)
        if level not in LEVELS:
            raise InvalidArgument("type", f"{level[:20]!r} is not one of project, environment, job")
        if not value:
            raise InvalidArgument("raw_value", "give the variable's value (delete it to remove it)")
        environment({name: value}, "raw_value")
        async with self._store.transaction() as conn:
            await self._project(conn, account_id, project_id)
            return await self._set(
                conn,
                account_id=account_id,
                project_id=project_id,
                name=name,
                level=level,
                scope_id=scope_id,
                value=value,
            )

    async def update(self, account_id: AccountId, project_id: int, variable_id: int, value: str) -> SavedVariable:
        """A new value for the variable ``variable_id`` names (its name and level stay)."""
        async with self._store.transaction() as conn:
            known = await self._known(conn, account_id, project_id, variable_id)
            if not value:
                raise InvalidArgument("raw_value", "give the variable's value (delete it to remove it)")
            environment({known.name: value}, "raw_value")
            return await self._set(
                conn,
                account_id=account_id,
                project_id=project_id,
                name=known.name,
                level=known.level,
                scope_id=known.scope_id,
                value=value,
            )

    async def delete(self, account_id: AccountId, project_id: int, variable_id: int) -> None:
        async with self._store.transaction() as conn:
            known = await self._known(conn, account_id, project_id, variable_id)
            await self._unset(
                conn,
                account_id=account_id,
                project_id=project_id,
                name=known.name,
                level=known.level,
                scope_id=known.scope_id,
            )

    async def bulk_create(
        self, account_id: AccountId, project_id: int, entries: list[dict[str, str | None]]
    ) -> list[SavedVariable]:
        """dbt Cloud's bulk create: each entry a ``new_name`` with its ``project`` default and values
        by environment name; every entry is checked before any is kept."""
        saved: list[SavedVariable] = []
        async with self._store.transaction() as conn:
            await self._project(conn, account_id, project_id)
            by_name = {e.name: e.id for e in await self._environments(conn, account_id, project_id)}
            for entry in entries:
                name = checked_name(str(entry.get("new_name") or ""))
                for key, value in entry.items():
                    if key == "new_name" or not value:
                        continue
                    if key == "project":
                        level, scope_id = "project", 0
                    elif key in by_name:
                        level, scope_id = "environment", by_name[key]
                    else:
                        raise InvalidArgument("env_var", f"{key[:80]!r} is neither project nor an environment's name")
                    environment({name: value}, f"env_var[{name}]")
                    saved.append(
                        await self._set(
                            conn,
                            account_id=account_id,
                            project_id=project_id,
                            name=name,
                            level=level,
                            scope_id=scope_id,
                            value=value,
                        )
                    )
        return saved

    async def bulk_update(
        self, account_id: AccountId, project_id: int, values: dict[str, str | None]
    ) -> tuple[list[int], list[int]]:
        """dbt Cloud's bulk update of one variable (``name``): keys that are ids of its values set them,
        environment names (and ``project``) add values, an empty value removes one. The new ids and the
        removed ones."""
        name = checked_name(str(values.get("name") or ""))
        if values.get("new_name") not in (None, "", name):
            raise InvalidArgument("env_vars.new_name", "runplane does not rename a variable: set the new name anew")
        new: list[int] = []
        deleted: list[int] = []
        async with self._store.transaction() as conn:
            await self._project(conn, account_id, project_id)
            by_name = {e.name: e.id for e in await self._environments(conn, account_id, project_id)}
            for key, value in values.items():
                if key in ("name", "new_name"):
                    continue
                if key.isdigit():
                    known = await self._known(conn, account_id, project_id, int(key))
                    if known.name != name:
                        raise InvalidArgument("env_vars", f"{key} is a value of {known.name}, not of {name}")
                    level, scope_id = known.level, known.scope_id
                elif key == "project":
                    level, scope_id = "project", 0
                elif key in by_name:
                    level, scope_id = "environment", by_name[key]
                else:
                    raise InvalidArgument("env_vars", f"{key[:80]!r} is neither a value's id nor an environment's name")
                if value:
                    environment({name: value}, f"env_vars[{key}]")
                    saved = await self._set(
                        conn,
                        account_id=account_id,
                        project_id=project_id,
                        name=name,
                        level=level,
                        scope_id=scope_id,
                        value=value,
                    )
                    if not key.isdigit():
                        new.append(saved.id)
                else:
                    deleted.append(
                        await self._unset(
                            conn,
                            account_id=account_id,
                            project_id=project_id,
                            name=name,
                            level=level,
                            scope_id=scope_id,
                        )
                    )
        return new, deleted

    async def _set(
        self,
        conn: Connection,
        *,
        account_id: AccountId,
        project_id: int,
        name: str,
        level: str,
        scope_id: int,
        value: str,
    ) -> SavedVariable:
        secret = is_secret_name(name)
        stored = self._encrypting().encrypt(value) if secret else value
        params = {
            "account_id": account_id,
            "project_id": project_id,
            "name": name,
            "scope_id": scope_id,
            "value": stored,
            "secret": secret,
        }
        if level == "project":
            await conn.execute(Q["set_project_variable"], params)
        else:
            cur = await conn.execute(Q[f"set_{level}_variable"], params)
            if cur.rowcount == 0:
                what = "environment" if level == "environment" else "job"
                raise NotFound(f"{what} {scope_id} not found in project {project_id}")
        variable_id = await self._id(
            conn, account_id=account_id, project_id=project_id, name=name, level=level, scope_id=scope_id
        )
        return SavedVariable(
            id=variable_id,
            account_id=account_id,
            project_id=project_id,
            name=name,
            type=level,
            environment_id=scope_id if level == "environment" else None,
            job_definition_id=scope_id if level == "job" else None,
            display_value=HIDDEN if secret else value,
        )

    async def _project_defaults(
        self, conn: Connection, account_id: AccountId, project_id: int
    ) -> dict[str, dict[str, Value]]:
        """Each project default as the first level of its variable."""
        variables: dict[str, dict[str, Value]] = {}
        for row in await self._defaults(conn, project_id):
            variables[row.name] = {
                "project": await self._value(
                    conn,
                    account_id=account_id,
                    project_id=project_id,
                    name=row.name,
                    level="project",
                    scope_id=0,
                    value=row.value,
                    secret=row.secret,
                )
            }
        return variables

    async def _unset(
        self, conn: Connection, *, account_id: AccountId, project_id: int, name: str, level: str, scope_id: int
    ) -> int:
        params = {"account_id": account_id, "project_id": project_id, "name": name, "scope_id": scope_id}
        if level == "project":
            await conn.execute(Q["unset_project_variable"], params)
        else:
            await conn.execute(Q[f"unset_{level}_variable"], params)
        return await self._id(
            conn, account_id=account_id, project_id=project_id, name=name, level=level, scope_id=scope_id
        )

    async def _value(
        self,
        conn: Connection,
        *,
        account_id: AccountId,
        project_id: int,
        name: str,
        level: str,
        scope_id: int,
        value: str,
        secret: bool,
    ) -> Value:
        variable_id = await self._id(
            conn, account_id=account_id, project_id=project_id, name=name, level=level, scope_id=scope_id
        )
        return Value(variable_id, HIDDEN if secret else value)

    async def _id(
        self, conn: Connection, *, account_id: AccountId, project_id: int, name: str, level: str, scope_id: int
    ) -> int:
        params = {"account_id": account_id, "project_id": project_id, "name": name, "level": level}
        row = await fetch_one(conn, Q["variable_id"], {**params, "scope_id": scope_id}, _NewId)
        assert row is not None
        return row.id

    async def _known(self, conn: Connection, account_id: AccountId, project_id: int, variable_id: int) -> VariableId:
        params = {"account_id": account_id, "project_id": project_id, "id": variable_id}
        row = await fetch_one(conn, Q["variable_by_id"], params, VariableId)
        if row is None:
            raise NotFound(f"environment variable {variable_id} not found")
        return row

    async def _project(self, conn: Connection, account_id: AccountId, project_id: int) -> None:
        if await self._store.get_project(conn, account_id, project_id) is None:
            raise NotFound(f"project {project_id} not found")

    async def _defaults(self, conn: Connection, project_id: int) -> list[_ProjectVariable]:
        return await fetch_all(conn, Q["project_variables"], {"project_id": project_id}, _ProjectVariable)

    async def _environments(self, conn: Connection, account_id: AccountId, project_id: int) -> list[_Environment]:
        params = {"account_id": account_id, "project_id": project_id}
        return await fetch_all(conn, Q["project_environments"], params, _Environment)

    async def _job(self, conn: Connection, account_id: AccountId, project_id: int, job_id: int) -> _Job:
        params = {"account_id": account_id, "project_id": project_id, "job_id": job_id}
        row = await fetch_one(conn, Q["job_variables"], params, _Job)
        if row is None:
            raise NotFound(f"job {job_id} not found in project {project_id}")
        return row

    def _encrypting(self) -> SecretBox:
        if self._box is None:
            raise InvalidArgument("raw_value", "secret variables need RUNPLANE_SECRET_KEYS on the API")
        return self._box


def _values(plain: dict[str, Any], secret: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The (name, value, secret) of a level's stored variables; a secret's value stays ciphertext."""
    found = [(str(k), str(v), False) for k, v in plain.items()]
    found += [(str(k), str(v), True) for k, v in secret.items()]
    return sorted(found)
