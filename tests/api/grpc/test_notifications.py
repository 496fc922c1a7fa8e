"""NotificationService: the same notifications as REST and the pages, by the same rules; secrets are
write-only; a test message is queued on the outbox and shows in the delivery log."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from api.admin import create_account
from api.process import RunningApi
from client.cli import channel
from runplane.basics.settings import Settings
from runplane.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, notifications_pb2, notifications_pb2_grpc
from tests.api.conftest import status_of


class Account:
    def __init__(self, chan: grpc.aio.Channel) -> None:
        self.notifications = notifications_pb2_grpc.NotificationServiceStub(chan)
        self.jobs = jobs_pb2_grpc.JobServiceStub(chan)


@pytest.fixture
async def account(api: RunningApi, settings: Settings) -> AsyncIterator[Account]:
    _, token = await create_account(settings, name="acme", run_slots=2, memory_mb=1024)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Account(chan)


@pytest.fixture
async def stranger(api: RunningApi, settings: Settings) -> AsyncIterator[Account]:
    _, token = await create_account(settings, name="globex", run_slots=1, memory_mb=512)
    async with channel(f"127.0.0.1:{api.port}", token) as chan:
        yield Account(chan)


async def test_notifications_over_grpc(account: Account, stranger: Account) -> None:
    job = await account.jobs.CreateJob(
        jobs_pb2.CreateJobRequest(name="nightly", job_type=common_pb2.JOB_TYPE_DEPLOY, steps=["echo hi"])
    )
    spec = notifications_pb2.NotificationSpec(
        type=notifications_pb2.NOTIFICATION_TYPE_SLACK,
        slack_bot_token="xoxb-grpc-secret",
        slack_channel_id="C9",
        on_failure=[job.id],
        on_warning=[job.id],
    )
    made = await account.notifications.CreateNotification(
        notifications_pb2.CreateNotificationRequest(notification=spec)
    )
    assert made.secret_set == "slack_bot_token" and "xoxb-grpc-secret" not in str(made)
    assert list(made.on_failure) == [job.id] and list(made.on_warning) == [job.id]
    listed = await account.notifications.ListNotifications(notifications_pb2.ListNotificationsRequest(job_id=job.id))
    assert [n.id for n in listed.notifications] == [made.id]
    code, _ = await status_of(
        stranger.notifications.GetNotification(notifications_pb2.GetNotificationRequest(notification_id=made.id))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = await status_of(
        account.notifications.CreateNotification(
            notifications_pb2.CreateNotificationRequest(
                notification=notifications_pb2.NotificationSpec(
                    type=notifications_pb2.NOTIFICATION_TYPE_EXTERNAL_EMAIL, external_email="nope"
                )
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "external_email" in details
    sent = await account.notifications.SendTestNotification(
        notifications_pb2.SendTestNotificationRequest(notification_id=made.id)
    )
    log = await account.notifications.ListNotificationDeliveries(
        notifications_pb2.ListNotificationDeliveriesRequest(notification_id=made.id)
    )
    assert [(d.event_id, d.status, d.run_id) for d in log.deliveries] == [(sent.event_id, "pending", 0)]
    gone = await account.notifications.DeleteNotification(
        notifications_pb2.DeleteNotificationRequest(notification_id=made.id)
    )
    assert gone.deleted
