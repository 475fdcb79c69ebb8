"""The peer renders whole conversations with the reference libraries, offline."""

import hashlib

import orjson
import pytest
from hotloop._core import ChatFormat, Conversation, parse_request
from hotloop.engines.sim import SIM_FORMATS
from hotloop.lab.peer import O200K_SHA256, Peer, PeerError, vocab_dir
from hotloop.lab.rollout import Rollout, build_rollout


@pytest.fixture(scope="module")
def rollout() -> Rollout:
    return build_rollout(1, tool_calls=6)


def test_vocabulary_is_openais_file_byte_for_byte() -> None:
    data = (vocab_dir() / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256


def _chain(peer: Peer, rollout: Rollout, steps: int) -> list[int]:
    """Render turn by turn through previous_response_id; return the last prompt."""
    previous = None
    ids: list[int] = []
    for index in range(steps + 1):
        new = [rollout.history_items(0)[0]] if index == 0 else [rollout.tool_result(index - 1)]
        response_id = f"resp_{index}"
        ids = peer.render(
            response_id, previous, orjson.dumps(new).decode(), rollout.instructions, rollout.tools
        )
        if index < steps:
            peer.commit(response_id, orjson.dumps({"output": rollout.step_items(index)}))
        previous = response_id
    return ids


@pytest.mark.parametrize("flavour", ["harmony", "template", "open-model"])
def test_chained_turn_renders_the_same_as_full_history(flavour: str, rollout: Rollout) -> None:
    chained = _chain(Peer(flavour), rollout, 4)
    full = Peer(flavour).render(
        "resp_full",
        None,
        orjson.dumps(rollout.history_items(4)).decode(),
        rollout.instructions,
        rollout.tools,
    )
    assert chained == full
    assert len(full) > 1000


def test_harmony_prompt_ends_with_the_assistant_header(rollout: Rollout) -> None:
    import tiktoken

    ids = _chain(Peer("harmony"), rollout, 2)
    # o200k_harmony's specials: <|start|> 200006, "assistant" follows it.
    assert ids[-2] == 200006
    text = tiktoken.get_encoding("o200k_base").decode([i for i in ids if i < 199998])
    assert rollout.steps[1].output[:200] in text
    assert "functions.exec_command" in text


def test_template_prompt_holds_tool_output_verbatim(rollout: Rollout) -> None:
    import tiktoken

    ids = _chain(Peer("template"), rollout, 3)
    text = tiktoken.get_encoding("o200k_base").decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert rollout.steps[2].output in text


def test_unknown_previous_response_is_an_error(rollout: Rollout) -> None:
    with pytest.raises(PeerError, match="resp_missing"):
        Peer("template").render("resp_1", "resp_missing", "[]", None, [])


def test_unknown_flavour_is_an_error() -> None:
    with pytest.raises(PeerError, match="unknown baseline"):
        Peer("vllm")


@pytest.mark.parametrize("effort", [None, "high"])
def test_harmony_peer_ids_equal_hotloops_for_the_same_conversation(
    rollout: Rollout, effort: str | None
) -> None:
    """The baseline feeds the engine the peer's ids: they must be hotloop's prompt for
    the same conversation, or the benchmark compares different prompts."""
    body = {
        "model": "sim",
        "instructions": rollout.instructions,
        "tools": [*rollout.tools, {"type": "function", "name": "ping"}],
        "input": rollout.history_items(4),
        **({"reasoning": {"effort": effort}} if effort else {}),
    }
    request = parse_request(orjson.dumps(body).decode())
    assert request.error is None
    conversation = Conversation(ChatFormat.harmony(), context_window=1 << 22)
    conversation.extend(request)
    peer_prompt = Peer("harmony").render_request("resp_full", request)
    assert peer_prompt.tokens() == conversation.prompt().tokens()
    assert len(peer_prompt) == len(conversation.prompt()) > 1000


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


def _chatml_history(rollout: Rollout, steps: int) -> list[dict[str, object]]:
    """The rollout as the `smollm2` sim answers it: each step's reasoning said as text
    before its call (ChatML has no reasoning channel)."""
    items: list[dict[str, object]] = [rollout.history_items(0)[0]]
    for index in range(steps):
        text = rollout.steps[index].reasoning
        items.append({"type": "message", "role": "assistant", "content": text})
        items.append(rollout.step_items(index)[1])
        items.append(rollout.tool_result(index))
    return items


def _prompts(
    body: dict[str, object], sim_format: str = "smollm2", flavour: str = "open-model"
) -> tuple[list[int], list[int]]:
    """(the peer's ids, hotloop's prompt ids in the sim format) for one request body."""
    request = parse_request(orjson.dumps({"model": "sim", **body}).decode())
    assert request.error is None
    conversation = Conversation(SIM_FORMATS[sim_format](), context_window=1 << 22)
    conversation.extend(request)
    peer_prompt = Peer(flavour).render_request("resp_full", request)
    return peer_prompt.tokens(), conversation.prompt().tokens()


def test_open_model_peer_ids_equal_hotloops_for_a_tool_conversation() -> None:
    """The open-model baseline feeds the `smollm2` sim the peer's ids: for a multi-turn
    tool conversation they must be hotloop's ChatML prompt, token for token."""
    body = {
        "instructions": "Use tools when useful. Answer briefly.",
        "tools": [WEATHER, {"type": "function", "name": "ping"}],
        "input": [
            {"type": "message", "role": "user", "content": "Weather in Zürich?  \n\n12°C?"},
            {
                "type": "function_call",
                "call_id": "call_a",
                "name": "get_weather",
                "arguments": '{"city":"Zürich", "unit": "c"}',
            },
            {"type": "function_call_output", "call_id": "call_a", "output": '{"temp": 21}\n'},
            {
                "type": "message",
                "role": "assistant",
                "content": "It is 21 °C in Zürich. 東京?",
            },
            {"type": "message", "role": "user", "content": "And 3 days from now?"},
        ],
    }
    peer, ours = _prompts(body)
    assert peer == ours
    text = SIM_FORMATS["smollm2"]().tokenizer.decode(ours)
    assert '"name": "ping"' in text and '{"city": "Zürich", "unit": "c"}' in text
    assert text.endswith(
        "<|im_start|>user\nAnd 3 days from now?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_open_model_peer_ids_equal_hotloops_for_the_rollout(rollout: Rollout) -> None:
    body = {
        "instructions": rollout.instructions,
        "tools": rollout.tools,
        "input": _chatml_history(rollout, 5),
    }
    peer, ours = _prompts(body)
    assert peer == ours
    assert len(ours) > 1000


def test_qwen3_peer_ids_equal_hotloops_for_the_rollout(rollout: Rollout) -> None:
    """The qwen3 baseline (vLLM's path: its messages, Qwen3's own template, HF
    tokenizers) feeds the `qwen3` sim its ids: they must be hotloop's, token for token."""
    body = {
        "instructions": rollout.instructions,
        "tools": rollout.tools,
        "input": _chatml_history(rollout, 5),
    }
    peer, ours = _prompts(body, "qwen3", "qwen3")
    assert peer == ours
    assert len(ours) > 1000
    assert SIM_FORMATS["qwen3"]().tokenizer.decode(ours).endswith("<|im_start|>assistant\n")
