"""What a test does when something the project's own set-up installs is missing: on a
developer's machine it skips with the command that installs it; in CI (`CI` set, as
`.ci/run` does), where `make test` installed everything, it fails, so a broken install
step cannot hide behind a skip. The same for a fault a test stages itself
(`cannot_set_up`)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str, setup: str) -> NoReturn:
    message = f"{what} is not installed: run `{setup}`"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (in CI the set-up must have installed it)")
    pytest.skip(message)


def cannot_set_up(what: str, why: str) -> NoReturn:
    """A fault the test stages itself (a small filesystem, a read-only mount) that this
    machine refuses: a skip on a developer's machine without the privilege, a failure in
    CI, which runs as root and must run every fault test."""
    message = f"cannot set up {what} here: {why}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI must run this fault test)")
    pytest.skip(message)
