"""Job notifications in dbt Cloud's v2 shape (``/api/v2/accounts/{id}/notifications/``), with runplane's
receivers (Slack incoming webhook or bot token, Teams Workflows, the models' owners), a test message and
the delivery log of each."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from api.notification_definitions import AddressRule, Notifications, delivery_status, notification_spec
from api.rest import params
from api.rest.auth import Account
from api.rest.envelope import ERROR_RESPONSES, Envelope, Extra, ListEnvelope, Pagination, success
from api.rest.shapes import stamp
from api.rest.webhooks import Attempt, TestSent
from api.rest.webhooks import Delivery as WebhookDelivery
from api.rows import Notification as NotificationRow

router = APIRouter(responses=ERROR_RESPONSES)
BASE = "/api/v2/accounts/{account_id}/notifications"
NotificationPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The notification's id")]
JobIds = list[Annotated[int, Field(ge=1, le=2**63 - 1)]]
FILTERS = frozenset({"limit", "offset", "state", "job_id", "include_related"})


class NotificationBody(BaseModel):
    """dbt Cloud's JobNotificationSettingsRequest, and runplane's write-only receiver secrets."""

    account_id: int | None = None
    user_id: int = Field(0, ge=0, le=2**63 - 1)
    type: int = Field(description="2 Slack, 4 external email, 6 Microsoft Teams (runplane), 7 the models' owners")
    external_email: str = Field("", max_length=254)
    slack_channel_id: str = Field("", max_length=64)
    slack_channel_name: str = Field("", max_length=255)
    slack_webhook_url: str = Field("", max_length=2048, description="Write-only: a Slack incoming webhook.")
    slack_bot_token: str = Field("", max_length=255, description="Write-only: a bot token (chat.postMessage).")
    teams_webhook_url: str = Field("", max_length=2048, description="Write-only: a Teams Workflows webhook.")
    on_success: JobIds = Field(default_factory=list, max_length=1000)
    on_warning: JobIds = Field(default_factory=list, max_length=1000)
    on_failure: JobIds = Field(default_factory=list, max_length=1000)
    on_cancel: JobIds = Field(default_factory=list, max_length=1000)
    state: int = Field(1, ge=1, le=2)


class Notification(BaseModel):
    id: int
    account_id: int
    user_id: int
    type: int
    external_email: str
    slack_channel_id: str
    slack_channel_name: str
    on_success: list[int]
    on_warning: list[int]
    on_failure: list[int]
    on_cancel: list[int]
    state: int
    created_at: str | None
    updated_at: str | None
    secret_set: str = Field(description="Which write-only secret is set (never its value), or empty.")
    consecutive_failures: int
    disabled_at: str | None = Field(description="When it was switched off after failures in a row.")
    disabled_reason: str


class Delivery(WebhookDelivery):
    """A webhook delivery's fields, and a notification's own: its recipient, status and outcome."""

    recipient: str
    status: str = Field(description="delivered, pending, abandoned, in doubt, or skipped")
    outcome: str


def _notifications(request: Request) -> Notifications:
    notifications: Notifications = request.app.state.notifications
    return notifications


def view(row: NotificationRow) -> Notification:
    return Notification(
        id=row.id,
        account_id=row.account_id,
        user_id=row.user_id,
        type=row.type,
        external_email=row.external_email,
        slack_channel_id=row.slack_channel_id,
        slack_channel_name=row.slack_channel_name,
        on_success=list(row.on_success),
        on_warning=list(row.on_warning),
        on_failure=list(row.on_failure),
        on_cancel=list(row.on_cancel),
        state=row.state,
        created_at=stamp(row.created_at),
        updated_at=stamp(row.updated_at),
        secret_set=row.secret_kind,
        consecutive_failures=row.consecutive_failures,
        disabled_at=stamp(row.disabled_at),
        disabled_reason=row.disabled_reason,
    )


def _spec(request: Request, body: NotificationBody, *, creating: bool) -> Any:
    allowed: AddressRule = request.app.state.notification_networks
    fields = body.model_dump(exclude={"account_id"})
    return notification_spec(**fields, creating=creating, allowed_networks=allowed)


@router.get(f"{BASE}/", summary="List notifications")
async def list_all(
    request: Request,
    account_id: Account,
    *,
    state: Annotated[int | None, Query(ge=1, le=2, description="1 active, 2 deleted")] = 1,
    job_id: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="Those naming this job")] = None,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
) -> ListEnvelope[Notification]:
    params.only_known(request.query_params, FILTERS)
    rows = await _notifications(request).all(account_id, state=state, job_id=job_id, limit=limit, offset=offset)
    filters: dict[str, Any] = {"limit": limit, "offset": offset, "state": state}
    if job_id is not None:
        filters["job_id"] = job_id
    return ListEnvelope[Notification](
        status=success(),
        data=[view(r) for r in rows],
        extra=Extra(filters=filters, order_by="id", pagination=Pagination(count=len(rows), total_count=len(rows))),
    )


@router.post(f"{BASE}/", summary="Create a notification")
async def create(request: Request, account_id: Account, body: NotificationBody) -> Envelope[Notification]:
    row = await _notifications(request).create(account_id, _spec(request, body, creating=True))
    return Envelope[Notification](status=success(), data=view(row))


@router.get(f"{BASE}/{{notification_id}}/", summary="Get a notification")
async def get(request: Request, account_id: Account, notification_id: NotificationPath) -> Envelope[Notification]:
    row = await _notifications(request).get(account_id, notification_id)
    return Envelope[Notification](status=success(), data=view(row))


@router.post(f"{BASE}/{{notification_id}}/", summary="Update a notification (switches it back on)")
async def update(
    request: Request, account_id: Account, notification_id: NotificationPath, body: NotificationBody
) -> Envelope[Notification]:
    row = await _notifications(request).update(account_id, notification_id, _spec(request, body, creating=False))
    return Envelope[Notification](status=success(), data=view(row))


@router.delete(f"{BASE}/{{notification_id}}/", summary="Delete a notification (state 2)")
async def delete(request: Request, account_id: Account, notification_id: NotificationPath) -> Envelope[Notification]:
    row = await _notifications(request).delete(account_id, notification_id)
    return Envelope[Notification](status=success(), data=view(row))


@router.post(f"{BASE}/{{notification_id}}/test/", summary="Send a test message through the outbox")
async def send_test(request: Request, account_id: Account, notification_id: NotificationPath) -> Envelope[TestSent]:
    event_id = await _notifications(request).send_test(account_id, notification_id)
    return Envelope[TestSent](status=success(), data=TestSent(event_id=event_id))


@router.get(f"{BASE}/{{notification_id}}/deliveries/", summary="The delivery log of a notification")
async def deliveries(
    request: Request, account_id: Account, notification_id: NotificationPath
) -> Envelope[list[Delivery]]:
    rows = await _notifications(request).deliveries(account_id, notification_id)
    return Envelope[list[Delivery]](
        status=success(),
        data=[
            Delivery(
                event_id=r.event_id,
                event_type=r.event_type,
                run_id=r.run_id,
                recipient=r.recipient,
                created_at=stamp(r.created_at),
                attempts=r.attempts,
                status=delivery_status(r.delivered_at, r.abandoned_at, r.outcome),
                outcome=r.outcome,
                delivered_at=stamp(r.delivered_at),
                abandoned_at=stamp(r.abandoned_at),
                next_attempt_at=stamp(r.next_attempt_at),
                attempt_log=[Attempt(**a) for a in r.attempt_log],
            )
            for r in rows
        ],
    )
