"""dbt Cloud's own clients, from PyPI, against a real API process over HTTPS and real runs.

The API process serves a certificate from a throwaway CA (trustme); the clients are pointed at
runplane only through their documented settings (``DBT_CLOUD_HOST``, the API token, the account)
and trust the CA through ``REQUESTS_CA_BUNDLE``, as any requests-based client does. Nothing in
them is patched.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trustme

from api.admin import create_account
from runplane.basics.settings import Settings
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import Services

pytestmark = pytest.mark.slow

T = TypeVar("T")
ECHO_SETTINGS = 'echo "target=$RUNPLANE_TARGET_NAME threads=$RUNPLANE_THREADS"'
MANIFEST_STEP = "echo building; mkdir -p target; printf '{\"nodes\": 3}' > target/manifest.json"


@dataclass
class Api:
    host: str  # what the clients call DBT_CLOUD_HOST: host and port, no scheme
    ca_file: Path
    account_id: int
    token: str

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"https://{self.host}",
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            headers={"Authorization": f"Token {self.token}"},
        )


@pytest.fixture
def api(services: Services, settings: Settings, tmp_path: Path) -> Iterator[Api]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    rest_port = free_port()
    # The API first, with its TLS or webhook settings: a dispatcher started first would bring its own.
    services.start(
        "api",
        "api",
        RUNPLANE_API__REST_PORT=str(rest_port),
        RUNPLANE_API__TLS_CERTFILE=str(cert_file),
        RUNPLANE_API__TLS_KEYFILE=str(key_file),
    )
    services.start("scheduler")
    services.start("dispatcher")
    import asyncio

    account_id, token = asyncio.run(create_account(settings, name="acme", run_slots=4, memory_mb=1024))
    running = Api(f"localhost:{rest_port}", ca_file, account_id, token)
    with running.http() as http:
        wait_for(lambda: _answers(http), 30, what="the REST API to answer over HTTPS")
    yield running


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/api/v2/accounts/").status_code == 200
    except httpx.TransportError:
        return False


def make_job(api: Api, db: Any, name: str, steps: list[str]) -> int:
    row = db.execute(
        "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, %s, 'deploy', %s) RETURNING id",
        (api.account_id, name, steps),
    ).fetchone()
    return int(row[0])


def client_env(api: Api) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    env.update(
        DBT_CLOUD_HOST=api.host,
        DBT_CLOUD_API_TOKEN=api.token,
        DBT_CLOUD_API_KEY=api.token,
        DBT_CLOUD_ACCOUNT_ID=str(api.account_id),
        REQUESTS_CA_BUNDLE=str(api.ca_file),
        SSL_CERT_FILE=str(api.ca_file),
    )
    return env


def dbt_cloud(api: Api, *args: str, check: bool = True) -> Any:
    """Run the ``dbt-cloud`` command of dbt-cloud-cli and parse the JSON it prints."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dbt-cloud"), *args],
        env=client_env(api),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stdout


def test_dbt_cloud_cli_triggers_with_overrides_waits_lists_and_downloads(api: Api, db: Any, tmp_path: Path) -> None:
    job_id = make_job(api, db, "nightly", ["echo plain"])
    out = dbt_cloud(
        api,
        "job", "run", "--job-id", str(job_id), "--cause", "from dbt-cloud-cli", "--wait",
        "--steps-override", json.dumps([MANIFEST_STEP, ECHO_SETTINGS]),
        "--target-name-override", "ci", "--threads-override", "6", "--git-branch", "main",
    )  # fmt: skip
    run = out["data"]
    assert run["status"] == 10 and run["is_success"] is True and run["job_definition_id"] == job_id
    got = dbt_cloud(api, "run", "get", "--run-id", str(run["id"]), "--include-related", "['trigger','run_steps']")
    assert got["data"]["trigger"]["cause"] == "from dbt-cloud-cli"
    assert got["data"]["trigger"]["threads_override"] == 6
    assert "target=ci threads=6" in got["data"]["run_steps"][1]["logs"]
    listed = dbt_cloud(api, "run", "list", "--job-id", str(job_id))
    assert [r["id"] for r in listed["data"]] == [run["id"]]
    artifacts = dbt_cloud(api, "run", "list-artifacts", "--run-id", str(run["id"]))
    assert artifacts["data"] == ["manifest.json"]
    target = tmp_path / "manifest.json"
    dbt_cloud(api, "run", "get-artifact", "--run-id", str(run["id"]), "--path", "manifest.json", "-f", str(target))
    assert json.loads(target.read_text()) == {"nodes": 3}
    jobs = dbt_cloud(api, "job", "list")
    assert [j["id"] for j in jobs["data"]] == [job_id]


def test_dbt_cloud_cli_cancels_a_running_run(api: Api, db: Any) -> None:
    job_id = make_job(api, db, "slow", ["echo started; sleep 60"])
    run_id = dbt_cloud(api, "job", "run", "--job-id", str(job_id))["data"]["id"]
    wait_for(
        lambda: dbt_cloud(api, "run", "get", "--run-id", str(run_id))["data"]["status"],
        60,
        until=lambda status: status == 3,
        what="the run to be running",
    )
    dbt_cloud(api, "run", "cancel", "--run-id", str(run_id))
    final = wait_for(
        lambda: dbt_cloud(api, "run", "get", "--run-id", str(run_id))["data"],
        60,
        until=lambda run: run["is_complete"],
        what="the run to end",
    )
    assert final["status"] == 30 and final["is_cancelled"] is True


def test_dbtc_triggers_polls_reruns_lists_cancels_and_downloads(
    api: Api, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dbtc import dbtCloudClient

    for key, value in client_env(api).items():
        monkeypatch.setenv(key, value)
    # dbtc's clients share one session whose header the last one sets (from the service token).
    client = dbtCloudClient(api_key=api.token, service_token=api.token, host=api.host)
    ok_job = make_job(api, db, "models", [MANIFEST_STEP])
    bad_job = make_job(api, db, "broken", ["echo failing; exit 3"])
    run = client.cloud.trigger_job(
        api.account_id, ok_job, {"cause": "dbtc", "schema_override": "dbt_dbtc"}, should_poll=True, poll_interval=1
    )
    assert run["status"]["is_success"] and run["data"]["status"] == 10, run
    assert client.cloud.list_run_artifacts(api.account_id, run["data"]["id"])["data"] == ["manifest.json"]
    assert client.cloud.get_run_artifact(api.account_id, run["data"]["id"], "manifest.json") == {"nodes": 3}
    failed = client.cloud.trigger_job(api.account_id, bad_job, {"cause": "dbtc"}, should_poll=True, poll_interval=1)
    assert failed["data"]["status"] == 20
    rerun = client.cloud.trigger_job_from_failure(api.account_id, bad_job, should_poll=True, poll_interval=1)
    assert rerun["data"]["status"] == 20 and rerun["data"]["retrying_run_id"] == failed["data"]["id"]
    runs = client.cloud.list_runs(
        api.account_id, job_definition_id=bad_job, order_by="-id", include_related=["trigger"]
    )
    assert [r["id"] for r in runs["data"]] == [rerun["data"]["id"], failed["data"]["id"]]
    # A failed run is rerun from its failed step, dbt Cloud's "rerun from failure".
    assert runs["data"][0]["trigger"]["cause"] == f"Rerun of run {failed['data']['id']} from step 1"
    errored = client.cloud.list_runs(api.account_id, status="error")
    assert {r["id"] for r in errored["data"]} == {failed["data"]["id"], rerun["data"]["id"]}
    slow = make_job(api, db, "slow", ["sleep 60"])
    queued = client.cloud.trigger_job(api.account_id, slow, {"cause": "to cancel"}, should_poll=False)
    cancelled = client.cloud.cancel_run(api.account_id, queued["data"]["id"])
    assert cancelled["status"]["is_success"]
    final = wait_for(
        lambda: client.cloud.get_run(api.account_id, queued["data"]["id"])["data"],
        60,
        until=lambda r: r["is_complete"],
        what="the cancelled run to end",
    )
    assert final["status"] == 30
    assert [a["id"] for a in client.cloud.list_accounts()["data"]] == [api.account_id]
    assert {j["id"] for j in client.cloud.list_jobs(api.account_id)["data"]} == {ok_job, bad_job, slow}


def test_an_untrusted_certificate_is_refused_by_the_clients(api: Api, db: Any) -> None:
    env = client_env(api)
    env.pop("REQUESTS_CA_BUNDLE")
    env.pop("SSL_CERT_FILE")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dbt-cloud"), "job", "list"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in (done.stdout + done.stderr)


def test_clients_find_projects_environments_and_jobs_by_name(
    api: Api, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dbtc import dbtCloudClient

    v3 = f"/api/v3/accounts/{api.account_id}"
    with api.http() as http:
        project = http.post(
            f"{v3}/projects/",
            json={"name": "Jaffle Shop", "repository": {"remote_url": "https://git.example.com/j.git"}},
        ).json()["data"]
        environment = http.post(
            f"{v3}/projects/{project['id']}/environments/",
            json={
                "name": "Production",
                "type": "deployment",
                "dbt_version": "1.10",
                "connection": {"type": "postgres", "details": {"host": "db", "user": "dbt", "dbname": "shop"}},
                "credentials": {"schema": "analytics"},
            },
        ).json()["data"]
        job = http.post(
            f"/api/v2/accounts/{api.account_id}/jobs/",
            json={"name": "Daily build", "environment_id": environment["id"], "execute_steps": ["dbt build"]},
        ).json()["data"]
    plain = make_job(api, db, "plain", ["echo plain"])
    # dbt-cloud-cli: projects, a project's environments, jobs of a project, every run page by page
    projects = dbt_cloud(api, "project", "list")
    assert [p["name"] for p in projects["data"]] == ["Jaffle Shop"]
    environments = dbt_cloud(api, "environment", "list", "--project-id", str(project["id"]))
    assert [(e["id"], e["dbt_version"]) for e in environments["data"]] == [(environment["id"], "1.10")]
    jobs = dbt_cloud(api, "job", "list", "--project-id", str(project["id"]))
    assert [j["name"] for j in jobs["data"]] == ["Daily build"]
    runs = [dbt_cloud(api, "job", "run", "--job-id", str(plain))["data"]["id"] for _ in range(3)]
    paged = dbt_cloud(api, "run", "list", "--paginate")
    assert sorted(r["id"] for r in paged["data"]) == sorted(runs)
    # dbtc: a project by name, its environments by name, its jobs
    for key, value in client_env(api).items():
        monkeypatch.setenv(key, value)
    client = dbtCloudClient(api_key=api.token, service_token=api.token, host=api.host)
    found = client.cloud.get_project_by_name("Jaffle Shop", account_id=api.account_id)
    assert found["data"]["id"] == project["id"]
    named = client.cloud.list_environments(api.account_id, project["id"], name="Production")
    assert [e["id"] for e in named["data"]] == [environment["id"]]
    in_project = client.cloud.list_jobs(api.account_id, project_id=project["id"])
    assert [j["id"] for j in in_project["data"]] == [job["id"]]
    assert in_project["data"][0]["environment"]["name"] == "Production"
