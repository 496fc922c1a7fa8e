"""The job page's notifications: who hears of the job's runs and how each message went, a test
message, and a form to add a receiver for this job. The rules are ``api/notification_definitions.py``'s,
as at the other doors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse

from api.lookup import existing_job
from api.notification_definitions import (
    AddressRule,
    Notifications,
    NotificationType,
    delivery_status,
    notification_spec,
)
from api.rows import Notification, NotificationDelivery
from api.web.layout import see_other, store_of
from api.web.session import Changing
from runplane.basics.types import AccountId

router = APIRouter(prefix="/ui", include_in_schema=False)
SHOWN_DELIVERIES = 5
OUTCOMES = ("on_success", "on_warning", "on_failure", "on_cancel")
TYPE_NAMES = {
    NotificationType.SLACK: "Slack",
    NotificationType.EXTERNAL_EMAIL: "Email",
    NotificationType.TEAMS: "Microsoft Teams",
    NotificationType.MODEL_OWNERS: "The models' owners",
}


@dataclass(frozen=True)
class Notice:
    """One notification as the job page shows it."""

    row: Notification
    kind: str
    receiver: str
    outcomes: list[str]
    deliveries: list[tuple[NotificationDelivery, str, str]]  # the delivery, its status, its last answer


def _notifications(request: Request) -> Notifications:
    notifications: Notifications = request.app.state.notifications
    return notifications


def _receiver(row: Notification) -> str:
    if row.type == NotificationType.EXTERNAL_EMAIL:
        return row.external_email
    if row.secret_kind == "slack_bot_token":
        return f"channel {row.slack_channel_name or row.slack_channel_id} (bot token set)"
    if row.secret_kind:
        return f"{row.secret_kind.replace('_', ' ')} set"
    return "owners of the groups in the run's manifest.json"


async def job_notices(request: Request, account_id: AccountId, job_id: int) -> list[Notice]:
    notifications = _notifications(request)
    notices = []
    for row in await notifications.all(account_id, job_id=job_id):
        deliveries = (await notifications.deliveries(account_id, row.id))[:SHOWN_DELIVERIES]
        shown = []
        for d in deliveries:
            last = d.attempt_log[-1] if d.attempt_log else {}
            answer = " ".join(str(x) for x in (last.get("status_code") or "", last.get("error") or "") if x)
            shown.append((d, delivery_status(d.delivered_at, d.abandoned_at, d.outcome), answer or d.outcome))
        outcomes = [name.removeprefix("on_") for name in OUTCOMES if job_id in getattr(row, name)]
        notices.append(Notice(row, TYPE_NAMES[NotificationType(row.type)], _receiver(row), outcomes, shown))
    return notices


@router.post("/jobs/{job_id}/notifications")
async def add(
    request: Request,
    who: Changing,
    job_id: int,
    *,
    type: Annotated[int, Form()],
    external_email: Annotated[str, Form()] = "",
    url: Annotated[str, Form()] = "",
    outcome: Annotated[list[str] | None, Form()] = None,
) -> RedirectResponse:
    """A receiver for this job's outcomes ticked; a Slack or Teams URL is kept as their secret."""
    store = store_of(request)
    async with store.connection() as conn:
        await existing_job(store, conn, who.account_id, job_id)
    ticked = set(outcome or [])

    def jobs_on(name: str) -> list[int]:
        return [job_id] if name in ticked else []

    allowed: AddressRule = request.app.state.notification_networks
    spec = notification_spec(
        type=type,
        external_email=external_email,
        slack_webhook_url=url if type == NotificationType.SLACK else "",
        teams_webhook_url=url if type == NotificationType.TEAMS else "",
        allowed_networks=allowed,
        on_success=jobs_on("success"),
        on_warning=jobs_on("warning"),
        on_failure=jobs_on("failure"),
        on_cancel=jobs_on("cancel"),
    )
    await _notifications(request).create(who.account_id, spec)
    return see_other(f"/ui/jobs/{job_id}#notifications")


@router.post("/jobs/{job_id}/notifications/{notification_id}/test")
async def test(request: Request, who: Changing, job_id: int, notification_id: int) -> RedirectResponse:
    """Queue a test message; it shows in the delivery log below once sent."""
    await _notifications(request).send_test(who.account_id, notification_id)
    return see_other(f"/ui/jobs/{job_id}#notifications")
