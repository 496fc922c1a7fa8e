"""Log lines: the fields passed in ``extra`` are shown, nothing a library adds for terminals is."""

from __future__ import annotations

import json
import logging

from runplane.basics.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (42,), None)
    record.__dict__.update(extra)
    return record


def test_a_json_line_carries_the_extra_fields_and_not_uvicorns_coloured_copy() -> None:
    record = _record(run_id=7, color_message="Started server process [\x1b[36m%d\x1b[0m]")
    line = json.loads(JsonFormatter("api").format(record))
    assert line["msg"] == "Started server process [42]"
    assert line["run_id"] == 7
    assert "color_message" not in line


def test_a_text_line_carries_the_extra_fields_and_not_uvicorns_coloured_copy() -> None:
    line = TextFormatter("api").format(_record(run_id=7, color_message="\x1b[36m"))
    assert line.endswith("uvicorn.error: Started server process [42] run_id=7")
    assert "\x1b" not in line
