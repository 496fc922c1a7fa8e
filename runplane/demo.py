"""The demo that ``make run`` shows: an account, a token and a few jobs (made by ``api.admin``)."""

from __future__ import annotations

import asyncio

from runplane.settings import Settings

DEMO_ACCOUNT = "demo"


def seed_demo(settings: Settings) -> list[str]:
    """Create the demo account (once), a fresh token and the demo jobs; returns what to print."""
    from api.admin import seed_demo as seed

    account_id, token, job_ids = asyncio.run(seed(settings, DEMO_ACCOUNT))
    address = f"{settings.api.host}:{settings.api.port}"
    return [
        "",
        f"demo account {account_id}, jobs {job_ids}",
        f"demo token: {token}",
        "",
        "try (with grpcurl, or any gRPC client using server reflection):",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' {address} list",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' -d '{{\"job_id\": {job_ids[0]}}}' "
        f"{address} runplane.v1.RunService/TriggerRun",
        f"  grpcurl -plaintext -H 'authorization: Bearer {token}' -d '{{\"run_id\": 1}}' "
        f"{address} runplane.v1.RunService/GetRun",
        "or the bundled client:",
        f"  RUNPLANE_TOKEN={token} .venv/bin/python -m api.client trigger {job_ids[0]} --follow",
        "",
        "Ctrl-C stops everything.",
    ]
