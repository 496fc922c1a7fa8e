"""Every warehouse adapter an environment may name: its fields are the adapter's own, the profile a
run gets is one dbt itself accepts, and DuckDB runs the example project for real (Postgres does in
the other dbt tests). The cloud warehouses cannot be reached from here: dbt parses the project
with their profile, which loads and checks the credentials without connecting."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest

from api.admin import create_token
from api.process import RunningApi
from api.rest.server import RestServer
from runner.profile import write_profile
from runplane.basics.types import JobType, Trigger
from runplane.dbt.connections import ADAPTERS, ConnectionFieldError, check_secret_fields, typed_profile_fields
from runplane.dbt.context import DbtContext
from runplane.v1 import common_pb2, projects_pb2, runs_pb2
from tests.dbt.conftest import (
    DBT_BIN,
    EXAMPLE,
    KEPT_WAREHOUSES,
    SETUP,
    Client,
    account_client,
    dbt_job,
    duckdb_tables,
    environment,
    make_repository,
    run_job,
    run_log,
)

pytestmark = [pytest.mark.slow, pytest.mark.dbt, pytest.mark.timeout(600)]

Db = psycopg.Connection[Any]

# One process of the dbt install does every check of the installed adapters: importing dbt and its
# adapters costs seconds each time, and a process per check paid it eleven times. It lists each
# adapter's credentials fields (names and aliases), then parses the project with each profile given,
# through dbt's own command line in-process (dbtRunner), noting the adapters dbt registered.
DBT_CHECKS = """
import dataclasses, importlib, json, os, sys
from dbt.cli.main import dbtRunner

spec = json.load(open(sys.argv[1]))
fields = {}
for name in spec["adapters"]:
    credentials = importlib.import_module(f"dbt.adapters.{name}").Plugin.credentials
    aliases = getattr(credentials, "_ALIASES", {})
    fields[name] = sorted({f.name for f in dataclasses.fields(credentials)} | set(aliases))

def parse(check):
    registered = []
    def seen(event):
        if event.info.name == "AdapterRegistered":
            registered.append(event.data.adapter_name)
    os.environ.clear()
    os.environ.update(check["env"])
    done = dbtRunner(callbacks=[seen]).invoke(
        ["parse", "--profiles-dir", check["profiles_dir"], "--project-dir", check["project"]])
    return {"success": done.success, "registered": registered, "exception": repr(done.exception)}

parsed = {name: parse(check) for name, check in spec["parses"].items()}
with open(sys.argv[2], "w") as out:
    json.dump({"fields": fields, "parsed": parsed}, out)
"""

CLOUD_CASES = ["snowflake-password", "snowflake-key-pair", "bigquery", "databricks", "redshift"]
# Under pytest-xdist, the tests of ``dbt_checks`` go to one worker, so the checks run once, not per worker.
CHECKED = pytest.mark.xdist_group("dbt-adapter-checks")


def _rsa_key(tmp_path: Path) -> str:
    key = tmp_path / "key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
                   check=True, capture_output=True)  # fmt: skip
    return key.read_text()


SERVICE_ACCOUNT = {
    "type": "service_account",
    "project_id": "acme-analytics",
    "private_key_id": "0123456789abcdef",
    "private_key": "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
    "client_email": "dbt@acme-analytics.iam.gserviceaccount.com",
    "client_id": "1234567890",
    "token_uri": "https://oauth2.googleapis.com/token",
}


def _connections(tmp_path: Path) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """(fields, secret fields) of a connection of each cloud adapter, as a user would give them."""
    return {
        "snowflake-password": (
            {"account": "acme-xy12345", "user": "DBT", "database": "ANALYTICS", "warehouse": "TRANSFORMING",
             "role": "TRANSFORMER", "client_session_keep_alive": "false", "connect_retries": "3"},
            {"password": "sf-pass-word"},
        ),
        "snowflake-key-pair": (
            {"account": "acme-xy12345", "user": "DBT", "database": "ANALYTICS", "warehouse": "TRANSFORMING"},
            {"private_key": _rsa_key(tmp_path), "private_key_passphrase": "pass-phrase-1"},
        ),
        "bigquery": (
            {"project": "acme-analytics", "location": "EU", "priority": "interactive",
             "job_execution_timeout_seconds": "300"},
            {"keyfile_json": json.dumps(SERVICE_ACCOUNT)},
        ),
        "databricks": (
            {"host": "dbc-1234.cloud.databricks.com", "http_path": "/sql/1.0/warehouses/abc123", "catalog": "main"},
            {"token": "dapi-secret-token"},
        ),
        "redshift": (
            {"host": "acme.abc123.eu-west-1.redshift.amazonaws.com", "user": "dbt", "dbname": "analytics",
             "method": "database", "sslmode": "require"},
            {"password": "rs-pass-word"},
        ),
    }  # fmt: skip


def _context(adapter_type: str, fields: dict[str, str], secrets: dict[str, str]) -> DbtContext:
    return DbtContext(
        run_id=1, job_id=1, account_id=1, project_id=1, environment_id=1, environment_type="deployment",
        job_type=JobType.DEPLOY, trigger=Trigger.API, cause="", repository_url="", subdirectory="",
        git_credential_kind="none", git_credential="", git_sha="", git_branch="", dbt_version="1.10",
        adapter_type=adapter_type, connection=fields, connection_secrets=secrets, target_name="prod",
        schema="analytics", threads=4, variables={}, pull_request_number=None,
    )  # fmt: skip


@dataclass(frozen=True)
class Written:
    """A case's profiles.yml as a run gets it, and the secrets it must refer to only by name."""

    text: str
    secrets: dict[str, str]


@pytest.fixture(scope="module")
def dbt_checks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Written], dict[str, Any]]:
    """Each cloud case's written profile, and what the installed dbt made of every adapter and profile."""
    base = tmp_path_factory.mktemp("adapters")
    connections = _connections(base)
    written: dict[str, Written] = {}
    parses: dict[str, dict[str, Any]] = {}
    for case in CLOUD_CASES:
        fields, secrets = connections[case]
        adapter_type = case.split("-", maxsplit=1)[0]
        typed_profile_fields(adapter_type, fields)  # what the API checks when the environment is saved
        check_secret_fields(adapter_type, secrets)
        home = base / case
        project = home / "project"
        shutil.copytree(EXAMPLE, project)
        profile = write_profile(_context(adapter_type, fields, secrets), project, home / "profile")
        text = (profile.directory / "profiles.yml").read_text()
        wrong = home / "wrong"
        wrong.mkdir()
        required = sorted(ADAPTERS[adapter_type].required)[0]
        (wrong / "profiles.yml").write_text(text.replace(f" {required}:", f" {required}_misspelled:"))
        env = {"PATH": f"{DBT_BIN}:/usr/bin:/bin", "HOME": str(home), "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
               **profile.environment}  # fmt: skip
        right_check = {"profiles_dir": str(profile.directory), "project": str(project), "env": env}
        wrong_check = {**right_check, "profiles_dir": str(wrong)}
        parses[case], parses[f"{case}/wrong"] = right_check, wrong_check
        written[case] = Written(text, secrets)
    spec, out = base / "spec.json", base / "checks.json"
    spec.write_text(json.dumps({"adapters": sorted(ADAPTERS), "parses": parses}))
    done = subprocess.run([str(DBT_BIN / "python"), "-c", DBT_CHECKS, str(spec), str(out)],
                          capture_output=True, text=True, timeout=500, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return written, json.loads(out.read_text())


@CHECKED
def test_every_field_of_every_adapter_is_the_adapters_own(
    dbt_checks: tuple[dict[str, Written], dict[str, Any]],
) -> None:
    declared: dict[str, list[str]] = dbt_checks[1]["fields"]
    for name, schema in ADAPTERS.items():
        ours = schema.strings | schema.integers | schema.booleans | schema.secrets | set(schema.profile_defaults)
        unknown = ours - set(declared[name]) - {"method"}  # method: how dbt-bigquery and dbt-redshift authenticate
        assert not unknown, f"{name}: not fields of the installed adapter: {sorted(unknown)}"


@CHECKED
@pytest.mark.parametrize("case", CLOUD_CASES)
def test_dbt_accepts_the_profile_written_for_each_cloud_adapter(
    case: str, dbt_checks: tuple[dict[str, Written], dict[str, Any]]
) -> None:
    written, checks = dbt_checks[0][case], dbt_checks[1]["parsed"]
    assert all(value not in written.text for value in written.secrets.values()), written.text  # only by reference
    parsed = checks[case]
    assert parsed["success"], parsed["exception"]
    assert parsed["registered"] == [case.split("-", maxsplit=1)[0]], parsed

    # The same check fails a profile whose required field is misnamed: dbt does read the fields.
    assert not checks[f"{case}/wrong"]["success"], checks[f"{case}/wrong"]


def test_a_secret_json_key_file_must_be_json() -> None:
    with pytest.raises(ConnectionFieldError, match=r"secret_fields\[keyfile_json\]: must be a JSON object"):
        check_secret_fields("bigquery", {"keyfile_json": "not json"})


async def test_duckdb_runs_seed_build_test_and_docs_in_a_warehouse_file_of_the_environment(
    client: Client, dbt_settings: Any, db: Db, database_url: str, tmp_path: Path, *, kept_directory: Path
) -> None:
    repo = make_repository(tmp_path / "jaffle")
    warehouse = kept_directory / "production.duckdb"
    connection = projects_pb2.Connection(adapter_type="duckdb", fields={"path": str(warehouse)})
    env = await environment(client, database_url, str(repo), connection=connection)
    job = await dbt_job(client, env.id, ["dbt seed", "dbt build", "dbt test", "dbt docs generate"])

    run = await run_job(client, dbt_settings, db, job.id)

    log = await run_log(client, run.id)
    assert run.status == common_pb2.RUN_STATUS_SUCCESS, f"{run.status_message}\n{log[-4000:]}"
    assert "Registered adapter: duckdb=" in log
    tables = await asyncio.to_thread(duckdb_tables, warehouse)
    assert {"customers", "orders"} <= tables, tables
    docs_step = SETUP + 3  # the job's fourth command, after the setup steps
    manifest, catalog = [
        json.loads(
            (
                await client.runs.GetArtifact(
                    runs_pb2.GetArtifactRequest(run_id=run.id, path=path, step_index=docs_step)
                )
            ).content
        )
        for path in ("target/manifest.json", "target/catalog.json")
    ]
    assert manifest["metadata"]["adapter_type"] == "duckdb"
    assert "model.jaffle_shop.customers" in catalog["nodes"]  # docs read the warehouse file


async def test_a_duckdb_file_a_run_cannot_keep_is_refused_with_the_reason_at_every_door(
    client: Client, *, rest_server: RestServer, dbt_settings: Any, tmp_path: Path, kept_directory: Path
) -> None:
    project = await client.projects.CreateProject(
        projects_pb2.CreateProjectRequest(name="jaffle", repository_url=str(make_repository(tmp_path / "jaffle")))
    )
    token = await create_token(dbt_settings, account_id=client.account_id)
    refused = {
        str(tmp_path / "warehouse.duckdb"): "is under /tmp, which a run does not keep",
        "/var/tmp/warehouse.duckdb": "is under /var/tmp",
        "/dev/shm/warehouse.duckdb": "is under /dev/shm",
        "/run/warehouse.duckdb": "is under /run",
        f"{kept_directory}/../../../../tmp/warehouse.duckdb": "is under /tmp",
        "warehouse.duckdb": "must be an absolute path: a relative one is inside the run's checkout",
        "/var/lib/elsewhere/shop/warehouse.duckdb": f"is outside the warehouse root {KEPT_WAREHOUSES}",
        f"{KEPT_WAREHOUSES}/warehouse.duckdb": f"is directly in the warehouse root {KEPT_WAREHOUSES}",
    }

    def request(path: str) -> projects_pb2.CreateEnvironmentRequest:
        return projects_pb2.CreateEnvironmentRequest(
            project_id=project.id,
            name="production",
            environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10",
            connection=projects_pb2.Connection(adapter_type="duckdb", fields={"path": path}),
            schema="analytics",
        )

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
    ) as http:
        for path, reason in refused.items():
            with pytest.raises(grpc.aio.AioRpcError) as by_grpc:
                await client.projects.CreateEnvironment(request(path))
            assert by_grpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "fields[path]" in str(by_grpc.value.details()) and reason in str(by_grpc.value.details())
            by_rest = await http.post(
                f"/api/v3/accounts/{client.account_id}/projects/{project.id}/environments/",
                json={
                    "name": "production",
                    "type": "deployment",
                    "dbt_version": "1.10",
                    "connection": {"type": "duckdb", "details": {"path": path}},
                    "credentials": {"schema": "analytics"},
                },
            )
            assert by_rest.status_code == 400 and reason in by_rest.text, (path, by_rest.text)
        kept = await client.projects.CreateEnvironment(request(str(kept_directory / "production.duckdb")))
        moved = await http.post(
            f"/api/v3/accounts/{client.account_id}/projects/{project.id}/environments/{kept.id}/",
            json={"connection": {"type": "duckdb", "details": {"path": "/tmp/production.duckdb"}}},
        )
        assert moved.status_code == 400 and "is under /tmp" in moved.text, moved.text
    listed = await client.projects.ListEnvironments(projects_pb2.ListEnvironmentsRequest(project_id=project.id))
    assert [e.connection_fields["path"] for e in listed.environments] == [str(kept_directory / "production.duckdb")]


async def test_a_duckdb_file_in_another_environments_directory_is_refused_at_every_door(
    api: RunningApi, client: Client, *, rest_server: RestServer, dbt_settings: Any, tmp_path: Path, kept_directory: Path
) -> None:
    repository = str(make_repository(tmp_path / "jaffle"))
    connection = projects_pb2.Connection(adapter_type="duckdb", fields={"path": str(kept_directory / "shop.duckdb")})
    owner = await environment(client, "", repository, connection=connection)
    taken = f"is in {kept_directory}, the warehouse directory of another environment"
    elsewhere = kept_directory.with_name(f"{kept_directory.name}-other") / "own.duckdb"  # a directory of its own
    async with account_client(api, dbt_settings, "other") as other:
        token = await create_token(dbt_settings, account_id=other.account_id)
        project = await other.projects.CreateProject(
            projects_pb2.CreateProjectRequest(name="jaffle", repository_url=repository)
        )
        for path in (kept_directory / "shop.duckdb", kept_directory / "another.duckdb", kept_directory / "a" / "b"):
            with pytest.raises(grpc.aio.AioRpcError) as by_grpc:
                await other.projects.CreateEnvironment(
                    projects_pb2.CreateEnvironmentRequest(
                        project_id=project.id, name="stolen", environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
                        dbt_version="1.10", schema="analytics",
                        connection=projects_pb2.Connection(adapter_type="duckdb", fields={"path": str(path)}),
                    )
                )  # fmt: skip
            assert by_grpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert taken in str(by_grpc.value.details()), by_grpc.value.details()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{rest_server.port}", headers={"Authorization": f"Token {token}"}
        ) as http:
            by_rest = await http.post(
                f"/api/v3/accounts/{other.account_id}/projects/{project.id}/environments/",
                json={
                    "name": "stolen", "type": "deployment", "dbt_version": "1.10",
                    "connection": {"type": "duckdb", "details": {"path": str(kept_directory / "shop.duckdb")}},
                    "credentials": {"schema": "analytics"},
                },
            )  # fmt: skip
            assert by_rest.status_code == 400 and taken in by_rest.text, by_rest.text
            own = await other.projects.CreateEnvironment(
                projects_pb2.CreateEnvironmentRequest(
                    project_id=project.id, name="own", environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
                    dbt_version="1.10", schema="analytics",
                    connection=projects_pb2.Connection(adapter_type="duckdb", fields={"path": str(elsewhere)}),
                )
            )  # fmt: skip
            moved = await http.post(
                f"/api/v3/accounts/{other.account_id}/projects/{project.id}/environments/{own.id}/",
                json={"connection": {"type": "duckdb", "details": {"path": str(kept_directory / "shop.duckdb")}}},
            )
            assert moved.status_code == 400 and taken in moved.text, moved.text
    # A second environment of the same account is another environment too; the owner keeps its own.
    with pytest.raises(grpc.aio.AioRpcError, match="the warehouse directory of another environment"):
        await environment(client, "", repository, connection=connection)
    renamed = await client.projects.UpdateEnvironment(
        projects_pb2.UpdateEnvironmentRequest(
            environment_id=owner.id, name="renamed", environment_type=projects_pb2.ENVIRONMENT_TYPE_DEPLOYMENT,
            dbt_version="1.10", schema="analytics", connection=connection,
        )
    )  # fmt: skip
    assert renamed.name == "renamed"


async def test_key_pair_and_key_file_secrets_are_stored_encrypted_and_never_returned(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    connections = _connections(tmp_path)
    for case in ("snowflake-key-pair", "bigquery"):
        fields, secrets = connections[case]
        connection = projects_pb2.Connection(adapter_type=case.split("-")[0], fields=fields, secret_fields=secrets)
        created = await environment(client, database_url, str(tmp_path), connection=connection)
        read = await client.projects.GetEnvironment(projects_pb2.GetEnvironmentRequest(environment_id=created.id))
        assert sorted(read.secret_fields_set) == sorted(secrets)
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cur = await conn.execute("SELECT connection_secrets::text FROM environments WHERE id = %s", (created.id,))
            row = await cur.fetchone()
        assert row is not None
        for value in secrets.values():
            assert value not in str(read) and value not in str(created)
            for line in value.splitlines()[1:2]:  # a line of the key is not stored in the clear either
                assert line not in row[0]
            assert json.dumps(value)[1:-1] not in row[0]
