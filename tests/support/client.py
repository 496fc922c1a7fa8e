"""The command-line client (``python -m client``) run as users run it: a process of its own."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from tests.support.processes import finish


async def start(env: dict[str, str], *args: str, json_output: bool = True) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client",
        *(("--json",) if json_output else ()),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_client(env: dict[str, str], *args: str) -> dict[str, Any]:
    code, out, err = await finish(await start(env, *args))
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result
