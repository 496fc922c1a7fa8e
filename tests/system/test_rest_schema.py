"""schemathesis against the REST API's own OpenAPI document, on a real API process.

Every operation gets schema-valid requests (mostly aimed at this account's real job and run, some at
random ids) and schema-invalid ones. No answer may be a 5xx or stray from the document, and a
rejected request must leave the database exactly as it was.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import psycopg
import pytest
import requests
import schemathesis
from psycopg.types.json import Jsonb
from schemathesis import checks
from schemathesis.core.result import Ok
from schemathesis.generation.modes import GenerationMode

from api.admin import create_account
from runplane.basics.secrets import generate_key
from runplane.basics.settings import Settings
from tests.support.ports import free_port
from tests.support.processes import Services
from tests.support.records import one

# About 40 s on an idle machine; a busy one needs more than the default per-test timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
# Requests per operation: aimed at real ids, free positive ones, and invalid ones.
AIMED, FREE, INVALID = 30, 10, 15
REQUEST_TIMEOUT = 20
FINGERPRINT = """
SELECT (SELECT count(*) FROM runs), (SELECT coalesce(sum(status), 0) FROM runs),
       (SELECT count(*) FROM runs WHERE cancel_requested_at IS NOT NULL),
       (SELECT count(*) FROM jobs), (SELECT coalesce(sum(version), 0) FROM jobs),
       (SELECT count(*) FROM accounts), (SELECT count(*) FROM api_tokens), (SELECT count(*) FROM artifacts),
       (SELECT count(*) FROM webhook_subscriptions), (SELECT count(*) FROM git_webhooks),
       (SELECT coalesce(max(updated_at), 'epoch') FROM webhook_subscriptions),
       (SELECT count(*) FROM projects WHERE deleted_at IS NULL),
       (SELECT coalesce(max(updated_at), 'epoch') FROM projects),
       (SELECT count(*) FROM environments WHERE deleted_at IS NULL),
       (SELECT coalesce(max(updated_at), 'epoch') FROM environments)
"""


@dataclass
class Target:
    base_url: str
    token: str
    account_id: int
    job_id: int
    run_id: int
    project_id: int
    environment_id: int


@pytest.fixture
def target(services: Services, settings: Settings, db: psycopg.Connection[tuple[Any, ...]]) -> Iterator[Target]:
    rest_port = free_port()
    services.start(
        "api",
        "api",
        RUNPLANE_API__PORT=str(free_port()),
        RUNPLANE_API__REST_PORT=str(rest_port),
        RUNPLANE_SECRET_KEYS=generate_key(),
    )
    account_id, token = asyncio.run(create_account(settings, name="acme", run_slots=1, memory_mb=512))
    asyncio.run(create_account(settings, name="globex", run_slots=1, memory_mb=512))
    job_id = one(
        db,
        "INSERT INTO jobs (account_id, name, job_type, steps) VALUES (%s, 'j', 'deploy', %s) RETURNING id",
        (account_id, ["echo hi"]),
    )[0]
    run_id = one(
        db,
        "INSERT INTO runs (account_id, job_id, job_type, trigger, idempotency_key, takes_slot, scheduled_at, status,"
        " finished_at) VALUES (%s, %s, 'deploy', 'api', 'k', true, now(), 10, now()) RETURNING id",
        (account_id, job_id),
    )[0]
    db.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, '{}')",
        (run_id,),
    )
    project_id = one(
        db,
        "INSERT INTO projects (account_id, name, repository_url) VALUES (%s, 'shop', 'file:///srv/shop') RETURNING id",
        (account_id,),
    )[0]
    environment_id = one(
        db,
        "INSERT INTO environments (account_id, project_id, name, environment_type, dbt_version, adapter_type,"
        " connection, schema_name) VALUES (%s, %s, 'prod', 'deployment', '1.10', 'postgres', %s, 'analytics')"
        " RETURNING id",
        (account_id, project_id, Jsonb({"host": "db", "user": "dbt", "dbname": "shop"})),
    )[0]
    base_url = f"http://127.0.0.1:{rest_port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"{base_url}/openapi.json", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, services.log_text("api")
        time.sleep(0.1)
    yield Target(base_url, token, account_id, job_id, run_id, project_id, environment_id)


def test_every_operation_holds_to_the_document(target: Target, db: psycopg.Connection[tuple[Any, ...]]) -> None:
    session = requests.Session()
    headers = {"Authorization": f"Token {target.token}"}
    sent = 0
    slowest: list[tuple[float, str]] = []
    # The document the running API serves (the app's own, as FastAPI builds it).
    schema = schemathesis.openapi.from_dict(requests.get(f"{target.base_url}/openapi.json", timeout=10).json())
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the document is valid: every operation loads
        operation = result.ok()
        names = {p.name for p in operation.path_parameters}
        real = {
            "account_id": target.account_id,
            "job_id": target.job_id,
            "run_id": target.run_id,
            "project_id": target.project_id,
            "environment_id": target.environment_id,
            "path": "manifest.json",
        }
        aimed = operation.as_strategy(path_parameters={k: v for k, v in real.items() if k in names})

        def exercise(case: Any) -> None:
            nonlocal sent
            before = db.execute(FINGERPRINT).fetchone()
            started = time.monotonic()
            response = case.call_and_validate(
                base_url=target.base_url, session=session, headers=headers, checks=CHECKS, timeout=REQUEST_TIMEOUT
            )
            slowest.append((time.monotonic() - started, f"{case.method} {case.formatted_path}"))
            sent += 1
            if response.status_code >= 400:
                assert db.execute(FINGERPRINT).fetchone() == before, (case.method, case.formatted_path, response.text)

        for strategy, examples in (
            (aimed, AIMED),
            (operation.as_strategy(), FREE),
            (operation.as_strategy(generation_mode=GenerationMode.NEGATIVE), INVALID),
        ):
            hypothesis.settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(hypothesis.HealthCheck),
                phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
            )(hypothesis.given(case=strategy)(exercise))()
    slowest.sort(reverse=True)
    print(f"{sent} requests; slowest: {slowest[:3]}")
    assert sent >= 1000, sent
