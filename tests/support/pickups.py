"""Reading the Pickups that wait on a test's pickup queue."""

from __future__ import annotations

import aio_pika

from runplane.adapters.bus import Topology, decode
from runplane.basics.settings import Settings
from runplane.runs.pickups import pickup_accounts
from runplane.v1 import bus_pb2


async def waiting_pickup_accounts(settings: Settings) -> list[int]:
    """Accounts named by the Pickups waiting on the pickup queue, in order; the Pickups are taken off it."""
    connection = await aio_pika.connect(settings.amqp_url)
    accounts: list[int] = []
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(Topology(settings.bus_prefix).pickup, durable=True)
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            pickup = decode(message.type, message.body)
            assert isinstance(pickup, bus_pb2.Pickup)
            accounts += pickup_accounts(pickup)
    finally:
        await connection.close()
    return accounts
