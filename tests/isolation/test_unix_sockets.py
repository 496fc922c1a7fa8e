"""Unix sockets a step shares the host's network namespace with: none outside its run is reachable.

nftables sees IP packets only, so a Unix socket is out of a step's reach by other means: an
abstract socket (a name, no file, no permission) by the Landlock scope of the run
(``runplane.adapters.landlock``), the control plane's pathname sockets by their directories being
covered in the step's mount namespace, another run's by its private temporary directory.
"""

from __future__ import annotations

import json
import secrets
import socket

import pytest

from runplane.adapters import landlock
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.isolation.conftest import (
    UID_BASE,
    connect_from_a_step,
    hostile,
    reported,
    run_log,
    run_temporary_directory,
    wait_until_ended,
)
from tests.support.polling import wait_for
from tests.support.processes import Services
from tests.support.records import Conn, create_account, create_job, queue_run

pytestmark = pytest.mark.slow
needs_scope = pytest.mark.skipif(
    landlock.unavailable() is not None, reason=f"abstract sockets are not fenced here: {landlock.unavailable()}"
)


def first_report(db: Conn, run_id: int) -> dict[str, object] | None:
    """The first ``HOSTILE`` line a step has logged so far, or None."""
    for line in run_log(db, run_id).splitlines():
        if line.startswith("HOSTILE "):
            found: dict[str, object] = json.loads(line.removeprefix("HOSTILE "))
            return found
    return None


@needs_scope
def test_a_step_cannot_connect_to_an_abstract_socket_of_a_process_outside_its_run(
    db: Conn, system: Services, settings: Settings
) -> None:
    name = f"runplane-test-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX) as listener:  # this test process, root, outside every run
        listener.bind(f"\0{name}")
        listener.listen()
        outcome = connect_from_a_step(db, system, settings, [f"@{name}"])
    assert str(outcome[f"@{name}"]).startswith("refused"), outcome


@needs_scope
def test_a_step_cannot_connect_to_the_unix_sockets_of_another_run(db: Conn, system: Services) -> None:
    marker = f"rp-listener-{secrets.token_hex(4)}"
    listener = queue_run(db, create_job(db, create_account(db, name="a"), steps=[hostile("listen", marker)]))
    listener_tmp = run_temporary_directory(UID_BASE + listener % 2)
    system.start("scheduler")
    system.start("dispatcher")
    own = wait_for(lambda: first_report(db, listener), timeout=60, what="the listening step to start")
    # Its own sockets are the run's to use.
    assert own == {f"own @{marker}": "connected", f"own /tmp/{marker}.sock": "connected"}, own
    try:
        other = queue_run(
            db,
            create_job(
                db,
                create_account(db, name="b"),
                steps=[hostile("connect", f"@{marker}", str(listener_tmp / f"{marker}.sock"), f"/tmp/{marker}.sock")],
            ),
        )
        assert wait_until_ended(db, other)["status"] == RunStatus.SUCCESS, run_log(db, other)
        outcome = reported(db, other)
        assert all(str(result).startswith("refused") for result in outcome.values()), outcome
    finally:
        (listener_tmp / f"{marker}.seen").touch()
    assert wait_until_ended(db, listener)["status"] == RunStatus.SUCCESS, run_log(db, listener)
    assert reported(db, listener) == {"seen": "True"}


def test_a_step_cannot_log_in_to_postgres_through_its_unix_socket(db: Conn, system: Services) -> None:
    # On this machine Postgres trusts its local clients: a login through the socket is a superuser's.
    psql = "psql -h /var/run/postgresql -U postgres -d postgres -Atc 'SELECT 4242 * 2'"
    run_id = queue_run(db, create_job(db, create_account(db), steps=[f'{psql}; echo "psql exit $?"']))
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, run_id)["status"] == RunStatus.SUCCESS, run_log(db, run_id)
    log = run_log(db, run_id)
    assert "psql exit 2" in log and "8484" not in log, log
