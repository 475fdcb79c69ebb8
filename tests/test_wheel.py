"""The wheel as pip users get it: built once per session (or taken from
`HOTLOOP_WHEEL`, e.g. `make wheel`'s), installed into a fresh virtualenv whose PATH has
no Rust toolchain, then used the way a user would: `hotloop --version`, `hotloop serve
--engine sim` with a two-turn openai-SDK conversation over the WebSocket,
`hotloop.TokenCache`, and every optional extra resolving to installable wheels.

pip's download cache is left on, so after the first run the install costs seconds.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hotloop.lab.proc import ServerProcess
from openai import OpenAI

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parent.parent
# Bounds for the slow steps, so a stuck build or install fails instead of hanging CI.
BUILD_TIMEOUT = 1800
INSTALL_TIMEOUT = 600


def run(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: Path) -> str:
    result = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("HOTLOOP_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    maturin = shutil.which("maturin", path=str(Path(sys.executable).parent)) or "maturin"
    # The same profile and features as `maturin develop --release`: cargo reuses its build.
    run(
        [maturin, "build", "--release", "--quiet", "--out", str(out)],
        env=dict(os.environ),
        timeout=BUILD_TIMEOUT,
        cwd=ROOT,
    )
    (built,) = out.glob("hotloop-*.whl")
    return built


@pytest.fixture(scope="session")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh virtualenv and the environment of a user without Rust: its PATH holds
    the virtualenv and the system's directories only."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "CARGO_HOME", "RUSTUP_HOME", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is on the user's PATH"
    yield venv, env


@pytest.fixture(scope="session")
def installed(wheel: Path, user_env: tuple[Path, dict[str, str]]) -> tuple[Path, dict[str, str]]:
    venv, env = user_env
    # Only wheels: a dependency that would compile (and need a toolchain) fails here.
    run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--only-binary",
            ":all:",
            str(wheel),
        ],
        env=env,
        timeout=INSTALL_TIMEOUT,
        cwd=venv,
    )
    return venv, env


def test_the_wheel_is_abi3(wheel: Path) -> None:
    assert "-abi3-" in wheel.name, wheel.name


def test_version(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    out = run([str(venv / "bin" / "hotloop"), "--version"], env=env, timeout=60, cwd=venv)
    assert out.strip() == f"hotloop {importlib.metadata.version('hotloop')}"


def test_token_cache_from_the_installed_package(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    script = (
        "import hotloop, sys\n"
        "from hotloop import TokenCache\n"
        "from hotloop._core import ChatFormat\n"
        "cache = TokenCache(ChatFormat.harmony(), max_bytes=1 << 20)\n"
        "first = cache.append('s', [{'role': 'user', 'content': 'Fix the test.'}])\n"
        "n = len(first.tokens())\n"
        "second = cache.append('s', [{'role': 'user', 'content': 'Now run it.'}])\n"
        "print(hotloop.__file__, n, len(second.tokens()))\n"
    )
    path, first, second = run(
        [str(venv / "bin" / "python"), "-c", script], env=env, timeout=60, cwd=venv
    ).split()
    assert Path(path).is_relative_to(venv), "imported from the checkout, not the wheel"
    assert 0 < int(first) < int(second)


def test_serve_sim_and_a_two_turn_conversation(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    flags = ["--engine", "sim", "--sim-text", "Hello from the wheel."]
    with ServerProcess.start(flags, command=[str(venv / "bin" / "hotloop")], env=env) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        responses = []
        with client.responses.connect() as conn:
            for question in ("Say hello.", "Again?"):
                previous = {"previous_response_id": responses[-1].id} if responses else {}
                conn.response.create(model="sim", input=question, store=False, **previous)
                for event in conn:
                    if event.type == "response.completed":
                        responses.append(event.response)
                        break
    first, second = responses
    assert first.output_text == second.output_text == "Hello from the wheel."
    assert second.previous_response_id == first.id
    # Turn 2's prompt came from the server's rendered-token cache.
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_every_extra_resolves_to_wheels(
    wheel: Path, installed: tuple[Path, dict[str, str]]
) -> None:
    venv, env = installed
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        extras = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Provides-Extra:")
        ]
    # `test` and `dev` serve this repository (`make develop` installs them in CI);
    # the rest are for users, named for what they enable.
    for_users = [extra for extra in extras if extra not in ("test", "dev")]
    assert "bench" in for_users
    # One resolution for all of them; --dry-run downloads metadata, installs nothing.
    requirement = f"hotloop[{','.join(for_users)}] @ {wheel.as_uri()}"
    out = run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--only-binary",
            ":all:",
            requirement,
        ],
        env=env,
        timeout=INSTALL_TIMEOUT,
        cwd=venv,
    )
    assert "Would install" in out
