"""Readiness: is every dependency this process uses reachable right now?

Adapters register a check when they connect (Postgres pools, the bus, Redis clients) and forget it
when they close. ``GET /ready`` on the probe port answers 200 when every check passes and 503 naming
the ones that fail (a Kubernetes readiness probe takes the pod out of rotation meanwhile, without
restarting it); ``GET /live`` answers 200 while the process serves at all. The registry is per
process, like the metric instruments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[bool]]

_CHECK_TIMEOUT = 2.0
_checks: dict[str, Check] = {}


def register(name: str, check: Check) -> None:
    """Report ``name`` as down while ``check()`` returns False, raises or takes over 2 s."""
    _checks[name] = check


def forget(name: str) -> None:
    _checks.pop(name, None)


async def failing() -> list[str]:
    """Names of the dependencies that are down now (empty: ready)."""

    async def passes(check: Check) -> bool:
        try:
            return await asyncio.wait_for(check(), _CHECK_TIMEOUT)
        except Exception:
            return False

    names = sorted(_checks)
    results = await asyncio.gather(*(passes(_checks[name]) for name in names))
    return [name for name, ok in zip(names, results, strict=True) if not ok]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readline(), 5)
        path = request.split(b" ")[1].decode() if request.count(b" ") >= 2 else ""
        body: dict[str, object]
        if path == "/live":
            status, body = 200, {"live": True}
        elif path == "/ready":
            down = await failing()
            status, body = (503 if down else 200), {"ready": not down, "down": down}
        else:
            status, body = 404, {"error": "try /ready or /live"}
        payload = json.dumps(body).encode()
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve_probes(port: int, stop: asyncio.Event, host: str = "0.0.0.0") -> None:
    """Answer ``/ready`` and ``/live`` on ``port`` until ``stop`` is set."""
    server = await asyncio.start_server(_answer, host, port)
    log.info("probe endpoint up", extra={"port": port})
    async with server:
        await stop.wait()
