"""Token-id conversations for the engine tests: ChatML turns for SmolLM2, built with the
model's own vocabulary (the engines never see text; the tests need some ids to send, as
`hotloop._core.Prompt.from_tokens`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache

import llama_cpp
from hotloop.engines.llama import LlamaConfig, LlamaEngine
from hotloop.native_deps import smollm2_gguf_path

IM_END = 2  # SmolLM2's <|im_end|>, the ChatML stop token
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@cache
def _vocab() -> llama_cpp.Llama:
    return llama_cpp.Llama(str(smollm2_gguf_path()), vocab_only=True, verbose=False)


def encode(text: str) -> list[int]:
    """ChatML markup in `text` becomes special ids, as the chat format renders it."""
    return list(_vocab().tokenize(text.encode(), add_bos=False, special=True))


def first_turn(user: str) -> list[int]:
    return encode(
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


def next_turn(history: list[int], reply: list[int], user: str) -> list[int]:
    """The prompt after `history` was answered with `reply` (kept verbatim, as the
    rendered-token cache does) and the user said `user`."""
    closed = reply if reply and reply[-1] == IM_END else [*reply, IM_END]
    return [
        *history,
        *closed,
        *encode(f"\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"),
    ]


@asynccontextmanager
async def small_llama() -> AsyncIterator[LlamaEngine]:
    """SmolLM2 in-process, started: a 4k-token KV cache of two sequences, one thread."""
    engine = LlamaEngine(LlamaConfig(n_ctx=4096, max_sequences=2, n_threads=1))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
