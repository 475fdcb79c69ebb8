"""`hotloop serve` with a bad flag, path or file: through the real command line, each
class of misconfiguration ends with one line on stderr that names what is wrong and a
non-zero exit, before anything says it is serving (no traceback, no false start, no
workers restarted for ever)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HANG_GUARD = 60.0  # seconds; only bounds a broken run (a server that did start)


def serve(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The exit status and the whole output (stderr, then stdout) of `hotloop serve`."""
    environment = {**os.environ, "HOTLOOP_DATA_DIR": str(tmp_path / "data"), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "hotloop.cli", "serve", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=environment,
        cwd=tmp_path,
    )
    return done.returncode, done.stderr + done.stdout


def refused(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """The one line `hotloop serve` refused `flags` with."""
    status, output = serve(tmp_path, *flags, env=env)
    lines = [line for line in output.splitlines() if line.strip()]
    assert status != 0, output
    assert "serving" not in output
    assert len(lines) == 1, output
    assert lines[0].startswith("hotloop: ")
    return lines[0]


SIM = ("--engine", "sim")
UPSTREAM = ("--engine", "upstream", "--upstream-replicas", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # A value that does not parse, or out of its range.
        ((*SIM, "--port", "abc"), "--port: expected an integer, got 'abc'"),
        ((*SIM, "--port", "99999"), "--port: expected a TCP port, 0-65535, got '99999'"),
        ((*SIM, "--drain-timeout", "soon"), "--drain-timeout: expected a number, got 'soon'"),
        ((*SIM, "--store", "mysql://db/x"), "--store: expected a postgresql:// or postgres://"),
        ((*SIM, "--store-cache", "memcached://c"), "--store-cache: expected a redis://"),
        # A choice that does not exist, also with several workers.
        (("--engine", "bogus"), "unknown engine 'bogus'; choose one of sim, llama, upstream"),
        (("--engine", "bogus", "--workers", "2"), "unknown engine 'bogus'"),
        ((*SIM, "--sim-format", "nope"), "unknown --sim-format 'nope'"),
        ((*UPSTREAM, "--upstream-dialect", "openai"), "unknown upstream dialect 'openai'"),
        # What an engine needs and was not given, or given wrong.
        (("--engine", "upstream"), "--engine upstream needs --upstream-replicas"),
        (
            ("--engine", "upstream", "--upstream-replicas", "ftp://x"),
            "an upstream URL is http:// or https:// with a host: 'ftp://x'",
        ),
        # A path that is not there.
        (
            ("--engine", "llama", "--llama-model-path", "/nonexistent.gguf"),
            "--llama-model-path: cannot read /nonexistent.gguf: No such file or directory",
        ),
        ((*SIM, "--sim-script", "/nonexistent.json"), "/nonexistent.json: No such file"),
        (
            (*UPSTREAM, "--upstream-format", "chatml", "--upstream-tokenizer", "/nonexistent"),
            "/nonexistent",
        ),
        (
            (*UPSTREAM, "--upstream-tokenizer", "o200k_base", "--chat-template", "/none.jinja"),
            "/none.jinja: No such file or directory",
        ),
    ],
)
def test_a_bad_flag_is_one_line_before_serving(
    tmp_path: Path, flags: tuple[str, ...], said: str
) -> None:
    assert said in refused(tmp_path, *flags)


def test_a_bad_file_is_one_line_before_serving(tmp_path: Path) -> None:
    """Files that are there but not what they should be: a model that is no GGUF, a
    replay script that is no JSON, a data directory under a file."""
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    line = refused(tmp_path, "--engine", "llama", "--llama-model-path", str(text))
    assert line.endswith(f"--llama-model-path: {text} is not a GGUF file")
    script = tmp_path / "script.json"
    script.write_text("{not json")
    line = refused(tmp_path, *SIM, "--sim-script", str(script))
    assert f"{script} is not a replay script" in line
    script.write_text('{"rounds": []}')
    line = refused(tmp_path, *SIM, "--sim-script", str(script))
    assert f"{script} is not a replay script" in line
    under = tmp_path / "model.gguf" / "data"
    line = refused(tmp_path, *SIM, "--data-dir", str(under))
    assert line == f"hotloop: {under}: Not a directory"


def test_a_bad_environment_variable_is_one_line_naming_it(tmp_path: Path) -> None:
    line = refused(tmp_path, *SIM, env={"HOTLOOP_MAX_FRAME_BYTES": "lots"})
    assert line == "hotloop: HOTLOOP_MAX_FRAME_BYTES: expected an integer, got 'lots'"


def test_an_address_that_cannot_be_listened_on_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = serve(tmp_path, *SIM, "--port", str(port))
    lines = [line for line in output.splitlines() if line.strip()]
    assert status != 0 and "serving" not in output
    assert lines == [f"hotloop: cannot listen on 127.0.0.1:{port}: Address already in use"]
