"""One real vLLM (CPU build, SmolLM2 run in float32) for a test session, and what the
tests read from it: its `/tokenize`, its Prometheus gauges and counters, its completions.

The `vllm` fixture runs `hotloop setup vllm` on first use (minutes, once per user; its
progress is shown, not captured), starts vLLM on a free loopback port (about a minute),
and stops it by its process group at the end. A machine without the set-up skips with
the command that installs it; in CI that is a failure (tests/missing.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hotloop.engines.base import EngineError
from hotloop.lab.vllm_server import VllmServer
from hotloop.native_deps import NativeSetupError, ensure_vllm, ensure_vllm_model
from missing import missing

HANG_GUARD = 120.0  # seconds; only bounds a broken run, never part of what is checked


@pytest.fixture(scope="session")
def vllm(pytestconfig: pytest.Config) -> Iterator[VllmServer]:
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            python, model = ensure_vllm(), ensure_vllm_model()
        except NativeSetupError as e:
            missing(f"vLLM's CPU build ({e})", "hotloop setup vllm")
        # float32: bf16 greedy text depends on which kernels the CPU selects (AMX
        # ones answer the canary otherwise); the tests check hotloop, not bf16 numerics.
        server = VllmServer(python, model, dtype="float32")
        try:
            server.start()
        except EngineError as e:
            pytest.fail(e.message)
    try:
        yield server
    finally:
        server.stop()


def tokenize(
    server: VllmServer, messages: list[dict[str, Any]], template: str | None = None
) -> list[int]:
    """vLLM's own prompt for `messages`: its chat template (or `template`),
    add_generation_prompt."""
    body = {"model": "smollm2", "messages": messages, "add_generation_prompt": True}
    if template is not None:
        body["chat_template"] = template
    reply = httpx.post(f"{server.url}/tokenize", json=body, timeout=HANG_GUARD)
    reply.raise_for_status()
    tokens: list[int] = reply.json()["tokens"]
    return tokens
