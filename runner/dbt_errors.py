"""The line of a failed step's output that says why: dbt's first error header and what follows it.

dbt prints the adapter's reason under a header — ``Runtime Error``, ``Database Error`` (either alone or
``… in model x``), or ``Encountered an error:`` followed by one of them — and the reason on the next
line. The run's status message carries those lines, so "step 4 failed" comes with the warehouse's own
words instead of only in the log. The text watched is the masked text the log gets.
"""

from __future__ import annotations

import re

HEADERS = ("Runtime Error", "Database Error", "Encountered an error")
MAX_CHARS = 400
# dbt's log lines start with the time ("12:34:56  " or "12:34:56.789012 "); the rest is the message.
_TIME = re.compile(r"^\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+")
_MAX_LINE = 4096  # a line longer than this is cut where it is watched: enough for any header or reason


class ErrorLines:
    """Fed a step's output as it comes; :attr:`found` is dbt's first error header and its reason."""

    def __init__(self) -> None:
        self._partial = ""
        self._lines: list[str] = []  # the header, then the lines after it, until a reason is seen
        self._done = False

    def feed(self, text: str) -> None:
        if self._done:
            return
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[:_MAX_LINE]
        for line in lines:
            self._line(line[:_MAX_LINE])
            if self._done:
                return

    def end(self) -> None:
        """The step's output is over: a last line without a newline counts too."""
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        self._done = True

    @property
    def found(self) -> str | None:
        """``Runtime Error: IO Error: Cannot open file …`` (header and reason joined), or None."""
        if not self._lines:
            return None
        joined = ": ".join(part.rstrip(":") for part in self._lines if part.rstrip(":"))
        return joined if len(joined) <= MAX_CHARS else joined[: MAX_CHARS - 1] + "…"

    def _line(self, raw: str) -> None:
        line = _TIME.sub("", raw.strip()).strip()
        if not self._lines:
            if line.startswith(HEADERS):
                self._lines.append(line)
            return
        if not line:
            return
        self._lines.append(line)
        # "Encountered an error:" is followed by the header of the kind of error, then the reason.
        if not line.startswith(HEADERS):
            self._done = True
