"""The Grafana dashboard loads and every panel's query names a metric the services export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runplane.adapters import instruments

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "runplane.json"


def exported_names() -> set[str]:
    return instruments.prometheus_names()


def test_every_panel_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    assert "runplane_run_delay_seconds_bucket" in exported
    assert "runplane_runs_finished_total" in exported
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\brunplane_[a-z_]+", target["expr"]))
            assert used, (panel["title"], target["expr"])
            assert used <= exported, (panel["title"], used - exported)


def test_the_dashboard_shows_what_operators_watch() -> None:
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for subject in ("on time", "run delay", "prep time", "trigger lag", "queue", "slots", "heartbeat", "term"):
        assert subject in titles
