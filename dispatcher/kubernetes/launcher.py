"""The ``kubernetes`` launcher: one Pod per launch of a run, created directly (no Job controller).

The Pod's name is deterministic (run id and launch attempt), so a second create of the same launch
answers 409 and counts as launched. API errors become ``LaunchError``: 403, 422 (and other
4xx) fail the run with the API's reason; 429, 5xx and dropped connections are retried here with
bounded backoff, then reported as retryable (with Retry-After when the API sent one).
"""

from __future__ import annotations

import logging
from typing import Any

import kubernetes.client

from dispatcher.kubernetes import api as kubernetes_api
from dispatcher.kubernetes.api import CallRetries, KubernetesApiError
from dispatcher.kubernetes.pods import build_pod, pod_name
from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.errors import LaunchError
from runplane.settings import Settings

log = logging.getLogger(__name__)

CONFLICT = 409


class KubernetesLauncher:
    """Launches runners as Pods in one cluster: ``settings.kubernetes`` says where and how."""

    name = "kubernetes"

    def __init__(self, settings: Settings, *, configuration: kubernetes.client.Configuration | None = None) -> None:
        """``configuration`` overrides the cluster from settings (a kubeconfig context or in-cluster)."""
        self._settings = settings
        self._k8s = settings.kubernetes
        self._cluster = settings.dispatcher.cluster
        config = configuration if configuration is not None else kubernetes_api.configuration(self._k8s)
        self._api_client = kubernetes.client.ApiClient(config)
        self._core = kubernetes.client.CoreV1Api(self._api_client)
        self._policy = CallRetries.from_settings(self._k8s)

    @property
    def cluster(self) -> str:
        return self._cluster

    def pod_for(self, request: LaunchRequest) -> dict[str, Any]:
        # The Pod's grace covers the runner's own stop of a step: SIGINT, then SIGTERM, then SIGKILL.
        grace = self._settings.runner.interrupt_grace + self._settings.runner.cancel_grace
        return build_pod(request, self._k8s, cluster=self._cluster, cancel_grace=grace)

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        pod = self.pod_for(request)
        name = pod_name(request.run_id, request.attempt)
        fields = {"run_id": request.run_id, "job_id": request.job_id, "account_id": request.account_id, "pod": name}
        try:
            await kubernetes_api.call(
                self._policy,
                "create pod",
                self._core.create_namespaced_pod,
                self._k8s.namespace,
                pod,
                _preload_content=False,
                _request_timeout=self._k8s.request_timeout,
            )
        except KubernetesApiError as exc:
            if exc.status == CONFLICT:
                log.info("pod already exists; launched before", extra=fields)
                return LaunchResult(cluster=self._cluster, pod_name=name)
            log.warning("pod create failed", extra={**fields, "status": exc.status, "reason": exc.reason})
            raise LaunchError(
                f"cluster {self._cluster}: {exc}", retryable=exc.transient, retry_after=exc.retry_after
            ) from exc
        log.info("pod created", extra={**fields, "cluster": self._cluster})
        return LaunchResult(cluster=self._cluster, pod_name=name)

    async def delete_pod(self, name: str) -> bool:
        """Delete one Pod in the runs namespace; False when it was already gone."""
        return await kubernetes_api.delete_pod(self._policy, self._core, self._k8s, name)

    async def close(self) -> None:
        self._api_client.close()  # type: ignore[no-untyped-call]
