"""Streaming a run's output into ``run_log_chunks`` as it comes.

Output is batched a little (``flush_interval`` or ``max_bytes``, whichever comes first) so a chatty
step costs a handful of inserts per second, and a reader following the run sees lines within a
fraction of a second. ``seq`` increases across the whole run; text is decoded per step, so a
character split between two reads is not garbled.
"""

from __future__ import annotations

import asyncio
import codecs
import logging

from psycopg_pool import AsyncConnectionPool

from runplane.db import Connection
from runplane.secrets import mask
from runplane.sql import load_queries
from runplane.supervise import wait_any

log = logging.getLogger(__name__)

Q = load_queries("runner")


class RunLogs:
    def __init__(
        self,
        pool: AsyncConnectionPool[Connection],
        run_id: int,
        *,
        first_seq: int = 1,
        flush_interval: float = 0.2,
        max_bytes: int = 64 * 1024,
    ) -> None:
        self._pool = pool
        self._run_id = run_id
        self._next_seq = first_seq
        self._flush_interval = flush_interval
        self._max_bytes = max_bytes
        self._pending: list[tuple[int, str]] = []
        self._pending_bytes = 0
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()
        self.secrets: list[str] = []  # masked in everything stored

    def write(self, step_index: int, data: bytes, *, final: bool = False) -> None:
        decoder = self._decoders.setdefault(step_index, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        text = decoder.decode(data, final=final)
        if not text:
            return
        self._pending.append((step_index, text))
        self._pending_bytes += len(data)
        if self._pending_bytes >= self._max_bytes:
            self._full.set()

    def end_step(self, step_index: int) -> None:
        self.write(step_index, b"", final=True)

    async def flush(self) -> None:
        async with self._lock:
            if not self._pending:
                return
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._full.clear()
            merged = _merge(batch)
            seqs = list(range(self._next_seq, self._next_seq + len(merged)))
            self._next_seq += len(merged)
            async with self._pool.connection() as conn:
                await conn.execute(
                    Q["insert_log_chunks"],
                    {
                        "run_id": self._run_id,
                        "seqs": seqs,
                        "step_indexes": [step for step, _ in merged],
                        "texts": [mask(text, self.secrets) for _, text in merged],
                    },
                )

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every interval (sooner when the buffer fills) until ``stop``, then once more."""
        while not stop.is_set():
            if await wait_any(stop, self._full, timeout=self._flush_interval):
                break
            await self.flush()
        await self.flush()


def _merge(batch: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Adjacent pieces of the same step become one chunk."""
    merged: list[tuple[int, str]] = []
    for step, text in batch:
        if merged and merged[-1][0] == step:
            merged[-1] = (step, merged[-1][1] + text)
        else:
            merged.append((step, text))
    return merged
