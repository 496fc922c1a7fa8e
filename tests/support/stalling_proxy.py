"""A TCP proxy whose open connections can be made to go silent: what a dropped NAT or conntrack entry
does to a connection, which neither end sees closed; or slow, as a long or congested link is."""

from __future__ import annotations

import asyncio
import contextlib


class StallingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``, each chunk ``delay`` seconds late; ``stall`` stops
    every connection open now (bytes are read and dropped, nothing is closed), while connections made
    later are forwarded unless ``later_too``."""

    def __init__(self, target: str, *, delay: float = 0.0) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._open: list[asyncio.Event] = []  # per connection: set when it is stalled
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.delay = delay
        self._stall_later = False

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def forward_later(self) -> None:
        """Connections made from now on are forwarded again (stalled ones stay silent)."""
        self._stall_later = False

    def stall(self, *, later_too: bool = False) -> None:
        self._stall_later = later_too
        for stalled in self._open:
            stalled.set()
        self._open.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        stalled = asyncio.Event()
        if self._stall_later:
            stalled.set()
        else:
            self._open.append(stalled)
        pumps = [
            asyncio.create_task(_pump(reader, upstream_writer, stalled, self.delay)),
            asyncio.create_task(_pump(upstream_reader, writer, stalled, self.delay)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for w in (writer, upstream_writer):
                w.close()


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stalled: asyncio.Event, delay: float
) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            if delay:
                await asyncio.sleep(delay)
            if stalled.is_set():
                continue  # swallowed: the peer waits for an answer that never comes
            writer.write(data)
            await writer.drain()
