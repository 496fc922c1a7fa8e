"""The edge to the Kubernetes API: client configuration, bounded retries, and our errors.

The official client is synchronous; every call runs in a thread (``asyncio.to_thread``). Its own
retries are turned off so that this module is the only place that decides how often to try:
429 honours Retry-After, 5xx and dropped connections back off exponentially, both bounded by
``KubernetesSettings.api_attempts`` and ``api_backoff_cap``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException

from runplane.basics.backoff import ceiling
from runplane.basics.errors import RunplaneError, ServiceUnavailable
from runplane.basics.settings import KubernetesSettings

log = logging.getLogger(__name__)

T = TypeVar("T")


class KubernetesApiError(RunplaneError):
    """The API answered with an error. ``transient``: trying again later may help."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"Kubernetes API {status} {reason}: {message}".rstrip(": "))
        self.status = status
        self.reason = reason
        self.api_message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        # 401: the service account token is being rotated; anything else in 4xx is a rejection.
        return self.status in {0, 401, 429} or self.status >= 500


class _Closable(Protocol):
    def close(self) -> None: ...


def close_client(client: kubernetes.client.ApiClient) -> None:
    """Close the client's connection pool (``ApiClient.close`` has no annotations; this is it, typed)."""
    closable: _Closable = client
    closable.close()


def configuration(settings: KubernetesSettings) -> kubernetes.client.Configuration:
    """Client configuration for the cluster in ``settings``: a kubeconfig context, or in-cluster."""
    config = kubernetes.client.Configuration()
    # The kubernetes package has no annotations: its loaders are typed here.
    load_kube_config: Callable[..., None] = kubernetes.config.load_kube_config
    load_incluster_config: Callable[..., None] = kubernetes.config.load_incluster_config
    try:
        if settings.context or settings.kubeconfig:
            load_kube_config(
                config_file=settings.kubeconfig or None,
                context=settings.context or None,
                client_configuration=config,
            )
        else:
            load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException as exc:
        where = f"context {settings.context!r}" if settings.context else "in-cluster service account"
        raise ServiceUnavailable(f"cannot configure the Kubernetes client ({where}): {exc}") from exc
    return without_client_retries(config)


def without_client_retries(config: kubernetes.client.Configuration) -> kubernetes.client.Configuration:
    """Turn off urllib3's retries: ``call`` retries, with backoff and Retry-After."""
    config.retries = 0
    return config


@dataclass(frozen=True)
class CallRetries:
    """How ``call`` retries a transient Kubernetes API failure (not a run's retries: runplane.runs.retries)."""

    attempts: int
    backoff: float
    backoff_cap: float

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> CallRetries:
        return cls(
            attempts=max(1, settings.api_attempts), backoff=settings.api_backoff, backoff_cap=settings.api_backoff_cap
        )

    def delay(self, attempt: int) -> float:
        """Wait before retry number ``attempt`` (1-based)."""
        return ceiling(self.backoff, attempt, cap=self.backoff_cap)


async def call(policy: CallRetries, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a thread, retrying transient failures; raises ``KubernetesApiError``."""
    attempt = 1
    while True:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            error = api_error(exc)
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, dropped mid-response, timed out
            error = KubernetesApiError(0, "ConnectionError", str(exc) or type(exc).__name__)
            error.__cause__ = exc
        if not error.transient or attempt >= policy.attempts:
            raise error
        delay = policy.delay(attempt)
        if error.retry_after is not None:
            if error.retry_after > policy.backoff_cap:
                raise error  # longer than a launch should hold on: the caller defers the work instead
            delay = error.retry_after
        log.warning(
            "Kubernetes API call failed; retrying",
            extra={"call": what, "status": error.status, "attempt": attempt, "delay": delay},
        )
        await asyncio.sleep(delay)
        attempt += 1


async def in_namespace(
    policy: CallRetries,
    settings: KubernetesSettings,
    what: str,
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    body: object = None,
) -> Any:
    """``fn``, a ``*_namespaced_*`` call of the core API, on the object ``name`` (when it names one) in
    the runs namespace, with ``body`` (when it sends one): through :func:`call`, bounded by the request
    timeout. The response is the raw one (:func:`load_json` reads it): the client's models are slow to
    build and the dispatcher reads a field or two."""
    args = (*((name,) if name is not None else ()), settings.namespace, *((body,) if body is not None else ()))
    return await call(policy, what, fn, *args, _preload_content=False, _request_timeout=settings.request_timeout)


async def give_secret_to_pod(
    policy: CallRetries, core: kubernetes.client.CoreV1Api, settings: KubernetesSettings, name: str, created: Any
) -> None:
    """Make the Pod ``name`` (``created``: the response that created it) the owner of its token Secret
    (also named ``name``), so the Secret goes when the Pod goes."""
    uid = load_json(created)["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
    patch = {"metadata": {"ownerReferences": [owner]}}
    await in_namespace(policy, settings, "patch secret", core.patch_namespaced_secret, name=name, body=patch)


async def delete_pod(
    policy: CallRetries, core: kubernetes.client.CoreV1Api, settings: KubernetesSettings, name: str
) -> bool:
    """Delete one Pod in the runs namespace; False when it was already gone."""
    try:
        await in_namespace(policy, settings, "delete pod", core.delete_namespaced_pod, name=name)
    except KubernetesApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def api_error(exc: ApiException) -> KubernetesApiError:
    """Our error for the client's, with the API's own message (a ``Status`` object) when it sent one."""
    message = ""
    reason = str(exc.reason or "")
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            message = body[:500]
        else:
            if isinstance(status, dict):
                message = str(status.get("message") or "")
                reason = str(status.get("reason") or reason)
    error = KubernetesApiError(int(exc.status or 0), reason, message, retry_after=retry_after(exc.headers))
    error.__cause__ = exc
    return error


def retry_after(headers: Any) -> float | None:
    """Seconds from a Retry-After header (the API sends whole seconds)."""
    if not headers:
        return None
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return None


def load_json(response: Any) -> dict[str, Any]:
    """The body of a ``_preload_content=False`` response as JSON."""
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise KubernetesApiError(0, "BadResponse", f"expected a JSON object, got {type(data).__name__}")
    return data
