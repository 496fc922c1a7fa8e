"""What a run's code can reach, from inside a real step started by a real dispatcher (local launcher).

The step is ``credential_probe.py``: it reads the environments and command lines along ``/proc``,
the files its ancestors hold open, every process it can see and the work directory, looking for
database, Redis or RabbitMQ URLs, secret keys and run tokens, and tries to connect with each URL
found. Nothing may be found and nothing may connect. The dispatcher runs with the default settings
(as ``make run`` starts it): as root, it gives each run a uid of its own (``runner.local_uid``) and
runs its steps in namespaces of their own, where no process of the control plane or of the runner
is visible; the same checks run for runners forked from the fork server and for fresh runner
processes.

A second test follows a secret from the job to the run: decrypted for the step, masked in the logs
(also when the value reaches the runner in two pieces) and in the artifact, and only ciphertext in
the database.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runplane.basics.settings import RunnerSettings
from runplane.basics.types import RunStatus
from tests.support.files import readable_by_all
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run, rows, run_row

pytestmark = pytest.mark.slow

PROBE = readable_by_all(Path(__file__).with_name("credential_probe.py"))  # the run's uid executes it
RUN_UID_BASE = RunnerSettings().local_uid  # the default: nothing below is configured


def probe_result(db: Conn, run_id: int) -> dict[str, object]:
    text = "".join(
        r["text"] for r in rows(db, "SELECT text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    )
    [line] = [line for line in text.splitlines() if line.startswith("PROBE ")]
    result: dict[str, object] = json.loads(line.removeprefix("PROBE "))
    return result


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork-server", "fresh-process"])
def test_a_step_finds_no_control_plane_credential(db: Conn, services: Services, fork_server: bool) -> None:
    assert os.geteuid() == 0, "the dispatcher must be root to give runs uids of their own"
    del services.env["RUNPLANE_RUNNER__LOCAL_UID"]  # the default, as `make run` has it
    assert not any(name.startswith("RUNPLANE_RUNNER__LOCAL_UID") for name in services.env)
    services.env["RUNPLANE_DISPATCHER__LOCAL_FORK_SERVER"] = str(fork_server).lower()
    account = create_account(db)
    job = create_job(db, account, steps=[f"/usr/bin/python3 -I {PROBE}"], secrets={"DBT_ENV_SECRET_TOKEN": "tok-1"})
    run_id = queue_run(db, job)
    services.start("scheduler")
    dispatcher = services.start("dispatcher")

    wait_for(lambda: run_row(db, run_id)["status"] >= RunStatus.SUCCESS, timeout=90, what="the probe run to end")
    assert run_row(db, run_id)["status"] == RunStatus.SUCCESS
    result = probe_result(db, run_id)
    assert result["found"] == {}, result["found"]
    assert result["connected"] == []
    tried = result["tried"]
    assert isinstance(tried, dict)
    assert tried["own environment"] == "read"  # the probe did look
    own_uid = result["uid"]
    assert isinstance(own_uid, int) and own_uid >= RUN_UID_BASE  # the run's own uid, not the dispatcher's
    # The step runs in a PID namespace of its own: its runner and the control plane's processes are
    # not there to be read at all. What it sees is its namespace's init and its own shell, of its uid.
    seen = {label.split()[1] for label in tried if label.startswith(("ancestor ", "process "))}
    assert len(seen) <= 3, sorted(seen)
    assert str(dispatcher.pid) not in seen or dispatcher.pid <= 3
    for label, value in tried.items():
        if label.startswith("ancestor ") and label.endswith(" uid"):
            assert value == str(own_uid), (label, value)


def test_secrets_are_masked_in_logs_and_artifacts_and_ciphertext_at_rest(db: Conn, services: Services) -> None:
    secret = "s3cr3t-Value-42"
    account = create_account(db)
    steps = [
        # Whole, then split across two writes a second apart (two reads, two flushes of the log).
        'echo "password is $DBT_ENV_SECRET_PASSWORD"; printf "s3cr3t-Va"; sleep 1; printf "lue-42 done\\n"',
        'mkdir -p target; printf \'{"profile": {"password": "%s"}}\' "$DBT_ENV_SECRET_PASSWORD" > target/manifest.json',
        'test "$DBT_ENV_SECRET_PASSWORD" = "s3cr3t-Value-42" && echo "the step saw the real value"',
    ]
    job = create_job(db, account, steps=steps, secrets={"DBT_ENV_SECRET_PASSWORD": secret})
    run_id = queue_run(db, job)
    services.start("scheduler")
    services.start("dispatcher")

    wait_for(lambda: run_row(db, run_id)["status"] >= RunStatus.SUCCESS, timeout=90, what="the run to end")
    assert run_row(db, run_id)["status"] == RunStatus.SUCCESS
    chunks = rows(db, "SELECT seq, text FROM run_log_chunks WHERE run_id = %s ORDER BY seq", (run_id,))
    assert len(chunks) >= 3  # the split value did reach the log in separate chunks
    text = "".join(c["text"] for c in chunks)
    assert "password is *****\n" in text
    assert "***** done\n" in text  # the split value, masked whole
    assert "the step saw the real value" in text
    assert "s3cr3t" not in text and "lue-42" not in text
    [artifact] = rows(db, "SELECT content FROM artifacts WHERE run_id = %s", (run_id,))
    assert bytes(artifact["content"]) == b'{"profile": {"password": "*****"}}'
    [stored] = rows(db, "SELECT secret_environment::text AS s, environment::text AS e FROM jobs WHERE id = %s", (job,))
    assert secret not in stored["s"] and secret not in stored["e"]
    assert json.loads(stored["s"])["DBT_ENV_SECRET_PASSWORD"].startswith("gAAAA")  # a Fernet token
