"""A dbt run's steps as dbt Cloud's API v2 shows them (``run_steps`` of a run with
``include_related``): the setup steps first ("Clone git repository", "Create profile from
connection …", "Invoke dbt deps"), each with its status, times and log, then the job's commands as
"Invoke `…`", numbered from 1 across both. Clients retry from failure by that numbering: the
failed step's index less the setup steps is the job's command to start from.
"""

from __future__ import annotations

from typing import Any

from tests.api.conftest import AsyncDb, Rest
from tests.api.rest.test_dbt_cloud import _environment, _project, _trigger

SETUP_NAMES = ["Clone git repository", "Create profile from connection postgres", "Invoke dbt deps"]
COMMANDS = ["dbt seed", "dbt build", "dbt test"]


async def _dbt_run(rest: Rest, adb: AsyncDb, statuses: list[int]) -> tuple[int, int]:
    """A dbt job's run that ended as error, its steps as a runner records them: three setup steps,
    then the commands; ``statuses`` of the steps that ran, the rest skipped."""
    project = await _project(rest)
    env = await _environment(rest, project["id"])
    job_id = await rest.create_job(adb, environment_id=env["id"], steps=COMMANDS)
    run_id = await _trigger(rest, job_id)
    for index, command in enumerate([*SETUP_NAMES, *COMMANDS]):
        ran = index < len(statuses)
        await adb.execute(
            "INSERT INTO run_steps (run_id, step_index, command, setup, status, skipped, started_at, finished_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s THEN now() - interval '2 s' END,"
            " CASE WHEN %s THEN now() END)",
            (run_id, index, command, index < 3, statuses[index] if ran else 1, not ran, ran, ran),
        )
        await adb.execute(
            "INSERT INTO run_log_chunks (run_id, seq, step_index, text) VALUES (%s, %s, %s, %s)",
            (run_id, index + 1, index, f"log of {command}\n"),
        )
    await adb.execute("UPDATE runs SET status = 20, finished_at = now() WHERE id = %s", (run_id,))
    return job_id, run_id


async def _steps(rest: Rest, run_id: int) -> list[dict[str, Any]]:
    got = await rest.http.get(f"{rest.base}/runs/{run_id}/", params={"include_related": "run_steps"})
    return list(got.json()["data"]["run_steps"])


def retry_from_failure(job: dict[str, Any], steps: list[dict[str, Any]]) -> list[str]:
    """What a dbt Cloud client sends as ``steps_override`` to restart from the failed command: the
    failed step's 1-based index, less the setup steps dbt Cloud lists first, picks the command."""
    failed = next(s for s in steps if s["status"] == 20)
    return list(job["execute_steps"][failed["index"] - 1 - len(SETUP_NAMES) :])


async def test_setup_steps_come_first_and_the_commands_are_numbered_after_them(rest: Rest, adb: AsyncDb) -> None:
    job_id, run_id = await _dbt_run(rest, adb, [10, 10, 10, 20])
    steps = await _steps(rest, run_id)
    assert [(s["index"], s["name"], s["status"]) for s in steps] == [
        (1, "Clone git repository", 10),
        (2, "Create profile from connection postgres", 10),
        (3, "Invoke dbt deps", 10),
        (4, "Invoke `dbt seed`", 20),
        (5, "Invoke `dbt build`", 1),
        (6, "Invoke `dbt test`", 1),
    ]
    assert steps[0]["logs"] == "log of Clone git repository\n" and steps[3]["logs"] == "log of dbt seed\n"
    assert steps[0]["duration_humanized"] and steps[0]["finished_at"]

    # A failure in the job's first command is retried from that command, by the client's numbering
    # and by runplane's own rerun.
    job = (await rest.http.get(f"{rest.base}/jobs/{job_id}/")).json()["data"]
    assert retry_from_failure(job, steps) == COMMANDS
    retried = await rest.http.post(f"{rest.base}/jobs/{job_id}/run/", json={"steps_override": COMMANDS})
    assert retried.status_code == 200, retried.text
    rerun = (await rest.http.post(f"{rest.base}/runs/{run_id}/retry/")).json()["data"]["id"]
    again = await rest.http.get(f"{rest.base}/runs/{rerun}/", params={"include_related": "trigger"})
    assert again.json()["data"]["trigger"]["steps_override"] == COMMANDS
    assert again.json()["data"]["trigger"]["cause"] == f"Rerun of run {run_id} from step 4"


async def test_a_failed_setup_step_reruns_every_command_and_no_setup_step(rest: Rest, adb: AsyncDb) -> None:
    _, run_id = await _dbt_run(rest, adb, [10, 10, 20])
    steps = await _steps(rest, run_id)
    assert [(s["name"], s["status"]) for s in steps[:3]] == list(zip(SETUP_NAMES, [10, 10, 20], strict=True))
    rerun = (await rest.http.post(f"{rest.base}/runs/{run_id}/retry/")).json()["data"]["id"]
    again = await rest.http.get(f"{rest.base}/runs/{rerun}/", params={"include_related": "trigger"})
    assert again.json()["data"]["trigger"]["steps_override"] == COMMANDS


async def test_step_parameters_count_the_setup_steps(rest: Rest, adb: AsyncDb) -> None:
    _, run_id = await _dbt_run(rest, adb, [10, 10, 10, 10, 20])
    await adb.execute(
        "INSERT INTO artifacts (run_id, path, step_index, content) VALUES (%s, 'target/run_results.json', 3, %s),"
        " (%s, 'target/run_results.json', 4, %s)",
        (run_id, b'{"which": "seed"}', run_id, b'{"which": "build"}'),
    )
    seed = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/run_results.json", params={"step": 4})
    build = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/run_results.json", params={"step": 5})
    assert (seed.json(), build.json()) == ({"which": "seed"}, {"which": "build"})
    listed = await rest.http.get(f"{rest.base}/runs/{run_id}/artifacts/", params={"step": 1})
    assert listed.json()["data"] == []  # the clone step writes no artifact
