"""The services check: a stopped local server is started; a missing one is named with how to get it."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import redis

from runplane.basics.settings import Settings
from runplane.commands.preflight import ensure_services
from tests.support.ports import free_port


def test_all_three_services_answer() -> None:
    assert ensure_services(Settings(), start=False, say=lambda _: None) == []


def test_a_stopped_local_redis_is_started() -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    said: list[str] = []
    try:
        problems = ensure_services(Settings(redis_url=url), say=said.append)
        assert problems == []
        assert any("Redis is installed but not answering; starting it" in line for line in said)
        assert redis.Redis.from_url(url).ping()
    finally:
        with contextlib.suppress(redis.ConnectionError):  # shutdown closes the connection it came on
            redis.Redis.from_url(url).shutdown(nosave=True)


def test_a_service_that_cannot_be_started_is_named_with_the_fix() -> None:
    port = free_port()
    problems = ensure_services(
        Settings(amqp_url=f"amqp://guest:guest@127.0.0.1:{port}/"), say=lambda _: None, wait_seconds=1
    )
    assert len(problems) == 1
    assert problems[0].startswith(f"RabbitMQ does not answer at amqp://guest@127.0.0.1:{port}/")
    assert "RUNPLANE_AMQP_URL" in problems[0]
    assert "apt-get install rabbitmq-server" in problems[0]


def test_check_services_command_exits_non_zero_with_the_message() -> None:
    port = free_port()
    env = {"RUNPLANE_DATABASE_URL": f"postgresql://postgres@db.invalid:{port}/runplane", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "runplane", "check-services"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Postgres does not answer" in result.stderr
    assert "runs elsewhere (db.invalid)" in result.stderr
    assert "RUNPLANE_DATABASE_URL" in result.stderr
