"""What a test does when something the project's own set-up installs is missing: on a
developer's machine it skips with the command that installs it; in CI (`CI` set, as
`.ci/run` does), where `make test` installed everything, it fails, so a broken install
step cannot hide behind a skip."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str, setup: str) -> NoReturn:
    message = f"{what} is not installed: run `{setup}`"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (in CI the set-up must have installed it)")
    pytest.skip(message)
