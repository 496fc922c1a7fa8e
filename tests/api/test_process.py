"""The API process is supervised like every service: a side task that ends on its own stops it."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI

from api import process
from api.rest.server import RestServer, bind_rest
from runplane.basics.settings import ApiSettings, Settings
from runplane.basics.supervise import TaskEnded
from tests.support.polling import eventually


async def test_the_rest_server_ending_on_its_own_stops_the_process(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound: list[RestServer] = []

    def bind_and_keep(app: FastAPI, api: ApiSettings, port: int) -> RestServer:
        bound.append(bind_rest(app, api, port))
        return bound[-1]

    monkeypatch.setattr(process, "bind_rest", bind_and_keep)
    stop = asyncio.Event()
    serving = asyncio.create_task(process.serve(settings, stop), name="api")
    await eventually(lambda: bool(bound) and bound[0].server.started, 15, what="the REST server listening")
    bound[0].server.should_exit = True  # uvicorn returns as if it had given up on its own
    with pytest.raises(BaseExceptionGroup) as caught:
        await asyncio.wait_for(serving, 15)
    assert caught.group_contains(TaskEnded)
    assert not stop.is_set()
