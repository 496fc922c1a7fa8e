"""A TCP proxy whose open connections can be made to go silent: what a dropped NAT or conntrack entry
does to a connection, which neither end sees closed."""

from __future__ import annotations

import asyncio
import contextlib


class StallingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``stall`` stops every connection open now (bytes
    are read and dropped, nothing is closed), while connections made later are forwarded."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._open: list[asyncio.Event] = []  # per connection: set when it is stalled
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def stall(self) -> None:
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
        self._open.append(stalled)
        pumps = [
            asyncio.create_task(_pump(reader, upstream_writer, stalled)),
            asyncio.create_task(_pump(upstream_reader, writer, stalled)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for w in (writer, upstream_writer):
                w.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stalled: asyncio.Event) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            if stalled.is_set():
                continue  # swallowed: the peer waits for an answer that never comes
            writer.write(data)
            await writer.drain()
