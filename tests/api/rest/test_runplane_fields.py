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


async def _triggers(adb: AsyncDb, job_id: int) -> list[tuple[int, list[int]]]:
    rows = await adb.execute(
        "SELECT upstream_job_id, statuses FROM job_completion_triggers WHERE job_id = %s ORDER BY 1", (job_id,)
    )
    return [(upstream, sorted(statuses)) for upstream, statuses in await rows.fetchall()]


async def test_an_update_made_from_an_older_version_is_refused_naming_the_current_one(rest: Rest, adb: AsyncDb) -> None:
    job_id = await rest.create_job(adb, job_type="adhoc")
    read = await rest.http.get(f"{rest.base}/jobs/{job_id}/")
    version = read.json()["data"]["runplane"]["version"]
    assert read.headers["ETag"] == f'"{version}"'

    saved = await rest.http.post(
        f"{rest.base}/jobs/{job_id}/", json=_body(name="first edit"), headers={"If-Match": read.headers["ETag"]}
    )
    assert saved.status_code == 200, saved.text
    current = saved.json()["data"]["runplane"]["version"]
    assert current > version and saved.headers["ETag"] == f'"{current}"'

    stale = await rest.http.post(
        f"{rest.base}/jobs/{job_id}/", json=_body(name="second edit"), headers={"If-Match": str(version)}
    )
    assert stale.status_code == 409, stale.text
    message = stale.json()["status"]["user_message"]
    assert f"at version {current}, not {version}" in message, message
    assert await scalar(adb, "SELECT name FROM jobs WHERE id = %s", job_id) == "first edit"

    malformed = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(), headers={"If-Match": 'W/"x"'})
    assert malformed.status_code == 400 and "If-Match" in malformed.json()["status"]["user_message"]
    for any_version in ({"If-Match": "*"}, {}):
        unchecked = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(name="last"), headers=any_version)
        assert unchecked.status_code == 200, unchecked.text


async def test_every_completion_trigger_is_read_and_set_and_none_is_dropped_silently(rest: Rest, adb: AsyncDb) -> None:
    first, second, third = [await rest.create_job(adb, name=name) for name in ("first", "second", "third")]
    fan_in = {
        "completion_mode": "all",
        "job_completion_trigger_conditions": [
            {"job_id": first, "statuses": [10]},
            {"job_id": second, "statuses": [20, 10]},
        ],
    }
    created = await rest.http.post(f"{rest.base}/jobs/", json=_body(runplane=fan_in))
    assert created.status_code == 200, created.text
    job = created.json()["data"]
    job_id = job["id"]
    assert job["runplane"]["job_completion_trigger_conditions"] == [
        {"job_id": first, "project_id": None, "statuses": [10]},
        {"job_id": second, "project_id": None, "statuses": [10, 20]},
    ]
    assert job["job_completion_trigger_condition"] == {
        "condition": {"job_id": first, "project_id": None, "statuses": [10]}
    }
    assert await _triggers(adb, job_id) == [(first, [10]), (second, [10, 20])]

    # dbt Cloud's one condition, changed, on a job with two: refused, nothing written.
    other = {"condition": {"job_id": third, "statuses": [10]}}
    refused = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(job_completion_trigger_condition=other))
    assert refused.status_code == 400, refused.text
    message = refused.json()["status"]["user_message"]
    assert "job_completion_trigger_condition" in message and "2 completion triggers" in message, message
    assert "runplane.job_completion_trigger_conditions" in message, message
    assert await _triggers(adb, job_id) == [(first, [10]), (second, [10, 20])]

    # The first as it is keeps them all, and the completion mode.
    kept = await rest.http.post(
        f"{rest.base}/jobs/{job_id}/",
        json=_body(job_completion_trigger_condition=job["job_completion_trigger_condition"]),
    )
    assert kept.status_code == 200, kept.text
    assert await _triggers(adb, job_id) == [(first, [10]), (second, [10, 20])]
    assert kept.json()["data"]["runplane"]["completion_mode"] == "all"

    disagree = _body(
        job_completion_trigger_condition=other,
        runplane={"job_completion_trigger_conditions": [{"job_id": first, "statuses": [10]}]},
    )
    response = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=disagree)
    assert response.status_code == 400 and "must be the first" in response.json()["status"]["user_message"]

    listed = {
        "job_completion_trigger_conditions": [{"job_id": third, "statuses": [30]}, {"job_id": first, "statuses": [10]}]
    }
    replaced = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(runplane=listed))
    assert replaced.status_code == 200, replaced.text
    assert await _triggers(adb, job_id) == [(first, [10]), (third, [30])]
    shown = replaced.json()["data"]["runplane"]["job_completion_trigger_conditions"]
    assert {c["job_id"] for c in shown} == {first, third}

    cleared = await rest.http.post(
        f"{rest.base}/jobs/{job_id}/", json=_body(runplane={"job_completion_trigger_conditions": []})
    )
    assert cleared.status_code == 200 and cleared.json()["data"]["job_completion_trigger_condition"] is None
    assert await _triggers(adb, job_id) == []

    # With one trigger, dbt Cloud's field replaces it, as in dbt Cloud.
    single = {"condition": {"job_id": second, "statuses": [10]}}
    assert (
        await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(job_completion_trigger_condition=other))
    ).status_code == 200
    moved = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(job_completion_trigger_condition=single))
    assert moved.status_code == 200, moved.text
    assert await _triggers(adb, job_id) == [(second, [10])]

    listed_twice = {"job_completion_trigger_conditions": [{"job_id": first, "statuses": [10]}] * 2}
    twice = await rest.http.post(f"{rest.base}/jobs/{job_id}/", json=_body(runplane=listed_twice))
    assert twice.status_code == 400 and "listed twice" in twice.json()["status"]["user_message"]


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
    assert at_most.status_code == 200, at_most.text
    assert at_most.json()["data"]["execution"]["timeout_seconds"] == 86_400
    for seconds in (86_401, 7 * 24 * 3600 + 1, -1):
        response = await rest.http.post(f"{rest.base}/jobs/", json=_body(execution={"timeout_seconds": seconds}))
        assert response.status_code == 400, (seconds, response.text)
        message = response.json()["status"]["user_message"]
        assert f"execution.timeout_seconds: must be between 0 and 86400 (got {seconds})" in message, message
    too_big = await rest.http.post(f"{rest.base}/jobs/", json=_body(execution={"timeout_seconds": 2**40}))
    assert too_big.status_code == 400 and "execution.timeout_seconds" in too_big.json()["status"]["user_message"]
    assert await scalar(adb, "SELECT count(*) FROM jobs") == 1


async def test_a_completion_trigger_on_a_status_that_is_no_run_end_is_refused(rest: Rest, adb: AsyncDb) -> None:
    """dbt Cloud's statuses are 10, 20 and 30; any other number, however large, is a 400 naming the
    field (a number past what the contract holds answered 500)."""
    upstream = await rest.create_job(adb, job_type="adhoc")
    for statuses in ([35549213213416], [1], [10, 99]):
        condition = {"condition": {"job_id": upstream, "statuses": statuses}}
        answer = await rest.http.post(
            f"{rest.base}/jobs/", json=_body(name="watcher", job_completion_trigger_condition=condition)
        )
        assert answer.status_code == 400, answer.text
        assert "statuses" in answer.text
    assert await scalar(adb, "SELECT count(*) FROM jobs WHERE name = 'watcher'") == 0
