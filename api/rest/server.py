"""uvicorn serving the REST app inside the API process, next to the gRPC server.

HTTPS when ``api.tls_certfile`` and ``api.tls_keyfile`` are set (dbt Cloud's clients build
``https://<host>/api/v2/...``); plain HTTP otherwise, for a TLS-terminating proxy in front.
The process's signal handlers stay the entry point's: uvicorn is told not to install its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from runplane.basics.errors import ServiceUnavailable
from runplane.basics.settings import ApiSettings

log = logging.getLogger(__name__)
STARTUP_TIMEOUT = 15.0


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Shutdown comes from the API's drain, not from signals caught here.
        yield


@dataclass
class RestServer:
    """The REST API's server, bound to its port; :meth:`start` serves it in a task the caller makes."""

    server: uvicorn.Server
    sock: socket.socket
    port: int
    https: bool
    task: asyncio.Task[None] | None = None

    async def start(self, start_task: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        """Serve in the task ``start_task`` makes of the server's coroutine; return once it listens."""
        self.task = start_task(self.server.serve(sockets=[self.sock]))
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT
        while not self.server.started:
            if self.task.done():
                self.sock.close()
                self.task.result()  # raises what stopped it
                raise ServiceUnavailable("the REST API stopped while starting")
            if asyncio.get_running_loop().time() > deadline:
                self.server.should_exit = True
                await self.task
                raise ServiceUnavailable("the REST API did not start")
            await asyncio.sleep(0.01)
        log.info("rest api listening", extra={"port": self.port, "https": self.https})

    async def stop(self, grace: float) -> None:
        """Stop accepting, give requests in flight ``grace`` seconds, then close them."""
        self.server.should_exit = True
        if self.task is None or self.task.done():
            self.sock.close()
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace + 1.0)
        except TimeoutError:
            self.server.force_exit = True
            await self.task


def bind_rest(app: FastAPI, settings: ApiSettings, port: int) -> RestServer:
    """``app``'s server, bound to ``settings.host:port`` (0 picks a port); :meth:`RestServer.start` serves it."""
    https = bool(settings.tls_certfile and settings.tls_keyfile)
    if bool(settings.tls_certfile) != bool(settings.tls_keyfile):
        raise ServiceUnavailable("set both api.tls_certfile and api.tls_keyfile, or neither")
    # IPPROTO_TCP named, not 0: asyncio turns on TCP_NODELAY only for sockets that say TCP, and without
    # it a kept-alive connection waits ~40 ms per answer (Nagle against the client's delayed ACK).
    sock = socket.socket(
        socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, port))
    except OSError as exc:
        sock.close()
        raise ServiceUnavailable(f"REST API cannot listen on {settings.host}:{port}: {exc}") from exc
    config = uvicorn.Config(
        app,
        log_config=None,
        lifespan="off",
        access_log=False,
        ssl_certfile=settings.tls_certfile or None,
        ssl_keyfile=settings.tls_keyfile or None,
        timeout_graceful_shutdown=None,
        # uvicorn's own bound on a request's headers (its default, said here); bodies: api.rest.body_limit.
        h11_max_incomplete_event_size=16 * 1024,
    )
    return RestServer(_EmbeddedServer(config), sock, sock.getsockname()[1], https)
