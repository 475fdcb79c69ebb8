"""The Codex CLI itself (npm `@openai/codex`, tests/codex, see `node_clients`) against a
live hotloop server over the WebSocket: `codex exec` with hotloop as its model provider
(`wire_api = "responses"`, `supports_websockets = true`) runs a whole tool loop. The sim
calls Codex's `exec_command` tool once; Codex runs the command on this machine, sends its
output back as the next turn over the same socket, and prints the sim's answer. Every
frame the server sent is checked against the SDK's models (`servers.Validating`).
tests/test_ws_codex.py replays Codex-shaped frames written by hand; this runs Codex."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript
from hotloop.transport import App
from hotloop.transport.asgi import RECEIVE_UTF8, Message, Receive, Scope, Send
from hotloop.transport.encoding import decoded
from node_clients import installed
from servers import Validating, serving, sim_engine

MARK = "hotloop-codex-ok"
SCRIPT = SimScript(
    text="All done.",
    tool="exec_command",
    tool_calls=1,
    tool_arguments=f'{{"cmd":"echo {MARK}"}}',
)


@pytest.fixture(scope="module")
def codex() -> Path:
    return installed("codex") / "node_modules" / ".bin" / "codex"


def test_codex_runs_a_tool_loop_over_the_websocket(codex: Path, tmp_path: Path) -> None:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    app = App.from_config(
        ServerConfig(engine="sim", api_keys=("sk-codex",), data_dir=str(tmp_path / "data")),
        sim_engine(SCRIPT),
    )
    checked = Validating(app)
    with serving(checked) as url:
        provider = (
            f'{{name="hotloop", base_url="{url}/v1", wire_api="responses", '
            'env_key="HOTLOOP_TEST_KEY", supports_websockets=true}'
        )
        done = run_codex(
            codex, home, work, provider, "Run the check.", env={"HOTLOOP_TEST_KEY": "sk-codex"}
        )
        metrics = httpx.get(url + "/metrics", timeout=30).text
    assert checked.invalid == []
    assert done.returncode == 0, done.stdout + done.stderr
    # Codex ran the call hotloop streamed (its transcript goes to stderr), sent the
    # command's output back, and printed the answer that followed (stdout).
    assert f"echo {MARK}" in done.stderr and f"\n{MARK}\n" in done.stderr, done.stderr
    assert done.stdout.strip() == "All done."
    # Over the WebSocket: the call's turn and the answer's, the second continuing the
    # first from the connection's cache.
    assert sample(metrics, 'hotloop_turns_total{transport="websocket",outcome="completed"}') >= 2
    assert sample(metrics, 'hotloop_prompt_tokens_total{source="cache"}') > 0


def test_codex_calls_a_function_of_its_namespace_tool(codex: Path, tmp_path: Path) -> None:
    """Codex sends its sub-agent tools as the `namespace` tool `multi_agent_v1`. The sim
    calls `multi_agent_v1.close_agent` for an agent that does not exist: Codex routes the
    call (`name` and `namespace`) to its agent tools, whose refusal comes back as the
    call's output, and prints the answer of the turn after it."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    script = SimScript(
        text="All done.",
        tool="multi_agent_v1.close_agent",
        tool_calls=1,
        tool_arguments='{"target":"nope"}',
    )
    recorded = Recording(
        App.from_config(
            ServerConfig(engine="sim", api_keys=("sk-codex",), data_dir=str(tmp_path / "data")),
            sim_engine(script),
        )
    )
    checked = Validating(recorded)
    with serving(checked) as url:
        provider = (
            f'{{name="hotloop", base_url="{url}/v1", wire_api="responses", '
            'env_key="HOTLOOP_TEST_KEY", supports_websockets=true}'
        )
        done = run_codex(
            codex, home, work, provider, "Close it.", env={"HOTLOOP_TEST_KEY": "sk-codex"}
        )
    assert checked.invalid == []
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "All done."
    namespaces = [t["name"] for t in recorded.turns[0][1]["tools"] if t["type"] == "namespace"]
    assert "multi_agent_v1" in namespaces
    outputs = [
        str(item["output"])
        for _, body in recorded.turns
        for item in body["input"]
        if item.get("type") == "function_call_output"
    ]
    # The agent tools' own refusal, not Codex's "unsupported call".
    assert len(outputs) == 1 and "invalid agent id nope" in outputs[0], outputs


def run_codex(
    codex: Path,
    home: Path,
    work: Path,
    provider: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`codex exec *args` (the prompt last) with `provider` as its model provider "hotloop"."""
    return subprocess.run(
        [
            str(codex),
            "exec",
            *args[:-1],
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--model",
            "sim",
            "-c",
            "model_provider=hotloop",
            "-c",
            f"model_providers.hotloop={provider}",
            args[-1],
        ],
        cwd=work,
        env={**os.environ, "CODEX_HOME": str(home), **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def signed_in(tmp_path: Path, script: SimScript) -> tuple[Path, Path, Recording]:
    """Codex's home (signed in with ChatGPT), its working directory, and a hotloop app
    running `script` that accepts the sign-in's token, recorded."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    key = chatgpt_sign_in(home)
    app = App.from_config(
        ServerConfig(engine="sim", api_keys=(key,), data_dir=str(tmp_path / "data")),
        sim_engine(script),
    )
    return home, work, Recording(app)


def sample(metrics: str, name: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


class Recording:
    """Wraps an ASGI app: keeps each `/v1/responses` request Codex made, its headers and
    its JSON body as the server decoded it (`transport/encoding.py`), whether it came as
    an HTTP POST or as a `response.create` frame on a WebSocket (the upgrade's headers)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.turns: list[tuple[dict[str, str], Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode(): v.decode() for k, v in scope.get("headers", ())}
        if scope["type"] == "websocket":

            async def framed() -> Message:
                message = await receive()
                # A large frame comes as its UTF-8 bytes (`RECEIVE_UTF8`).
                data = message.get("text") or message.get(RECEIVE_UTF8)
                if message["type"] == "websocket.receive" and data:
                    body = orjson.loads(data)
                    if body.get("type") == "response.create":
                        self.turns.append((headers, body))
                return message

            await self.app(scope, framed, send)
            return
        if scope["type"] != "http" or scope["path"] != "/v1/responses":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while not messages or messages[-1].get("more_body"):
            messages.append(await receive())
        body = b"".join(m.get("body", b"") for m in messages)
        encoding = headers.get("content-encoding", "").encode()
        self.turns.append(
            (
                headers,
                orjson.loads(decoded(encoding, body, 1 << 26, ServerConfig.max_compressed_frames)),
            )
        )
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


def chatgpt_sign_in(home: Path) -> str:
    """Codex compresses request bodies only when signed in with ChatGPT and talking to a
    provider named "OpenAI" (`responses_request_compression` in codex-rs
    core/src/client.rs; `enable_request_compression` is on by default but alone does
    nothing for an API-key provider). A ChatGPT sign-in is an `auth.json` whose tokens
    Codex reads without checking a signature; its access token is the bearer token
    hotloop checks, so it is returned as the API key to configure."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(value)).rstrip(b"=").decode()

    claims = {
        "email": "codex@example.com",
        "exp": int(time.time()) + 86400,
        "https://api.openai.com/auth": {
            "chatgpt_plan_type": "pro",
            "chatgpt_account_id": "hotloop-test",
        },
    }
    token = f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"
    refreshed = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    (home / "auth.json").write_bytes(
        orjson.dumps(
            {
                "auth_mode": "chatgpt",
                "OPENAI_API_KEY": None,
                "tokens": {
                    "id_token": token,
                    "access_token": token,
                    "refresh_token": "unused",
                    "account_id": "hotloop-test",
                },
                "last_refresh": refreshed,
            }
        )
    )
    return token


def codex_as_openai(
    codex: Path, home: Path, work: Path, url: str, *args: str, websockets: bool = False
) -> subprocess.CompletedProcess[str]:
    """`codex exec *args` signed in with ChatGPT against hotloop as "OpenAI", over HTTP
    unless `websockets` (Codex compresses HTTP bodies only); the ChatGPT apps connector,
    which would call chatgpt.com, is off."""
    provider = (
        f'{{name="OpenAI", base_url="{url}/v1", wire_api="responses", '
        f"requires_openai_auth=true, supports_websockets={str(websockets).lower()}}}"
    )
    return run_codex(codex, home, work, provider, "-c", "features.apps=false", *args)


def test_codex_sends_zstd_bodies_through_a_tool_loop(codex: Path, tmp_path: Path) -> None:
    home, work, recorded = signed_in(tmp_path, SCRIPT)
    with serving(recorded) as url:
        done = codex_as_openai(codex, home, work, url, "Run the check.")
        metrics = httpx.get(url + "/metrics", timeout=30).text
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"\n{MARK}\n" in done.stderr, done.stderr
    assert done.stdout.strip() == "All done."
    turns = recorded.turns
    # The call's turn and the answer's, both compressed, both answered.
    assert len(turns) == 2
    assert [headers.get("content-encoding") for headers, _ in turns] == ["zstd", "zstd"]
    assert sample(metrics, 'hotloop_turns_total{transport="http",outcome="completed"}') >= 2


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
def test_codex_remote_compaction_gets_a_compaction_item_and_continues(
    codex: Path, tmp_path: Path, websockets: bool
) -> None:
    """Codex compacts remotely (its `remote_compaction_v2`, announced in
    `x-codex-beta-features`) with a ChatGPT sign-in on an "OpenAI" provider. A resumed
    session whose last turn used more tokens than `model_auto_compact_token_limit` is
    compacted before its next turn: one request ending in `compaction_trigger`, whose
    `compaction` item Codex then sends in place of the history."""
    home, work, recorded = signed_in(tmp_path, SimScript(text="All done."))
    with serving(recorded) as url:
        first = codex_as_openai(codex, home, work, url, "Say done.", websockets=websockets)
        assert first.returncode == 0, first.stdout + first.stderr
        again = codex_as_openai(
            codex,
            home,
            work,
            url,
            "resume",
            "--last",
            "-c",
            "model_auto_compact_token_limit=1000",
            "Say done again.",
            websockets=websockets,
        )
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.strip() == "All done."
    kinds = [[item.get("type") for item in body["input"]] for _, body in recorded.turns]
    (trigger,) = [i for i, types in enumerate(kinds) if "compaction_trigger" in types]
    assert kinds[trigger][-1] == "compaction_trigger"
    # The turn after it carries hotloop's compaction item instead of the history.
    assert kinds[trigger + 1].count("compaction") == 1
    assert "compaction_trigger" not in kinds[trigger + 1]
