"""The chart's alert rules, checked and unit-tested by the real promtool (Debian's `prometheus` package,
installed by `make test`) on the PrometheusRule Helm renders, with the metric names runplane exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runplane.adapters import instruments
from tests.support.helm import helm
from tests.support.promtool import promtool

JOB = "rp-runplane-metrics"
QUEUER = {"job": JOB, "app_kubernetes_io_component": "queuer-worker"}
DISPATCHER = {"job": JOB, "app_kubernetes_io_component": "dispatcher-default"}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _rendered_rules() -> dict[str, Any]:
    out = helm("template", "rp", ".", "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
    docs = [d for d in yaml.safe_load_all(out) if d]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    assert service["metadata"]["name"] == JOB  # the job label a ServiceMonitor scrape gets
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["podTargetLabels"] == ["app.kubernetes.io/component"]
    return {"groups": rule["spec"]["groups"]}


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(_rendered_rules()))
    return path


def test_the_rules_are_valid_promql(rules_file: Path) -> None:
    assert "SUCCESS: 10 rules found" in promtool("check", "rules", rules_file.as_posix())


def test_the_rules_name_only_metrics_runplane_exports(rules_file: Path) -> None:
    text = rules_file.read_text()
    used = {name for name in instruments.prometheus_names() if name in text}
    mentioned = {word for word in text.replace("(", " ").replace("{", " ").split() if word.startswith("runplane_")}
    assert mentioned and mentioned <= instruments.prometheus_names(), mentioned - instruments.prometheus_names()
    assert used == mentioned


def _alerts(name: str, at: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": alerts}


def _alert(labels: dict[str, str], summary: str, description: str | None = None) -> dict[str, Any]:
    annotations = {"summary": summary, **({"description": description} if description else {})}
    return {"exp_labels": labels, "exp_annotations": annotations}


WARNING = {"severity": "warning"}
POOL_SMALL = {**DISPATCHER, "pod": "d-1", "pool": "small", "cluster": "east"}
POOL_BIG = {**DISPATCHER, "pod": "d-1", "pool": "big", "cluster": "east"}
POOL_NONE = {**DISPATCHER, "pod": "d-1", "pool": "none", "cluster": "east"}
LATE = "Accounts whose runs started more than 60 s after their schedule; `runplane status` lists the worst."
HEALTHY_COMPONENTS = [
    _series("up", {**QUEUER, "pod": "q-1"}, "1x60"),
    _series("up", {**DISPATCHER, "pod": "d-1"}, "1x60"),
]

CASES: list[dict[str, Any]] = [
    {  # two accounts late from minute 11: firing 15 minutes later, not before
        "input_series": [
            _series("runplane_accounts_by_on_time_ratio", {"job": JOB, "at_most": "0.95"}, "0x10 2x40"),
            _series("runplane_accounts_by_on_time_ratio", {"job": JOB, "at_most": "0.5"}, "0x50"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts("RunplaneAccountsLate", "20m", []),
            _alerts(
                "RunplaneAccountsLate",
                "40m",
                [_alert(WARNING, "2 accounts have at most a share of 0.95 of their runs on time", LATE)],
            ),
        ],
    },
    {  # 9 of 10 runs on time against a 95 % setting; a queue that does not grow raises nothing
        "input_series": [
            _series("runplane_run_delay_seconds_bucket", {"job": JOB, "le": "60", "trigger": "schedule"}, "0+9x60"),
            _series("runplane_run_delay_seconds_count", {"job": JOB, "trigger": "schedule"}, "0+10x60"),
            _series("runplane_runs_queued_now", {"job": JOB}, "500x60"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts(
                "RunplaneOnTimeRatioLow",
                "40m",
                [_alert(WARNING, "Only 90% of runs started within 60 s of their schedule")],
            ),
            _alerts("RunplaneQueueGrowing", "40m", []),
        ],
    },
    {  # a queue growing by 10 runs a minute; three runs stuck from minute 6
        "input_series": [
            _series("runplane_runs_queued_now", {"job": JOB}, "10+10x40"),
            _series("runplane_runs_stuck_now", {"job": JOB}, "0x5 3x30"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts(
                "RunplaneQueueGrowing",
                "30m",
                [_alert(WARNING, "The run queue has grown for 10m (100 more runs)")],
            ),
            _alerts("RunplaneRunsStuck", "8m", []),
            _alerts(
                "RunplaneRunsStuck",
                "20m",
                [
                    _alert(
                        {"severity": "warning"},
                        "3 runs starting past the start timeout or running with an expired lease",
                    )
                ],
            ),
        ],
    },
    {  # one of two queuer workers stops answering; then every dispatcher does
        "input_series": [
            _series("up", {**QUEUER, "pod": "q-1"}, "1x5 0x40"),
            _series("up", {**QUEUER, "pod": "q-2"}, "1x45"),
            _series("up", {**DISPATCHER, "pod": "d-1"}, "1x20 0x30"),
        ],
        "alert_rule_test": [
            _alerts(
                "RunplaneQueuerWorkerDown",
                "15m",
                [
                    _alert(
                        {**QUEUER, "pod": "q-1", "severity": "warning"},
                        "Queuer worker q-1 does not answer scrapes",
                    )
                ],
            ),
            _alerts("RunplaneNoQueuerWorkerOrDispatcher", "15m", []),
            _alerts(
                "RunplaneDispatcherDown",
                "35m",
                [_alert({**DISPATCHER, "pod": "d-1", "severity": "warning"}, "Dispatcher d-1 does not answer scrapes")],
            ),
            _alerts(
                "RunplaneNoQueuerWorkerOrDispatcher",
                "35m",
                [
                    _alert(
                        {"severity": "critical"},
                        "No queuer worker or no dispatcher is up: runs are neither queued nor started",
                    )
                ],
            ),
        ],
    },
    {  # the leader assigned a worker its jobs again once, at minute 10; nothing before
        "input_series": [
            _series("runplane_orchestrator_workers_drifted_total", {"job": JOB, "pod": "o-1"}, "0x9 1x50"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts("RunplaneQueuerWorkerLostJobs", "9m", []),
            _alerts(
                "RunplaneQueuerWorkerLostJobs",
                "12m",
                [
                    _alert(
                        WARNING,
                        "The leader found a queuer worker not holding jobs it owns 1 times in 30 minutes and assigned"
                        " them again",
                        "Fires of those jobs between the loss and the new Assign were queued only within their"
                        " missed-run grace; the orchestrator's log names the worker.",
                    )
                ],
            ),
        ],
    },
    {  # a peak of 8 runs at minute 8: pool small never held more than 3 idle runners and served 5 runs cold;
        # pool big held its forecast of 4 and served one run past it cold; runs no pool fits are cold by design
        "input_series": [
            _series("runplane_pool_forecast", POOL_SMALL, "0x4 8x4 0x20"),
            _series("runplane_pool_idle", POOL_SMALL, "1x4 3x4 0x20"),
            _series("runplane_pool_launches_total", {**POOL_SMALL, "served": "cold"}, "0x7 5x25"),
            _series("runplane_pool_forecast", POOL_BIG, "0x4 4x4 0x20"),
            _series("runplane_pool_idle", POOL_BIG, "1x4 4x3 0x21"),
            _series("runplane_pool_launches_total", {**POOL_BIG, "served": "warm"}, "0x7 4x25"),
            _series("runplane_pool_launches_total", {**POOL_BIG, "served": "cold"}, "0x7 1x25"),
            _series("runplane_pool_launches_total", {**POOL_NONE, "served": "cold"}, "0x7 3x25"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts("RunplanePoolServedColdAtPeak", "7m", []),
            _alerts(
                "RunplanePoolServedColdAtPeak",
                "9m",
                [
                    _alert(
                        {"cluster": "east", "pool": "small", "severity": "warning"},
                        "Pool small of cluster east served runs cold at a forecast peak",
                        "Its idle runners stayed below the forecast over the last 5m; the dashboard's Warm pools row"
                        " shows whether the target was capped (max size, capacity) or the pool filled too late (lead"
                        " time).",
                    )
                ],
            ),
            _alerts("RunplanePoolServedColdAtPeak", "20m", []),  # the peak is over
        ],
    },
    {  # 6 of 10 webhook attempts fail
        "input_series": [
            _series("runplane_webhooks_attempts_total", {"job": JOB, "result": "failed"}, "0+6x60"),
            _series("runplane_webhooks_attempts_total", {"job": JOB, "result": "delivered"}, "0+4x60"),
            *HEALTHY_COMPONENTS,
        ],
        "alert_rule_test": [
            _alerts(
                "RunplaneWebhookDeliveriesFailing",
                "40m",
                [_alert(WARNING, "60% of webhook delivery attempts fail")],
            )
        ],
    },
]


def test_the_rules_fire_when_they_should_and_not_before(rules_file: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests.yaml"
    cases = [{"interval": "1m", **case} for case in CASES]
    tests.write_text(yaml.safe_dump({"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": cases}))
    assert "SUCCESS" in promtool("test", "rules", tests.as_posix())
