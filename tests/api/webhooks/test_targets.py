"""Webhooks reach public addresses only: checked when saved, and against DNS on every delivery."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from api.admin import create_account
from api.webhooks.deliveries import WebhookDeliverer
from api.webhooks.targets import TargetPolicy, TargetRefused
from runplane.adapters.db import Connection, close_pool, open_pool
from runplane.basics.errors import InvalidArgument
from runplane.basics.secrets import SecretBox
from runplane.basics.settings import Settings

REFUSED = [
    "127.0.0.1",
    "10.1.2.3",
    "172.16.0.9",
    "192.168.1.1",
    "169.254.169.254",  # a cloud's instance metadata
    "100.64.0.1",  # shared address space
    "0.0.0.0",
    "224.0.0.1",
    "::1",
    "fe80::1",
    "fd00::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64's well-known prefix with 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # ... with 169.254.169.254
    "2002:7f00:1::1",  # 6to4 with 127.0.0.1
    "2002:a00:1::",  # 6to4 with 10.0.0.1
]


@pytest.mark.parametrize("address", REFUSED)
def test_addresses_that_are_not_public_are_refused(address: str) -> None:
    reason = TargetPolicy().refusal(ipaddress.ip_address(address))
    assert reason is not None and "not a public address" in reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "64:ff9b::808:808"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert TargetPolicy().refusal(ipaddress.ip_address(address)) is None


def test_a_listed_network_is_allowed_and_only_it() -> None:
    policy = TargetPolicy(["10.20.0.0/16", "fd00:1::/64"])
    assert policy.refusal(ipaddress.ip_address("10.20.3.4")) is None
    assert policy.refusal(ipaddress.ip_address("fd00:1::5")) is None
    assert policy.refusal(ipaddress.ip_address("10.21.0.1")) is not None
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is not None


@pytest.mark.parametrize(
    "url",
    ["http://169.254.169.254/latest/meta-data/", "https://localhost:8443/hook", "http://[::1]:80/", "http://10.0.0.1"],
)
def test_a_url_naming_a_refused_address_is_refused_when_saved(url: str) -> None:
    with pytest.raises(InvalidArgument, match="not a public address"):
        TargetPolicy().check_url(url)


def test_a_url_naming_a_host_is_left_to_delivery_time() -> None:
    TargetPolicy().check_url("https://hooks.example.com/runplane")


async def test_a_name_that_resolves_to_loopback_is_refused_at_delivery() -> None:
    with pytest.raises(TargetRefused, match=r"localhost resolves to 127\.0\.0\.1"):
        await TargetPolicy().resolve("http://localhost:9/hook")


async def test_delivery_connects_to_the_address_it_checked_with_the_original_host() -> None:
    target = await TargetPolicy(["127.0.0.0/8", "::1/128"]).resolve("https://user:pw@localhost:8443/hook?x=1")
    assert target.url in ("https://127.0.0.1:8443/hook?x=1", "https://[::1]:8443/hook?x=1")
    assert target.host_header == "localhost:8443"
    assert target.server_name == "localhost"


class Receiver:
    """A plain HTTP server on loopback that answers 200 and keeps each request's head."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lengths = [int(line.split(":")[1]) for line in head.splitlines() if line.lower().startswith("content-length")]
        await reader.readexactly(lengths[0] if lengths else 0)
        self.requests.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Connection]]:
    pool = await open_pool(database_url, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await close_pool(pool)


async def _queue_event(settings: Settings, database_url: str, client_url: str) -> int:
    """An outbox event for a subscription saved with ``client_url`` (as if its name was public then)."""
    account_id, _ = await create_account(settings, name="acme", run_slots=1, memory_mb=512)
    secret = SecretBox.from_keys(settings.secret_keys.get_secret_value()).encrypt("s3cret")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO webhook_subscriptions (id, account_id, name, client_url, event_types, hmac_secret)"
            " VALUES ('wsu_t', %s, 'ops', %s, '{job.run.completed}', %s)",
            (account_id, client_url, secret),
        )
        cur = await conn.execute(
            "INSERT INTO webhook_outbox (event_id, subscription_id, account_id, event_type, payload)"
            " VALUES ('wev_t', 'wsu_t', %s, 'job.run.completed', '{\"eventId\": \"wev_t\"}') RETURNING id",
            (account_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _attempts(database_url: str, outbox_id: int) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT status_code, error FROM webhook_attempts WHERE outbox_id = %s ORDER BY id", (outbox_id,)
        )
        return await cur.fetchall()


async def test_a_delivery_to_a_refused_address_sends_nothing_and_says_why(
    settings: Settings, database_url: str, pool: AsyncConnectionPool[Connection]
) -> None:
    async with Receiver() as receiver:
        outbox_id = await _queue_event(settings, database_url, f"http://localhost:{receiver.port}/hook")
        box = SecretBox.from_keys(settings.secret_keys.get_secret_value())
        deliverer = WebhookDeliverer(pool, box, settings.webhooks)
        async with _http() as http:
            await deliverer.deliver_due(http)
        assert receiver.requests == []
    [(status_code, error)] = await _attempts(database_url, outbox_id)
    assert status_code is None
    assert error.startswith("refused: localhost resolves to 127.0.0.1 is not a public address")


async def test_a_listed_network_is_delivered_to_with_the_original_host(
    settings: Settings, database_url: str, pool: AsyncConnectionPool[Connection]
) -> None:
    async with Receiver() as receiver:
        outbox_id = await _queue_event(settings, database_url, f"http://localhost:{receiver.port}/hook")
        box = SecretBox.from_keys(settings.secret_keys.get_secret_value())
        allowed = settings.webhooks.model_copy(update={"allowed_networks": ["127.0.0.0/8", "::1/128"]})
        async with _http() as http:
            await WebhookDeliverer(pool, box, allowed).deliver_due(http)
        [head] = receiver.requests
    assert head.startswith("POST /hook HTTP/1.1")
    assert f"host: localhost:{receiver.port}" in head.lower()
    assert await _attempts(database_url, outbox_id) == [(200, "")]


def _http() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=5, follow_redirects=False)
