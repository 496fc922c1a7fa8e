"""The whole path as real processes: scheduler loop, dispatchers, local runners; slots and ordering."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from runplane.basics.types import RunStatus
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import (
    Conn,
    all_terminal,
    create_account,
    create_job,
    queue_run,
    rows,
    run_row,
)

pytestmark = pytest.mark.slow


def test_two_slots_ten_runs_three_dispatchers(db: Conn, services: Services, tmp_path: Path) -> None:
    account = create_account(db, run_slots=2)
    artifact = "mkdir -p target; printf '{\"run\": '$RUNPLANE_RUN_ID'}' > target/run_results.json"
    runs = [
        queue_run(db, create_job(db, account, name=f"job {i}", steps=[f"echo start {i}", f"sleep 0.3; {artifact}"]))
        for i in range(10)
    ]
    services.start("scheduler")
    for _ in range(3):
        services.start("dispatcher")

    most_active, waited = 0, set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # sample as fast as the database answers
        [sample] = rows(
            db,
            """SELECT count(*) FILTER (WHERE status IN (2, 3)) AS active,
                      count(*) FILTER (WHERE status >= 10) AS done,
                      array_agg(id) FILTER (WHERE waiting_reason = 'no_run_slot') AS waiting
                 FROM runs WHERE account_id = %s""",
            (account,),
        )
        most_active = max(most_active, sample["active"])
        waited |= set(sample["waiting"] or [])
        if sample["done"] == len(runs):
            break
    assert most_active == 2  # never more than the account's run slots, and both slots were used
    assert len(waited) >= 5  # waiting runs said why
    finished = [run_row(db, r) for r in runs]
    assert [r["status"] for r in finished] == [RunStatus.SUCCESS] * 10
    for r in finished:
        assert r["scheduled_at"] <= r["queued_at"] <= r["dispatched_at"] <= r["started_at"] <= r["finished_at"]
        assert r["pod_name"].startswith("pid:") and r["cluster"] == "local" and r["launch_attempts"] == 1
    logs = rows(db, "SELECT run_id, step_index, text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (runs[3],))
    assert [(c["step_index"], c["text"]) for c in logs] == [(0, "start 3\n")]
    [artifact_row] = rows(db, "SELECT path, content FROM artifacts WHERE run_id = %s", (runs[3],))
    assert bytes(artifact_row["content"]) == f'{{"run": {runs[3]}}}'.encode()


def test_a_peak_larger_than_the_machine_waits_queued_and_every_run_runs_once(db: Conn, services: Services) -> None:
    runs = [
        queue_run(db, create_job(db, create_account(db, run_slots=4), name=f"peak {i}", steps=["sleep 0.5"]))
        for i in range(12)
    ]
    # Twelve runs due at once on a dispatcher whose machine holds three runners: the other nine wait
    # queued, where no start timeout runs, instead of as runners that cannot all claim in time.
    services.start("scheduler")
    services.start("dispatcher", RUNPLANE_DISPATCHER__LOCAL_CAPACITY="3")
    wait_for(lambda: all_terminal(db, runs), timeout=90, what="the peak's runs to end")
    finished = [run_row(db, r) for r in runs]
    assert [r["status"] for r in finished] == [RunStatus.SUCCESS] * len(runs)
    assert [r["launch_attempts"] for r in finished] == [1] * len(runs)
    # A runner is alive from its launch until after its run finished: no more than three at any moment.
    edges = sorted(
        itertools.chain.from_iterable(((r["dispatched_at"], 1), (r["finished_at"], -1)) for r in finished),
        key=lambda edge: (edge[0], edge[1]),
    )
    most = max(itertools.accumulate(change for _, change in edges))
    assert most == 3


def test_deploy_runs_are_serial_and_ci_runs_concurrent_outside_the_slots(db: Conn, services: Services) -> None:
    account = create_account(db, run_slots=1)
    deploy = create_job(db, account, name="deploy", steps=["sleep 0.2"])
    ci = create_job(db, account, name="ci", job_type="ci", steps=['sleep 2; echo "schema=$RUNPLANE_SCHEMA"'])
    deploys = [queue_run(db, deploy) for _ in range(5)]
    cis = [queue_run(db, ci, trigger="ci", pull_request_number=pr) for pr in range(201, 206)]
    services.start("scheduler")
    services.start("dispatcher")
    services.start("dispatcher")
    wait_for(lambda: all_terminal(db, deploys + cis), timeout=90, what="all runs to finish")

    serial = sorted((run_row(db, r) for r in deploys), key=lambda r: r["started_at"])
    assert [r["status"] for r in serial] == [RunStatus.SUCCESS] * 5
    for before, after in itertools.pairwise(serial):
        assert before["finished_at"] <= after["dispatched_at"]  # strictly one after another
    assert [r["id"] for r in serial] == deploys  # in queue order

    concurrent = [run_row(db, r) for r in cis]
    assert [r["status"] for r in concurrent] == [RunStatus.SUCCESS] * 5
    assert max(r["started_at"] for r in concurrent) < min(r["finished_at"] for r in concurrent)  # all at once
    assert not any(r["takes_slot"] for r in concurrent)
    outputs = {
        r["id"]: "".join(c["text"] for c in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s", (r["id"],)))
        for r in concurrent
    }
    assert outputs == {r: f"schema=dbt_cloud_pr_{ci}_{pr}\n" for r, pr in zip(cis, range(201, 206), strict=True)}
    # CI runs ran while a deploy run held the only slot.
    assert any(
        c["started_at"] < d["finished_at"] and d["started_at"] < c["finished_at"] for c in concurrent for d in serial
    )
