"""Each server restarted under a running system: no service exits, readiness says not-ready while
the server is down, and every cron occurrence still gets exactly one run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from runplane.cron import next_fire
from tests.faults.world import BASIC, EVERY_MINUTE, World, fire_done, make_world, probe_run, wait

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with make_world(BASIC) as w:
        yield w


def ride_out(world: World, fault: Callable[[], float], report: dict[str, float]) -> None:
    """Let one minute's fires finish, inject ``fault`` (it returns once the server is back), then check
    a run queued at once succeeds, the next minute's fires and the invariants."""
    before = next_fire(EVERY_MINUTE, "UTC", time.time())
    wait(lambda: fire_done(world, before), 100, f"the fires of {before}")
    fault_at = time.time()
    back_at = fault()
    report["outage_s"] = round(back_at - fault_at, 2)
    report["ready_after_back_s"] = round(time.time() - back_at, 2)
    report["run_after_back_s"] = round(probe_run(world, back_at), 2)
    after = next_fire(EVERY_MINUTE, "UTC", time.time())
    try:
        wait(lambda: fire_done(world, after), 100, f"the fires of {after} after the fault")
    except AssertionError:
        print(world.logs())
        raise
    assert world.exited() == [], world.logs()
    result = world.invariants(until=after)
    assert result.ok, result
    print(f"\nfault report: {report}")


def down_then_up(world: World, stop: Callable[[], None], start: Callable[[], None], dependency: str) -> float:
    """Stop a server, see readiness say so, start it again; returns when it was back up."""
    stop()
    try:
        for name in ("scheduler", "dispatcher"):
            wait(
                lambda n=name: not world.ready(n)[0] and any(dependency in d for d in world.ready(n)[1]),  # type: ignore[misc]
                20,
                f"{name} to report {dependency} down",
            )
        time.sleep(3)
    finally:
        start()
    back_at = time.time()
    for name in ("scheduler", "dispatcher"):
        try:
            wait(lambda n=name: world.ready(n)[0], 60, f"{name} to be ready again")  # type: ignore[misc]
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
            wait(lambda: "redis" in world.ready("dispatcher")[1], 20, "the dispatcher to report redis down")
            time.sleep(3)
        finally:
            world.redis.start()
        back_at = time.time()
        wait(lambda: world.ready("dispatcher")[0], 60, "the dispatcher to be ready again")
        return back_at

    ride_out(world, restart, report)


@pytest.mark.xfail(
    reason="after a RabbitMQ restart a queuer worker whose own queue the leader deleted (declared dead "
    "while the broker was away) has its consumer cancelled by the broker and not restored; its jobs stop "
    "firing until it is restarted",
    strict=False,
)
def test_rabbitmq_restart(world: World) -> None:
    report: dict[str, float] = {}
    ride_out(world, lambda: down_then_up(world, world.rabbit.stop, world.rabbit.start, "rabbitmq"), report)
