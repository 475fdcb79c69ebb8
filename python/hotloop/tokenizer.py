"""Tokenizers for Python callers: typed wrappers over the compiled core's BPE.

Owns the public tokenizer API (`Tokenizer`, `StreamDecoder`, `IncrementalText`):
construction from the embedded OpenAI encodings, a GGUF file, a `tokenizer.json`, a
`tekken.json` or a SentencePiece `.model`, plain-text encoding, decoding, streaming
decoding, and incremental encoding of a growing text. The algorithms live in Rust
(rust/src/tokenizer/); this module adds documentation, path handling and nothing per token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from hotloop import _core


class Tokenizer:
    """A BPE tokenizer.

    Text is always encoded as plain text: a string such as ``<|end|>`` inside a message
    is ordinary bytes, never a special token. Special tokens are looked up by name with
    :meth:`special` and inserted by chat formats, by id.
    """

    __slots__ = ("_core",)

    def __init__(self, core: _core.Tokenizer) -> None:
        self._core = core

    @classmethod
    def openai(cls, name: str) -> Tokenizer:
        """One of the embedded OpenAI encodings: ``o200k_base``, ``o200k_harmony``
        (gpt-oss) or ``cl100k_base``. Nothing is downloaded."""
        return cls(_core.Tokenizer.openai(name))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """BPE from the tokenizer metadata of a GGUF model file (``gpt2`` byte-level
        vocabularies with their ``pre`` split, ``llama`` SentencePiece ones); only the
        metadata header is read, never the tensors. Ids equal llama.cpp's."""
        return cls(_core.Tokenizer.from_gguf(os.fspath(path)))

    @classmethod
    def from_tokenizer_json(cls, data: str | bytes) -> Tokenizer:
        """BPE from the contents of a Hugging Face ``tokenizer.json`` (Llama 3, Qwen,
        DeepSeek, Gemma, ...). Ids equal Hugging Face ``tokenizers``' with special tokens
        read as text; an unsupported component raises ``CoreError`` (code
        ``invalid_vocabulary``) naming it."""
        return cls(_core.Tokenizer.from_tokenizer_json(data))

    @classmethod
    def from_tekken(cls, data: str | bytes) -> Tokenizer:
        """Mistral's tekken BPE from the contents of a ``tekken.json``, with the ids
        ``mistral-common`` gives (special tokens first)."""
        return cls(_core.Tokenizer.from_tekken(data))

    @classmethod
    def from_sentencepiece_model(cls, data: bytes) -> Tokenizer:
        """SentencePiece BPE from the bytes of a ``.model`` file (Mistral v1/v2/v3/v7 as
        ``mistral-common`` ships them, Llama 2), with the ids the ``sentencepiece`` library
        gives. Unigram models and normalization rule tables raise ``CoreError`` (code
        ``invalid_vocabulary``) naming them."""
        return cls(_core.Tokenizer.from_sentencepiece_model(data))

    @property
    def core(self) -> _core.Tokenizer:
        """The native tokenizer, for the core's other classes (chat formats)."""
        return self._core

    @property
    def name(self) -> str:
        """The encoding name, or the model name for a GGUF vocabulary."""
        return self._core.name

    @property
    def vocab_size(self) -> int:
        """Number of ids, special and reserved ones included."""
        return self._core.vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, encoded as plain text."""
        return self._core.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD, and the dummy
        space a SentencePiece vocabulary puts before a text is dropped. Raises
        ``CoreError`` (code ``invalid_value``) for an id outside the vocabulary."""
        return self._core.decode(ids)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of ``ids`` (may end inside a UTF-8 character)."""
        return self._core.decode_bytes(ids)

    def special(self, name: str) -> int | None:
        """Id of the special token spelled ``name`` (``<|im_start|>``, ``<|start|>``), or
        None if the vocabulary has no such token."""
        return self._core.special(name)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` over this tokenizer."""
        return StreamDecoder(self)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"


class StreamDecoder:
    """Token ids in, UTF-8 text deltas out.

    A character split across tokens is held back until it is complete, so every delta
    can be sent as is; the concatenated deltas equal ``tokenizer.decode`` of all ids.
    """

    __slots__ = ("_core",)

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._core = _core.StreamDecoder(tokenizer.core)

    def feed(self, ids: Sequence[int]) -> str:
        """Decode the next ids; returns the text they complete (possibly empty)."""
        return self._core.feed(ids)

    def finish(self) -> str:
        """End of stream: returns any incomplete character left over, as U+FFFD."""
        return self._core.finish()


class IncrementalText:
    """A growing text that keeps its token ids, equal to ``tokenizer.encode(text)``
    after every append.

    Appending re-encodes only the last pre-tokenizer pieces before the join, so a long
    tool output arriving in chunks costs O(chunk), not O(text). :meth:`push` returns
    the index of the first id that changed; ids before it are kept::

        run = IncrementalText(tok, "Hello")
        start = run.push(", world")
        cache[start:] = run.ids_from(start)
    """

    __slots__ = ("_core",)

    def __init__(self, tokenizer: Tokenizer, text: str = "") -> None:
        self._core = _core.IncrementalText(tokenizer.core, text)

    def push(self, chunk: str) -> int:
        """Append ``chunk``; returns the index of the first id that changed."""
        return self._core.push(chunk)

    @property
    def text(self) -> str:
        return self._core.text

    def ids(self) -> list[int]:
        return self._core.ids()

    def ids_from(self, start: int) -> list[int]:
        """The ids from index ``start`` on (what changed after a :meth:`push`)."""
        return self._core.ids_from(start)

    def __len__(self) -> int:
        return len(self._core)

    @property
    def fallbacks(self) -> int:
        """Appends that could not be checked locally and re-encoded the whole text."""
        return self._core.fallbacks
