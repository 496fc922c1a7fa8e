"""The client's webhook commands, over the REST API (webhooks have no gRPC calls)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from client.address import rest_url


def add_webhook_commands(sub: Any) -> None:
    create = sub.add_parser("webhook-create", help="subscribe a URL to run events")
    create.add_argument("--account", type=int, required=True)
    create.add_argument("--name", required=True)
    create.add_argument("--url", required=True)
    create.add_argument(
        "--event", action="append", required=True, help="job.run.started, .completed or .errored; repeat for several"
    )
    create.add_argument("--job", type=int, action="append", default=[], help="only these jobs; repeat")
    for name, text in (("webhook-list", "list webhook subscriptions"),):
        sub.add_parser(name, help=text).add_argument("--account", type=int, required=True)
    for name, text in (
        ("webhook-delete", "delete a webhook subscription"),
        ("webhook-deliveries", "a subscription's delivery log: events and every attempt"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--account", type=int, required=True)
        command.add_argument("webhook_id")


def run_webhook_command(args: argparse.Namespace, token: str) -> int:
    base = f"/api/v3/accounts/{args.account}/webhooks"
    with httpx.Client(base_url=rest_url(), headers={"Authorization": f"Token {token}"}, timeout=30) as http:
        match args.command:
            case "webhook-create":
                body = {"name": args.name, "client_url": args.url, "event_types": args.event, "job_ids": args.job}
                response = http.post(f"{base}/subscriptions/", json=body)
            case "webhook-list":
                response = http.get(f"{base}/subscriptions/")
            case "webhook-delete":
                response = http.delete(f"{base}/subscription/{args.webhook_id}/")
            case _:
                response = http.get(f"{base}/subscription/{args.webhook_id}/deliveries/")
    body = response.json()
    if not body["status"]["is_success"]:
        print(f"{body['status']['code']}: {body['status']['user_message']}", file=sys.stderr)
        return 1
    data = body["data"]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for item in data if isinstance(data, list) else [data]:
        if "client_url" in item:
            secret = f"\tsecret {item['hmac_secret']}" if item.get("hmac_secret") else ""
            print(f"{item['id']}\t{item['name']}\t{item['client_url']}\t{','.join(item['event_types'])}{secret}")
        elif "event_id" in item:
            state = "delivered" if item["delivered_at"] else ("abandoned" if item["abandoned_at"] else "pending")
            print(
                f"{item['event_id']}\t{item['event_type']}\trun {item['run_id']}\t{state}\t{item['attempts']} attempts"
            )
        else:
            print(f"deleted {item['id']}")
    return 0
