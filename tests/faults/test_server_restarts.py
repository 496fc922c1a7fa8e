"""Each server restarted under a running system: no service exits, readiness says not-ready while
the server is down, and every cron occurrence still gets exactly one run."""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from runplane.basics.cron import next_fire
from tests.faults.world import BASIC, EVERY_MINUTE, FAST, World, fire_done, make_world, probe_run, run_delay_p99
from tests.support.polling import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with make_world(BASIC) as w:
        yield w


def ride_out(world: World, fault: Callable[[], float], report: dict[str, float]) -> None:
    """Let one minute's fires finish, inject ``fault`` (it returns once the server is back), then check
    a run queued at once succeeds, the next minute's fires and the invariants."""
    before = next_fire(EVERY_MINUTE, "UTC", time.time())
    wait_for(lambda: fire_done(world, before), 100, what=f"the fires of {before}")
    fault_at = time.time()
    back_at = fault()
    report["outage_s"] = round(back_at - fault_at, 2)
    report["ready_after_back_s"] = round(time.time() - back_at, 2)
    report["run_after_back_s"] = round(probe_run(world, back_at), 2)
    report["run_delay_p99_s"] = run_delay_p99(world, fault_at) or 0.0
    after = next_fire(EVERY_MINUTE, "UTC", time.time())
    try:
        wait_for(lambda: fire_done(world, after), 100, what=f"the fires of {after} after the fault")
    except AssertionError:
        print(world.logs())
        raise
    assert world.exited() == [], world.logs()
    result = world.invariants(until=after)
    assert result.ok, result
    print(f"\nfault report: {report}")


def down_then_up(world: World, stop: Callable[[], None], start: Callable[[], None], dependency: str) -> float:
    """Stop a server, see readiness say so, start it again; returns when it was back up."""

    def reports_down(name: str) -> bool:
        ready, down = world.ready(name)
        return not ready and any(dependency in d for d in down)

    def is_ready(name: str) -> bool:
        return world.ready(name)[0]

    stop()
    try:
        for name in ("scheduler", "dispatcher"):
            wait_for(functools.partial(reports_down, name), 20, what=f"{name} to report {dependency} down")
        time.sleep(3)
    finally:
        start()
    back_at = time.time()
    for name in ("scheduler", "dispatcher"):
        try:
            wait_for(functools.partial(is_ready, name), 60, what=f"{name} to be ready again")
        except AssertionError as exc:
            print(world.logs())
            raise AssertionError(f"{exc}; down: {world.ready(name)[1]}") from exc
    return back_at


def test_postgres_restart(world: World) -> None:
    report: dict[str, float] = {}
    ride_out(world, lambda: down_then_up(world, world.postgres.stop, world.postgres.start, "postgres"), report)


def test_redis_restart(world: World) -> None:
    report: dict[str, float] = {}

    def restart() -> float:
        world.redis.kill()
        try:
            wait_for(lambda: "redis" in world.ready("dispatcher")[1], 20, what="the dispatcher to report redis down")
            time.sleep(3)
        finally:
            world.redis.start()
        back_at = time.time()
        wait_for(lambda: world.ready("dispatcher")[0], 60, what="the dispatcher to be ready again")
        return back_at

    ride_out(world, restart, report)


def test_rabbitmq_restart(world: World) -> None:
    report: dict[str, float] = {}
    ride_out(world, lambda: down_then_up(world, world.rabbit.stop, world.rabbit.start, "rabbitmq"), report)


def test_every_service_stops_on_sigterm_while_the_broker_is_gone(world: World) -> None:
    # Last in this module: it leaves the broker down and the services stopped.
    world.rabbit.stop()
    wait_for(lambda: "rabbitmq" in world.ready("dispatcher")[1], 20, what="the dispatcher to report rabbitmq down")
    time.sleep(2)  # well into reconnecting
    processes = dict(world.services.processes)
    sent = time.monotonic()
    for process in processes.values():
        process.send_signal(signal.SIGTERM)
    drain = float(FAST["RUNPLANE_DRAIN_SECONDS"])
    took: dict[str, float] = {}
    for name, process in processes.items():
        try:
            process.wait(timeout=max(0.0, sent + drain + 10 - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(world.logs())
            raise AssertionError(f"{name} did not exit within {drain + 10} s of SIGTERM") from None
        took[name] = round(time.monotonic() - sent, 2)
    print(f"\nexit after SIGTERM with the broker gone (s): {took}")
