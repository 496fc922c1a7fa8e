"""dbt-jobs-as-code, the real tool, plans and syncs a YAML of jobs against runplane unchanged.

It runs from a virtual environment of its own (``make jobs-as-code``: its pins conflict with
runplane's), as a subprocess pointed at the REST API by ``DBT_BASE_URL``."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.process import RunningApi
from api.rest.server import RestServer
from runplane.basics.settings import Settings
from tests.api.conftest import AsyncDb, Rest, scalar
from tests.api.jobs_as_code.commands import runplane
from tests.support.api import serving_api

TOOL = Path(__file__).resolve().parents[3] / ".venv" / "jobs-as-code" / "bin" / "dbt-jobs-as-code"
OUTPUT = os.environ.get("RUNPLANE_JOBS_AS_CODE_OUTPUT", "")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not TOOL.exists() and not os.environ.get("CI"), reason="make jobs-as-code installs dbt-jobs-as-code"
    ),
]

JOBS = """\
jobs:
  nightly:
    account_id: {account}
    project_id: {project}
    environment_id: {environment}
    dbt_version: "1.10"
    name: "{name}"
    settings:
      threads: 4
      target_name: default
    execution:
      timeout_seconds: 600
    run_generate_sources: false
    execute_steps:
      - "dbt build"
    generate_docs: false
    schedule:
      cron: "0 6 * * *"
    triggers:
      github_webhook: false
      git_provider_webhook: false
      schedule: true
      on_merge: false
    job_type: scheduled
    custom_environment_variables:
      - DBT_TARGET_LAKE: nightly
"""


@pytest.fixture
async def api(settings: Settings, _cleanup_bus: None) -> AsyncIterator[RunningApi]:
    async with serving_api(settings, rest=True, deliveries=False) as running:
        yield running


async def tool(rest_server: RestServer, rest: Rest, *args: str, log: list[str]) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "DBT_API_KEY": rest.token,
        "DBT_BASE_URL": f"http://127.0.0.1:{rest_server.port}",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "COLUMNS": "200",
    }
    process = await asyncio.create_subprocess_exec(
        str(TOOL), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    text = out.decode(errors="replace")
    log.append(f"$ dbt-jobs-as-code {' '.join(args)}\n{text}(exit {process.returncode})\n")
    assert process.returncode == 0, text
    return text


async def runplane_logged(api: RunningApi, token: str, *args: str) -> str:
    """``runplane plan``/``apply``: what it printed, after its command line."""
    code, text = await runplane(api, token, *args)
    assert code == 0, text
    return f"$ runplane {' '.join(args)}\n{text}"


async def jobs(adb: AsyncDb, account_id: int) -> list[tuple[int, str]]:
    cur = await adb.execute(
        "SELECT id, name FROM jobs WHERE account_id = %s AND deleted_at IS NULL ORDER BY id", (account_id,)
    )
    return [(int(r[0]), str(r[1])) for r in await cur.fetchall()]


async def test_plan_sync_plan_rename_sync_updates_the_job_it_made(
    api: RunningApi, rest_server: RestServer, rest: Rest, adb: AsyncDb, tmp_path: Path
) -> None:
    project, environment = await rest.create_project_and_environment(adb)
    # The tool overrides only variables the project has: its default is made over the v3 API first.
    default = await rest.http.post(
        f"/api/v3/accounts/{rest.account_id}/projects/{project}/environment-variables/",
        json={
            "account_id": rest.account_id,
            "project_id": project,
            "name": "DBT_TARGET_LAKE",
            "type": "project",
            "raw_value": "lake",
        },
    )
    assert default.status_code == 200, default.text
    config = tmp_path / "jobs.yml"
    fields = {"account": rest.account_id, "project": project, "environment": environment}
    config.write_text(JOBS.format(name="Nightly build", **fields))
    log: list[str] = []
    try:
        planned = await tool(rest_server, rest, "plan", str(config), log=log)
        assert "create" in planned.lower()
        assert await jobs(adb, rest.account_id) == []
        await tool(rest_server, rest, "sync", str(config), log=log)
        made = await jobs(adb, rest.account_id)
        assert made == [(made[0][0], "Nightly build [[nightly]]")]
        override = "SELECT environment ->> 'DBT_TARGET_LAKE' FROM jobs WHERE id = %s"
        assert await scalar(adb, override, made[0][0]) == "nightly"  # where the job's runs read it
        again = await tool(rest_server, rest, "plan", str(config), log=log)
        assert "no changes detected" in again.lower(), again

        # runplane's own settings over the same job, by its identifier; the tool's next sync keeps them.
        own = tmp_path / "runplane-jobs.yml"
        own.write_text("jobs:\n  nightly:\n    timezone: Europe/Amsterdam\n    priority: 10\n")
        log.append(await runplane_logged(api, rest.token, "apply", str(own)))
        config.write_text(JOBS.format(name="Nightly build and test", **fields))
        renamed = await tool(rest_server, rest, "plan", str(config), log=log)
        assert "update" in renamed.lower()
        await tool(rest_server, rest, "sync", str(config), log=log)
        assert await jobs(adb, rest.account_id) == [(made[0][0], "Nightly build and test [[nightly]]")]
        settled = await tool(rest_server, rest, "plan", str(config), log=log)
        assert "no changes detected" in settled.lower(), settled
        kept = await runplane_logged(api, rest.token, "plan", str(own))
        log.append(kept)
        assert kept.endswith("no changes\n"), kept

        exported = tmp_path / "exported.yml"
        imported = await tool(rest_server, rest, "import-jobs", "--account-id", str(rest.account_id), log=log)
        exported.write_text(imported)
        assert "Nightly build and test" in imported and "dbt build" in imported
    finally:
        if OUTPUT:
            await asyncio.to_thread(keep_output, log, config)


def keep_output(log: list[str], config: Path) -> None:
    Path(OUTPUT).write_text("\n".join(log))
    shutil.copy(config, Path(OUTPUT).with_suffix(".yml"))
