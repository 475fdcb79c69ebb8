"""Attacks on the connection layer by one tenant, against a real server (uvicorn in a
thread, sim engine, SQLite store), asserting what the other tenant still gets.

Issue 21 defect 9: continuing a stored chain on a new socket rebuilds it from the store;
the rebuild ran on the event loop (0.17 s of loop time for a million tokens), so a tenant
continuing a long chain from new sockets over and over stalled every other tenant. The
attack here holds a rebuild in its middle and has the victim run a whole turn meanwhile:
only a rebuild off the loop lets that turn through. Deterministic: nothing is timed (the
guards only bound a broken run)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.store import Chain
from hotloop.transport import App
from servers import serving, sim_engine
from websockets.sync.client import connect

pytestmark = pytest.mark.abuse

ATTACKER, VICTIM = "sk-a", "sk-b"
GUARD = 30.0


def turn(base: str, key: str, **fields: Any) -> dict[str, Any]:
    """One WebSocket turn on a new socket; its terminal event (or error)."""
    url = base.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode())
        while True:
            event: dict[str, Any] = orjson.loads(ws.recv(GUARD))
            if event["type"] in ("response.completed", "response.failed", "error"):
                return event


def test_a_stored_chain_is_rebuilt_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ServerConfig(engine="sim", api_keys=(ATTACKER, VICTIM), data_dir=str(tmp_path))
    rebuilding = threading.Event()
    victim_served = threading.Event()
    on_loop: list[bool] = []
    replay: Callable[..., None] = Chain.replay

    def held(chain: Chain, *args: Any) -> None:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        rebuilding.set()
        # The attacker's rebuild stays in its middle until the victim's turn is done.
        victim_served.wait(GUARD)
        replay(chain, *args)

    with serving(App.from_config(settings, sim_engine())) as base:
        stored = httpx.post(
            base + "/v1/responses",
            json={"model": "sim", "input": "a long history", "store": True},
            headers={"authorization": f"Bearer {ATTACKER}"},
        ).json()
        monkeypatch.setattr(Chain, "replay", held)
        attack: dict[str, Any] = {}
        attacker = threading.Thread(
            target=lambda: attack.update(
                turn(base, ATTACKER, input="go on", previous_response_id=stored["id"])
            )
        )
        attacker.start()
        try:
            assert rebuilding.wait(GUARD)
            victim = turn(base, VICTIM, input="hello")
        finally:
            victim_served.set()
            attacker.join()
    assert victim["type"] == "response.completed"
    assert on_loop == [False]
    assert attack["type"] == "response.completed", attack
    assert attack["response"]["previous_response_id"] == stored["id"]


def test_a_compaction_item_opens_for_its_own_key_only(tmp_path: Path) -> None:
    """Issue 21: key B sent key A's compaction item and read A's summary back through
    `input_items`. Refused now, over HTTP and WebSocket; A still continues from it."""
    settings = ServerConfig(engine="sim", api_keys=(ATTACKER, VICTIM), data_dir=str(tmp_path))
    conversation = [{"role": "user", "content": "The launch code word is slate."}]
    with serving(App.from_config(settings, sim_engine())) as base:

        def post(key: str, path: str, body: dict[str, Any]) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return httpx.post(base + path, json={"model": "sim", **body}, headers=headers)

        compacted = post(VICTIM, "/v1/responses/compact", {"model": "sim", "input": conversation})
        (item,) = compacted.json()["output"]
        stolen = post(ATTACKER, "/v1/responses", {"model": "sim", "input": [item], "store": True})
        assert stolen.status_code == 400
        assert stolen.json()["error"]["code"] == "invalid_encrypted_content"
        refused = turn(base, ATTACKER, input=[item])
        assert refused["error"]["code"] == "invalid_encrypted_content"
        assert post(VICTIM, "/v1/responses", {"model": "sim", "input": [item]}).status_code == 200
        assert turn(base, VICTIM, input=[item])["type"] == "response.completed"


def test_frames_nested_too_deep_keep_the_socket(tmp_path: Path) -> None:
    """Issue 21 minor: a steer, interrupt or inject frame with an unknown field nested
    past the decoder's 1,024 levels dropped the socket (1006, every lane lost)."""
    settings = ServerConfig(engine="sim", api_keys=(ATTACKER,), inject=True)
    deep = "[" * 1100 + "]" * 1100
    with serving(App.from_config(settings, sim_engine())) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url, additional_headers={"authorization": f"Bearer {ATTACKER}"}) as ws:
            for kind in ("response.steer", "response.interrupt", "response.inject"):
                ws.send(f'{{"type":"{kind}","response_id":"resp_x","zz":{deep}}}')
                refused = orjson.loads(ws.recv(GUARD))
                assert refused["error"]["code"] == "invalid_json", refused
            ws.send('{"type":"response.create","model":"sim","input":"hi"}')
            while (event := orjson.loads(ws.recv(GUARD)))["type"] != "response.completed":
                assert event["type"] != "error", event
