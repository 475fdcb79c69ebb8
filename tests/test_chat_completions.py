"""`POST /v1/chat/completions`, spoken by the real openai SDK (`chat.completions`, sync,
async and streaming) against a real server (uvicorn, the sim engine in harmony): a tool
loop that resends its whole history every turn and gets the cache for it, reasoning in
`reasoning_content`, usage with `prompt_tokens_details.cached_tokens`, and the refusals
and error envelopes it shares with `/v1/responses`. Every reply is validated strictly
with the SDK's pydantic models."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimTurn
from hotloop.transport import App
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from servers import serving, sim_engine

KEY = "sk-chat"
SYSTEM = "You are a coding agent. Use the tools."
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List the files of a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
SCRIPT = SimScript(
    turns=(
        SimTurn(reasoning="I should look at the files.", calls=(("ls", '{"path":"."}'),)),
        SimTurn(reasoning="Two of them.", text="There are two files: a.py and b.txt."),
    )
)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = ServerConfig(
        engine="sim", api_keys=(KEY,), data_dir=str(tmp_path_factory.mktemp("store"))
    )
    with serving(App.from_config(settings, sim_engine(SCRIPT))) as base:
        yield base


@pytest.fixture
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def strict(completion: ChatCompletion) -> ChatCompletion:
    """The completion as the SDK's models validate its JSON strictly."""
    return ChatCompletion.model_validate_json(completion.model_dump_json(), strict=True)


def first_turn() -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is here?"}]


def test_a_tool_loop_that_resends_its_history_gets_the_cache(client: OpenAI) -> None:
    messages = first_turn()
    first = strict(client.chat.completions.create(model="sim", messages=messages, tools=TOOLS))
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert first.id.startswith("chatcmpl-") and first.object == "chat.completion"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("ls", '{"path":"."}')]
    assert choice.message.content is None
    # Reasoning as vLLM returns it for gpt-oss, under both of its names.
    extra = choice.message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "I should look at the files."
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # The client's own loop: the assistant message as it came back, then the tool's output.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "a.py\nb.txt"})
    second = strict(client.chat.completions.create(model="sim", messages=messages, tools=TOOLS))
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "There are two files: a.py and b.txt."
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    # The whole history came again; all of it up to the tool output was found by its
    # content (the first turn's end state: the replayed reasoning and call match it).
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens + first.usage.completion_tokens <= cached
    assert cached < second.usage.prompt_tokens


def test_streaming_gives_the_same_completion_in_chunks(client: OpenAI) -> None:
    whole = client.chat.completions.create(model="sim", messages=first_turn(), tools=TOOLS)
    stream = client.chat.completions.create(
        model="sim",
        messages=first_turn(),
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [ChatCompletionChunk.model_validate_json(c.model_dump_json()) for c in stream]
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert call.function is not None
            if call.function.name:
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    finished = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finished[-1] == "tool_calls" and set(finished[:-1]) == {None}
    # The last chunk: no choices, the usage.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    message = whole.choices[0].message
    calls = message.tool_calls or []
    assert reasoning == (message.model_extra or {})["reasoning_content"]
    assert [(names[i], arguments[i]) for i in sorted(names)] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert whole.usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_async_client_runs_the_loop(url: str) -> None:
    async def loop() -> str | None:
        client = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        messages = first_turn()
        first = await client.chat.completions.create(model="sim", messages=messages, tools=TOOLS)
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
        stream = await client.chat.completions.create(
            model="sim", messages=messages, tools=TOOLS, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return text

    assert asyncio.run(loop()) == "There are two files: a.py and b.txt."


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"n": 2}, "unsupported_parameter", "n"),
        ({"stop": ["\n"]}, "unsupported_parameter", "stop"),
        ({"seed": 7}, "unsupported_parameter", "seed"),
        ({"logprobs": True}, "unsupported_parameter", "logprobs"),
        ({"store": True}, "unsupported_parameter", "store"),
        ({"response_format": {"type": "json_object"}}, "unsupported_parameter", "response_format"),
        ({"stream_options": {"include_usage": True}}, "invalid_value", "stream_options"),
        ({"max_tokens": 0}, "invalid_value", "max_tokens"),
        ({"temperature": 3}, "invalid_value", "temperature"),
        ({"messages": []}, "invalid_value", "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "unsupported_content",
            "messages[0].content[0]",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "invalid_value",
            "tools[0].function.name",
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "rm"}}},
            "invalid_value",
            "tool_choice.function.name",
        ),
    ],
)
def test_what_it_cannot_honour_is_refused_by_name(
    client: OpenAI, fields: dict[str, Any], code: str, param: str
) -> None:
    body: dict[str, Any] = {"model": "sim", "messages": first_turn(), "tools": TOOLS, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**body)
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")


def test_keys_and_bounds_are_those_of_the_responses_api(url: str) -> None:
    body = {"model": "sim", "messages": first_turn()}
    with httpx.Client(base_url=url, timeout=60) as http:
        denied = http.post("/v1/chat/completions", json=body)
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "missing_api_key"
        huge = {**body, "messages": [{"role": "user", "content": "x" * (17 << 20)}]}
        headers = {"authorization": f"Bearer {KEY}"}
        too_large = http.post("/v1/chat/completions", json=huge, headers=headers)
        assert too_large.status_code == 413
        assert too_large.json()["error"]["code"] == "request_too_large"
        assert http.get("/v1/chat/completions", headers=headers).status_code == 405


def test_the_listed_model_answers_on_the_chat_path(client: OpenAI) -> None:
    model = client.models.list().data[0].id
    completion = client.chat.completions.create(model=model, messages=first_turn())
    assert completion.model == model
