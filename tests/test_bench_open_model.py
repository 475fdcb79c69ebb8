"""The open-model peer renders the same prompt as hotloop: SmolLM2's own chat template
through jinja2, tokenized by Hugging Face `tokenizers`, gives hotloop's ChatML ids."""

from __future__ import annotations

import json

import pytest
from hotloop._core import ChatFormat, Conversation, Tokenizer, parse_request
from hotloop.lab.open_model import OpenModelPeer
from hotloop.native_deps import smollm2_gguf_path

SYSTEM = "You are a careful assistant. Answer in one sentence."
TURNS = [
    ("user", "What is 12 * 37? Show the digits: 444."),
    ("assistant", "12 * 37 = 444, because 12 * 30 = 360 and 12 * 7 = 84."),
    ("user", "Und auf Deutsch, bitte — mit Umlauten: äöü, 東京, 🙂\n\n  indented  text\t."),
]


@pytest.fixture(scope="module")
def path() -> str:
    return str(smollm2_gguf_path())


def test_peer_ids_equal_hotloop_prompt(path: str) -> None:
    peer = OpenModelPeer(path)
    messages = [{"role": "system", "content": SYSTEM}] + [
        {"role": role, "content": text} for role, text in TURNS
    ]
    conversation = Conversation(
        ChatFormat.chatml(Tokenizer.from_gguf(path)), context_window=1 << 16
    )
    request = {
        "instructions": SYSTEM,
        "input": [{"type": "message", "role": role, "content": text} for role, text in TURNS],
    }
    conversation.extend(parse_request(json.dumps(request).encode()))
    ours = conversation.prompt().tokens()
    theirs = peer.prompt(messages)
    assert theirs == ours
    assert peer.render(messages).endswith("<|im_start|>assistant\n")
