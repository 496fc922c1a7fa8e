"""Every operation of dbt Cloud's OpenAPI documents that runplane serves answers with the documented
status code and with fields of the documented types.

The documents' part that runplane serves is vendored in ``spec/dbt_cloud_openapi.json`` (cut by
``spec/extract.py`` from github.com/dbt-labs/dbt-cloud-openapi-spec, at the commit it records). A
field runplane does not have is null, never made up: null passes any type. A required field
runplane leaves out is named below with the reason; any other missing one fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.api.conftest import AsyncDb, Rest
from tests.api.rest.test_dbt_cloud import POSTGRES, _environment, _project
from tests.api.rest.test_run_steps import _dbt_run

SPEC = json.loads((Path(__file__).parent / "spec" / "dbt_cloud_openapi.json").read_text())
# Documented codes runplane answers otherwise, and why.
OTHER_CODES = {
    # The document says 204 (no body); dbt Cloud's clients (dbtc's delete_*, dbt-cloud-cli's
    # `job delete`) parse the answer's JSON, so runplane answers 200 with the deleted object (state 2).
    "DELETE": (204, 200),
}
# Required fields runplane does not send, by schema, and why ("*": every field it has no value for).
# Each is a field runplane has no such thing behind: it leaves the field out rather than make one up.
ABSENT: dict[str, set[str]] = {
    # Billing, seats, locks, subdomains and groups: runplane's account is run slots and limits.
    "AccountResponse": {"*"},
    "AccountListEnveloped": {"extra"},  # the accounts a token can use: one, never paged
    # No Fusion, no lifecycle webhooks, no linting or compare-changes; a job's account, project and
    # environment objects are nested only where include_related asks (runs).
    "HumanReadableJobDefinitionResponse": {
        "account",
        "environment",
        "project",
        "fusion_readiness",
        "is_deferrable",
        "lifecycle_webhooks_url",
        "raw_dbt_version",
        "lifecycle_webhooks",
        "run_compare_changes",
        "run_lint",
        "errors_on_lint_failure",
    },
    "InternalJobDefinition": {"lifecycle_webhooks", "run_compare_changes", "run_lint", "errors_on_lint_failure"},
    # A project's connection is its environments' here; no docs or freshness job, no groups, no Fusion.
    "Project": {"type"},
    "ProjectResponse": {"*"},
    # An environment's connection and credentials are part of it (details and secrets set), not
    # dbt Cloud's separate connection and credentials objects with their own ids and states.
    "EnvironmentV2": {"supports_docs"},
    "EnvironmentV2Response": {"*"},
    "EnvironmentV3Response": {"*"},
    "PostgresConnection": {"*"},
    # A repository is a URL and a credential here: no git provider, GitHub app, deploy key object or
    # private link behind it.
    "RepositoryV3Response": {
        "deploy_key",
        "git_provider",
        "github_repo",
        "gitlab",
        "is_private_link_enabled",
        "name",
        "web_url",
    },
    "PostgresCredentials": {"*"},
    # runplane keeps a step's command and log, not dbt Cloud's command and invocation records.
    "RunStepResponse": {"run_step_command", "run_step_invocation"},
    "UserResponse": {"*"},  # a token is not a person: no logins, providers or e-mail address
}
# Lists the document types as one object: its ``data`` is the list's item, and its own text says the
# list answers many. runplane answers a list (as dbt Cloud does, and its clients read), each item checked.
ONE_OBJECT_LISTS = {("GET", "/api/v3/accounts/{account_id}/connections/")}
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def problems(value: Any, schema: dict[str, Any] | None, where: str, missing: set[str]) -> list[str]:
    """What in ``value`` is not of ``schema``'s types; required fields left out go to ``missing``
    (as ``Schema.field``)."""
    if value is None or not schema:
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        found = problems(value, SPEC["schemas"][name], where, missing)
        required = SPEC["schemas"][name].get("required", [])
        if isinstance(value, dict):
            missing.update(f"{name}.{field}" for field in required if field not in value)
        return found
    for combined in ("oneOf", "anyOf"):
        if combined in schema and all(problems(value, s, where, set()) for s in schema[combined]):
            return [f"{where}: {value!r} is none of {combined}"]
    out = [p for s in schema.get("allOf", []) for p in problems(value, s, where, missing)]
    kind = schema.get("type")
    wrong_number = kind in ("integer", "number") and isinstance(value, bool)
    if kind in _PYTHON_TYPES and (not isinstance(value, _PYTHON_TYPES[kind]) or wrong_number):
        return [*out, f"{where}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            out += problems(item, schema.get("items"), f"{where}[{i}]", missing)
    if isinstance(value, dict):
        for name, field in (schema.get("properties") or {}).items():
            if name in value:
                out += problems(value[name], field, f"{where}.{name}", missing)
    return out


def _operations() -> set[tuple[str, str]]:
    return {(op["method"], op["path"]) for op in SPEC["operations"]}


async def test_served_operations_answer_the_documented_codes_and_types(rest: Rest, adb: AsyncDb) -> None:
    v2, v3 = rest.base, f"/api/v3/accounts/{rest.account_id}"
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    job_id, failed = await _dbt_run(rest, adb, [10, 10, 10, 20])
    await adb.execute("UPDATE jobs SET environment_id = %s WHERE id = %s", (env["id"], job_id))
    done = await rest.create_job(adb, name="done")
    succeeded = int((await rest.http.post(f"{v2}/jobs/{done}/run/", json={})).json()["data"]["id"])
    await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (succeeded,))
    queued = int((await rest.http.post(f"{v2}/jobs/{done}/run/", json={})).json()["data"]["id"])
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, '{}')",
        (succeeded,),
    )
    step_id = (await rest.http.get(f"{v2}/runs/{failed}/", params={"include_related": "run_steps"})).json()["data"][
        "run_steps"
    ][0]["id"]
    env_body = {"name": "e", "type": "deployment", "dbt_version": "1.10", "credentials": {"schema": "a"}}
    connection_body = {"name": "w", "adapter_version": "postgres_v0", "config": {"hostname": "h", "dbname": "d"}}
    connection = (await rest.http.post(f"{v3}/connections/", json=connection_body)).json()["data"]
    credentials_body = {"type": "postgres", "username": "u", "password": "p", "default_schema": "a"}
    credentials_path = f"{v3}/projects/{project['id']}/credentials/"
    credentials = (await rest.http.post(credentials_path, json=credentials_body)).json()["data"]
    repositories_path = f"{v3}/projects/{project['id']}/repositories/"
    repository_body = {"remote_url": "https://git.example.com/a/c.git"}
    repository = (await rest.http.post(repositories_path, json=repository_body)).json()["data"]
    ids: dict[str, Any] = {}

    async def made(key: str, response: Any) -> None:
        ids[key] = response.json()["data"]["id"]

    # In order: what a later call reads or removes is made first. (method, path, body, then)
    calls: list[tuple[str, str, str, Any]] = [
        ("GET", "/api/v2/accounts/", "/api/v2/accounts/", None),
        ("GET", "/api/v2/accounts/{account_id}/", f"{v2}/", None),
        ("GET", "/api/v2/accounts/{account_id}/users/", f"{v2}/users/", None),
        ("GET", "/api/v2/accounts/{account_id}/projects/", f"{v2}/projects/", None),
        ("GET", "/api/v2/accounts/{account_id}/projects/{id}/", f"{v2}/projects/{project['id']}/", None),
        ("GET", "/api/v3/accounts/{account_id}/projects/", f"{v3}/projects/", None),
        ("GET", "/api/v3/accounts/{account_id}/projects/{id}/", f"{v3}/projects/{project['id']}/", None),
        ("POST", "/api/v3/accounts/{account_id}/projects/{id}/", f"{v3}/projects/{project['id']}/", {"name": "p2"}),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/",
            f"{v3}/projects/",
            {"name": "gone", "repository": {"remote_url": "https://git.example.com/a/b.git"}},
        ),
        ("GET", "/api/v2/accounts/{account_id}/environments/", f"{v2}/environments/", None),
        ("GET", "/api/v2/accounts/{account_id}/environments/{id}/", f"{v2}/environments/{env['id']}/", None),
        (
            "POST",
            "/api/v2/accounts/{account_id}/environments/",
            f"{v2}/environments/",
            {**env_body, "project_id": project["id"], "connection": POSTGRES},
        ),
        ("POST", "/api/v2/accounts/{account_id}/environments/{id}/", f"{v2}/environments/{env['id']}/", {"name": "x"}),
        (
            "GET",
            "/api/v3/accounts/{account_id}/projects/{project_id}/environments/",
            f"{v3}/projects/{project['id']}/environments/",
            None,
        ),
        (
            "GET",
            "/api/v3/accounts/{account_id}/projects/{project_id}/environments/{id}/",
            f"{v3}/projects/{project['id']}/environments/{env['id']}/",
            None,
        ),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/{project_id}/environments/{id}/",
            f"{v3}/projects/{project['id']}/environments/{env['id']}/",
            {"name": "y"},
        ),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/{project_id}/environments/",
            f"{v3}/projects/{project['id']}/environments/",
            {**env_body, "connection": POSTGRES},
        ),
        ("GET", "/api/v2/accounts/{account_id}/jobs/", f"{v2}/jobs/", None),
        ("GET", "/api/v2/accounts/{account_id}/jobs/{id}/", f"{v2}/jobs/{job_id}/", None),
        (
            "POST",
            "/api/v2/accounts/{account_id}/jobs/",
            f"{v2}/jobs/",
            {"name": "new", "environment_id": env["id"], "execute_steps": ["dbt build"]},
        ),
        (
            "POST",
            "/api/v2/accounts/{account_id}/jobs/{id}/",
            f"{v2}/jobs/{done}/",
            {"name": "done again", "execute_steps": ["echo done"]},
        ),
        ("GET", "/api/v2/accounts/{account_id}/runs/", f"{v2}/runs/", None),
        ("GET", "/api/v2/accounts/{account_id}/runs/{id}/", f"{v2}/runs/{failed}/", None),
        ("GET", "/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/", f"{v2}/runs/{succeeded}/artifacts/", None),
        (
            "GET",
            "/api/v2/accounts/{account_id}/runs/{run_id}/artifacts/{remainder}",
            f"{v2}/runs/{succeeded}/artifacts/manifest.json",
            None,
        ),
        (
            "GET",
            "/api/v2/accounts/{account_id}/jobs/{job_id}/artifacts/{remainder}",
            f"{v2}/jobs/{done}/artifacts/manifest.json",
            None,
        ),
        ("GET", "/api/v2/accounts/{account_id}/steps/{id}/", f"{v2}/steps/{step_id}/", None),
        ("GET", "/api/v2/accounts/{account_id}/runs/{run_id}/retry/", f"{v2}/runs/{failed}/retry/", None),
        ("POST", "/api/v2/accounts/{account_id}/runs/{run_id}/retry/", f"{v2}/runs/{failed}/retry/", {}),
        ("POST", "/api/v2/accounts/{account_id}/jobs/{job_id}/run/", f"{v2}/jobs/{done}/run/", {}),
        ("POST", "/api/v2/accounts/{account_id}/jobs/{job_id}/rerun/", f"{v2}/jobs/{done}/rerun/", {}),
        ("POST", "/api/v2/accounts/{account_id}/runs/{run_id}/cancel/", f"{v2}/runs/{queued}/cancel/", {}),
        ("GET", "/api/v3/accounts/{account_id}/connections/", f"{v3}/connections/", None),
        ("POST", "/api/v3/accounts/{account_id}/connections/", f"{v3}/connections/", connection_body),
        ("GET", "/api/v3/accounts/{account_id}/connections/{id}/", f"{v3}/connections/{connection['id']}/", None),
        (
            "PATCH",
            "/api/v3/accounts/{account_id}/connections/{id}/",
            f"{v3}/connections/{connection['id']}/",
            {"config": {"port": 6432}},
        ),
        ("GET", "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/", credentials_path, None),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/",
            credentials_path,
            credentials_body,
        ),
        (
            "GET",
            "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/{id}/",
            f"{credentials_path}{credentials['id']}/",
            None,
        ),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/{id}/",
            f"{credentials_path}{credentials['id']}/",
            {"threads": 8},
        ),
        (
            "PATCH",
            "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/{id}/",
            f"{credentials_path}{credentials['id']}/",
            {"target_name": "prod"},
        ),
        ("GET", "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/", repositories_path, None),
        (
            "POST",
            "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/",
            repositories_path,
            repository_body,
        ),
        (
            "GET",
            "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/{id}/",
            f"{repositories_path}{repository['id']}/",
            None,
        ),
    ]
    deletes = [
        ("DELETE", "/api/v2/accounts/{account_id}/jobs/{id}/", "new_job", "{v2}/jobs/{id}/"),
        ("DELETE", "/api/v2/accounts/{account_id}/environments/{id}/", "v2_env", "{v2}/environments/{id}/"),
        (
            "DELETE",
            "/api/v3/accounts/{account_id}/projects/{project_id}/environments/{id}/",
            "v3_env",
            "{v3}/projects/{project}/environments/{id}/",
        ),
        ("DELETE", "/api/v3/accounts/{account_id}/connections/{id}/", "connection", "{v3}/connections/{id}/"),
        (
            "DELETE",
            "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/{id}/",
            "credentials",
            "{v3}/projects/{project}/credentials/{id}/",
        ),
        (
            "DELETE",
            "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/{id}/",
            "repository",
            "{v3}/projects/{project}/repositories/{id}/",
        ),
        ("DELETE", "/api/v3/accounts/{account_id}/projects/{id}/", "project", "{v3}/projects/{id}/"),
    ]
    assert {(m, p) for m, p, _, _ in calls} | {(m, p) for m, p, _, _ in deletes} == _operations(), (
        "every served operation of the document is called here, and only those"
    )
    made_by = {
        ("POST", "/api/v2/accounts/{account_id}/jobs/"): "new_job",
        ("POST", "/api/v2/accounts/{account_id}/environments/"): "v2_env",
        ("POST", "/api/v3/accounts/{account_id}/projects/{project_id}/environments/"): "v3_env",
        ("POST", "/api/v3/accounts/{account_id}/projects/"): "project",
        ("POST", "/api/v3/accounts/{account_id}/connections/"): "connection",
        ("POST", "/api/v3/accounts/{account_id}/projects/{project_id}/credentials/"): "credentials",
        ("POST", "/api/v3/accounts/{account_id}/projects/{project_id}/repositories/"): "repository",
    }
    spec = {(op["method"], op["path"]): op for op in SPEC["operations"]}
    failures: list[str] = []
    missing: set[str] = set()

    async def check(method: str, documented: str, path: str, body: Any) -> Any:
        response = await rest.http.request(method, path, json=body)
        (code,) = spec[(method, documented)]["responses"]  # one documented answer per served operation
        expected = OTHER_CODES[method][1] if OTHER_CODES.get(method, (None,))[0] == int(code) else int(code)
        if response.status_code != expected:
            failures.append(f"{method} {documented}: {response.status_code}, documented {code}: {response.text[:300]}")
            return response
        schema = spec[(method, documented)]["responses"][code]
        if (method, documented) in ONE_OBJECT_LISTS:
            envelope = SPEC["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
            item = envelope["properties"]["data"]
            schema = {**envelope, "properties": {**envelope["properties"], "data": {"type": "array", "items": item}}}
        if schema is not None:
            failures.extend(problems(response.json(), schema, f"{method} {documented}", missing))
        return response

    for method, documented, path, body in calls:
        response = await check(method, documented, path, body)
        if (method, documented) in made_by and response.status_code == 200:
            await made(made_by[(method, documented)], response)
    for method, documented, key, template in deletes:
        path = template.format(v2=v2, v3=v3, project=project["id"], id=ids.get(key, 0))
        await check(method, documented, path, None)
    assert not failures, "\n".join(failures)
    unexpected = {m for m in missing if not ABSENT.get(m.split(".", 1)[0], set()) & {"*", m.split(".", 1)[1]}}
    assert not unexpected, "\n".join(sorted(unexpected))


def test_the_vendored_document_is_the_recorded_cut() -> None:
    """The fixture says where it came from, and holds only operations and the schemas they reach."""
    assert SPEC["source"] == "https://github.com/dbt-labs/dbt-cloud-openapi-spec"
    assert re.fullmatch(r"[0-9a-f]{40}", SPEC["commit"])
    reached = set(re.findall(r"#/components/schemas/(\w+)", json.dumps(SPEC["operations"])))
    todo = set(reached)
    while todo:
        name = todo.pop()
        found = set(re.findall(r"#/components/schemas/(\w+)", json.dumps(SPEC["schemas"][name]))) - reached
        reached |= found
        todo |= found
    assert reached == set(SPEC["schemas"])
