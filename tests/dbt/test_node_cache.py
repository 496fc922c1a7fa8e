"""dbt runs whose packages come from the node's cache keeper, as in a run Pod: the real runner, the
real runner API, ``dbt deps`` and ``dbt parse``.

The first run of an account installs its packages and the keeper keeps them; the next run of that
account gets them from the keeper (no ``dbt deps``) and dbt parses a model that calls the package;
a run of another account with the very same project installs its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.process import RunningApi
from runner.node_cache import NodeCacheKeeper
from runplane.basics.settings import Settings
from tests.dbt.conftest import (
    OK,
    Client,
    Db,
    account_client,
    commit,
    dbt_job,
    dbt_run_marks,
    environment,
    make_repository,
    run_job,
    run_log,
)
from tests.support.git_servers import macro_package
from tests.support.polling import eventually

pytestmark = dbt_run_marks(300)


@pytest.fixture
async def node_settings(dbt_settings: Settings, tmp_path: Path) -> AsyncIterator[Settings]:
    """``dbt_settings`` with a node cache keeper serving the runner (its entries in ``tmp_path/node``)."""
    socket_path = tmp_path / "node-socket" / "cache.sock"
    keeper = NodeCacheKeeper(socket_path, tmp_path / "node", dbt_settings.runner.api_address)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.serve(stop), name="node-cache")
    try:
        await eventually(lambda: task.done() or socket_path.exists(), 10, what="the keeper's socket")
        assert not task.done(), task.exception()
        runner = dbt_settings.runner.model_copy(
            update={"node_cache_socket": str(socket_path), "package_cache": str(tmp_path / "pod-packages")}
        )
        yield dbt_settings.model_copy(update={"runner": runner})
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def other(api: RunningApi, dbt_settings: Settings) -> AsyncIterator[Client]:
    """A second account."""
    async with account_client(api, dbt_settings, "other") as made:
        yield made


async def test_an_accounts_next_run_gets_its_packages_from_the_node_and_another_account_does_not(
    client: Client, other: Client, node_settings: Settings, db: Db, tmp_path: Path
) -> None:
    pinned = macro_package(tmp_path / "git")  # a commit: without a lock, a branch is never cached
    package = tmp_path / "git" / "bench_macros"
    repo = make_repository(tmp_path / "jaffle")
    (repo / "packages.yml").write_text(f"packages:\n  - git: file://{package}\n    revision: {pinned}\n")
    # dbt renders a model's Jinja when it parses the project: a missing package fails the parse.
    (repo / "models" / "uses_package.sql").write_text("select {{ bench_macros.bench_macros_3(39) }} as answer\n")
    commit(repo, "a package")

    async def run(account: Client) -> str:
        env = await environment(account, node_settings.database_url, f"file://{repo}")
        job = await dbt_job(account, env.id, ["dbt parse"])
        done = await run_job(account, node_settings, db, job.id)
        log = await run_log(account, done.id)
        assert done.status == OK, log[-3000:]
        return log

    first, second, others = await run(client), await run(client), await run(other)

    assert "runplane: dbt deps\n" in first and "dbt packages kept by this host for the next runs" in first
    assert "dbt deps skipped" in second and "runplane: dbt deps\n" not in second, second[-3000:]
    assert "runplane: dbt deps\n" in others and "dbt deps skipped" not in others, others[-3000:]
    entries = {p.name: sorted(e.name for e in p.iterdir()) for p in (tmp_path / "node").iterdir()}
    assert sorted(entries) == sorted([str(client.account_id), str(other.account_id)])
    assert all(len(keys) == 1 for keys in entries.values())
    assert not (tmp_path / "pod-packages").exists()  # nothing kept in the Pod's own cache
