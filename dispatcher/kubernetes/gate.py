"""Whether a dispatcher takes pickups: its cluster's API answers, and the cluster has room for runs.

A dispatcher talks to one cluster. While that cluster's API server does not answer
(``/version``, ``health_failures`` probes in a row, one every ``health_interval`` seconds), or the cluster holds
``capacity`` active run Pods (Pods given a run: a warm pool Pod still waiting for one takes a run
without a new Pod), the dispatcher stops consuming pickups (its consumers are cancelled),
so the dispatchers of other clusters take the runs; it consumes again once the API answers and
there is room. A run it moved to starting but could not launch goes back to the queue as a
retryable launch failure, where any dispatcher picks it up; the compare-and-set on the run's status
keeps a run from starting twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import kubernetes.client

from dispatcher.kubernetes import api as kubernetes_api
from dispatcher.kubernetes.api import CallRetries, KubernetesApiError
from runplane.basics import supervise
from runplane.basics.settings import Settings

log = logging.getLogger(__name__)


class Consume(Protocol):
    """A consumer of pickups that runs until ``stop`` is set (``Bus.consume`` with its queue bound)."""

    def __call__(self, *, stop: asyncio.Event) -> Awaitable[None]: ...


class ClusterGate:
    """Opens and closes this dispatcher's intake of pickups. Start ``run(stop)`` as a named task."""

    def __init__(
        self,
        settings: Settings,
        *,
        configuration: kubernetes.client.Configuration | None = None,
        active_pods: Callable[[], int] | None = None,
    ) -> None:
        self._k8s = settings.kubernetes
        self._cluster = settings.dispatcher.cluster
        config = configuration if configuration is not None else kubernetes_api.configuration(self._k8s)
        self._api_client = kubernetes.client.ApiClient(config)
        self._policy = CallRetries(attempts=1, backoff=0.0, backoff_cap=0.0)  # one probe is one try
        self._active_pods = active_pods
        self._failures = 0
        self._open = asyncio.Event()
        self._closed = asyncio.Event()
        self._open.set()  # until a probe says otherwise
        self.healthy = True

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while True:
                await self.check()
                if await supervise.sleep_or_stop(stop, self._k8s.health_interval):
                    return
        finally:
            kubernetes_api.close_client(self._api_client)

    async def check(self) -> None:
        """Probe the API once and open or close the gate."""
        self.healthy = await self._probe()
        full = self._k8s.capacity > 0 and self._active_pods is not None and self._active_pods() >= self._k8s.capacity
        self._set(self.healthy and not full, "api down" if not self.healthy else "at capacity")

    async def _probe(self) -> bool:
        try:
            await kubernetes_api.call(
                self._policy,
                "version",
                kubernetes.client.VersionApi(self._api_client).get_code,
                _preload_content=False,
                _request_timeout=self._k8s.request_timeout,
            )
        except KubernetesApiError as exc:
            self._failures += 1
            if self._failures == self._k8s.health_failures:
                log.warning("cluster API not answering", extra={"cluster": self._cluster, "error": str(exc)})
            return self._failures < self._k8s.health_failures
        self._failures = 0
        return True

    def _set(self, want_open: bool, why: str) -> None:
        if want_open and not self._open.is_set():
            log.info("taking pickups again", extra={"cluster": self._cluster})
            self._closed.clear()
            self._open.set()
        elif not want_open and self._open.is_set():
            log.warning("not taking pickups", extra={"cluster": self._cluster, "why": why})
            self._open.clear()
            self._closed.set()

    async def consume_while_open(self, consume: Consume, stop: asyncio.Event) -> None:
        """Run ``consume(stop=pause)`` while the gate is open; ``pause`` is set when it closes or on ``stop``."""
        while not stop.is_set():
            if await supervise.wait_any(stop, self._open):
                return
            pause = asyncio.Event()
            relay = asyncio.create_task(_pause_when_closed(pause, self._closed, stop), name="cluster-gate:relay")
            try:
                await consume(stop=pause)
            finally:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await relay


async def _pause_when_closed(pause: asyncio.Event, closed: asyncio.Event, stop: asyncio.Event) -> None:
    await supervise.wait_any(stop, closed)
    pause.set()
