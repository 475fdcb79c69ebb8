"""The npm clients the tests run (tests/node: openai-node; tests/aisdk: the Vercel AI
SDK; tests/codex: the Codex CLI), each a package with its own lockfile. `make test`
installs them with `npm ci`; run alone, a test installs a missing one the same way. node
must be on PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson

TESTS = Path(__file__).parent


def installed(package: str) -> Path:
    """The directory of the client package `package` (tests/<package>), installed."""
    assert shutil.which("node") and shutil.which("npm"), "node and npm are required"
    directory = TESTS / package
    if not (directory / "node_modules").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=directory,
            check=True,
        )
    return directory


def run(script: Path, *args: str) -> dict[str, object]:
    """Run a client script; its last line of output is its JSON result."""
    done = subprocess.run(["node", str(script), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result
