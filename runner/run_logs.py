"""Streaming a run's output to the runner API as it comes, with its secrets masked.

Output is batched a little (``flush_interval`` or ``max_bytes``, whichever comes first) so a chatty
step costs a handful of calls per second, and a reader following the run sees lines within a
fraction of a second. ``seq`` increases across the whole run; text is decoded per step, so a
character split between two reads is not garbled.

A step's output is read only as fast as it is shipped: at most ``max_pending`` bytes wait to be
sent, and the reader of the step's pipe waits for :meth:`RunLogs.room` before each read, so a step
that writes faster than the runner API stores blocks on its own pipe instead of filling the
runner's memory. Batches are joined in linear time and shipped in calls of at most ``CALL_CHARS``,
each a short transaction on the server, and the lease is renewed on a connection of its own
(``runner.control_plane``): no amount of output delays a heartbeat.

Secret values are replaced with ``*****`` before anything leaves the runner. A value can arrive cut
in two by the pipe, so each step's stream holds back its last ``longest secret - 1`` characters
until more output (or the end of the step) shows whether they start a secret.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence

from runner.dbt_errors import ErrorLines
from runplane.basics.secrets import MASK
from runplane.basics.supervise import wait_any

log = logging.getLogger(__name__)

CHUNK_CHARS = 256 * 1024  # well inside what the runner API takes per chunk and per call
CALL_CHARS = 1024 * 1024  # per AppendLogs call: the run's row is held FOR SHARE while it is stored
MAX_PENDING = 4 * 1024 * 1024  # output read from the steps and not yet shipped, before reads wait
AppendChunks = Callable[[Sequence[tuple[int, int, str]]], Awaitable[None]]


class StreamMasker:
    """Masks secrets in a stream of text pieces, also when a secret is split between two pieces."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None
        self._keep = max((len(v) for v in values), default=1) - 1
        self._held = ""

    def feed(self, text: str, *, final: bool = False) -> str:
        """The masked text that is safe to emit now; the rest waits for the next piece."""
        if self._pattern is None:
            return text
        buffer = self._held + text
        cut = len(buffer) if final else max(0, len(buffer) - self._keep)
        out: list[str] = []
        position = 0
        for match in self._pattern.finditer(buffer):
            if match.start() >= cut:
                break
            # A match that starts before the cut ends inside the buffer: it is emitted whole.
            out.append(buffer[position : match.start()])
            out.append(MASK)
            position = match.end()
        cut = max(cut, position)
        out.append(buffer[position:cut])
        self._held = buffer[cut:]
        return "".join(out)


class RunLogs:
    def __init__(
        self,
        append: AppendChunks,
        *,
        secrets: Iterable[str] = (),
        first_seq: int = 1,
        flush_interval: float = 0.2,
        max_bytes: int = 64 * 1024,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._append = append
        self._secrets = tuple(secrets)
        self._maskers: dict[int, StreamMasker] = {}
        self._errors: dict[int, ErrorLines] = {}
        self._next_seq = first_seq
        self._flush_interval = flush_interval
        self._max_bytes = max_bytes
        self._max_pending = max_pending
        self._pending: list[tuple[int, str]] = []
        self._pending_bytes = 0
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._full = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._lock = asyncio.Lock()

    def write(self, step_index: int, data: bytes, *, final: bool = False) -> None:
        decoder = self._decoders.setdefault(step_index, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        masker = self._maskers.setdefault(step_index, StreamMasker(self._secrets))
        # NUL cannot be stored in a text column; it is no printable output either.
        text = masker.feed(decoder.decode(data, final=final).replace("\x00", "\ufffd"), final=final)
        errors = self._errors.setdefault(step_index, ErrorLines())
        errors.feed(text)
        if final:
            errors.end()
        if not text:
            return
        self._pending.append((step_index, text))
        self._pending_bytes += len(data)
        if self._pending_bytes >= self._max_bytes:
            self._full.set()
        if self._pending_bytes >= self._max_pending:
            self._room.clear()

    async def room(self) -> None:
        """Return once fewer than ``max_pending`` bytes wait to be shipped (the step's reader waits here)."""
        await self._room.wait()

    def end_step(self, step_index: int) -> None:
        self.write(step_index, b"", final=True)

    def error_of(self, step_index: int) -> str | None:
        """dbt's first error header and its reason in the step's (masked) output, if it printed one."""
        errors = self._errors.get(step_index)
        return errors.found if errors else None

    async def flush(self) -> None:
        async with self._lock:
            if not self._pending:
                return
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._full.clear()
            self._room.set()  # the next batch is read while this one is shipped: at most twice the bound held
            pieces = _split(_merge(batch), CHUNK_CHARS)
            chunks = [(self._next_seq + n, step, text) for n, (step, text) in enumerate(pieces)]
            self._next_seq += len(chunks)
            for call in _calls(chunks, CALL_CHARS):
                await self._append(call)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every interval (sooner when the buffer fills) until ``stop``, then once more."""
        while not stop.is_set():
            if await wait_any(stop, self._full, timeout=self._flush_interval):
                break
            await self.flush()
        await self.flush()


def _merge(batch: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Adjacent pieces of the same step become one chunk (joined once: linear in the batch's size)."""
    runs: list[tuple[int, list[str]]] = []
    for step, text in batch:
        if runs and runs[-1][0] == step:
            runs[-1][1].append(text)
        else:
            runs.append((step, [text]))
    return [(step, "".join(pieces)) for step, pieces in runs]


def _split(merged: list[tuple[int, str]], size: int) -> list[tuple[int, str]]:
    """Chunks of at most ``size`` characters."""
    return [(step, text[i : i + size]) for step, text in merged for i in range(0, len(text), size)]


def _calls(chunks: list[tuple[int, int, str]], size: int) -> list[list[tuple[int, int, str]]]:
    """Chunks grouped into calls of at most ``size`` characters (in order: seq stays increasing)."""
    calls: list[list[tuple[int, int, str]]] = [[]]
    total = 0
    for chunk in chunks:
        if calls[-1] and (total + len(chunk[2]) > size or len(calls[-1]) >= 1000):
            calls.append([])
            total = 0
        calls[-1].append(chunk)
        total += len(chunk[2])
    return calls
