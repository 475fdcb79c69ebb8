"""API-key authentication for both transports (HTTP requests and WebSocket upgrades).

Owns the set of accepted keys and the three names of a key, none of which is the
secret: its id (`key_id`, a digest that names the owner of stored responses, stable
across restarts and never shown outside the process), its tenant label, the name
usage totals and `/metrics` show, and its cache salt, the name the engine's prefix
cache is partitioned by (`--engine-cache-scope`). An operator names keys
(`--api-keys name:sk-...`); an unnamed key is labelled by a keyed hash (HMAC-SHA256
under a secret the operator sets or the process draws), so an unauthenticated
`/metrics` reader cannot test guesses of a weak key against its label. A salt is a
keyed hash too, under the server's own secret, so nobody outside the process can
compute one and a salt seen in an engine's logs gives no key away. Auth is on exactly
when keys are configured.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from typing import NamedTuple

TENANT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class AuthError(Exception):
    """A refused credential: stable `code` (`missing_api_key`, `invalid_api_key`);
    the transports answer 401 `authentication_error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@functools.lru_cache(maxsize=1024)
def key_id(key: str) -> str:
    """The owner name of an API key in the store: `key_` + 12 hex digits of its SHA-256.
    Stable across restarts (stored rows keep their owner); never rendered on
    `/metrics` or any response, where the tenant label stands instead. Remembered for
    the configured keys (several lookups per HTTP request)."""
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def keyed_label(key: str, secret: bytes) -> str:
    """The tenant label of an unnamed key: `key_` + 12 hex digits of HMAC-SHA256."""
    return "key_" + hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:12]


CACHE_SCOPES = ("key", "name", "shared")
"""`--engine-cache-scope`: each key its own engine prefix cache, keys of one name one
cache, or one cache for all (no salt)."""


def cache_salt(group: str, secret: bytes) -> str:
    """The salt of a cache group (`key:<secret>` or `name:<name>`): 32 hex digits
    (128 bits) of HMAC-SHA256 under the server's secret, within every engine's
    limits (vLLM: at most 128 characters, none of `@/\\`)."""
    return hmac.new(secret, group.encode(), hashlib.sha256).hexdigest()[:32]


def parse_entry(entry: str) -> tuple[str | None, str]:
    """`name:secret` or a bare `secret` (an entry whose text before its first `:` is
    not a tenant name, 1-64 of `[A-Za-z0-9_.-]`, is a bare secret)."""
    name, sep, secret = entry.partition(":")
    if sep and secret and TENANT_NAME.fullmatch(name):
        return name, secret
    return None, entry


class Credential(NamedTuple):
    """An accepted key: the secret (the protocol layer's principal, hashed by the
    ledger before anything is stored), its store id and its tenant label."""

    key: str
    id: str
    label: str


class ApiKeys:
    """The accepted keys (`--api-keys` entries, `name:secret` or `secret`).
    `label_secret` keys the hash that labels unnamed keys; None draws one for the
    process (labels then change at every start). `cache_scope` (one of `CACHE_SCOPES`)
    says which keys share a cache salt, `cache_secret` keys the salts (None: drawn for
    the process, so no engine cache outlives it)."""

    def __init__(
        self,
        entries: Iterable[str] = (),
        label_secret: str | None = None,
        *,
        cache_scope: str = "key",
        cache_secret: bytes | None = None,
    ) -> None:
        if cache_scope not in CACHE_SCOPES:
            raise ValueError(f"unknown engine cache scope {cache_scope!r}")
        secret = label_secret.encode() if label_secret else secrets.token_bytes(32)
        salt_secret = cache_secret or secrets.token_bytes(32)
        self._keys: dict[bytes, Credential] = {}
        self._by_key: dict[str, Credential] = {}
        self._salts: dict[str, str] = {}
        for entry in entries:
            if not entry:
                continue
            name, key = parse_entry(entry)
            credential = Credential(key, key_id(key), name or keyed_label(key, secret))
            self._keys[key.encode()] = credential
            self._by_key[key] = credential
            if cache_scope != "shared":
                group = f"name:{name}" if cache_scope == "name" and name else f"key:{key}"
                self._salts[key] = cache_salt(group, salt_secret)

    def cache_salt(self, principal: str | None) -> str | None:
        """The salt `principal`'s requests carry to the engine: None when auth is off
        (one tenant) or every key shares the cache (`shared`)."""
        return None if principal is None else self._salts.get(principal)

    def label(self, principal: str | None) -> str | None:
        """The tenant label of an authenticated principal (None when auth is off)."""
        if principal is None:
            return None
        credential = self._by_key.get(principal)
        return None if credential is None else credential.label

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def authenticate(self, authorization: bytes | None) -> Credential | None:
        """The key an `Authorization` header value names, None when auth is off.
        Raises AuthError when auth is on and the header is missing or wrong."""
        if not self._keys:
            return None
        if not authorization:
            raise AuthError(
                "missing_api_key",
                "No API key provided: send it as 'Authorization: Bearer <key>'.",
            )
        scheme, _, secret = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not secret:
            raise AuthError(
                "invalid_api_key",
                "Malformed Authorization header: expected 'Bearer <key>'.",
            )
        secret = secret.strip()
        for known, credential in self._keys.items():
            # Constant-time per comparison: response time does not leak a key prefix.
            if hmac.compare_digest(known, secret):
                return credential
        raise AuthError("invalid_api_key", "Incorrect API key provided.")


__all__ = [
    "CACHE_SCOPES",
    "ApiKeys",
    "AuthError",
    "Credential",
    "cache_salt",
    "key_id",
    "keyed_label",
    "parse_entry",
]
