"""Environment variables in dbt Cloud's v3 shape: project defaults, environment values, job overrides.

``DBT_ENV_SECRET_*`` values are write-only: every answer shows them as ``**********``. The values
live where runplane's jobs and environments keep them (``api/environment_variables.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field

from api.environment_variables import EnvironmentVariables, SavedVariable, Value
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, success
from runplane.basics.errors import InvalidArgument

router = APIRouter(responses=ERROR_RESPONSES)
# The bulk routes come before ".../{variable_id}/", which would take "bulk" for an id.
BASE = "/api/v3/accounts/{account_id}/projects/{project_id}/environment-variables"
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]
MAX_VALUE = 100_000


class VariableBody(BaseModel):
    """dbt Cloud's CustomEnvironmentVariableRequest (``user`` variables are not runplane's)."""

    account_id: int | None = None
    project_id: int | None = None
    name: str = Field(min_length=1, max_length=255)
    type: str = Field("project", max_length=20)
    environment_id: int | None = None
    job_definition_id: int | None = None
    raw_value: str | None = Field(None, max_length=MAX_VALUE)
    display_value: str | None = Field(None, max_length=MAX_VALUE)


class Variable(BaseModel):
    id: int
    account_id: int
    project_id: int
    name: str
    type: str
    state: int = 1
    environment_id: int | None
    job_definition_id: int | None
    user_id: int | None = None
    display_value: str


class IdValue(BaseModel):
    id: int
    value: str


class ByEnvironment(BaseModel):
    environments: list[str]
    variables: dict[str, dict[str, IdValue]]


class BulkBody(BaseModel):
    env_var: list[dict[str, str | None]] = Field(max_length=1000)


class BulkUpdateBody(BaseModel):
    env_vars: dict[str, str | None] = Field(max_length=1000)


class BulkCreated(BaseModel):
    status: str
    status_code: int
    key_name: str
    data: Variable


class BulkUpdated(BaseModel):
    message: str
    new_var_ids: list[int]
    deleted_var_ids: list[int]
    failures: dict[str, str] = Field(default_factory=dict)


def _variables(request: Request) -> EnvironmentVariables:
    variables: EnvironmentVariables = request.app.state.environment_variables
    return variables


def _view(row: SavedVariable) -> Variable:
    return Variable(
        id=row.id,
        account_id=row.account_id,
        project_id=row.project_id,
        name=row.name,
        type=row.type,
        environment_id=row.environment_id,
        job_definition_id=row.job_definition_id,
        display_value=row.display_value,
    )


def _levels(values: dict[str, Value]) -> dict[str, IdValue]:
    return {level: IdValue(id=v.id, value=v.value) for level, v in values.items()}


def _scope(body: VariableBody) -> int:
    match body.type:
        case "project":
            return 0
        case "environment":
            if not body.environment_id:
                raise InvalidArgument("environment_id", "an environment's value names its environment")
            return body.environment_id
        case "job":
            if not body.job_definition_id:
                raise InvalidArgument("job_definition_id", "a job's override names its job")
            return body.job_definition_id
        case _:
            raise InvalidArgument("type", f"{body.type[:20]!r} is not one of project, environment, job")


@router.get(f"{BASE}/environment/", summary="A project's environment variables by environment")
async def by_environment(request: Request, account_id: Account, project_id: Id) -> Envelope[ByEnvironment]:
    names, variables = await _variables(request).by_environment(account_id, project_id)
    data = ByEnvironment(environments=names, variables={k: _levels(v) for k, v in variables.items()})
    return Envelope[ByEnvironment](status=success(), data=data)


@router.get(f"{BASE}/job/", summary="The environment variables a job sees, level by level")
async def of_job(
    request: Request, account_id: Account, project_id: Id, job_definition_id: Annotated[int, Query(ge=1, le=2**63 - 1)]
) -> Envelope[dict[str, dict[str, IdValue]]]:
    variables = await _variables(request).of_job(account_id, project_id, job_definition_id)
    return Envelope[dict[str, dict[str, IdValue]]](status=success(), data={k: _levels(v) for k, v in variables.items()})


@router.post(f"{BASE}/", summary="Create an environment variable's value at one level")
async def create(request: Request, account_id: Account, project_id: Id, body: VariableBody) -> Envelope[Variable]:
    saved = await _variables(request).set(
        account_id, project_id, name=body.name, level=body.type, scope_id=_scope(body), value=body.raw_value or ""
    )
    return Envelope[Variable](status=success(), data=_view(saved))


@router.post(f"{BASE}/bulk/", summary="Create environment variables with their values")
async def bulk_create(
    request: Request, account_id: Account, project_id: Id, body: BulkBody
) -> Envelope[list[BulkCreated]]:
    saved = await _variables(request).bulk_create(account_id, project_id, body.env_var)
    data = [BulkCreated(status="success", status_code=200, key_name=s.name, data=_view(s)) for s in saved]
    return Envelope[list[BulkCreated]](status=success(), data=data)


@router.put(f"{BASE}/bulk/", summary="Update one environment variable's values")
async def bulk_update(
    request: Request, account_id: Account, project_id: Id, body: BulkUpdateBody
) -> Envelope[BulkUpdated]:
    new, deleted = await _variables(request).bulk_update(account_id, project_id, body.env_vars)
    data = BulkUpdated(message="Environment variables updated", new_var_ids=new, deleted_var_ids=deleted)
    return Envelope[BulkUpdated](status=success(), data=data)


@router.post(f"{BASE}/{{variable_id}}/", summary="Update an environment variable's value")
async def update(
    request: Request, account_id: Account, project_id: Id, variable_id: Id, body: VariableBody
) -> Envelope[Variable]:
    saved = await _variables(request).update(account_id, project_id, variable_id, body.raw_value or "")
    return Envelope[Variable](status=success(), data=_view(saved))


@router.delete(f"{BASE}/{{variable_id}}/", summary="Delete an environment variable's value", status_code=204)
async def delete(request: Request, account_id: Account, project_id: Id, variable_id: Id) -> Response:
    await _variables(request).delete(account_id, project_id, variable_id)
    return Response(status_code=204)
