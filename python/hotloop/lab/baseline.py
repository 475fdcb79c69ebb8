"""`hotloop bench serve --baseline FLAVOUR`: `hotloop serve` with a stateless peer's
per-turn prompt work (hotloop.lab.peer) run on every turn, for the agent benchmark's
"what a user would otherwise run" (docs/benchmarks.md).

The peer is installed from outside the server, which knows nothing of it: `PeerEngine`
wraps the engine and feeds it, on a response's first engine call, the prompt the peer
renders from the request (`engines.base.SERVING` names the response and its request);
later calls of the same response (a steered or resumed turn) and hotloop's own prompt
work are left as they are. The peer is one of the ledger's `watchers`, so every
finished response reaches its message store. One peer per process, shared by both
transports like the store. `create_app` is the application each uvicorn worker builds
(the flavour comes in `HOTLOOP_BASELINE`, as the configuration comes in `HOTLOOP_*`).

This module owns the wiring only: the rendering is the peer's, the serving the server's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence

from hotloop._core import Prompt
from hotloop.cli import argument_parser, serve, server_config
from hotloop.config import ServerConfig
from hotloop.engines import load_engine
from hotloop.engines.base import SERVING, Engine, EngineSession, Sampling, WrappedEngine
from hotloop.lab.peer import SIM_FORMAT, Peer
from hotloop.transport import App

ENV = "HOTLOOP_BASELINE"


class PeerEngine(WrappedEngine):
    """`engine`, fed the peer's prompt for every response's first engine call."""

    def __init__(self, engine: Engine, peer: Peer) -> None:
        super().__init__(engine)
        self._peer = peer

    def session(self, cache_salt: str | None = None) -> EngineSession:
        return PeerSession(self.engine.session(cache_salt), self._peer)


class PeerSession:
    def __init__(self, session: EngineSession, peer: Peer) -> None:
        self._session = session
        self._peer = peer

    def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        serving = SERVING.get()
        if serving is not None and not self._peer.knows(serving.response_id):
            prompt = self._peer.render_request(serving.response_id, serving.request)
        return self._session.generate(prompt, sampling, route_key)

    async def close(self) -> None:
        await self._session.close()


def with_peer(engine: Engine, config: ServerConfig, peer: Peer) -> App:
    """The whole server around `engine` (`App.from_config`), `peer` installed."""
    app = App.from_config(config, PeerEngine(engine, peer))
    assert app.ledger is not None, "from_config gives the app its ledger"
    app.ledger.watchers.append(peer)
    return app


def create_app() -> App:
    """The application a uvicorn worker builds: `hotloop.cli.create_app`'s, with the
    peer named in `HOTLOOP_BASELINE` installed."""
    config = ServerConfig.from_env()
    return with_peer(load_engine(config), config, Peer(os.environ[ENV]))


def run(flavour: str, serve_flags: Sequence[str]) -> None:
    """`hotloop serve SERVE_FLAGS` with the `flavour` peer in every worker."""
    config = server_config(argument_parser().parse_args(["serve", *serve_flags]))
    # The engine is fed the peer's ids: they must be in the sim's vocabulary.
    peer_format = SIM_FORMAT.get(flavour, config.sim_format)
    if config.engine == "sim" and peer_format != config.sim_format:
        raise SystemExit(f"hotloop: --baseline {flavour} renders for --sim-format {peer_format}")
    os.environ[ENV] = flavour
    serve(config, app="hotloop.lab.baseline:create_app")
