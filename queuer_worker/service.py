"""``runplane queuer-worker``: connect to Postgres and RabbitMQ and run one queuer worker."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from queuer_worker.forecast import Forecaster
from queuer_worker.runs_store import PostgresRunsStore
from queuer_worker.worker import QueuerWorker
from runplane.adapters.bus import AmqpBus
from runplane.adapters.db import open_pool
from runplane.basics.settings import Settings

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    """Unique per process: a restarted worker is a new worker and registers afresh."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    worker_id = new_worker_id()
    pool = await open_pool(settings.database_url, min_size=1, max_size=4, name="queuer-worker")
    try:
        bus = await AmqpBus.connect(settings.amqp_url)
        try:
            log.info("queuer worker starting", extra={"worker_id": worker_id})
            forecaster = Forecaster(settings.forecast, pool, worker_id)
            await QueuerWorker(settings, bus, PostgresRunsStore(pool), worker_id, forecaster=forecaster).run(stop)
        finally:
            await bus.close()
    finally:
        await pool.close()
