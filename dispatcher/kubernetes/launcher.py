"""The ``kubernetes`` launcher: one Pod per launch of a run, created directly (no Job controller).

A dispatcher launches many runs at once; ``kubernetes.pod_creates_per_second`` bounds the launches
(each a Secret, a Pod and a patch) this launcher sends the API server per second, so a burst at the
top of the hour queues here instead of drawing 429s from the API server.

The Pod's name is deterministic (run id and launch attempt), so a second create of the same launch
answers 409 and counts as launched. API errors become ``LaunchError``: 403, 422 (and other
4xx) fail the run with the API's reason; 429, 5xx and dropped connections are retried here with
bounded backoff, then reported as retryable (with Retry-After when the API sent one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kubernetes.client
from aiolimiter import AsyncLimiter

from dispatcher.kubernetes import api as kubernetes_api
from dispatcher.kubernetes.api import CallRetries, KubernetesApiError
from dispatcher.kubernetes.pods import build_pod, build_token_secret, pod_name
from dispatcher.launcher import LaunchRequest, LaunchResult
from runplane.basics.errors import LaunchError
from runplane.basics.settings import Settings

log = logging.getLogger(__name__)

CONFLICT = 409
NOT_FOUND = 404


def _pod_create_limiter(per_second: float) -> AsyncLimiter | None:
    """A leaky bucket letting ``per_second`` launches through per second (bursts up to one second's worth)."""
    if per_second <= 0:
        return None
    if per_second >= 1:
        return AsyncLimiter(per_second, 1.0)
    return AsyncLimiter(1, 1.0 / per_second)


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
        # Launches run concurrently (``dispatcher.launch_concurrency``); this bounds what reaches the API server.
        rate = self._k8s.pod_creates_per_second
        self._pod_creates = _pod_create_limiter(rate)

    @property
    def cluster(self) -> str:
        return self._cluster

    def pod_for(self, request: LaunchRequest) -> dict[str, Any]:
        return build_pod(
            request,
            self._k8s,
            cluster=self._cluster,
            # The Pod's grace covers the runner's own stop of a step: SIGINT, then SIGTERM, then SIGKILL.
            cancel_grace=self._settings.runner.interrupt_grace + self._settings.runner.cancel_grace,
            runner_api_address=self._settings.runner.api_address,
            repositories=self._settings.repositories,
        )

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        """The token's Secret first (the Pod mounts it), then the Pod, then the Pod owns the Secret."""
        pod = self.pod_for(request)
        name = pod_name(request.run_id, request.attempt)
        fields = {"run_id": request.run_id, "job_id": request.job_id, "account_id": request.account_id, "pod": name}
        if self._pod_creates is not None:
            await self._pod_creates.acquire()
        try:
            await self._create_token_secret(request)
            created = await self._in_namespace("create pod", self._core.create_namespaced_pod, body=pod)
        except KubernetesApiError as exc:
            if exc.status == CONFLICT:
                log.info("pod already exists; launched before", extra=fields)
                return LaunchResult(cluster=self._cluster, pod_name=name)
            if not exc.transient:
                await self._delete_token_secret(name)
            log.warning("pod create failed", extra={**fields, "status": exc.status, "reason": exc.reason})
            raise LaunchError(
                f"cluster {self._cluster}: {exc}", retryable=exc.transient, retry_after=exc.retry_after
            ) from exc
        log.info("pod created", extra={**fields, "cluster": self._cluster})
        await self._secret_owned_by_pod(name, created)
        return LaunchResult(cluster=self._cluster, pod_name=name)

    async def _create_token_secret(self, request: LaunchRequest) -> None:
        if not request.token:
            raise LaunchError(f"run {request.run_id} has no run token", retryable=False)
        secret = build_token_secret(request, self._k8s, cluster=self._cluster)
        try:
            await self._in_namespace("create secret", self._core.create_namespaced_secret, body=secret)
        except KubernetesApiError as exc:
            if exc.status != CONFLICT:
                raise
            # Left by an earlier try of this launch: this launch's token is the one that counts.
            await self._delete_token_secret(secret["metadata"]["name"])
            await self._in_namespace("create secret", self._core.create_namespaced_secret, body=secret)

    async def _delete_token_secret(self, name: str) -> None:
        try:
            await self._in_namespace("delete secret", self._core.delete_namespaced_secret, name=name)
        except KubernetesApiError as exc:
            if exc.status != NOT_FOUND:
                log.warning("token secret not deleted", extra={"pod": name, "status": exc.status})

    async def _secret_owned_by_pod(self, name: str, created: Any) -> None:
        """Make the Pod the token Secret's owner, so the Secret goes when the Pod goes (best effort)."""
        try:
            await kubernetes_api.give_secret_to_pod(self._policy, self._core, self._k8s, name, created)
        except (KubernetesApiError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("token secret not tied to its pod: %s", exc, extra={"pod": name})

    async def _in_namespace(
        self, what: str, fn: Callable[..., Any], *, name: str | None = None, body: object = None
    ) -> Any:
        return await kubernetes_api.in_namespace(self._policy, self._k8s, what, fn, name=name, body=body)

    async def delete_pod(self, name: str) -> bool:
        """Delete one Pod in the runs namespace; False when it was already gone."""
        return await kubernetes_api.delete_pod(self._policy, self._core, self._k8s, name)

    async def close(self) -> None:
        kubernetes_api.close_client(self._api_client)
