"""The command-line client (``python -m client``) against the in-process server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from api.process import RunningApi
from client.cli import _parser
from tests.api.conftest import AsyncDb, Client, scalar
from tests.support.client import run_client, start
from tests.support.polling import eventually
from tests.support.processes import finish

# Each test starts the client a dozen times, a Python process each: seconds apiece on a loaded machine.
pytestmark = pytest.mark.slow


def client_env(service_env: dict[str, str], api: RunningApi, token: str) -> dict[str, str]:
    return {
        **service_env,
        "RUNPLANE_TOKEN": token,
        "RUNPLANE_API__HOST": "127.0.0.1",
        "RUNPLANE_API__PORT": str(api.port),
    }


async def test_create_trigger_get_list_cancel(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(
        env, "create-job", "--name", "cli", "--step", "echo 1", "--step", "echo 2", "--cron", "0 6 * * *",
        "--timezone", "Europe/Amsterdam",
    )  # fmt: skip
    assert job["name"] == "cli" and job["steps"] == ["echo 1", "echo 2"]
    assert job["triggers"]["schedule"] == {"cron": "0 6 * * *", "timezone": "Europe/Amsterdam"}
    run = await run_client(env, "trigger", str(job["id"]))
    assert run["status"] == "RUN_STATUS_QUEUED" and run["jobId"] == job["id"]
    assert (await run_client(env, "get-run", run["id"]))["id"] == run["id"]
    listed = await run_client(env, "list-runs", "--job", job["id"])
    assert [r["id"] for r in listed["runs"]] == [run["id"]]
    cancelled = await run_client(env, "cancel", run["id"])
    assert cancelled["status"] == "RUN_STATUS_CANCELLED"
    assert (await run_client(env, "pause-job", job["id"]))["paused"] is True
    assert "paused" not in await run_client(env, "unpause-job", job["id"])  # proto3 JSON leaves out false
    code, _, err = await finish(await start(env, "rerun", run["id"]))
    assert code == 1 and "FAILED_PRECONDITION" in err  # cancelled, not failed
    failed = await run_client(env, "trigger", str(job["id"]))
    await adb.execute("UPDATE runs SET status = 20, finished_at = now() WHERE id = %s", (failed["id"],))
    rerun = await run_client(env, "rerun", failed["id"])
    assert rerun["parentRunId"] == failed["id"] and rerun["trigger"] == "TRIGGER_RETRY"
    assert (await run_client(env, "close-pull-request", "7")) == {}  # no ci job built a schema for it
    code, _, err = await finish(await start({**env, "RUNPLANE_TOKEN": "wrong"}, "get-run", run["id"]))
    assert code == 1 and "UNAUTHENTICATED" in err


async def test_trigger_follow_prints_the_logs_then_the_outcome(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(env, "create-job", "--name", "followed", "--step", "echo hi")
    proc = await start(env, "trigger", job["id"], "--follow")
    try:

        async def triggered() -> int | None:
            assert proc.returncode is None, "the client exited before it triggered a run"
            return await _run_of(adb, int(job["id"]))

        run_id = await eventually(triggered, 30, what="the client to trigger a run")
        await adb.execute("UPDATE runs SET status = 3, started_at = now() WHERE id = %s", (run_id,))
        # A chunk ends where the runner flushed: here in the middle of a line, and the log's last
        # line has no line break.
        for seq, text in enumerate(("hi from ", "the runner\nbye"), start=1):
            await adb.execute(
                "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, %s, 0, %s)",
                (run_id, seq, text),
            )
        await adb.execute("UPDATE runs SET status = 10, finished_at = now() WHERE id = %s", (run_id,))
    finally:
        code, out, err = await finish(proc)
    assert code == 0, err
    assert "hi from the runner\nbye\n" in err, err
    assert json.loads(out)["status"] == "RUN_STATUS_SUCCESS"


async def _run_of(adb: AsyncDb, job_id: int) -> int | None:
    cur = await adb.execute("SELECT id FROM runs WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def test_settings_overrides_ci_logs_and_artifacts(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb, tmp_path: Any
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(
        env, "create-job", "--name", "pr", "--type", "ci", "--on-pull-request", "--step", "dbt build",
        "--threads", "6", "--timeout", "900", "--target-name", "ci", "--env", "A=1", "--env", "B=x=y",
        "--git-branch", "main", "--retries", "2", "--priority", "5",
    )  # fmt: skip
    settings = job["settings"]
    assert job["jobType"] == "JOB_TYPE_CI" and job["triggers"]["onPullRequest"] is True
    assert settings["threads"] == 6 and settings["timeoutSeconds"] == 900 and settings["targetName"] == "ci"
    assert settings["environment"] == {"A": "1", "B": "x=y"} and settings["retryMaxAttempts"] == 2
    run = await run_client(
        env, "trigger", job["id"], "--ci", "--pull-request", "17", "--threads", "2", "--git-sha", "abcdef12",
        "--step", "dbt build -s state:modified+", "--cause", "PR 17",
    )  # fmt: skip
    assert run["trigger"] == "TRIGGER_CI" and run["cause"] == "PR 17"
    assert run["overrides"]["pullRequestNumber"] == 17 and run["overrides"]["steps"] == ["dbt build -s state:modified+"]
    run_id = int(run["id"])
    await adb.execute(
        "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, 1, 0, 'built 3 models\n')", (run_id,)
    )
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/manifest.json', 0, %s)",
        (run_id, b'{"nodes": 3}'),
    )
    code, out, err = await finish(await start(env, "logs", str(run_id), json_output=False))
    assert code == 0 and out == "built 3 models\n", err
    listed = await run_client(env, "artifacts", str(run_id))
    assert [a["path"] for a in listed["artifacts"]] == ["target/manifest.json"]
    target = tmp_path / "manifest.json"
    code, _, err = await finish(await start(env, "artifact", str(run_id), "target/manifest.json", "-o", str(target)))
    assert code == 0 and json.loads(target.read_text()) == {"nodes": 3}, err
    code, out, _ = await finish(await start(env, "list-runs", json_output=False))
    assert out.strip().split("\t")[:3] == [f"run {run_id}", f"job {job['id']}", "queued"]


async def test_every_job_setting_from_the_command_line(
    api: RunningApi, client: Client, service_env: dict[str, str], adb: AsyncDb
) -> None:
    env = client_env(service_env, api, client.token)
    project = await run_client(env, "create-project", "--name", "shop", "--url", "https://git.example.com/shop.git")
    environment = await run_client(
        env, "create-environment", "--project", project["id"], "--name", "prod", "--dbt-version", "1.10",
        "--field", "host=db", "--field", "user=dbt", "--field", "dbname=shop", "--schema", "analytics",
    )  # fmt: skip
    databricks = await run_client(
        {**env, "DATABRICKS_TOKEN": "dapi-not-a-real-token"}, "create-environment", "--project", project["id"],
        "--name", "lake", "--dbt-version", "1.10", "--adapter", "databricks",
        "--field", "host=acme.cloud.databricks.com", "--field", "http_path=/sql/1.0/warehouses/abc",
        "--secret-env", "token=DATABRICKS_TOKEN", "--schema", "dbt",
    )  # fmt: skip
    stored = await (
        await adb.execute(
            "SELECT adapter_type, connection_secrets FROM environments WHERE id = %s", (databricks["id"],)
        )
    ).fetchone()
    assert stored is not None and stored[0] == "databricks" and set(stored[1]) == {"token"}
    assert "dapi-not-a-real-token" not in json.dumps(databricks) + json.dumps(stored[1])
    upstream = await run_client(env, "create-job", "--name", "upstream", "--step", "echo up", "--idempotency-key", "k1")
    again = await run_client(env, "create-job", "--name", "upstream", "--step", "echo up", "--idempotency-key", "k1")
    assert again["id"] == upstream["id"]  # a retried create makes no second job
    other = await run_client(env, "create-job", "--name", "other", "--step", "echo other")
    job = await run_client(
        env, "create-job", "--name", "dbt", "--step", "dbt build", "--environment", environment["id"],
        "--generate-docs", "--source-freshness", "--defer-to-job", upstream["id"], "--run-only-modified",
        "--on-completion", f"{upstream['id']}:success,error", "--on-completion", str(other["id"]),
        "--completion-mode", "all", "--missed-run-grace", "0",
    )  # fmt: skip
    settings, triggers = job["settings"], job["triggers"]
    assert settings["generateDocs"] and settings["runSourceFreshness"] and settings["runOnlyModified"]
    assert settings["deferToJobId"] == upstream["id"] and "missedRunGraceSeconds" not in settings  # 0
    assert triggers["completionMode"] == "COMPLETION_MODE_ALL"
    assert [(t["upstreamJobId"], t["statuses"]) for t in triggers["onCompletion"]] == [
        (upstream["id"], ["RUN_STATUS_SUCCESS", "RUN_STATUS_ERROR"]),
        (other["id"], ["RUN_STATUS_SUCCESS"]),
    ]
    # An update changes only what it is given; the rest of the job stays as it was.
    updated = await run_client(
        env, "update-job", job["id"], "--priority", "7", "--no-generate-docs", "--on-completion", str(other["id"]),
        "--env", "A=1",
    )  # fmt: skip
    settings, triggers = updated["settings"], updated["triggers"]
    assert updated["name"] == "dbt" and updated["steps"] == ["dbt build"]
    assert int(updated["version"]) == int(job["version"]) + 1
    assert settings["priority"] == 7 and "generateDocs" not in settings and settings["runSourceFreshness"]
    assert settings["deferToJobId"] == upstream["id"] and settings["environment"] == {"A": "1"}
    assert triggers["completionMode"] == "COMPLETION_MODE_ALL"
    assert [t["upstreamJobId"] for t in triggers["onCompletion"]] == [other["id"]]
    scheduled = await run_client(env, "update-job", job["id"], "--cron", "0 6 * * *", "--env", "A=")
    assert scheduled["triggers"]["schedule"] == {"cron": "0 6 * * *", "timezone": "UTC"}
    assert "environment" not in scheduled["settings"] and scheduled["settings"]["priority"] == 7
    unscheduled = await run_client(env, "update-job", job["id"], "--cron", "")
    assert "schedule" not in unscheduled["triggers"]
    code, _, err = await finish(await start(env, "update-job", job["id"], "--priority", "1", "--expected-version", "1"))
    assert code == 1 and "FAILED_PRECONDITION" in err  # changed since version 1
    code, _, err = await finish(
        await start(env, "create-job", "--name", "x", "--step", "echo", "--defer-to-job", upstream["id"])
    )
    assert code == 1 and "settings.environment_id" in err  # the server's check, as over gRPC and REST
    at = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    at_text = at.astimezone(timezone(timedelta(hours=2))).isoformat()  # an offset, read as the moment it names
    later = await run_client(
        env, "trigger", upstream["id"], "--run-at", at_text, "--no-generate-docs", "--target-name", "prod",
        "--dbt-version", "1.11",
    )  # fmt: skip
    assert later["overrides"]["generateDocs"] is False and later["overrides"]["targetName"] == "prod"
    assert later["overrides"]["dbtVersion"] == "1.11"
    code, _, err = await finish(await start(env, "trigger", upstream["id"], "--dbt-version", "1.11; rm -rf /"))
    assert code == 1 and "INVALID_ARGUMENT" in err and "overrides.dbt_version" in err
    assert await scalar(adb, "SELECT scheduled_at FROM runs WHERE id = %s", later["id"]) == at


async def test_overlap_jitter_pause_note_and_reattach_from_the_command_line(
    api: RunningApi, client: Client, service_env: dict[str, str]
) -> None:
    env = client_env(service_env, api, client.token)
    job = await run_client(
        env, "create-job", "--name", "hourly", "--step", "echo", "--overlap-policy", "skip", "--jitter", "30"
    )
    assert job["settings"]["overlapPolicy"] == "OVERLAP_POLICY_SKIP" and job["settings"]["jitterSeconds"] == 30
    kept = await run_client(env, "update-job", job["id"], "--priority", "2")
    assert kept["settings"]["overlapPolicy"] == "OVERLAP_POLICY_SKIP" and kept["settings"]["jitterSeconds"] == 30
    paused = await run_client(env, "pause-job", job["id"], "--note", "quarter close")
    assert paused["pauseNote"] == "quarter close" and paused["pausedBy"].startswith("token #")
    first = await run_client(env, "trigger", job["id"])
    again = await run_client(env, "trigger", job["id"], "--reattach")
    assert again["id"] == first["id"] and again["reattached"] is True


def test_a_step_counted_from_zero_is_refused_with_how_steps_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["artifact", "7", "run_results.json", "--step", "0"])
    assert exit_info.value.code == 2
    assert "steps count from 1 (the run's first step), not '0'" in capsys.readouterr().err
    assert _parser().parse_args(["artifact", "7", "run_results.json", "--step", "2"]).step == 2
