"""What REST says beyond dbt Cloud's fields, with the rules gRPC applies: a job update checked
against the version it was made from (``If-Match``), every completion trigger of a fan-in job
(``runplane.job_completion_trigger_conditions``), a one-time run (``runplane.run_at``), and the
shared bound of a job's timeout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.api.conftest import AsyncDb, Rest, scalar


def _body(**extra: Any) -> dict[str, Any]:
    """A job as a dbt Cloud client sends it: no environment, no schedule."""
    return {
        "name": "nightly",
        "execute_steps": ["echo hello"],
        "job_type": "other",
        "triggers": {"github_webhook": False, "schedule": False},
        **extra,
    }


async def test_a_trigger_with_run_at_queues_a_one_time_run_for_then(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb)
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    response = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"runplane": {"run_at": at.isoformat()}})
    assert response.status_code == 200, response.text
    run = response.json()["data"]
    assert run["status"] == 1 and datetime.fromisoformat(run["should_start_at"]) == at
    assert await scalar(adb, "SELECT scheduled_at FROM runs WHERE id = %s", run["id"]) == at

    for run_at, reason in (
        ((datetime.now(UTC) - timedelta(days=1)).isoformat(), "in the past"),
        ((datetime.now(UTC) + timedelta(days=400)).isoformat(), "days ahead"),
        ("2030-01-01T06:00:00", "timezone"),  # no offset: whose six o'clock?
    ):
        refused = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"runplane": {"run_at": run_at}})
        assert refused.status_code == 400, (run_at, refused.text)
        message = refused.json()["status"]["user_message"]
        assert "run_at" in message and reason in message, (run_at, message)
    assert await scalar(adb, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 1


async def test_a_job_timeout_is_bounded_by_the_shared_rule(rest: Rest, adb: AsyncDb) -> None:
    at_most = await rest.http.post(f"{rest.base}/jobs/", json=_body(execution={"timeout_seconds": 86_400}))
    assert at_most.status_code == 201, at_most.text
    assert at_most.json()["data"]["execution"]["timeout_seconds"] == 86_400
    for seconds in (86_401, 7 * 24 * 3600 + 1, -1):
        response = await rest.http.post(f"{rest.base}/jobs/", json=_body(execution={"timeout_seconds": seconds}))
        assert response.status_code == 400, (seconds, response.text)
        message = response.json()["status"]["user_message"]
        assert f"execution.timeout_seconds: must be between 0 and 86400 (got {seconds})" in message, message
    too_big = await rest.http.post(f"{rest.base}/jobs/", json=_body(execution={"timeout_seconds": 2**40}))
    assert too_big.status_code == 400 and "execution.timeout_seconds" in too_big.json()["status"]["user_message"]
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 1
