"""ProjectService: an account's dbt projects (git repositories) and their environments (created and
updated in ``api.project_definitions``, shared with the web pages).

Secret fields (the git credential, a connection's password or keyfile) are encrypted with the
configured keys (``RUNPLANE_SECRET_KEYS``, :mod:`runplane.basics.secrets`) before they are stored, and never
returned: a project says whether its credential is set, an environment which secret fields are.
"""

from __future__ import annotations

import logging

import grpc

from api.grpc import convert
from api.grpc.auth import current_account
from api.lookup import existing_environment, existing_project
from api.project_definitions import (
    create_environment,
    create_project,
    delete_environment,
    delete_project,
    update_environment,
    update_project,
)
from api.store import Store
from runplane.basics.errors import FailedPrecondition, InvalidArgument
from runplane.basics.repository_urls import RepositoryRule
from runplane.basics.secrets import SecretBox, SecretKeyError, box_from_settings
from runplane.basics.settings import Settings
from runplane.dbt.versions import InstalledDbtVersions
from runplane.dbt.warehouse_files import WarehouseFiles
from runplane.v1 import projects_pb2, projects_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[object, object]


class ProjectService(projects_pb2_grpc.ProjectServiceServicer):
    def __init__(self, store: Store, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        self._repositories = RepositoryRule(settings.repositories)
        self._dbt_versions = InstalledDbtVersions.of(settings)
        self._warehouses = WarehouseFiles.of(settings)

    def _box(self) -> SecretBox:
        """The keys, read when a secret is first stored: an API without keys serves everything else."""
        try:
            return box_from_settings(self._settings)
        except SecretKeyError as exc:
            raise FailedPrecondition(f"secrets cannot be stored: {exc}") from exc

    async def CreateProject(self, request: projects_pb2.CreateProjectRequest, context: Context) -> projects_pb2.Project:
        return convert.project(
            await create_project(self._store, self._box, self._repositories, current_account(), request)
        )

    async def GetProject(self, request: projects_pb2.GetProjectRequest, context: Context) -> projects_pb2.Project:
        async with self._store.connection() as conn:
            row = await existing_project(self._store, conn, current_account(), request.project_id)
        return convert.project(row)

    async def ListProjects(
        self, request: projects_pb2.ListProjectsRequest, context: Context
    ) -> projects_pb2.ListProjectsResponse:
        account_id = current_account()
        async with self._store.connection() as conn:
            rows = await self._store.list_projects(conn, account_id)
        return projects_pb2.ListProjectsResponse(projects=[convert.project(r) for r in rows])

    async def CreateEnvironment(
        self, request: projects_pb2.CreateEnvironmentRequest, context: Context
    ) -> projects_pb2.Environment:
        return convert.environment(
            await create_environment(
                self._store, self._box, self._dbt_versions, current_account(), request, warehouses=self._warehouses
            )
        )

    async def GetEnvironment(
        self, request: projects_pb2.GetEnvironmentRequest, context: Context
    ) -> projects_pb2.Environment:
        async with self._store.connection() as conn:
            row = await existing_environment(self._store, conn, current_account(), request.environment_id)
        return convert.environment(row)

    async def ListEnvironments(
        self, request: projects_pb2.ListEnvironmentsRequest, context: Context
    ) -> projects_pb2.ListEnvironmentsResponse:
        account_id = current_account()
        if request.project_id < 0:
            raise InvalidArgument("project_id", "must be a project id, or 0 for every project")
        async with self._store.connection() as conn:
            rows = await self._store.list_environments(conn, account_id, request.project_id or None)
        return projects_pb2.ListEnvironmentsResponse(environments=[convert.environment(r) for r in rows])

    async def UpdateProject(self, request: projects_pb2.UpdateProjectRequest, context: Context) -> projects_pb2.Project:
        return convert.project(
            await update_project(self._store, self._box, self._repositories, current_account(), request)
        )

    async def DeleteProject(
        self, request: projects_pb2.DeleteProjectRequest, context: Context
    ) -> projects_pb2.DeleteProjectResponse:
        await delete_project(self._store, current_account(), request.project_id)
        return projects_pb2.DeleteProjectResponse()

    async def UpdateEnvironment(
        self, request: projects_pb2.UpdateEnvironmentRequest, context: Context
    ) -> projects_pb2.Environment:
        return convert.environment(
            await update_environment(
                self._store, self._box, self._dbt_versions, current_account(), request, warehouses=self._warehouses
            )
        )

    async def DeleteEnvironment(
        self, request: projects_pb2.DeleteEnvironmentRequest, context: Context
    ) -> projects_pb2.DeleteEnvironmentResponse:
        await delete_environment(self._store, current_account(), request.environment_id)
        return projects_pb2.DeleteEnvironmentResponse()
