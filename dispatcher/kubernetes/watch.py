"""Watching run Pods and reconciling them with their runs.

``PodWatcher.run(stop)`` lists the Pods runplane manages (by the managed-by label), then watches
from the list's resourceVersion, resuming from the last version it saw after each server-side
timeout and relisting when the API answers 410 Gone. Each Pod is reconciled against its run
through ``PodOutcomes`` (Postgres in production, see ``outcomes``):

- OOMKilled → the run ends with "memory limit error";
- evicted, failed, or stuck before its container started → if the runner never claimed the run,
  it goes back to the queue within the launch budget (or fails when the budget is spent); if it
  had (the Pod is the one recorded on the running run), the runner is gone: the run ends "runner
  lost" with the Pod's reason at once, not when its lease runs out;
- still pending or running but its run is not live any more (cancelled, reaped, finished) → deleted;
- finished → deleted after ``pod_retention_seconds`` (kept meanwhile for ``kubectl logs``).

The sync client's watch stream is read in a daemon thread; stopping closes its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import kubernetes.client
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as kubernetes_watch

from dispatcher.kubernetes import api as kubernetes_api
from dispatcher.kubernetes.api import CallRetries, KubernetesApiError
from dispatcher.kubernetes.pods import SELECTOR, PodState, PodView, view_pod
from runplane.basics import supervise
from runplane.basics.settings import Settings
from runplane.basics.types import RunId

log = logging.getLogger(__name__)

GONE = 410


class PodOutcomes(Protocol):
    """What reconciling may do to runs. Every method is a compare-and-set: calling twice is harmless."""

    async def memory_limit_exceeded(self, run_id: RunId, pod_name: str) -> bool:
        """End a starting or running run with "memory limit error"; True when this call ended it."""
        ...

    async def failed_before_claim(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        """The Pod died while the run was still starting: relaunch within the budget, else error."""
        ...

    async def runner_pod_failed(self, run_id: RunId, pod_name: str, reason: str) -> bool:
        """The Pod recorded on a running run failed (its runner is gone): the run ends "runner lost"."""
        ...

    async def live_pods(self, pods: Sequence[tuple[RunId, str]]) -> set[str]:
        """Of these (run id, Pod name) pairs, the names of Pods whose run still needs them."""
        ...


class WatchExpired(Exception):
    """The resourceVersion is too old (410 Gone): list again."""


class PodWatcher:
    """Keeps the run Pods of one cluster in line with their runs. Start ``run(stop)`` as a named task."""

    def __init__(
        self,
        settings: Settings,
        outcomes: PodOutcomes,
        *,
        configuration: kubernetes.client.Configuration | None = None,
    ) -> None:
        self._k8s = settings.kubernetes
        self._outcomes = outcomes
        config = configuration if configuration is not None else kubernetes_api.configuration(self._k8s)
        self._api_client = kubernetes.client.ApiClient(config)
        self._core = kubernetes.client.CoreV1Api(self._api_client)
        self._policy = CallRetries.from_settings(self._k8s)
        self._pods: dict[str, PodView] = {}  # the Pods we know of, by name
        self._terminal_since: dict[str, float] = {}  # when a finished Pod was first seen finished
        self.relists = 0  # how many times the full list was read (observability and tests)
        self.expirations = 0  # how many watches answered 410 Gone

    @property
    def pods(self) -> dict[str, PodView]:
        return dict(self._pods)

    def active_count(self) -> int:
        """Pods of this cluster still pending or running, as last seen: run Pods and warm pool Pods."""
        return sum(1 for view in self._pods.values() if not view.terminal)

    def run_pod_count(self) -> int:
        """Pods of this cluster given a run and still pending or running, as last seen. A pool Pod
        waiting for a run is not one: a run given to it takes no new room."""
        return sum(1 for view in self._pods.values() if not view.terminal and view.run_id is not None)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                supervise.spawn(group, "pod-watch", self._watch_loop(stop))
                supervise.spawn(group, "pod-sweep", self._sweep_loop(stop))
        finally:
            kubernetes_api.close_client(self._api_client)

    # -- list and watch --------------------------------------------------------------------------

    async def _watch_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                version = await self._relist()
                while not stop.is_set():
                    version = await self._watch(version, stop)
            except WatchExpired:
                self.expirations += 1
                log.info("watch expired (410 Gone); relisting")
            except KubernetesApiError as exc:
                log.warning("pod watch failed; relisting", extra={"status": exc.status, "error": str(exc)})
                await supervise.sleep_or_stop(stop, self._k8s.relist_backoff)

    async def _relist(self) -> str:
        """Read every managed Pod, reconcile each, and return the list's resourceVersion."""
        response = await kubernetes_api.call(
            self._policy,
            "list pods",
            self._core.list_namespaced_pod,
            self._k8s.namespace,
            label_selector=SELECTOR,
            _preload_content=False,
            _request_timeout=self._k8s.request_timeout,
        )
        listing = kubernetes_api.load_json(response)
        self.relists += 1
        views = [view_pod(item) for item in listing.get("items") or []]
        self._pods = {view.name: view for view in views}
        self._terminal_since = {name: t for name, t in self._terminal_since.items() if name in self._pods}
        for view in views:
            if view.terminal:
                await self._reconcile(view)
        # Active Pods in one query: after a restart there may be thousands.
        active = [(view.run_id, view.name) for view in views if not view.terminal and view.run_id is not None]
        await self._delete_orphans(active)
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str, stop: asyncio.Event) -> str:
        """One watch request from ``version``; returns the last version seen when the server ends it."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        stream = _WatchStream(
            self._open_watch, version, lambda item: loop.call_soon_threadsafe(events.put_nowait, item)
        )
        stream.start()
        stopped = asyncio.create_task(stop.wait(), name="pod-watch:stop")
        try:
            while True:
                getter = asyncio.create_task(events.get(), name="pod-watch:event")
                await asyncio.wait({getter, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    return version
                item = getter.result()
                if item is None:
                    return version
                if isinstance(item, BaseException):
                    raise item
                version = await self._on_event(item, version)
        finally:
            stopped.cancel()
            stream.close()

    def _open_watch(self, version: str) -> Any:
        timeout = self._k8s.watch_timeout_seconds
        try:
            return self._core.list_namespaced_pod(
                self._k8s.namespace,
                label_selector=SELECTOR,
                watch=True,
                resource_version=version or None,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(self._k8s.request_timeout, timeout + self._k8s.request_timeout),
            )
        except ApiException as exc:
            if exc.status == GONE:
                raise WatchExpired() from exc
            raise kubernetes_api.api_error(exc) from exc

    async def _on_event(self, event: dict[str, Any], version: str) -> str:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == GONE:
                raise WatchExpired()
            raise KubernetesApiError(code, str(obj.get("reason") or "WatchError"), str(obj.get("message") or ""))
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or version
        if kind == "BOOKMARK":
            return new_version
        view = view_pod(obj)
        if kind == "DELETED":
            self._pods.pop(view.name, None)
            self._terminal_since.pop(view.name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._pods[view.name] = view
            await self._reconcile(view)
        return new_version

    # -- reconcile -------------------------------------------------------------------------------

    async def _reconcile(self, view: PodView) -> None:
        if view.run_id is None:
            return  # not a run Pod we can place; leave it to whoever made it
        fields = {"run_id": view.run_id, "pod": view.name}
        match view.state:
            case PodState.OOM_KILLED:
                if await self._outcomes.memory_limit_exceeded(view.run_id, view.name):
                    log.info("run exceeded its memory limit", extra=fields)
            case PodState.FAILED:
                if await self._outcomes.failed_before_claim(view.run_id, view.name, view.reason):
                    log.info("pod failed before the runner claimed the run", extra={**fields, "reason": view.reason})
                elif await self._outcomes.runner_pod_failed(view.run_id, view.name, view.reason):
                    log.warning(
                        "pod failed under its running run: runner lost", extra={**fields, "reason": view.reason}
                    )
            case PodState.ACTIVE:
                await self._delete_orphans([(view.run_id, view.name)])
            case PodState.SUCCEEDED:
                pass  # the runner recorded the outcome; the Pod stays for its retention period

    async def _sweep_loop(self, stop: asyncio.Event) -> None:
        while not await supervise.sleep_or_stop(stop, self._k8s.sweep_interval):
            try:
                await self.sweep()
            except KubernetesApiError as exc:
                log.warning("pod sweep failed", extra={"status": exc.status, "error": str(exc)})

    async def sweep(self, now: float | None = None) -> None:
        """Delete finished Pods past retention, and active Pods whose run is not live."""
        now = time.time() if now is None else now
        active: list[tuple[RunId, str]] = []
        for view in list(self._pods.values()):
            if view.terminal:
                finished = self._finished_at(view, now)
                if now - finished >= self._k8s.pod_retention_seconds:
                    await self._delete(view.name, "retention period over")
            elif view.run_id is not None:
                active.append((view.run_id, view.name))
        await self._delete_orphans(active)

    async def _delete_orphans(self, active: list[tuple[RunId, str]]) -> None:
        if not active:
            return
        live = await self._outcomes.live_pods(active)
        for _, name in active:
            if name not in live:
                await self._delete(name, "its run is not live")

    def _finished_at(self, view: PodView, now: float) -> float:
        if view.finished_at is not None:
            return view.finished_at.timestamp()
        return self._terminal_since.setdefault(view.name, now)

    async def _delete(self, name: str, why: str) -> None:
        await kubernetes_api.delete_pod(self._policy, self._core, self._k8s, name)
        self._pods.pop(name, None)
        self._terminal_since.pop(name, None)
        log.info("pod deleted", extra={"pod": name, "why": why})


class _WatchStream:
    """Reads one watch response in a daemon thread and hands each event to ``deliver``.

    Delivers decoded events, then ``None`` at the end of the stream, or the exception that ended it.
    ``close`` shuts the socket so the thread ends promptly (a quiet watch blocks in a read).
    """

    def __init__(
        self,
        open_watch: Callable[[str], Any],
        version: str,
        deliver: Callable[[dict[str, Any] | BaseException | None], object],
    ) -> None:
        self._open = open_watch
        self._version = version
        self._deliver = deliver
        self._response: Any = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="runplane-pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._drop_connection()

    def _drop_connection(self) -> None:
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # unblocks a read in progress (urllib3 >= 2.3)
            with contextlib.suppress(Exception):
                response.close()  # drop the connection, not back to the pool: the server ends its stream

    def _send(self, item: dict[str, Any] | BaseException | None) -> None:
        if self._closed.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is listening
            self._deliver(item)

    def _read(self) -> None:
        try:
            self._response = self._open(self._version)
            if self._closed.is_set():
                self.close()
                return
            for line in _lines(self._response):
                if self._closed.is_set():
                    return
                if line:
                    self._send(json.loads(line))
        except urllib3.exceptions.ReadTimeoutError:
            self._drop_connection()  # the server kept a quiet watch open past its timeout: watch again
        except Exception as exc:
            if isinstance(exc, ApiException):
                self._send(kubernetes_api.api_error(exc))
            elif isinstance(exc, KubernetesApiError | WatchExpired):
                self._send(exc)
            else:
                error = KubernetesApiError(0, "WatchDropped", str(exc) or type(exc).__name__)
                error.__cause__ = exc
                self._send(error)
            return
        self._send(None)


def _lines(response: object) -> Iterator[str]:
    """The lines of a watch response as they arrive (the kubernetes package's reader, typed: it has no annotations)."""
    lines: Callable[[object], Iterator[str]] = kubernetes_watch.iter_resp_lines
    return lines(response)
