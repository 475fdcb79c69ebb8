"""`usage.input_tokens_details.engine_cached_tokens`: the prompt ids the engine said it
served from its own KV cache, beside hotloop's own `cached_tokens`, over WebSocket and
HTTP, against the in-test vLLM (its usage chunk, with and without the details), and
absent where the engine says nothing (the sim engine)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from fake_upstreams import FakeUpstream, Script, serving
from hotloop._core import ChatFormat
from hotloop.chat_template import load_tokenizer
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine
from hotloop.events import Usage
from hotloop.native_deps import smollm2_gguf_path
from hotloop.transport import App
from servers import Validating
from servers import serving as serving_hotloop
from websockets.sync.client import connect

HANG_GUARD = 60.0  # seconds; only bounds a broken run
REQUEST = {"model": "smollm2", "input": "Hi", "store": False}


@pytest.fixture(scope="module")
def chatml() -> ChatFormat:
    return ChatFormat.chatml(load_tokenizer(str(smollm2_gguf_path())))


def turns(url: str) -> list[dict[str, Any]]:
    """The usage of one response over WebSocket and one over HTTP, with other input (the
    same input would continue the WebSocket's rendered conversation, issue 38: hotloop's
    own figure would then count what it had cached)."""
    with connect(url.replace("http", "ws", 1) + "/v1/responses") as socket:
        socket.send(orjson.dumps({"type": "response.create", **REQUEST}).decode())
        while (event := orjson.loads(socket.recv(HANG_GUARD)))["type"] != "response.completed":
            assert event["type"] not in ("response.failed", "error"), event
    other = {**REQUEST, "input": "Hello"}
    over_http = httpx.post(url + "/v1/responses", json=other, timeout=HANG_GUARD).json()
    return [event["response"]["usage"], over_http["usage"]]


@pytest.mark.parametrize(("cached", "details"), [(64, {"engine_cached_tokens": 64}), (None, {})])
async def test_the_engines_figure_rides_beside_hotloops_own(
    chatml: ChatFormat, cached: int | None, details: dict[str, int]
) -> None:
    format_ = chatml
    reply = [*format_.tokenizer.encode("Hello."), *format_.stop_tokens[:1]]
    upstream = FakeUpstream("vllm", Script(reply=reply, cached_tokens=cached))
    async with serving(upstream):
        config = UpstreamConfig(
            dialect="vllm", replicas=(upstream.url,), model="smollm2", context_window=4096
        )
        engine = UpstreamEngine(config, format_)
        app = Validating(App.from_config(ServerConfig(engine="upstream", data_dir=""), engine))
        with serving_hotloop(app) as url:
            usages = await asyncio.to_thread(turns, url)
    assert app.invalid == []
    for usage in usages:
        assert usage["input_tokens_details"] == {
            "cached_tokens": 0,
            "cache_write_tokens": usage["input_tokens"],
            **details,
        }


def test_an_engine_that_says_nothing_reports_nothing(chatml: ChatFormat) -> None:
    engine = SimEngine(chatml, model="smollm2")
    app = App.from_config(ServerConfig(engine="sim", data_dir=""), engine)
    with serving_hotloop(app) as url:
        usages = turns(url)
    for usage in usages:
        assert "engine_cached_tokens" not in usage["input_tokens_details"]


def test_engine_passes_add_up_where_known() -> None:
    """A response's passes (a summary and the turn, a long-running response's model
    turns) add their figures; a pass that said nothing adds nothing, and none saying
    anything leaves the field out."""
    said, silent = Usage(engine_cached_tokens=64), Usage()
    assert (said + Usage(engine_cached_tokens=32)).engine_cached_tokens == 96
    assert (said + silent).engine_cached_tokens == (silent + said).engine_cached_tokens == 64
    assert "engine_cached_tokens" not in (silent + silent).as_dict()["input_tokens_details"]


INSTRUCTIONS = " ".join(f"Rule {n}: answer question {n} in one line." for n in range(60))


def engine_cached(url: str, key: str, transport: str) -> int:
    """The engine's figure for one request of `key` with the long instructions."""
    request = {**REQUEST, "instructions": INSTRUCTIONS}
    headers = {"authorization": f"Bearer {key}"}
    if transport == "ws":
        ws_url = url.replace("http", "ws", 1) + "/v1/responses"
        with connect(ws_url, additional_headers=headers) as socket:
            socket.send(orjson.dumps({"type": "response.create", **request}).decode())
            while (event := orjson.loads(socket.recv(HANG_GUARD)))["type"] != "response.completed":
                assert event["type"] not in ("response.failed", "error"), event
        usage = event["response"]["usage"]
    else:
        reply = httpx.post(url + "/v1/responses", json=request, headers=headers, timeout=HANG_GUARD)
        usage = reply.json()["usage"]
    cached: int = usage["input_tokens_details"]["engine_cached_tokens"]
    return cached


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize(("scope", "shared"), [("key", False), ("shared", True)])
async def test_no_key_is_served_or_told_another_keys_prefix(
    chatml: ChatFormat, dialect: str, scope: str, shared: bool
) -> None:
    """Key a sends long instructions, then keys b (HTTP) and c (WebSocket) the same: each
    key's requests carry its own salt, so the engine (partitioning its prefix cache by
    it, as vLLM and SGLang do) serves them nothing of a's, and their usage says 0; a's
    own repeat hits. With `--engine-cache-scope shared` no salt goes out and every key
    hits what any other sent, as before the scopes."""
    reply = [*chatml.tokenizer.encode("Hello."), *chatml.stop_tokens[:1]]
    upstream = FakeUpstream(dialect, Script(reply=reply, prefix_cache=True))
    async with serving(upstream):
        config = UpstreamConfig(
            dialect=dialect, replicas=(upstream.url,), model="smollm2", context_window=4096
        )
        engine = UpstreamEngine(config, chatml)
        server = ServerConfig(
            engine="upstream",
            data_dir="",
            api_keys=("a:sk-a", "b:sk-b", "c:sk-c"),
            engine_cache_scope=scope,
        )
        app = Validating(App.from_config(server, engine))
        with serving_hotloop(app) as url:
            first = await asyncio.to_thread(engine_cached, url, "sk-a", "http")
            others = [
                await asyncio.to_thread(engine_cached, url, key, transport)
                for key, transport in (("sk-b", "http"), ("sk-c", "ws"))
            ]
            again = await asyncio.to_thread(engine_cached, url, "sk-a", "ws")
    assert app.invalid == []
    assert first == 0 and again > 0
    if shared:
        assert min(others) > 0
    else:
        assert others == [0, 0]
    salt = "cache_salt" if dialect == "vllm" else "extra_key"
    salts = [request.get(salt) for request in upstream.requests]
    if shared:
        assert salts == [None] * 4
    else:
        assert salts[0] == salts[3] and len(set(salts[:3])) == 3
        assert not any(key in str(salts) for key in ("sk-a", "sk-b", "sk-c"))
