"""What a run reaches on its machine's loopback beyond its allow-list: nothing on port 53 unless the
operator lets runs use a resolver there, and no more than ``LOCAL_CONNECTIONS`` connections at once to
what it may reach (the runner API first), so a flood cannot hold up other runs.

Each attack is a step of a real run started by a real dispatcher as root on a uid of this test's own.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runplane.adapters import network_fence
from runplane.adapters.network_fence import Endpoint
from runplane.basics.settings import Settings
from runplane.basics.types import RunStatus
from tests.isolation.conftest import (
    UID_BASE,
    UID_COUNT,
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

FLOOD_ATTEMPTS = 2000  # well past the cap, well under the run's open-files limit
OTHER_RUN_BOUND_SECONDS = 90.0  # a run of one echo step, queued to ended, on a busy two-core machine


@pytest.fixture
def loopback_port_53() -> Iterator[tuple[socket.socket | None, socket.socket]]:
    """(TCP listener or None when something of the machine's listens there already, UDP socket) on 127.0.0.1:53."""
    tcp: socket.socket | None
    try:
        tcp = socket.create_server(("127.0.0.1", network_fence.DNS_PORT))
    except OSError:
        tcp = None  # a resolver of the machine's: the step's connection reaches it just the same
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", network_fence.DNS_PORT))
    udp.setblocking(False)
    try:
        yield tcp, udp
    finally:
        udp.close()
        if tcp is not None:
            tcp.close()


def everything_reported(db: Conn, run_id: int) -> dict[str, object]:
    """Every ``HOSTILE`` line of the run's steps, merged."""
    merged: dict[str, object] = {}
    for line in run_log(db, run_id).splitlines():
        if line.startswith("HOSTILE "):
            merged.update(json.loads(line.removeprefix("HOSTILE ")))
    return merged


def test_nothing_on_loopback_port_53_answers_a_run_unless_it_is_the_allowed_resolver(
    db: Conn, system: Services, settings: Settings, loopback_port_53: tuple[socket.socket | None, socket.socket]
) -> None:
    _, udp = loopback_port_53
    target = f"127.0.0.1:{network_fence.DNS_PORT}"
    steps = [hostile("connect", settings.runner.api_address, target), hostile("datagram", target)]
    run_id = queue_run(db, create_job(db, create_account(db), steps=steps))
    system.start("scheduler")
    system.start("dispatcher")
    assert wait_until_ended(db, run_id)["status"] == RunStatus.SUCCESS, run_log(db, run_id)
    outcome = everything_reported(db, run_id)
    assert outcome[settings.runner.api_address] == "connected", outcome
    assert str(outcome[target]).startswith("refused"), outcome  # the TCP connection (the last line: UDP's)
    with pytest.raises(BlockingIOError):
        udp.recv(512)  # no datagram of the run's came through


def test_a_resolver_on_this_machine_is_reachable_only_when_the_operator_allows_it(tmp_path: Path) -> None:
    resolv_conf = tmp_path / "resolv.conf"
    resolv_conf.write_text("# a comment\nnameserver 127.0.0.53\nnameserver 192.0.2.53\noptions edns0\n")
    here = Endpoint("127.0.0.53", network_fence.DNS_PORT)
    assert network_fence.resolvers(resolv_conf) == [here, Endpoint("192.0.2.53", network_fence.DNS_PORT)]
    assert network_fence.local_resolvers(False, resolv_conf) == []
    assert network_fence.local_resolvers(True, resolv_conf) == [here]  # the one elsewhere needs no rule


def test_a_connection_flood_from_one_run_is_capped_and_another_runs_calls_still_go_through(
    db: Conn, system: Services, settings: Settings
) -> None:
    marker = f"flood-{secrets.token_hex(4)}"
    flood = hostile("flood", settings.runner.api_address, str(FLOOD_ATTEMPTS), marker)
    flooder = queue_run(db, create_job(db, create_account(db, name="a"), steps=[flood]))
    system.start("scheduler")
    system.start("dispatcher")
    uids = range(UID_BASE, UID_BASE + UID_COUNT)
    flooding = wait_for(
        lambda: next((u for u in uids if (run_temporary_directory(u) / f"{marker}.flooding").exists()), None),
        120,
        what="the flood to be open",
    )
    assert flooding is not None
    try:
        started = time.monotonic()
        other = queue_run(db, create_job(db, create_account(db, name="b"), steps=["echo called through"]))
        run = wait_until_ended(db, other, timeout=OTHER_RUN_BOUND_SECONDS)
        took = time.monotonic() - started
        print(f"the other run took {took:.1f} s from queued to ended beside the flood")
        assert run["status"] == RunStatus.SUCCESS, run_log(db, other)
        assert "called through" in run_log(db, other)
    finally:
        with contextlib.suppress(OSError):
            (run_temporary_directory(flooding) / f"{marker}.seen").touch()
    assert wait_until_ended(db, flooder)["status"] == RunStatus.SUCCESS, run_log(db, flooder)
    held = reported(db, flooder)
    # At most the cap (the runner's own connections count too when made as the run's uid), never thousands.
    assert 0 < int(str(held["connected"])) <= network_fence.LOCAL_CONNECTIONS, held
    assert int(str(held["refused"])) >= FLOOD_ATTEMPTS - network_fence.LOCAL_CONNECTIONS, held
