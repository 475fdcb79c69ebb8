"""Harmony (gpt-oss) against openai-harmony, the reference renderer and parser.

Rendering is checked through golden vectors shared with the Rust tests: this test proves
that `tests/golden/harmony_render.json` holds exactly what openai-harmony renders for the
cases below, and `rust/src/format/harmony/tests.rs` proves that hotloop renders the same
ids, segment by segment. Regenerate the file with `python tests/test_format_harmony.py`.
`tests/golden/harmony_parse.json` does the same for parsing: sampled outputs and the
messages openai-harmony's parser reads from them, which hotloop's parser must read too.
Completions and stop tokens go through the compiled core's Python API.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hotloop import _core
from hotloop._core import ChatFormat
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
    load_harmony_encoding,
)

GOLDEN = Path(__file__).parent / "golden" / "harmony_render.json"
GOLDEN_PARSE = Path(__file__).parent / "golden" / "harmony_parse.json"

WEATHER = {
    "name": "get_current_weather",
    "description": "Gets the current weather in the provided location.",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            },
            "format": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "default": "celsius",
            },
        },
        "required": ["location"],
    },
}

KITCHENSINK = {
    "name": "kitchensink",
    "description": "A function with various complex schemas.\nSecond line of the description.",
    "parameters": {
        "description": "params object",
        "type": "object",
        "properties": {
            "string": {
                "type": "string",
                "title": "STRING",
                "description": "A string",
                "examples": ["hello", "world"],
            },
            "string_nullable": {
                "type": "string",
                "nullable": True,
                "description": "A nullable string",
                "default": "the default",
            },
            "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
            "oneof_string_or_number": {
                "oneOf": [
                    {"type": "string", "default": "default_string_in_oneof"},
                    {"type": "number", "description": "numbers can happen too"},
                ],
                "description": "a oneof",
                "default": 20,
            },
            "nested": {
                "type": "object",
                "description": "An object inside",
                "properties": {
                    "depth": {"type": "integer", "default": 3},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "points": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                            "required": ["x", "y"],
                        },
                    },
                },
                "required": ["depth"],
            },
            "flags": {"type": ["boolean", "null"]},
            "anything": {},
            "list_any": {"type": "array"},
        },
        "required": ["string_enum", "nested"],
    },
}

NO_PARAMETERS = {"name": "get_location", "description": "Gets the location of the user."}
EMPTY_OBJECT = {
    "name": "refresh",
    "description": "",
    "parameters": {"type": "object", "properties": {}},
}
UNDESCRIBED = {
    "name": "exec_command",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "text": text}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


CASES: list[dict[str, Any]] = [
    {"name": "bare_user", "prefix": {}, "items": [user("Hello!")]},
    {
        "name": "every_item_type",
        "prefix": {"instructions": "Always respond in riddles", "tools": [WEATHER]},
        "items": [
            user("What is the weather like in SF?"),
            {"type": "reasoning", "text": "User asks weather; call the tool."},
            call("call_1", "get_current_weather", '{"location": "San Francisco, CA"}'),
            output("call_1", '{"temperature": 20, "sky": "sunny"}'),
            {"type": "reasoning", "text": "It is sunny."},
            {"type": "message", "role": "assistant", "text": "A sunny riddle: 20 degrees."},
            user("Thanks — and tomorrow? 🌦"),
        ],
    },
    {
        "name": "complex_schemas_high_effort",
        "prefix": {
            "instructions": "Use the tools.",
            "tools": [NO_PARAMETERS, KITCHENSINK, EMPTY_OBJECT, UNDESCRIBED, WEATHER],
            "reasoning_effort": "high",
        },
        "items": [user("Go.")],
    },
    {
        "name": "tools_without_instructions_low_effort",
        "prefix": {"tools": [UNDESCRIBED], "reasoning_effort": "low"},
        "items": [
            user("list files"),
            call("c1", "exec_command", '{"cmd":"ls -la"}'),
            output("c1", "total 0\n<|end|> is plain text here\n"),
        ],
    },
    {
        "name": "instructions_and_developer_items",
        "prefix": {"instructions": "Line one.\nLine two.", "reasoning_effort": "medium"},
        "items": [
            {"type": "message", "role": "developer", "text": "Prefer short answers."},
            {"type": "message", "role": "system", "text": "System note."},
            user("日本語で答えて"),
            {"type": "message", "role": "assistant", "text": "はい。"},
            user(""),
        ],
    },
    {
        "name": "empty_texts",
        "prefix": {"instructions": ""},
        "items": [
            user("?"),
            {"type": "reasoning", "text": ""},
            call("c9", "noop", "{}"),
            output("c9", ""),
            {"type": "message", "role": "assistant", "text": ""},
        ],
    },
]

# Sampled outputs (after the generation header `<|start|>assistant`) in the shapes gpt-oss
# writes them: channel before or after the recipient, `<|constrain|>` with or without a
# space, preambles on commentary, multi-byte text.
PARSE_CASES: list[dict[str, str]] = [
    {
        "name": "reasoning_then_final",
        "sampled": "<|channel|>analysis<|message|>User greets. Reply.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello! 👋 Ça va ?<|return|>",
    },
    {
        "name": "reasoning_then_call_channel_first",
        "sampled": "<|channel|>analysis<|message|>Need weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}<|call|>',
    },
    {
        "name": "call_recipient_first",
        "sampled": " to=functions.exec_command<|channel|>commentary <|constrain|>json"
        '<|message|>{"cmd": "ls -la"}<|call|>',
    },
    {
        "name": "preamble_then_call_adjacent_constrain",
        "sampled": "<|channel|>commentary<|message|>Checking the files…<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command<|constrain|>json"
        '<|message|>{"cmd":"cat 日本.txt"}<|call|>',
    },
]

EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


def load_reference(base: Path) -> HarmonyEncoding:
    """openai-harmony over the o200k vocabulary shipped in the `bpe-openai` wheel."""
    data = importlib.resources.files("bpe_openai") / "data" / "o200k_base.tiktoken.gz"
    (base / "o200k_base.tiktoken").write_bytes(gzip.decompress(data.read_bytes()))
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(base)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def developer(instructions: str | None, tools: list[dict[str, Any]]) -> Message:
    content = DeveloperContent.new()
    if instructions is not None:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools(
            [
                ToolDescription.new(
                    t["name"], t.get("description", ""), parameters=t.get("parameters")
                )
                for t in tools
            ]
        )
    return Message.from_role_and_content(Role.DEVELOPER, content)


def reference_messages(case: dict[str, Any]) -> list[Message]:
    """The conversation as openai-harmony messages, mapped as hotloop maps items."""
    prefix = case["prefix"]
    system = SystemContent.new().with_reasoning_effort(
        EFFORTS[prefix.get("reasoning_effort", "medium")]
    )
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]
    if prefix.get("instructions") is not None or prefix.get("tools"):
        messages.append(developer(prefix.get("instructions"), prefix.get("tools", [])))
    names = {i["call_id"]: i["name"] for i in case["items"] if i["type"] == "function_call"}
    for item in case["items"]:
        kind = item["type"]
        if kind == "message" and item["role"] in ("system", "developer"):
            messages.append(developer(item["text"], []))
        elif kind == "message" and item["role"] == "user":
            messages.append(Message.from_role_and_content(Role.USER, item["text"]))
        elif kind == "message":
            msg = Message.from_role_and_content(Role.ASSISTANT, item["text"])
            messages.append(msg.with_channel("final"))
        elif kind == "reasoning":
            msg = Message.from_role_and_content(Role.ASSISTANT, item["text"])
            messages.append(msg.with_channel("analysis"))
        elif kind == "function_call":
            msg = Message.from_role_and_content(Role.ASSISTANT, item["arguments"])
            msg = msg.with_channel("commentary").with_recipient(f"functions.{item['name']}")
            messages.append(msg.with_content_type("<|constrain|>json"))
        else:
            author = Author.new(Role.TOOL, f"functions.{names[item['call_id']]}")
            msg = Message.from_author_and_content(author, item["output"])
            messages.append(msg.with_recipient("assistant").with_channel("commentary"))
    return messages


def render_reference(encoding: HarmonyEncoding, case: dict[str, Any]) -> list[int]:
    conversation = Conversation.from_messages(reference_messages(case))
    config = RenderConversationConfig(auto_drop_analysis=False)
    return list(
        encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config=config)
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> HarmonyEncoding:
    saved = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    encoding = load_reference(tmp_path_factory.mktemp("tiktoken"))
    if saved is None:
        del os.environ["TIKTOKEN_ENCODINGS_BASE"]
    else:
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = saved
    return encoding


def test_golden_vectors_are_what_openai_harmony_renders(reference: HarmonyEncoding) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert [{k: v for k, v in g.items() if k != "tokens"} for g in golden] == CASES
    for case in golden:
        assert render_reference(reference, case) == case["tokens"], case["name"]


def request_body(case: dict[str, Any]) -> str:
    """The case as a `POST /v1/responses` body."""
    input_items: list[dict[str, Any]] = []
    for item in case["items"]:
        if item["type"] == "message":
            input_items.append({"type": "message", "role": item["role"], "content": item["text"]})
        elif item["type"] == "reasoning":
            content = [{"type": "reasoning_text", "text": item["text"]}]
            input_items.append({"type": "reasoning", "summary": [], "content": content})
        else:
            input_items.append(item)
    body: dict[str, Any] = {"model": "gpt-oss", "input": input_items}
    prefix = case["prefix"]
    if "instructions" in prefix:
        body["instructions"] = prefix["instructions"]
    if "tools" in prefix:
        body["tools"] = [{"type": "function", **t} for t in prefix["tools"]]
    if "reasoning_effort" in prefix:
        body["reasoning"] = {"effort": prefix["reasoning_effort"]}
    return json.dumps(body)


def test_namespace_tools_render_as_openai_harmony_namespaces(reference: HarmonyEncoding) -> None:
    """Codex's `namespace` tools: each is its own namespace block beside `functions` (in
    name order), its functions called as `NS.NAME`, and a namespaced `function_call`
    sent back renders as the sampled call did."""
    spawn = {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}
    body = {
        "model": "gpt-oss",
        "tools": [
            {"type": "function", **WEATHER},
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "Sub-agents.\nThey run in parallel.",
                "tools": [
                    {
                        "type": "function",
                        "name": "spawn_agent",
                        "description": "Start one.",
                        "parameters": spawn,
                    },
                    {"type": "function", "name": "wait", "description": ""},
                ],
            },
            {"type": "namespace", "name": "apps", "description": "None installed.", "tools": []},
        ],
        "input": [
            {"type": "message", "role": "user", "content": "Delegate."},
            {
                "type": "function_call",
                "call_id": "c1",
                "namespace": "multi_agent_v1",
                "name": "spawn_agent",
                "arguments": '{"task":"x"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "started"},
        ],
    }
    conversation = _core.Conversation(ChatFormat.harmony(), context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps(body)))

    content = DeveloperContent.new().with_function_tools(
        [
            ToolDescription.new(
                WEATHER["name"], WEATHER["description"], parameters=WEATHER["parameters"]
            )
        ]
    )
    content = content.with_tools(
        ToolNamespaceConfig(
            name="multi_agent_v1",
            description="Sub-agents.\nThey run in parallel.",
            tools=[
                ToolDescription.new("spawn_agent", "Start one.", parameters=spawn),
                ToolDescription.new("wait", ""),
            ],
        )
    )
    content = content.with_tools(
        ToolNamespaceConfig(name="apps", description="None installed.", tools=[])
    )
    call = Message.from_role_and_content(Role.ASSISTANT, '{"task":"x"}').with_channel("commentary")
    call = call.with_recipient("multi_agent_v1.spawn_agent").with_content_type("<|constrain|>json")
    output = Message.from_author_and_content(
        Author.new(Role.TOOL, "multi_agent_v1.spawn_agent"), "started"
    )
    messages = [
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
        Message.from_role_and_content(Role.DEVELOPER, content),
        Message.from_role_and_content(Role.USER, "Delegate."),
        call,
        output.with_recipient("assistant").with_channel("commentary"),
    ]
    config = RenderConversationConfig(auto_drop_analysis=False)
    expected = reference.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT, config=config
    )
    assert conversation.prompt().tokens() == list(expected)


def test_conversation_prompt_equals_openai_harmony(reference: HarmonyEncoding) -> None:
    """End to end: request parsing, validation, the rendered-token cache and harmony,
    token-exact for every case as given (a tool without `parameters` renders
    `() => any`, one with an empty object schema `(_: {\n}) => any`)."""
    for case in json.loads(GOLDEN.read_text()):
        conversation = _core.Conversation(ChatFormat.harmony(), context_window=1 << 20)
        conversation.extend(_core.parse_request(request_body(case)))
        assert conversation.prompt().tokens() == render_reference(reference, case), case["name"]


def test_parser_streams_a_completion_through_the_python_api() -> None:
    fmt = ChatFormat.harmony()
    conversation = _core.Conversation(fmt, context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps({"model": "gpt-oss", "input": "Hi"})))
    ids = fmt.completion_tokens(reasoning="Greet back — briefly.", text="Hello! 👋")
    parser = conversation.parser()
    events = [e for i in ids for e in parser.feed([i])]
    assert parser.stopped
    tail, outcome, message = parser.finish()
    assert (outcome, message) == ("stopped", None)
    events += tail
    assert [e[0] for e in events if e[0] not in ("text", "reasoning")] == [
        "reasoning_start",
        "reasoning_done",
        "message_start",
        "message_done",
    ]
    assert "".join(e[2] for e in events if e[0] == "reasoning") == "Greet back — briefly."
    assert "".join(e[2] for e in events if e[0] == "text") == "Hello! 👋"
    assert parser.output_tokens == len(ids)
    assert 0 < parser.reasoning_tokens < len(ids)


def test_off_format_output_finishes_malformed_with_the_reason() -> None:
    fmt = ChatFormat.harmony()
    conversation = _core.Conversation(fmt, context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps({"model": "gpt-oss", "input": "Hi"})))
    tokenizer = fmt.tokenizer
    special = tokenizer.special
    ids = [special("<|channel|>"), *tokenizer.encode("thoughts"), special("<|message|>")]
    parser = conversation.parser()
    parser.feed([i for i in ids if i is not None])
    _, outcome, message = parser.finish()
    assert outcome == "malformed"
    assert message is not None and "unknown channel" in message


def test_stop_tokens_are_the_assistant_action_stops(reference: HarmonyEncoding) -> None:
    fmt = ChatFormat.harmony()
    assert fmt.name == "harmony"
    assert sorted(fmt.stop_tokens) == sorted(reference.stop_tokens_for_assistant_actions())


def parse_reference(reference: HarmonyEncoding, tokens: list[int]) -> list[dict[str, Any]]:
    messages = reference.parse_messages_from_completion_tokens(tokens, role=Role.ASSISTANT)
    return [
        {
            "channel": m.channel,
            "recipient": m.recipient,
            "content_type": m.content_type,
            "text": "".join(c.text for c in m.content),  # type: ignore[attr-defined]
        }
        for m in messages
    ]


def test_completion_tokens_parse_in_openai_harmony(reference: HarmonyEncoding) -> None:
    fmt = ChatFormat.harmony()
    tokens = fmt.completion_tokens(
        reasoning="Need the weather — call the tool.",
        calls=[("get_current_weather", '{"location": "Paris"}')],
    )
    assert tokens[-1] == reference.encode("<|call|>", allowed_special="all")[0]
    assert parse_reference(reference, tokens) == [
        {
            "channel": "analysis",
            "recipient": None,
            "content_type": None,
            "text": "Need the weather — call the tool.",
        },
        {
            "channel": "commentary",
            "recipient": "functions.get_current_weather",
            "content_type": "<|constrain|>json",
            "text": '{"location": "Paris"}',
        },
    ]
    tokens = fmt.completion_tokens(text="Sunny, 20 °C ☀", reasoning="Easy.")
    assert tokens[-1] == reference.encode("<|return|>", allowed_special="all")[0]
    assert parse_reference(reference, tokens) == [
        {"channel": "analysis", "recipient": None, "content_type": None, "text": "Easy."},
        {"channel": "final", "recipient": None, "content_type": None, "text": "Sunny, 20 °C ☀"},
    ]


def parsed_case(reference: HarmonyEncoding, case: dict[str, str]) -> dict[str, Any]:
    tokens = list(reference.encode(case["sampled"], allowed_special="all"))
    return {**case, "tokens": tokens, "messages": parse_reference(reference, tokens)}


def test_parse_golden_vectors_are_what_openai_harmony_parses(reference: HarmonyEncoding) -> None:
    golden = json.loads(GOLDEN_PARSE.read_text())
    assert [{"name": g["name"], "sampled": g["sampled"]} for g in golden] == PARSE_CASES
    for case in golden:
        assert parsed_case(reference, case) == case, case["name"]


def write_golden(path: Path, cases: list[dict[str, Any]]) -> None:
    lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in cases)
    path.write_text(f"[\n{lines}\n]\n")
    print(f"wrote {len(cases)} cases to {path}", file=sys.stderr)


def main() -> None:
    """Regenerate the golden vectors from CASES and PARSE_CASES with openai-harmony."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        encoding = load_reference(Path(tmp))
        write_golden(
            GOLDEN, [{**case, "tokens": render_reference(encoding, case)} for case in CASES]
        )
        write_golden(GOLDEN_PARSE, [parsed_case(encoding, case) for case in PARSE_CASES])


if __name__ == "__main__":
    main()
