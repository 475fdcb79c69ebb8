"""`hotloop bench serve --baseline`: the peer is installed from outside the server
(hotloop.lab.baseline). The engine is fed the peer's prompt on a response's first
engine call, the peer's message store gets every finished response, and a peer whose
ids are not in the sim's vocabulary is refused before the server starts."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from hotloop._core import ChatFormat, CreateRequest, Prompt
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimEngine, SimScript
from hotloop.lab.baseline import PeerSession, run, with_peer
from hotloop.lab.peer import Peer
from hotloop.protocol import CacheBudget, Connection, ConnectionCache, Generate
from servers import FAST, HANG_GUARD, serving
from websockets.sync.client import connect


class FixedPeer:
    """A peer whose prompt is recognisable."""

    def __init__(self) -> None:
        self.prompt = Prompt.from_tokens([7, 8, 9])
        self.rendered: list[str] = []

    def knows(self, response_id: str) -> bool:
        return response_id in self.rendered

    def render_request(self, response_id: str, request: CreateRequest) -> Prompt:
        self.rendered.append(response_id)
        return self.prompt


class Recording:
    """An engine session that keeps the prompts it is given and samples nothing."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        self.prompts.append(prompt.tokens())
        for ids in ():
            yield ids

    async def close(self) -> None:
        pass


def _work() -> Generate:
    connection = Connection(
        chat_format=ChatFormat.harmony(),
        context_window=1 << 16,
        model="sim",
        cache=ConnectionCache(1 << 20, CacheBudget(1 << 20)),
    )
    connection.receive_text('{"type":"response.create","model":"sim","input":"Hi"}')
    (work,) = [a for a in connection.actions() if isinstance(a, Generate)]
    return work


async def test_the_engine_is_fed_the_peers_prompt_on_a_responses_first_call() -> None:
    work, peer, engine = _work(), FixedPeer(), Recording()
    session = PeerSession(engine, peer)  # type: ignore[arg-type]
    # Each call as the transports make it: in a task (a context) of its own.
    for _ in range(2):
        stream = contextvars.Context().run(work.start, session)
        assert [ids async for ids in stream] == []
    first, again = engine.prompts
    assert first == [7, 8, 9]
    assert peer.rendered == [work.serving.response_id]
    # A second call of the same response (a steered turn resumed) is hotloop's own.
    assert again == work.prompt.tokens() != first
    # A call that names no response (none of the protocol's) is left as it is.
    stream = session.generate(work.prompt, work.sampling, work.route_key)
    assert [ids async for ids in stream] == []
    assert engine.prompts[-1] == work.prompt.tokens()


def test_the_peer_serves_a_chain_from_its_own_store(tmp_path: Path) -> None:
    """Over a real server: the sim says the prompt it was fed, which is the `template`
    peer's ChatML (the sim's own format is harmony); the second turn, which names the
    first by `previous_response_id`, is rendered from the peer's store, which the first
    response's output reached when it finished."""
    config = ServerConfig(engine="sim", data_dir=str(tmp_path))
    engine = SimEngine(ChatFormat.harmony(), model="sim", speed=FAST, script=SimScript(echo=True))
    peer = Peer("template")
    app = with_peer(engine, config, peer)
    with serving(app) as url, connect(url.replace("http", "ws") + "/v1/responses") as socket:

        def turn(**fields: object) -> dict[str, object]:
            create = {"type": "response.create", "model": "sim", **fields}
            socket.send(orjson.dumps(create).decode())
            while True:
                event = orjson.loads(socket.recv(HANG_GUARD))
                if event["type"] == "response.completed":
                    response: dict[str, object] = event["response"]
                    return response

        def said(response: dict[str, object]) -> str:
            (message,) = response["output"]  # type: ignore[misc]
            text: str = message["content"][0]["text"]
            return text

        first = turn(input="Hi")
        assert "<|im_start|>user\nHi<|im_end|>" in said(first)
        second = turn(input="And then?", previous_response_id=first["id"])
        assert f"<|im_start|>assistant\n{said(first)}<|im_end|>" in said(second)
        assert said(second).endswith(
            "<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
        )
    assert peer.knows(str(first["id"])) and peer.knows(str(second["id"]))


def test_a_peer_in_another_format_than_the_sims_is_refused() -> None:
    # A peer feeds the engine its own ids: they must be in the sim's vocabulary.
    with pytest.raises(SystemExit, match="open-model renders for --sim-format smollm2"):
        run("open-model", ["--engine", "sim"])
    with pytest.raises(SystemExit, match="harmony renders for --sim-format harmony"):
        run("harmony", ["--engine", "sim", "--sim-format", "smollm2"])
