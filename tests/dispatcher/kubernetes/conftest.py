"""Settings for the Kubernetes tests, and kmock for the faults a real API server cannot be made to show.

The real API server (and node) come from ``tests/support/kubernetes_fixtures.py``; kmock (an HTTP
emulator) stays only for faults a real API server cannot be made to show on demand, each test saying so.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from dispatcher.kubernetes.api import without_client_retries
from runplane.basics.settings import DispatcherSettings, KubernetesSettings, SchedulerSettings, Settings

NAMESPACE = "runs"
KUBE_VERSION = "1.31"  # the chart's newest kubeVersion; every manifest is validated against this schema
REAL_KUBE_VERSION = "1.20"  # what the local API server is


def k8s_settings(cluster: str = "east", **kubernetes: Any) -> Settings:
    """Settings with fast retries and sweeps, so fault tests take well under a second each."""
    values: dict[str, Any] = {
        "namespace": NAMESPACE,
        "api_backoff": 0.05,
        "api_backoff_cap": 2.0,
        "request_timeout": 3.0,
        "watch_timeout_seconds": 2,
        "relist_backoff": 0.1,
        "sweep_interval": 0.2,
        "pod_retention_seconds": 0.6,
        "orphan_grace_seconds": 0.3,
    }
    values.update(kubernetes)
    return Settings(
        dispatcher=DispatcherSettings(launcher="kubernetes", cluster=cluster),
        scheduler=SchedulerSettings(launch_attempts=3, launch_backoff=2.0),
        kubernetes=KubernetesSettings(**values),
    )


def client_config(url: object) -> kubernetes.client.Configuration:
    """A client configuration for an emulated API server at ``url`` (kmock on 127.0.0.1)."""
    return without_client_retries(kubernetes.client.Configuration(host=str(url).rstrip("/")))


@pytest.fixture
def kube_url(kmock: Any) -> str:
    kmock.resources["v1/pods"] = {}  # the emulator lists pods even before one exists
    kmock.resources["v1/secrets"] = {}  # each launch's token
    return str(kmock.url).rstrip("/")
