"""The `runplane` command as a user runs it against the API under test."""

from __future__ import annotations

import asyncio
import os
import sys

from api.process import RunningApi


async def runplane(api: RunningApi, token: str, *args: str) -> tuple[int, str]:
    """``runplane ARGS`` with the account's token, pointed at ``api``'s gRPC port: its exit code and output."""
    env = {
        **os.environ,
        "RUNPLANE_TOKEN": token,
        "RUNPLANE_API__HOST": "127.0.0.1",
        "RUNPLANE_API__PORT": str(api.port),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runplane", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()
