"""hotloop's `--engine upstream --upstream-dialect vllm` against a real vLLM (CPU build,
SmolLM2 in float32; tests/real_vllm.py): the prompt ids vLLM receives (its request log)
are its own `/tokenize` of the same conversation, every continuation gets the full-block
prefix-cache hit of what it already holds (its `/metrics`) and no key hits another's, a
stopped response stops vLLM's request, and its failures reach the client as clear
errors.

One vLLM serves the whole module (it takes about a minute to start); hotloop runs as
`hotloop serve` processes in front of it. Replies are short (greedy, a few tokens).
The test that kills vLLM runs last and restarts it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop.lab.vllm_server import BLOCK_SIZE, VllmServer, metric
from hotloop.native_deps import ensure_chat_templates
from hotloop_process import HotloopProcess
from real_vllm import HANG_GUARD, tokenize, vllm
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.vllm

__all__ = ["vllm"]  # the fixture, imported for this module's tests

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
INSTRUCTIONS = "You are a concise assistant."
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")
RUNNING = "vllm:num_requests_running"
HITS = "vllm:prefix_cache_hits_total"
SAMPLED = "vllm:generation_tokens_total"
# How many tokens vLLM may still sample once a response is stopped: the stop reaches it
# within a few engine steps (0 tokens measured), while the story, left alone, runs to its
# 2,000-token cap (1,999 after the first delta, measured). Counted in vLLM's own tokens,
# not seconds: a loaded machine slows its steps and the stop alike.
SAMPLED_AFTER_STOP = 64
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
# A ten-turn conversation; turn 4 follows a tool call the assistant made (with its text)
# and the tool's output.
QUESTIONS = [
    "What is the capital of France?",
    "Name a river that flows through it.",
    "How long is that river?",
    "And how many people live there?",
    "Name a famous museum there.",
    "What is its most famous painting?",
    "Who painted it?",
    "In which century?",
    "Name another painting by the same artist.",
    "Thank you. Say goodbye in French.",
]
TOOL_TURN = 3
CALL = {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
CALL_OUTPUT = "Sunny, 21 C, 2.1 million inhabitants."


def hotloop(vllm: VllmServer, data_dir: Path, *flags: str) -> HotloopProcess:
    """A started `hotloop serve` in front of `vllm`, its store in `data_dir`."""
    args = [*vllm.hotloop_flags(), "--data-dir", str(data_dir)]
    return HotloopProcess([*args, *flags]).wait_ready()


# The two ways hotloop renders SmolLM2's prompts: its own ChatML (Qwen2.5's tool markup,
# so vLLM is asked to render with Qwen2.5's template) and the model's own template.
CHATML = ("--upstream-format", "chatml", "--upstream-default-system", DEFAULT_SYSTEM)
AUTO = ("--chat-template", "auto")


@pytest.fixture
def node(vllm: VllmServer, tmp_path: Path) -> Iterator[HotloopProcess]:
    # Hotloop's ChatML: tools in Qwen2.5's markup, which SmolLM2 follows from examples.
    process = hotloop(vllm, tmp_path, *CHATML, "--inject")
    try:
        yield process
    finally:
        process.stop()


def create(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "temperature": 0, "max_output_tokens": 12, **fields}


def ws_send(socket: ClientConnection, frame: dict[str, Any]) -> None:
    socket.send(orjson.dumps(frame).decode())


def ws_until(
    socket: ClientConnection, done: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or not done(events[-1]):
        events.append(orjson.loads(socket.recv(HANG_GUARD)))
    return events


def terminal(event: dict[str, Any]) -> bool:
    return event["type"] in TERMINAL


def ws_turn(socket: ClientConnection, **fields: Any) -> dict[str, Any]:
    ws_send(socket, {"type": "response.create", **create(**fields)})
    event = ws_until(socket, terminal)[-1]
    # Incomplete: the reply reached `max_output_tokens`, which the tests keep small.
    assert event["type"] in ("response.completed", "response.incomplete"), event
    response: dict[str, Any] = event["response"]
    return response


def http_turn(node: HotloopProcess, **fields: Any) -> dict[str, Any]:
    reply = httpx.post(f"{node.url}/v1/responses", json=create(**fields), timeout=HANG_GUARD)
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    return response


def text_of(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def wait_stopped(vllm: VllmServer) -> None:
    """Wait until vLLM's running-requests gauge reads 0 (HANG_GUARD only bounds a broken
    run)."""
    deadline = time.monotonic() + HANG_GUARD
    while metric(vllm.url, RUNNING) != 0:
        assert time.monotonic() < deadline, "vLLM kept generating"


def sampled(vllm: VllmServer) -> float:
    """The tokens vLLM has sampled since it started; it sampled some of the story, so the
    counter is read, not a metric missing from its page (which would read 0)."""
    count = metric(vllm.url, SAMPLED)
    assert count > 0, f"vLLM's /metrics has no {SAMPLED}"
    return count


def assert_stopped_early(vllm: VllmServer, at_stop: float) -> None:
    """vLLM's request ended having sampled at most SAMPLED_AFTER_STOP tokens after the
    stop (`at_stop`, `sampled` when the client stopped): it was aborted, not run on."""
    wait_stopped(vllm)
    after = sampled(vllm) - at_stop
    assert after <= SAMPLED_AFTER_STOP, f"vLLM sampled {after:.0f} tokens after the stop"


def test_greedy_canary(vllm: VllmServer, node: HotloopProcess) -> None:
    """A vLLM that serves wrong tokens without an error (bf16 without --enforce-eager
    does) fails here, not as mysterious mismatches elsewhere."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    direct = httpx.post(
        f"{vllm.url}/v1/chat/completions",
        json={"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 12},
        timeout=HANG_GUARD,
    ).json()
    assert direct["choices"][0]["message"]["content"] == "The capital of France is Paris."
    through = http_turn(node, input=messages[0]["content"])
    assert text_of(through) == "The capital of France is Paris."


class Conversation:
    """The chat messages vLLM's `/tokenize` gets for the turns hotloop served."""

    def __init__(self, instructions: str | None) -> None:
        self.messages: list[dict[str, Any]] = (
            [{"role": "system", "content": instructions}] if instructions else []
        )

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def reply(self, response: dict[str, Any]) -> None:
        self.messages.append({"role": "assistant", "content": text_of(response)})

    def tool_call(self) -> None:
        """The assistant's last reply went on with a tool call (one assistant message,
        as a template renders it), and the tool answered."""
        last = self.messages[-1]
        last["tool_calls"] = [
            {
                "id": CALL["call_id"],
                "type": "function",
                "function": {"name": CALL["name"], "arguments": CALL["arguments"]},
            }
        ]
        self.messages.append(
            {"role": "tool", "tool_call_id": CALL["call_id"], "content": CALL_OUTPUT}
        )


def turn_input(index: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if index == TOOL_TURN:
        items += [
            {"type": "function_call", **CALL},
            {"type": "function_call_output", "call_id": CALL["call_id"], "output": CALL_OUTPUT},
        ]
    return [*items, {"type": "message", "role": "user", "content": QUESTIONS[index]}]


@pytest.mark.parametrize("transport", ["ws", "http"])
@pytest.mark.parametrize("render", ["chatml", "auto"])
def test_prompts_are_vllms_own(
    vllm: VllmServer, tmp_path: Path, render: str, transport: str
) -> None:
    """Over ten turns with a tool call and its output, every prompt vLLM receives from
    hotloop is the one vLLM's `/tokenize` computes for the same messages."""
    flags = CHATML if render == "chatml" else AUTO
    # hotloop's ChatML writes tools as Qwen2.5 does; SmolLM2's template has no tool
    # markup, so the ChatML prompts are checked against Qwen2.5's template, with
    # instructions (its default system turn is not SmolLM2's).
    template = None
    instructions = None
    if render == "chatml":
        template = (
            ensure_chat_templates() / "templates/Qwen-Qwen2.5-7B-Instruct.jinja"
        ).read_text()
        instructions = INSTRUCTIONS
    conversation = Conversation(instructions)
    extra = {"instructions": instructions} if instructions else {}
    node = hotloop(vllm, tmp_path, *flags)
    try:
        previous: str | None = None
        with connect(node.ws_url) as socket:
            for index in range(len(QUESTIONS)):
                if index == TOOL_TURN:
                    conversation.tool_call()
                conversation.user(QUESTIONS[index])
                seen = len(vllm.prompt_ids())
                fields: dict[str, Any] = {"input": turn_input(index), **extra}
                if previous is not None:
                    fields["previous_response_id"] = previous
                if transport == "ws":
                    response = ws_turn(socket, **fields)
                else:
                    response = http_turn(node, **fields)
                sent = vllm.wait_prompts(seen + 1)[-1]
                assert sent == tokenize(vllm, conversation.messages, template), index
                conversation.reply(response)
                previous = response["id"]
    finally:
        node.stop()


def expected_hit(previous: dict[str, Any]) -> int:
    """What vLLM serves from its prefix cache for a continuation of `previous`: every
    full block of its prompt and reply but the reply's last id (sampled, never fed
    back to the model)."""
    usage = previous["usage"]
    held = usage["input_tokens"] + usage["output_tokens"] - 1
    return held // BLOCK_SIZE * BLOCK_SIZE


def assert_full_hit(previous: dict[str, Any], response: dict[str, Any], hits: int) -> None:
    """The continuation `response` of `previous` got the whole hit (`hits`: vLLM's
    `/metrics` delta), and its usage carries vLLM's own per-request figure, the same."""
    assert hits == expected_hit(previous)
    assert response["usage"]["input_tokens_details"]["engine_cached_tokens"] == hits


def hits_of(vllm: VllmServer, turn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], int]:
    before = metric(vllm.url, HITS)
    response = turn()
    return response, int(metric(vllm.url, HITS) - before)


def test_every_continuation_hits_what_vllm_holds(vllm: VllmServer, tmp_path: Path) -> None:
    """On one node over WebSocket, on another node sharing the store (rebuilt from it),
    and on a restarted node, each continuation's prompt starts with the previous prompt
    and reply, so vLLM serves all their full blocks from its cache."""
    instructions = "You answer questions about geography in one sentence."
    a = hotloop(vllm, tmp_path, *AUTO)
    b = hotloop(vllm, tmp_path, *AUTO)
    try:
        with connect(a.ws_url) as socket:
            previous = ws_turn(socket, input="Name a country in Africa.", instructions=instructions)
            for question in ("Name its capital.", "Name a river there."):
                response, hits = hits_of(
                    vllm,
                    lambda q=question, p=previous: ws_turn(
                        socket, input=q, previous_response_id=p["id"], instructions=instructions
                    ),
                )
                assert_full_hit(previous, response, hits)
                previous = response
        response, hits = hits_of(
            vllm,
            lambda: http_turn(
                b,
                input="Name a mountain there.",
                previous_response_id=previous["id"],
                instructions=instructions,
            ),
        )
        assert_full_hit(previous, response, hits)
        previous = response
        a.stop()
        a = hotloop(vllm, tmp_path, *AUTO)
        with connect(a.ws_url) as socket:
            response, hits = hits_of(
                vllm,
                lambda: ws_turn(
                    socket,
                    input="Name a city there.",
                    previous_response_id=previous["id"],
                    instructions=instructions,
                ),
            )
        assert_full_hit(previous, response, hits)
    finally:
        a.stop()
        b.stop()


def test_no_key_hits_another_keys_prefix_in_vllm(vllm: VllmServer, tmp_path: Path) -> None:
    """Two API keys send the same instructions: each request carries its key's
    `cache_salt`, so vLLM serves key b nothing of key a's prompt (its `/metrics` and
    b's usage say 0), while a's repeat hits every full block of it: the salt is sent,
    and vLLM keeps the keys apart by it."""
    node = hotloop(vllm, tmp_path, *AUTO, "--api-keys", "a:sk-a,b:sk-b")
    instructions = " ".join(f"Rule {n}: answer in one short sentence." for n in range(24))

    def turn(key: str) -> dict[str, Any]:
        fields = create(input="Hello.", instructions=instructions, max_output_tokens=1)
        headers = {"authorization": f"Bearer {key}"}
        reply = httpx.post(
            f"{node.url}/v1/responses", json=fields, headers=headers, timeout=HANG_GUARD
        )
        assert reply.status_code == 200, reply.text
        response: dict[str, Any] = reply.json()
        return response

    try:
        first = turn("sk-a")
        other, hits = hits_of(vllm, lambda: turn("sk-b"))
        assert hits == 0
        assert other["usage"]["input_tokens_details"]["engine_cached_tokens"] == 0
        again, hits = hits_of(vllm, lambda: turn("sk-a"))
        assert hits == (first["usage"]["input_tokens"] - 1) // BLOCK_SIZE * BLOCK_SIZE > 0
        assert again["usage"]["input_tokens_details"]["engine_cached_tokens"] == hits
    finally:
        node.stop()


STORY = "Write a very long story about a dragon who learns to cook."


def start_story(socket: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """A long response, running: its events up to its first text delta."""
    fields = {"input": STORY, "max_output_tokens": 2000, **fields}
    ws_send(socket, {"type": "response.create", **create(**fields)})
    return ws_until(socket, lambda e: e["type"] == "response.output_text.delta")


def test_response_cancel_stops_vllms_request(vllm: VllmServer, node: HotloopProcess) -> None:
    with connect(node.ws_url) as socket:
        start_story(socket)
        at_stop = sampled(vllm)
        ws_send(socket, {"type": "response.cancel"})
        ended = ws_until(socket, terminal)[-1]
        assert ended["response"]["status"] == "cancelled", ended
        assert_stopped_early(vllm, at_stop)


def test_a_websocket_client_leaving_mid_stream_stops_vllms_request(
    vllm: VllmServer, node: HotloopProcess
) -> None:
    with connect(node.ws_url) as socket:
        start_story(socket)
        at_stop = sampled(vllm)
    assert_stopped_early(vllm, at_stop)


def test_an_http_client_leaving_mid_stream_stops_vllms_request(
    vllm: VllmServer, node: HotloopProcess
) -> None:
    body = create(input=STORY, max_output_tokens=2000, stream=True)
    with httpx.stream("POST", f"{node.url}/v1/responses", json=body, timeout=HANG_GUARD) as reply:
        for line in reply.iter_lines():
            if "response.output_text.delta" in line:
                break
        at_stop = sampled(vllm)
    assert_stopped_early(vllm, at_stop)


def test_a_steered_response_leaves_nothing_running(vllm: VllmServer, node: HotloopProcess) -> None:
    """SmolLM2's turns are one item, so the steer boundary is the end of its text (or
    of `max_output_tokens`); the successor continues from the target's sampled ids plus
    the steering input, vLLM serves the target's prompt and reply from its cache, and
    once the successor ends nothing runs."""
    with connect(node.ws_url) as socket:
        events = start_story(socket, max_output_tokens=40)
        target = events[0]["response"]["id"]
        seen = len(vllm.prompt_ids())
        ws_send(
            socket,
            {"type": "response.steer", "previous_response_id": target, "input": "Make it short."},
        )
        events = ws_until(socket, terminal)
        assert any(e["type"] == "response.steer.accepted" for e in events)
        first = events[-1]["response"]
        assert first["id"] == target and first["status"] in ("completed", "incomplete")
        events = ws_until(socket, terminal)
        successor = events[-1]["response"]
        assert successor["previous_response_id"] == target
        assert successor["status"] in ("completed", "incomplete"), successor
        prompts = vllm.wait_prompts(seen + 1)
        target_prompt, successor_prompt = prompts[seen - 1], prompts[seen]
        assert successor_prompt[: len(target_prompt)] == target_prompt
        wait_stopped(vllm)


WEATHER = {
    "London": ("rainy", "8 C"),
    "Berlin": ("cloudy", "15 C"),
    "Rome": ("sunny", "24 C"),
    "Madrid": ("hot", "31 C"),
    "Oslo": ("snowy", "-3 C"),
}


def few_shot_weather() -> list[dict[str, Any]]:
    """A history that makes greedy SmolLM2 call `get_weather` for the last question
    (it calls no tool when only told to). Five calls with five different answers: with
    three alike, float32 wrote a `<tool_response>` of its own instead of the call (bf16
    called); with these both call (by hand, 2026-12-04)."""
    items: list[dict[str, Any]] = []
    for i, (city, (sky, temperature)) in enumerate(WEATHER.items()):
        call_id = f"call_{i}"
        items += [
            {"type": "message", "role": "user", "content": f"What is the weather in {city}?"},
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "get_weather",
                "arguments": json.dumps({"city": city}),
            },
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": f"{sky.capitalize()}, {temperature}",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": f"It is {sky} and {temperature} in {city}.",
            },
        ]
    return [*items, {"type": "message", "role": "user", "content": "What is the weather in Paris?"}]


def test_a_long_running_response_resumes_with_injected_tool_output(
    vllm: VllmServer, node: HotloopProcess
) -> None:
    """The response waits open for the call's output; the injection resumes it in the
    same response, and the resumed prompt is the first one extended (vLLM's cache
    serves the first prompt's full blocks)."""
    with connect(node.ws_url) as socket:
        seen = len(vllm.prompt_ids())
        ws_send(
            socket,
            {
                "type": "response.create",
                **create(input=few_shot_weather(), tools=TOOLS, max_output_tokens=60),
            },
        )
        events = ws_until(
            socket,
            lambda e: e["type"] == "response.output_item.done" or terminal(e),
        )
        call = events[-1]["item"]
        assert call["type"] == "function_call" and call["name"] == "get_weather", events[-1]
        response_id = events[0]["response"]["id"]
        before = metric(vllm.url, HITS)
        output = {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": "Rainy, 12 C",
        }
        ws_send(socket, {"type": "response.inject", "response_id": response_id, "input": [output]})
        events = ws_until(socket, terminal)
        assert any(e["type"] == "response.inject.created" for e in events)
        done = events[-1]["response"]
        assert done["status"] == "completed", done
        assert [item["type"] for item in done["output"]] == ["function_call", "message"]
        first, resumed = vllm.wait_prompts(seen + 2)[seen : seen + 2]
        assert resumed[: len(first)] == first
        assert metric(vllm.url, HITS) - before >= len(first) // BLOCK_SIZE * BLOCK_SIZE
        wait_stopped(vllm)


def test_over_the_context_window_fails_before_any_engine_call(
    vllm: VllmServer, node: HotloopProcess
) -> None:
    seen = len(vllm.prompt_ids())
    reply = httpx.post(
        f"{node.url}/v1/responses",
        json=create(input="word " * vllm.max_model_len),
        timeout=HANG_GUARD,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    with connect(node.ws_url) as socket:
        ws_send(socket, {"type": "response.create", **create(input="word " * vllm.max_model_len)})
        event = ws_until(socket, terminal)[-1]
    assert event["type"] == "error" and event["error"]["code"] == "context_length_exceeded", event
    # A request that does reach vLLM is logged: the probe's is the only one.
    http_turn(node, input="Say yes.")
    assert len(vllm.wait_prompts(seen + 1)) == seen + 1


def test_vllms_own_refusal_is_a_clear_error(vllm: VllmServer, tmp_path: Path) -> None:
    """A hotloop configured with a larger context window than vLLM's passes a
    `max_output_tokens` that vLLM refuses with a 400: the client gets vLLM's reason at
    once, over HTTP and WebSocket."""
    node = hotloop(vllm, tmp_path, *AUTO, "--upstream-context-window", str(2 * vllm.max_model_len))
    try:
        too_many = vllm.max_model_len + 1
        reply = httpx.post(
            f"{node.url}/v1/responses",
            json=create(input="Hi", max_output_tokens=too_many),
            timeout=HANG_GUARD,
        )
        error = reply.json()["error"]
        assert "upstream_rejected" in error["message"] and "max_tokens" in error["message"]
        with connect(node.ws_url) as socket:
            ws_send(
                socket,
                {"type": "response.create", **create(input="Hi", max_output_tokens=too_many)},
            )
            event = ws_until(socket, terminal)[-1]
        assert event["type"] == "response.failed", event
        assert "max_tokens" in event["response"]["error"]["message"]
    finally:
        node.stop()


def test_vllm_killed_mid_stream_fails_the_response_and_the_next_turn_is_exact(
    vllm: VllmServer, node: HotloopProcess
) -> None:
    """Runs last: it restarts vLLM. The killed response ends `response.failed` saying
    the engine went away; after vLLM is back the conversation continues with exactly
    the prompt vLLM computes (its prefix cache is cold, the ids are the same)."""
    conversation = Conversation(None)
    conversation.user(QUESTIONS[0])
    with connect(node.ws_url) as socket:
        first = ws_turn(socket, input=QUESTIONS[0])
        conversation.reply(first)
        start_story(socket, previous_response_id=first["id"])
        vllm.kill()
        ended = ws_until(socket, terminal)[-1]
        assert ended["type"] == "response.failed", ended
        assert "went away" in ended["response"]["error"]["message"], ended
        vllm.start()
        seen = len(vllm.prompt_ids())
        conversation.user(QUESTIONS[1])
        ws_turn(socket, input=QUESTIONS[1], previous_response_id=first["id"])
        sent = vllm.wait_prompts(seen + 1)[-1]
        assert sent == tokenize(vllm, conversation.messages)


def test_a_prewarm_fills_vllms_prefix_cache(vllm: VllmServer, node: HotloopProcess) -> None:
    """`prompt_cache_options.prewarm`: vLLM is asked for one id (it refuses
    `max_tokens` 0), which hotloop discards; the response is empty, and the turn that
    continues it hits every full block of the prewarmed prompt but the assistant
    header that ended it (a turn's header follows its own input)."""
    history = "Remember these notes: " + " ".join(f"note-{n}" for n in range(80))
    warm = http_turn(node, input=history, prompt_cache_options={"prewarm": True})
    assert warm["status"] == "completed" and warm["output"] == []
    assert warm["usage"]["output_tokens"] == 0
    held = warm["usage"]["input_tokens"]
    response, hits = hits_of(
        vllm,
        lambda: http_turn(node, input="Which note came first?", previous_response_id=warm["id"]),
    )
    assert (held - 3) // BLOCK_SIZE * BLOCK_SIZE <= hits <= held // BLOCK_SIZE * BLOCK_SIZE
    assert hits > 0
    assert response["usage"]["input_tokens_details"]["engine_cached_tokens"] == hits
