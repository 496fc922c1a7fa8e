"""Request bodies are bounded while they are read, before authentication, on every HTTP route."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from runplane.basics.settings import Settings
from tests.support.processes import Services, wait_for_port

pytestmark = pytest.mark.slow

HUGE = 512 * 1024 * 1024


@pytest.fixture
def api_process(
    service_env: dict[str, str], tmp_path: Path, database_url: str, _cleanup_bus: None
) -> Iterator[psutil.Process]:
    services = Services(service_env, tmp_path, database_url)
    try:
        process = services.start("api", name="api")
        wait_for_port(f"127.0.0.1:{service_env['RUNPLANE_API__REST_PORT']}")
        yield psutil.Process(process.pid)
    finally:
        services.stop_all()


def send_huge(port: int, path: str, *, declared: bool) -> bytes:
    """POST ``HUGE`` bytes to ``path`` (with its length declared, or chunked) for as long as the
    server reads them; what it answered."""
    chunk = b"x" * (1024 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        length = f"Content-Length: {HUGE}" if declared else "Transfer-Encoding: chunked"
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n{length}\r\n\r\n".encode()
        )
        try:
            for _ in range(HUGE // len(chunk)):
                sock.sendall(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if not declared:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: the rest was never read
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    return answer


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_huge_body_to_the_unauthenticated_git_webhook_is_refused_without_the_api_growing(
    api_process: psutil.Process, settings: Settings, declared: bool
) -> None:
    before = api_process.memory_info().rss
    answer = send_huge(settings.api.rest_port, "/webhooks/github/1/", declared=declared)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert api_process.memory_info().rss - before < 64 * 1024 * 1024


def test_every_route_takes_a_small_body_and_refuses_one_over_the_limit(
    api_process: psutil.Process, settings: Settings
) -> None:
    base = f"http://127.0.0.1:{settings.api.rest_port}"
    small = httpx.post(f"{base}/api/v2/accounts/1/jobs/", json={"name": "x"}, timeout=30)
    assert small.status_code == 401  # read, then refused for the missing token
    large = httpx.post(
        f"{base}/api/v2/accounts/1/jobs/", content=b"{" + b" " * settings.api.max_body_bytes + b"}", timeout=30
    )
    assert large.status_code == 413 and large.json()["status"]["is_success"] is False
    form = httpx.post(f"{base}/ui/login", data={"token": "x" * (2 * settings.api.max_body_bytes)}, timeout=30)
    assert form.status_code == 413
