"""Tenant labels: `/metrics` (unauthenticated) and `/v1/usage` name a key by the
operator's name for it (`--api-keys name:secret`) or by a keyed hash, never by a plain
digest of the secret that a reader could test guesses against."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from hotloop.auth import ApiKeys, AuthError, keyed_label, parse_entry
from hotloop.config import ServerConfig
from hotloop.transport import App
from servers import serving, sim_engine

WEAK = "sk-1234"


def test_entries_name_keys() -> None:
    assert parse_entry("alice:sk-a") == ("alice", "sk-a")
    assert parse_entry("sk-a") == (None, "sk-a")
    # Text before a colon that is no tenant name belongs to the secret.
    assert parse_entry("sk/x:y") == (None, "sk/x:y")
    assert parse_entry("alice:") == (None, "alice:")


def test_labels_are_names_or_keyed_hashes() -> None:
    keys = ApiKeys(["alice:sk-a", WEAK], label_secret="s3cret")
    credential = keys.authenticate(b"Bearer sk-a")
    assert credential is not None and credential.label == "alice"
    with pytest.raises(AuthError):  # the secret is the part after the name
        keys.authenticate(b"Bearer alice:sk-a")
    unnamed = keys.label(WEAK)
    assert unnamed == keyed_label(WEAK, b"s3cret")
    assert unnamed != ApiKeys([WEAK], label_secret="other").label(WEAK)
    assert hashlib.sha256(WEAK.encode()).hexdigest()[:12] not in str(unnamed)
    # Drawn per process without a secret: two starts label a key differently.
    assert ApiKeys([WEAK]).label(WEAK) != ApiKeys([WEAK]).label(WEAK)


def test_metrics_show_no_digest_of_a_key(tmp_path: Path) -> None:
    config = ServerConfig(engine="sim", api_keys=("team-a:sk-a", WEAK), data_dir=str(tmp_path))
    with serving(App.from_config(config, sim_engine())) as base:
        for key in ("sk-a", WEAK):
            reply = httpx.post(
                base + "/v1/responses",
                json={"model": "sim", "input": "hi"},
                headers={"authorization": f"Bearer {key}"},
            )
            assert reply.status_code == 200
        metrics = httpx.get(base + "/metrics").text
        usage = httpx.get(base + "/v1/usage", headers={"authorization": "Bearer sk-a"}).json()
    assert 'key="team-a"' in metrics
    assert hashlib.sha256(WEAK.encode()).hexdigest()[:12] not in metrics
    assert "sk-a" not in metrics and WEAK not in metrics
    assert usage["key"] == "team-a" and usage["responses"] == 1


def test_cache_salts_follow_the_scope_and_the_servers_secret() -> None:
    """Each key its own salt (the default), keys of one name one salt (`name`), or
    none (`shared`, and with auth off); a salt is a keyed hash under the server's
    secret, so it is stable where the secret is and shows nothing of the key."""
    entries = ["team:sk-1", "team:sk-2", "other:sk-3", WEAK]
    salts = {
        scope: ApiKeys(entries, cache_scope=scope, cache_secret=b"s" * 32)
        for scope in ("key", "name", "shared")
    }
    by_key = [salts["key"].cache_salt(k) for k in ("sk-1", "sk-2", "sk-3", WEAK)]
    assert len(set(by_key)) == 4 and None not in by_key
    by_name = [salts["name"].cache_salt(k) for k in ("sk-1", "sk-2", "sk-3", WEAK)]
    assert by_name[0] == by_name[1]
    assert len({by_name[0], by_name[2], by_name[3]}) == 3
    assert [salts["shared"].cache_salt(k) for k in ("sk-1", WEAK)] == [None, None]
    assert ApiKeys().cache_salt(None) is None
    salt = salts["key"].cache_salt(WEAK)
    assert salt == ApiKeys([WEAK], cache_secret=b"s" * 32).cache_salt(WEAK)
    assert salt != ApiKeys([WEAK], cache_secret=b"t" * 32).cache_salt(WEAK)
    assert salt is not None and WEAK not in salt
    assert salt not in (hashlib.sha256(WEAK.encode()).hexdigest(), keyed_label(WEAK, b"s" * 32))
    with pytest.raises(ValueError):
        ApiKeys(entries, cache_scope="tenant")
