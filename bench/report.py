"""Writing the results: ``latest.json`` (the records) and ``latest.md`` (the same as a table)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("scenario", "system", "n", "metric", "median", "min", "max", "unit", "runs", "note")


def format_number(value: float | None) -> str:
    """Readable figures: small values keep significant digits, large ones lose the decimals."""
    if value is None:
        return "—"
    if value == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.3g}"


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """A GitHub markdown table of the records, one row each."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _ in COLUMNS) + "|"]
    for r in records:
        cells = [
            str(r["scenario"]),
            str(r["system"]),
            f"{r['n']:,}",
            str(r["metric"]),
            format_number(r["value"]),
            format_number(r.get("min")),
            format_number(r.get("max")),
            str(r["unit"]),
            str(r.get("runs", "")),
            str(r.get("note", "")).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(records: Sequence[dict[str, Any]], out_dir: Path, preamble: str = "") -> tuple[Path, Path]:
    """Write latest.json and latest.md into ``out_dir``; each file is replaced atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "latest.json"
    md_path = out_dir / "latest.md"
    _atomic_write(json_path, json.dumps(list(records), indent=2) + "\n")
    _atomic_write(md_path, (preamble + "\n\n" if preamble else "") + markdown_table(records))
    return json_path, md_path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
