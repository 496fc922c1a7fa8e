"""The Grafana dashboard loads, every query in it (panels and variables) names a metric the services
export and parses as PromQL (the real promtool), and it shows what operators watch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from runplane.adapters import instruments
from tests.support.promtool import promtool

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "runplane.json"
# What Grafana puts in place of its variables before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$cluster": ".*", "$pool": ".*"}


def exported_names() -> set[str]:
    return instruments.prometheus_names()


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _rows_and_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel in order, the panels of a collapsed row right after it."""
    return [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]


def _query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _rows_and_panels(dashboard) if p["type"] != "row"]


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    found = [(panel["title"], target["expr"]) for panel in _query_panels(dashboard) for target in panel["targets"]]
    found += [
        (f"variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    return found


def test_every_panel_queries_exported_metrics() -> None:
    dashboard = _dashboard()
    exported = exported_names()
    assert "runplane_run_delay_seconds_bucket" in exported
    assert "runplane_runs_finished_total" in exported
    assert _query_panels(dashboard)
    for panel in _query_panels(dashboard):
        assert panel["targets"], panel["title"]
    for where, expr in _queries(dashboard):
        used = set(re.findall(r"\brunplane_[a-z_]+", expr))
        assert used, (where, expr)
        assert used <= exported, (where, used - exported)


def test_every_panel_query_is_promql(tmp_path: Path) -> None:
    """Each panel's query, its Grafana variables filled in, as a recording rule promtool checks."""
    rules = [
        {"record": f"dashboard:query_{index}", "expr": _as_prometheus_gets_it(expr)}
        for index, (_, expr) in enumerate(_queries(_dashboard()))
    ]
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in promtool("check", "rules", path.as_posix())


def _as_prometheus_gets_it(query: str) -> str:
    """A panel's or variable's query with Grafana's variables filled in (a variable's
    ``label_values(selector, label)`` is Grafana's own: its selector is the PromQL)."""
    label_values = re.fullmatch(r"label_values\((.*), *[a-z_]+\)", query)
    expr = label_values.group(1) if label_values is not None else query
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def test_the_dashboard_shows_what_operators_watch() -> None:
    titles = " | ".join(p["title"] for p in _rows_and_panels(_dashboard())).lower()
    for subject in ("on time", "run delay", "prep time", "trigger lag", "queue", "slots", "heartbeat", "term"):
        assert subject in titles


def test_the_warm_pools_row_shows_every_pool_metric_by_pool_and_cluster() -> None:
    panels = _rows_and_panels(_dashboard())
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Warm pools")
    row = panels[start + 1 :]
    row = row[: next((i for i, p in enumerate(row) if p["type"] == "row"), len(row))]
    exprs = [target["expr"] for panel in row for target in panel["targets"]]
    pool_metrics = {name for name in exported_names() if name.startswith("runplane_pool_")}
    assert {"runplane_pool_forecast", "runplane_pool_launches_total"} <= pool_metrics
    assert pool_metrics <= {name for expr in exprs for name in re.findall(r"\brunplane_[a-z_]+", expr)}
    for expr in exprs:
        assert "by (cluster, pool" in expr, expr
        assert 'cluster=~"$cluster", pool=~"$pool"' in expr, expr
    titles = " | ".join(p["title"] for p in row).lower()
    for subject in ("forecast", "target", "idle", "queued", "lead time", "served warm"):
        assert subject in titles


def test_the_clusters_row_shows_each_dispatchers_intake_bound_and_create_rate() -> None:
    panels = _rows_and_panels(_dashboard())
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Clusters")
    row = panels[start + 1 :]
    row = row[: next((i for i, p in enumerate(row) if p["type"] == "row"), len(row))]
    exprs = [target["expr"] for panel in row for target in panel["targets"]]
    shown = {name for expr in exprs for name in re.findall(r"\brunplane_[a-z_]+", expr)}
    assert {"runplane_dispatcher_intake_bound", "runplane_dispatcher_create_rate"} <= shown & exported_names()
    assert all("by (cluster)" in expr and 'cluster=~"$cluster"' in expr for expr in exprs), exprs
