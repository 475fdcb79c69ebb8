"""Compaction items: sealed conversation summaries, and their expansion when a client
sends them back.

`POST /v1/responses/compact` and `context_management` turn a conversation into a
summary written by the engine; the client receives it as a `compaction` item whose
`encrypted_content` is the summary sealed with the server's key (AES-256-GCM: opaque to
the client, and any change to it is detected). A request that carries such an item
(a new chain started from a compacted one, over HTTP or WebSocket) has it replaced by a
message holding the summary before the core parses the request, so the summary renders
in place of the history it stands for.

This module owns the key (`--compaction-key`, or one generated per data directory and
kept there, so restarts and `--workers` processes open each other's items; the secret
of the engine's cache salts is derived from it, `auth.ApiKeys`), sealing,
opening and the rewrite of request bodies, and the requests of a compaction: the one
that asks the engine for the summary and the one a compacted turn runs on. When to
compact and the engine work are `summarization.py`'s.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import os
import time
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hotloop._core import (
    Conversation,
    CoreError,
    CreateRequest,
    Limits,
    Turn,
    check_values,
    parse_request,
)
from hotloop.events import Usage, new_id
from hotloop.protocol.errors import ProtocolError

# Versioned, so a later format can be told apart; bound into the tag as associated data.
PREFIX = "hlc1."
_AAD = b"hotloop compaction v1"
_NONCE_BYTES = 12
KEY_FILE = "compaction.key"
# How a summary renders in place of the history it replaced.
SUMMARY_HEADER = "Summary of the conversation so far (earlier turns were compacted):\n"
# What the engine is asked, after the conversation, to write the summary.
SUMMARIZE = (
    "Summarize the conversation so far so that it can be continued from the summary "
    "alone: the task, what was done and decided, facts and results that matter, and what "
    "remains open. Write only the summary."
)
# Longest summary sampled by default, in tokens: short enough to free most of a small
# context.
SUMMARY_TOKENS = 512


class Compactor:
    """Seals summaries into `encrypted_content` and opens them, with one key; and how
    long a summary the engine may write (`summary_tokens`)."""

    def __init__(self, key: bytes, summary_tokens: int = SUMMARY_TOKENS) -> None:
        if len(key) != 32:
            raise ValueError("a compaction key is 32 bytes")
        self._aead = AESGCM(key)
        self._aad = _AAD
        self.summary_tokens = summary_tokens
        # Derived now, the key itself not kept: a one-way function of it, so a salt an
        # engine logs opens no compaction item.
        self.cache_secret = hmac.new(key, b"hotloop engine cache salt", hashlib.sha256).digest()
        """The secret of the engine's cache salts: the same wherever this key is (its
        restarts, `--workers` processes, nodes given one `--compaction-key`), so a key's
        requests find their engine cache from any of them."""

    def bound(self, owner: str | None) -> Compactor:
        """This key as API key id `owner` uses it: an item it seals opens for `owner`
        only (the id is bound into the tag), so no key reads another's summary. None
        (auth off): one tenant, items as unbound."""
        bound = copy.copy(self)
        bound._aad = _AAD if owner is None else _AAD + b"\0" + owner.encode()
        return bound

    @classmethod
    def from_secret(cls, secret: str, summary_tokens: int = SUMMARY_TOKENS) -> Compactor:
        """A key derived from an operator's secret (`--compaction-key`): every server
        given the same secret opens the same items."""
        key = hashlib.sha256(b"hotloop compaction key\0" + secret.encode()).digest()
        return cls(key, summary_tokens)

    @classmethod
    def in_directory(cls, data_dir: str, summary_tokens: int = SUMMARY_TOKENS) -> Compactor:
        """The key kept in `data_dir` (created there once, readable by the owner only):
        items survive restarts, and the worker processes of one server share it."""
        directory = Path(data_dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / KEY_FILE
        if not path.exists():
            # Written aside and linked into place: of processes starting together, one
            # key wins and every process reads that one.
            staged = directory / f".{KEY_FILE}.{os.getpid()}"
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex())
            try:
                os.link(staged, path)
            except FileExistsError:
                pass
            finally:
                staged.unlink()
        return cls(bytes.fromhex(path.read_text().strip()), summary_tokens)

    @classmethod
    def ephemeral(cls, summary_tokens: int = SUMMARY_TOKENS) -> Compactor:
        """A key for this process only (no data directory): items die with it."""
        return cls(os.urandom(32), summary_tokens)

    def seal(self, summary: str) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, summary.encode(), self._aad)
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, encrypted_content: str, param: str) -> str:
        """The summary inside `encrypted_content`; a 400 naming `param` when it was not
        sealed by this server's key for this owner, or was changed at all."""
        try:
            if not encrypted_content.startswith(PREFIX):
                raise ValueError("unknown format")
            text = encrypted_content[len(PREFIX) :].encode()
            raw = base64.b64decode(text, altchars=b"-_", validate=True)
            # Decoding alone accepts other spellings of the same bytes ('+' for '-',
            # padding bits): only the text `seal` wrote is the item.
            if base64.urlsafe_b64encode(raw) != text:
                raise ValueError("not the sealed text")
            nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
            return self._aead.decrypt(nonce, sealed, self._aad).decode()
        except (ValueError, InvalidTag) as e:
            raise ProtocolError(
                "invalid_encrypted_content",
                f"'{param}' is not a compaction item this server produced, or it was "
                "modified: send the item back exactly as it was returned.",
                param,
            ) from e

    def expand(self, body: str | bytes) -> str | bytes:
        """`body` (a request body or a `response.create` frame, flat or nested) with
        each `compaction` input item replaced by a message holding its summary; the
        body itself when it has none (the common case costs one substring search)."""
        marker: str | bytes = b'"compaction"' if isinstance(body, bytes) else '"compaction"'
        if marker not in body:  # type: ignore[operator]
            return body
        try:
            # orjson would load a 30-digit integer as a float and write it back changed,
            # past the core's boundary check: a frame that fails it is left to the core.
            check_values(body)
            parsed = orjson.loads(body)
        except (CoreError, orjson.JSONDecodeError):
            return body  # the core refuses it with its own error, on its lane
        holder = parsed.get("response") if isinstance(parsed, dict) else None
        request = holder if isinstance(holder, dict) else parsed
        items = request.get("input") if isinstance(request, dict) else None
        if not isinstance(items, list) or not any(_is_compaction(i) for i in items):
            return body
        request["input"] = self._expanded_list(items)
        out = orjson.dumps(parsed)
        return out if isinstance(body, bytes) else out.decode()

    def expand_items(self, items: bytes) -> bytes:
        """A JSON array of items (a stored chain's) with its compaction items expanded."""
        if b'"compaction"' not in items:
            return items
        return orjson.dumps(self._expanded_list(orjson.loads(items)))

    def _expanded_list(self, items: list[Any]) -> list[Any]:
        return [self._expanded(item, i) for i, item in enumerate(items)]

    def _expanded(self, item: Any, index: int) -> Any:
        if not _is_compaction(item):
            return item
        param = f"input[{index}].encrypted_content"
        content = item.get("encrypted_content")
        if not isinstance(content, str):
            raise ProtocolError(
                "missing_required_parameter",
                f"Missing required parameter: '{param}'.",
                param,
            )
        return summary_message(self.open(content, param))


def summary_message(summary: str) -> dict[str, Any]:
    """The input item a compaction stands for."""
    return _user(SUMMARY_HEADER + summary)


def compacted(output: list[Any]) -> bool:
    """Whether a response's output starts with a compaction (`context_management`): its
    conversation was replaced by the summary, its own input included."""
    return bool(output) and _is_compaction(output[0])


def _is_compaction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "compaction"


class Summary:
    """A summary the engine is writing for one response: its text as the output parser
    delivers it, and whether a turn resumes on it (`context_management`) or it is the
    answer (`/responses/compact`)."""

    __slots__ = ("before", "item_id", "resume", "text")

    def __init__(self, item_id: str, resume: bool) -> None:
        self.item_id = item_id
        self.resume = resume
        self.text = ""
        self.before: tuple[Conversation, Turn] | None = None
        """The turn as rendered before summarizing (its history and input): what an
        interrupt leaves warm, as the store rebuilds it."""

    def feed(self, parsed: list[tuple[Any, ...]]) -> None:
        """Keep the text of the parser's finished messages (calls and reasoning are no
        summary)."""
        for event in parsed:
            if event[0] == "message_done":
                self.text = event[2] if not self.text else self.text + "\n" + event[2]

    def item(self, compactor: Compactor) -> dict[str, Any]:
        """The `compaction` output item sealing the summary."""
        return {
            "id": self.item_id,
            "type": "compaction",
            "encrypted_content": compactor.seal(self.text),
        }


def summarizing(
    request: CreateRequest, summary_tokens: int, limits: Limits | None
) -> CreateRequest:
    """`request` with the instruction to summarize appended to its input, and no room
    for more than a summary: what the engine is given to write one (parsed with the
    connection's `limits`, as the request was)."""
    # The input as sent, but a `compaction_trigger` (the request's, not an item).
    sent = orjson.loads(request.input_json)
    items = [*(i for i in sent if i.get("type") != "compaction_trigger"), _user(SUMMARIZE)]
    return _derived(request, items, summary_tokens, limits)


def resumed(request: CreateRequest, summary: str) -> CreateRequest:
    """The turn `request` on a compacted conversation: its instructions and tools, and
    the summary in place of everything before."""
    return _derived(request, [summary_message(summary)], request.max_output_tokens, None)


def _derived(
    request: CreateRequest, items: list[Any], max_output_tokens: int | None, limits: Limits | None
) -> CreateRequest:
    # Only on a compaction (once per many turns): the request's own prefix is read back
    # from the fields it echoes, as the core serialised them.
    fields = orjson.loads(request.response_fields_json)
    body: dict[str, Any] = {
        "instructions": fields.get("instructions"),
        "tools": fields.get("tools", []),
        "input": items,
        "max_output_tokens": max_output_tokens,
    }
    if request.reasoning_effort is not None:
        body["reasoning"] = {"effort": request.reasoning_effort}
    derived = parse_request(orjson.dumps(body), limits)
    if derived.error is not None:
        raise derived.error
    return derived


def compacted_resource(item: dict[str, Any], usage: Usage) -> bytes:
    """The `response.compaction` object `/responses/compact` answers with."""
    return orjson.dumps(
        {
            "id": new_id("resp_"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [item],
            "usage": usage.as_dict(),
        }
    )


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}
