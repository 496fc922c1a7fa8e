"""Webhook subscriptions in dbt Cloud's v3 shape, and runplane's delivery log of each."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rest.shapes import stamp
from api.webhooks import rows
from api.webhooks.deliveries import body_of
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
    consecutive_failures: int = 0
    disabled_at: str | None = Field(None, description="When it was switched off after failures in a row.")
    disabled_reason: str = ""


class Attempt(BaseModel):
    attempted_at: str
    status_code: int | None
    latency_ms: float
    error: str
    response_body: str = Field("", description="What the receiver answered (its first kilobytes).")


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


class TestSent(BaseModel):
    event_id: str


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
        consecutive_failures=row.consecutive_failures,
        disabled_at=stamp(row.disabled_at),
        disabled_reason=row.disabled_reason,
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


class Event(BaseModel):
    """dbt Cloud's webhook Event (its string fields as it types them)."""

    id: str
    subscription_id: str
    account_identifier: str
    account_id: str
    job_id: str
    trigger_event_type: str
    payload: str
    http_status_code: str
    run_id: int | None
    created_at: str | None


class Receipt(BaseModel):
    """dbt Cloud's webhook Receipt: one attempt to deliver an event, with the receiver's answer."""

    id: str
    event_id: str
    subscription_id: str
    dispatched_at: str
    http_status_code: str
    error_info: str
    request_body: str
    request_headers: str
    response_body: str


@router.get(f"{BASE}/subscription/{{webhook_id}}/test/", summary="Send a test event to a subscription")
async def send_test(request: Request, account_id: Account, webhook_id: WebhookPath) -> Envelope[TestSent]:
    event_id = await _subscriptions(request).send_test(account_id, webhook_id)
    return Envelope[TestSent](status=success(), data=TestSent(event_id=event_id))


@router.get(f"{BASE}/subscription/{{webhook_id}}/events/", summary="The events of a subscription")
async def events(
    request: Request,
    account_id: Account,
    webhook_id: WebhookPath,
    *,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
) -> ListEnvelope[Event]:
    rows = await _subscriptions(request).events(account_id, webhook_id, limit=limit, offset=offset)
    data = [
        Event(
            id=r.id,
            subscription_id=r.subscription_id,
            account_identifier=str(r.account_id),
            account_id=str(r.account_id),
            job_id=r.job_id or "",
            trigger_event_type=r.event_type,
            payload=body_of(r.payload).decode(),
            http_status_code="" if r.status_code is None else str(r.status_code),
            run_id=r.run_id,
            created_at=stamp(r.created_at),
        )
        for r in rows
    ]
    return ListEnvelope[Event](
        status=success(),
        data=data,
        extra=Extra(
            filters={"limit": limit, "offset": offset},
            order_by="-id",
            pagination=Pagination(count=len(data), total_count=len(data)),
        ),
    )


@router.get(
    f"{BASE}/subscription/{{webhook_id}}/event/{{event_id}}/receipt/", summary="The receipts (attempts) of an event"
)
async def receipts(
    request: Request,
    account_id: Account,
    webhook_id: WebhookPath,
    event_id: Annotated[str, Path(min_length=1, max_length=64)],
) -> Envelope[list[Receipt]]:
    rows = await _subscriptions(request).receipts(account_id, webhook_id, event_id)
    return Envelope[list[Receipt]](
        status=success(),
        data=[
            Receipt(
                id=str(r.id),
                event_id=r.event_id,
                subscription_id=r.subscription_id,
                dispatched_at=stamp(r.attempted_at) or "",
                http_status_code="" if r.status_code is None else str(r.status_code),
                error_info=r.error,
                request_body=body_of(r.payload).decode(),
                request_headers='{"Content-Type": "application/json", "User-Agent": "runplane-webhooks"}',
                response_body=r.response_body,
            )
            for r in rows
        ],
    )
