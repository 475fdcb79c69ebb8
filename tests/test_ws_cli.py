"""`hotloop serve` options: one table, read from flags and HOTLOOP_* variables."""

from __future__ import annotations

import pytest
from hotloop.cli import argument_parser, config_env, main
from hotloop.config import ServerConfig
from hotloop.engines import load_engine


def test_every_option_has_a_flag_and_an_env_var(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = capsys.readouterr().out
    for option in ServerConfig.options():
        assert "--" + option.name.replace("_", "-") in help_text
        assert ServerConfig.env_name(option.name) in help_text


def test_env_then_overrides() -> None:
    env = {
        "HOTLOOP_PORT": "9001",
        "HOTLOOP_API_KEYS": "k1, k2,",
        "HOTLOOP_WEBSOCKET": "off",
        "HOTLOOP_CONNECTION_LIFETIME": "2.5",
        "HOTLOOP_SIM_TOOL": "exec_command",
    }
    config = ServerConfig.from_env(env, port=9002)
    assert config.port == 9002
    assert config.api_keys == ("k1", "k2") and config.auth
    assert config.websocket is False
    assert config.connection_lifetime == 2.5
    assert config.sim_tool == "exec_command"
    assert ServerConfig.from_env({}).auth is False


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="HOTLOOP_PORT"):
        ServerConfig.from_env({"HOTLOOP_PORT": "eighty"})


def test_config_round_trips_through_the_worker_environment() -> None:
    config = ServerConfig.from_env(
        {}, api_keys=("a", "b"), websocket=False, max_frame_bytes=123, sim_tool="f"
    )
    assert ServerConfig.from_env(config_env(config)) == config


def test_flags_parse_to_typed_values() -> None:
    args = argument_parser().parse_args(
        ["serve", "--port", "8100", "--no-websocket", "--api-keys", "x", "--sim-ttft", "0.5"]
    )
    assert args.port == "8100" and args.websocket is False
    assert ServerConfig.parse("sim_ttft", args.sim_ttft) == 0.5
    assert ServerConfig.parse("api_keys", args.api_keys) == ("x",)


def test_engine_choice_errors_are_clear() -> None:
    with pytest.raises(SystemExit, match="unknown engine 'gpu'"):
        load_engine(ServerConfig(engine="gpu"))
    with pytest.raises(SystemExit, match="--upstream-replicas"):
        load_engine(ServerConfig(engine="upstream"))
    with pytest.raises(SystemExit, match="unknown --sim-format 'gpt2'"):
        load_engine(ServerConfig(engine="sim", sim_format="gpt2"))


def test_sim_engine_from_flags() -> None:
    engine = load_engine(ServerConfig(engine="sim", model="m", sim_tokens_per_second=123.0))
    assert engine.model == "m"
