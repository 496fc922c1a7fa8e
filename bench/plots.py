"""PNG plots of the records (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt


def write_plots(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Every plot the records allow; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for metric, title, name in (
        ("lag_p99", "Top-of-the-hour burst: lag p99 (median of runs)", "burst_lag_p99.png"),
        ("all_done", "Top-of-the-hour burst: time until all are queued/started", "burst_all_done.png"),
        ("memory_per_job", "Top-of-the-hour burst: resident memory per scheduled job", "burst_memory_per_job.png"),
    ):
        path = _grouped_bars(records, "burst", metric, title, out_dir / name)
        if path:
            written.append(path)
    path = _throughput_vs_ceiling(records, out_dir / "throughput_vs_ceiling.png")
    if path:
        written.append(path)
    return written


def _grouped_bars(records: Sequence[dict[str, Any]], scenario: str, metric: str, title: str, path: Path) -> Path | None:
    """Bars of one metric per system, grouped by N, on a log scale (systems differ by orders)."""
    rows = [r for r in records if r["scenario"] == scenario and r["metric"] == metric and r["value"] is not None]
    if not rows:
        return None
    sizes = sorted({int(r["n"]) for r in rows})
    systems = list(dict.fromkeys(str(r["system"]) for r in rows))
    timed_out = {
        (str(r["system"]), int(r["n"]))
        for r in records
        if r["scenario"] == scenario and r["metric"] == "timed_out" and r["value"]
    }
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        placed: list[tuple[float, int, dict[str, Any]]] = [
            (j + i * width, n, r)
            for j, n in enumerate(sizes)
            for r in rows
            if r["system"] == system and int(r["n"]) == n
        ]
        heights = [max(float(r["value"]), 1e-4) for _, _, r in placed]
        low = [max(float(r["value"]) - float(r["min"]), 0.0) for _, _, r in placed]
        high = [max(float(r["max"]) - float(r["value"]), 0.0) for _, _, r in placed]
        bars = ax.bar([x for x, _, _ in placed], heights, width, yerr=[low, high], capsize=3, label=system)
        for (_, n, _), bar in zip(placed, bars, strict=True):
            if (system, n) in timed_out:
                bar.set_hatch("//")  # a lower bound: some jobs had not run when it gave up
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"N = {n:,}" for n in sizes])
    ax.set_yscale("log")
    unit = rows[0]["unit"]
    ax.set_ylabel(f"{metric} ({unit})")
    ax.set_title(title)
    if timed_out:
        fig.text(0.01, 0.01, "hatched: hit its time cap, a lower bound", fontsize=7)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput_vs_ceiling(records: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """runplane's runs/s beside Postgres's own insert/commit rate for a run-shaped row."""
    bars: list[tuple[str, dict[str, Any]]] = []
    for r in records:
        if r["value"] is None or r["unit"] != "1/s":
            continue
        if r["scenario"] == "ceiling":
            bars.append((f"Postgres ceiling\n({r['metric']})", r))
        elif r["scenario"] == "throughput":
            bars.append((f"{r['system']}\n({r['metric']})", r))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [label for label, _ in bars]
    values = [float(r["value"]) for _, r in bars]
    low = [max(float(r["value"]) - float(r["min"]), 0.0) for _, r in bars]
    high = [max(float(r["max"]) - float(r["value"]), 0.0) for _, r in bars]
    ax.bar(
        labels,
        values,
        yerr=[low, high],
        capsize=4,
        color=["tab:gray" if "ceiling" in lb else "tab:blue" for lb in labels],
    )
    ax.set_ylabel("per second")
    ax.set_title("Throughput against the Postgres ceiling (median, min to max)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
