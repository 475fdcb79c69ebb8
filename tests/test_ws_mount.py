"""hotloop mounted inside an existing Starlette application (as in the README): the
host owns the routes and the lifespan, hotloop serves WebSocket mode under its mount."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from hotloop.config import ServerConfig
from hotloop.transport import App
from sdk_events import validate
from servers import serving, sim_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from websockets.sync.client import connect


def test_mounted_under_a_starlette_app() -> None:
    hotloop = App(sim_engine(), ServerConfig(engine="sim"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hotloop.start()
        yield
        await hotloop.close()

    async def home(request: Request) -> JSONResponse:
        return JSONResponse({"app": "host"})

    host = Starlette(routes=[Route("/", home), Mount("/llm", app=hotloop)], lifespan=lifespan)
    # Served the way a host application runs it: plain uvicorn, no hotloop extension.
    with serving(host, ws="websockets-sansio") as base:
        with connect(base.replace("http://", "ws://") + "/llm/v1/responses") as ws:
            ws.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"}).decode()
            )
            while (event := validate(ws.recv()))["type"] != "response.completed":
                assert event["type"] != "error", event
