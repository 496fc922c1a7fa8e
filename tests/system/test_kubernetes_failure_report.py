"""A failing test with Pods prints why a Pod is Pending: its events, the nodes' conditions and images."""

from __future__ import annotations

import pytest

from tests.support.kubernetes_cluster import Rest
from tests.support.kubernetes_system import describe_pods

pytestmark = pytest.mark.slow


def test_the_report_says_why_a_pod_is_pending(kube: Rest, runs_namespace: str) -> None:
    node, pod = f"node-{runs_namespace}", "runplane-run-1-1"
    kube.post("/api/v1/nodes", {"metadata": {"name": node}})
    try:
        pressure = {
            "type": "DiskPressure",
            "status": "True",
            "reason": "KubeletHasDiskPressure",
            "message": "available disk space is low",
        }
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": {"conditions": [pressure], "images": [{"names": ["runplane-runner:dbt-1.10"], "sizeBytes": 1}]}},
            "application/merge-patch+json",
        )
        kube.post(
            f"/api/v1/namespaces/{runs_namespace}/pods",
            {
                "metadata": {"name": pod},
                "spec": {"containers": [{"name": "runner", "image": "runplane-runner:dbt-1.9"}]},
            },
        )
        kube.post(  # what the scheduler says of a Pod no node can take
            f"/api/v1/namespaces/{runs_namespace}/events",
            {
                "metadata": {"name": f"{pod}.1"},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": runs_namespace},
                "type": "Warning",
                "reason": "FailedScheduling",
                "message": "0/1 nodes are available: 1 node(s) had disk pressure.",
                "count": 3,
            },
        )
        report = describe_pods(kube, runs_namespace)
    finally:
        kube.delete(f"/api/v1/nodes/{node}")
    assert f"{pod}: Pending" in report
    assert "event Warning FailedScheduling x3: 0/1 nodes are available: 1 node(s) had disk pressure." in report
    assert "condition DiskPressure=True KubeletHasDiskPressure: available disk space is low" in report
    assert "runplane-runner:dbt-1.10" in report  # the node holds another dbt version's image
