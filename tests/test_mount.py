"""hotloop mounted inside a FastAPI application exactly as the README shows it: the
host owns its routes and the lifespan, and every route of `hotloop serve` (HTTP, SSE,
Chat Completions, WebSocket mode, health, metrics) answers under the mount."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sdk_events import validate
from servers import serving
from websockets.sync.client import connect

README = Path(__file__).parent.parent / "README.md"
HEADING = "**As an ASGI app inside your API server.**"


def readme_example() -> dict[str, Any]:
    """The README's example run as written: the names it defines."""
    text = README.read_text()
    example = re.search(r"```python\n(.*?)```", text[text.index(HEADING) :], re.S)
    assert example is not None
    names: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(example.group(1), "README.md", "exec"), names)
    return names


def test_the_readme_mount_serves_the_whole_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the example's store goes in the working directory
    names = readme_example()
    api = names["api"]

    @api.get("/")
    async def home() -> dict[str, str]:
        return {"app": "host"}

    # Served the way a host application runs it: plain uvicorn, no hotloop extension.
    with serving(api, ws="websockets-sansio") as base:
        llm = base + "/llm"
        with httpx.Client(timeout=60) as http:
            assert http.get(base + "/").json() == {"app": "host"}
            health = http.get(llm + "/health")
            assert (health.status_code, health.json()["status"]) == (200, "ok")
            models = http.get(llm + "/v1/models").json()
            assert [m["id"] for m in models["data"]] == ["sim"]
            created = http.post(llm + "/v1/responses", json={"model": "sim", "input": "hi"})
            assert created.status_code == 200, created.text
            response = created.json()
            assert response["status"] == "completed"
            stored = http.get(f"{llm}/v1/responses/{response['id']}")
            assert stored.json()["id"] == response["id"]
            body = {"model": "sim", "input": "hi", "stream": True}
            with http.stream("POST", llm + "/v1/responses", json=body) as stream:
                events = [line for line in stream.iter_lines() if line.startswith("event: ")]
            assert events[-1] == "event: response.completed"
            chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
            completion = http.post(llm + "/v1/chat/completions", json=chat)
            assert completion.json()["object"] == "chat.completion", completion.text
            conversation = http.post(llm + "/v1/conversations", json={})
            assert conversation.json()["object"] == "conversation"
            assert "hotloop_turns_total" in http.get(llm + "/metrics").text
        with connect(base.replace("http://", "ws://") + "/llm/v1/responses") as ws:
            ws.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"}).decode()
            )
            while (event := validate(ws.recv()))["type"] != "response.completed":
                assert event["type"] != "error", event
