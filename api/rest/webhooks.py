"""Webhook subscriptions in dbt Cloud's v3 shape, and runplane's delivery log of each."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, success
from api.rest.shapes import stamp
from api.webhooks import rows
from api.webhooks.subscriptions import Subscriptions, subscription_spec

router = APIRouter(responses=ERROR_RESPONSES)
BASE = "/api/v3/accounts/{account_id}/webhooks"
WebhookPath = Annotated[str, Path(min_length=1, max_length=64, description="The webhook's id (wsu_...)")]


class SubscriptionBody(BaseModel):
    name: str = Field(max_length=255)
    client_url: str = Field(max_length=2048)
    event_types: list[str] = Field(max_length=3)
    job_ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(default_factory=list, max_length=1000)
    description: str = Field("", max_length=1000)
    active: bool = True


class Subscription(BaseModel):
    id: str
    account_id: int
    name: str
    description: str
    client_url: str
    event_types: list[str]
    job_ids: list[str]
    active: bool
    hmac_secret: str | None = Field(None, description="Only in the answer to the create.")
    created_at: str | None
    updated_at: str | None


class Attempt(BaseModel):
    attempted_at: str
    status_code: int | None
    latency_ms: float
    error: str


class Delivery(BaseModel):
    event_id: str
    event_type: str
    run_id: int | None
    created_at: str | None
    attempts: int
    delivered_at: str | None
    abandoned_at: str | None
    next_attempt_at: str | None
    attempt_log: list[Attempt]


class Deleted(BaseModel):
    id: str


def _subscriptions(request: Request) -> Subscriptions:
    subscriptions: Subscriptions = request.app.state.subscriptions
    return subscriptions


def _spec(body: SubscriptionBody) -> Any:
    return subscription_spec(
        name=body.name,
        description=body.description,
        client_url=body.client_url,
        event_types=body.event_types,
        job_ids=body.job_ids,
        active=body.active,
    )


def _view(row: rows.Subscription, secret: str | None = None) -> Subscription:
    return Subscription(
        id=row.id,
        account_id=row.account_id,
        name=row.name,
        description=row.description,
        client_url=row.client_url,
        event_types=list(row.event_types),
        job_ids=[str(j) for j in row.job_ids],
        active=row.active,
        hmac_secret=secret,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
    )


@router.post(f"{BASE}/subscriptions/", summary="Create a webhook subscription")
async def create(request: Request, account_id: Account, body: SubscriptionBody) -> Envelope[Subscription]:
    row, secret = await _subscriptions(request).create(account_id, _spec(body))
    return Envelope[Subscription](status=success(), data=_view(row, secret))


@router.get(f"{BASE}/subscriptions/", summary="List webhook subscriptions")
async def list_all(request: Request, account_id: Account) -> Envelope[list[Subscription]]:
    rows = await _subscriptions(request).all(account_id)
    return Envelope[list[Subscription]](status=success(), data=[_view(r) for r in rows])


@router.get(f"{BASE}/subscription/{{webhook_id}}/", summary="Get a webhook subscription")
async def get(request: Request, account_id: Account, webhook_id: WebhookPath) -> Envelope[Subscription]:
    row = await _subscriptions(request).get(account_id, webhook_id)
    return Envelope[Subscription](status=success(), data=_view(row))


@router.put(f"{BASE}/subscription/{{webhook_id}}/", summary="Replace a webhook subscription")
async def update(
    request: Request, account_id: Account, webhook_id: WebhookPath, body: SubscriptionBody
) -> Envelope[Subscription]:
    row = await _subscriptions(request).update(account_id, webhook_id, _spec(body))
    return Envelope[Subscription](status=success(), data=_view(row))


@router.delete(f"{BASE}/subscription/{{webhook_id}}/", summary="Delete a webhook subscription")
async def delete(request: Request, account_id: Account, webhook_id: WebhookPath) -> Envelope[Deleted]:
    await _subscriptions(request).delete(account_id, webhook_id)
    return Envelope[Deleted](status=success(), data=Deleted(id=webhook_id))


@router.get(f"{BASE}/subscription/{{webhook_id}}/deliveries/", summary="The delivery log of a subscription")
async def deliveries(request: Request, account_id: Account, webhook_id: WebhookPath) -> Envelope[list[Delivery]]:
    rows = await _subscriptions(request).deliveries(account_id, webhook_id)
    return Envelope[list[Delivery]](
        status=success(),
        data=[
            Delivery(
                event_id=r.event_id,
                event_type=r.event_type,
                run_id=r.run_id,
                created_at=stamp(r.created_at),
                attempts=r.attempts,
                delivered_at=stamp(r.delivered_at),
                abandoned_at=stamp(r.abandoned_at),
                next_attempt_at=stamp(r.next_attempt_at),
                attempt_log=[Attempt(**a) for a in r.attempt_log],
            )
            for r in rows
        ],
    )
