"""NotificationService: who is told when a job's run ends, a test message, and the delivery log; the
rules are ``api/notification_definitions.py``'s, shared with REST and the pages."""

from __future__ import annotations

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from api.grpc.auth import current_account
from api.notification_definitions import (
    AddressRule,
    Notifications,
    NotificationSpec,
    delivery_status,
    notification_spec,
)
from api.rows import Notification, NotificationDelivery
from runplane.v1 import notifications_pb2, notifications_pb2_grpc

Context = grpc.aio.ServicerContext[object, object]


def _spec(spec: notifications_pb2.NotificationSpec, allowed: AddressRule, *, creating: bool) -> NotificationSpec:
    return notification_spec(
        type=int(spec.type),
        external_email=spec.external_email,
        slack_channel_id=spec.slack_channel_id,
        slack_channel_name=spec.slack_channel_name,
        slack_webhook_url=spec.slack_webhook_url,
        slack_bot_token=spec.slack_bot_token,
        teams_webhook_url=spec.teams_webhook_url,
        on_success=list(spec.on_success),
        on_warning=list(spec.on_warning),
        on_failure=list(spec.on_failure),
        on_cancel=list(spec.on_cancel),
        creating=creating,
        allowed_networks=allowed,
    )


def notification(row: Notification) -> notifications_pb2.Notification:
    message = notifications_pb2.Notification(
        id=row.id,
        account_id=row.account_id,
        type=notifications_pb2.NotificationType.ValueType(row.type),
        external_email=row.external_email,
        slack_channel_id=row.slack_channel_id,
        slack_channel_name=row.slack_channel_name,
        secret_set=row.secret_kind,
        on_success=row.on_success,
        on_warning=row.on_warning,
        on_failure=row.on_failure,
        on_cancel=row.on_cancel,
        deleted=row.state == 2,
        consecutive_failures=row.consecutive_failures,
        disabled_reason=row.disabled_reason,
    )
    if row.disabled_at is not None:
        message.disabled_at.FromDatetime(row.disabled_at)
    return message


def delivery(row: NotificationDelivery) -> notifications_pb2.NotificationDelivery:
    attempts = []
    for attempt in row.attempt_log:
        stamp = Timestamp()
        stamp.FromJsonString(str(attempt["attempted_at"]).replace("+00:00", "Z"))
        attempts.append(
            notifications_pb2.NotificationAttempt(
                attempted_at=stamp,
                status_code=int(attempt.get("status_code") or 0),
                error=str(attempt.get("error") or ""),
                response_body=str(attempt.get("response_body") or ""),
            )
        )
    return notifications_pb2.NotificationDelivery(
        event_id=row.event_id,
        run_id=row.run_id or 0,
        recipient=row.recipient,
        status=delivery_status(row.delivered_at, row.abandoned_at, row.outcome),
        outcome=row.outcome,
        attempts=row.attempts,
        attempt_log=attempts,
    )


class NotificationService(notifications_pb2_grpc.NotificationServiceServicer):
    def __init__(self, notifications: Notifications, allowed: AddressRule) -> None:
        self._notifications = notifications
        self._allowed = allowed

    async def CreateNotification(
        self, request: notifications_pb2.CreateNotificationRequest, context: Context
    ) -> notifications_pb2.Notification:
        spec = _spec(request.notification, self._allowed, creating=True)
        return notification(await self._notifications.create(current_account(), spec))

    async def UpdateNotification(
        self, request: notifications_pb2.UpdateNotificationRequest, context: Context
    ) -> notifications_pb2.Notification:
        spec = _spec(request.notification, self._allowed, creating=False)
        row = await self._notifications.update(current_account(), request.notification_id, spec)
        return notification(row)

    async def GetNotification(
        self, request: notifications_pb2.GetNotificationRequest, context: Context
    ) -> notifications_pb2.Notification:
        return notification(await self._notifications.get(current_account(), request.notification_id))

    async def DeleteNotification(
        self, request: notifications_pb2.DeleteNotificationRequest, context: Context
    ) -> notifications_pb2.Notification:
        return notification(await self._notifications.delete(current_account(), request.notification_id))

    async def ListNotifications(
        self, request: notifications_pb2.ListNotificationsRequest, context: Context
    ) -> notifications_pb2.ListNotificationsResponse:
        rows = await self._notifications.all(current_account(), job_id=request.job_id or None)
        return notifications_pb2.ListNotificationsResponse(notifications=[notification(r) for r in rows])

    async def SendTestNotification(
        self, request: notifications_pb2.SendTestNotificationRequest, context: Context
    ) -> notifications_pb2.SendTestNotificationResponse:
        event_id = await self._notifications.send_test(current_account(), request.notification_id)
        return notifications_pb2.SendTestNotificationResponse(event_id=event_id)

    async def ListNotificationDeliveries(
        self, request: notifications_pb2.ListNotificationDeliveriesRequest, context: Context
    ) -> notifications_pb2.ListNotificationDeliveriesResponse:
        rows = await self._notifications.deliveries(current_account(), request.notification_id)
        return notifications_pb2.ListNotificationDeliveriesResponse(deliveries=[delivery(r) for r in rows])
