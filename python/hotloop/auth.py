"""API-key authentication for both transports (HTTP requests and WebSocket upgrades).

Owns the set of accepted keys and the mapping from a key to its id: a short digest that
names the key in stored responses, usage totals and metrics without ever storing or
exposing the secret itself. Auth is on exactly when keys are configured.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import NamedTuple


class AuthError(Exception):
    """A refused credential: stable `code` (`missing_api_key`, `invalid_api_key`);
    the transports answer 401 `authentication_error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def key_id(key: str) -> str:
    """The public name of an API key: `key_` + 12 hex digits of its SHA-256."""
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Credential(NamedTuple):
    """An accepted key: the secret (the protocol layer's principal, hashed by the
    ledger before anything is stored) and its public id."""

    key: str
    id: str


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._keys = {key.encode(): Credential(key, key_id(key)) for key in keys if key}

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


__all__ = ["ApiKeys", "AuthError", "Credential", "key_id"]
