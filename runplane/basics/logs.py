"""Logging set-up for entry points: JSON lines in production, readable text on a terminal.

Library code logs with ``logging.getLogger(__name__)`` and passes ids in ``extra``
(``run_id``, ``job_id``, ``account_id``, ...); both formats show them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

# Record attributes that are not fields of the line: the standard ones, and uvicorn's copy of its
# message with terminal colour codes (``color_message``), which a log line must not carry.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__("%(asctime)s %(levelname)-5s " + service + " %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def configure(service: str, *, fmt: str = "auto", level: str = "INFO") -> None:
    """Install the one handler of this process (called only by entry points)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if use_json else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aio_pika", "aiormq", "psycopg.pool", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
