"""Choosing the launcher named by ``settings.dispatcher.launcher``."""

from __future__ import annotations

import importlib

from psycopg_pool import AsyncConnectionPool

from dispatcher.launcher import Launcher
from dispatcher.local_launcher import LocalLauncher
from dispatcher.noop_launcher import NoopLauncher
from runplane.db import Connection
from runplane.errors import InvalidArgument
from runplane.settings import Settings

# The Kubernetes launcher lives in its own module and is imported only when chosen (its client is heavy).
KUBERNETES_MODULE = "dispatcher.kubernetes_launcher"


def make_launcher(settings: Settings, pool: AsyncConnectionPool[Connection]) -> Launcher:
    name = settings.dispatcher.launcher
    match name:
        case "local":
            return LocalLauncher(settings.dispatcher.cluster, fork_server=settings.dispatcher.local_fork_server)
        case "noop":
            return NoopLauncher(pool, settings.dispatcher.cluster)
        case "kubernetes":
            module = importlib.import_module(KUBERNETES_MODULE)
            launcher: Launcher = module.create_launcher(settings, pool)
            return launcher
    raise InvalidArgument("dispatcher.launcher", f"unknown launcher {name!r}: local, noop or kubernetes")
