"""docs/configuration.md is generated from the command line's own definitions: it is
current, complete, and follows a flag added to the parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hotloop import native_deps
from hotloop.cli import argument_parser, main
from hotloop.config import ServerConfig
from hotloop.docgen import configuration_page
from hotloop.engines import ENGINES

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_the_committed_page_is_what_the_code_generates() -> None:
    generated = configuration_page(argument_parser(lab=True), ENGINES)
    assert PAGE.read_text() == generated, "docs/configuration.md is stale: run `make docs`"


def test_every_flag_and_variable_is_on_the_page() -> None:
    page = configuration_page(argument_parser(lab=True), ENGINES)
    for option in ServerConfig.options():
        assert f"`--{option.name.replace('_', '-')}" in page
        assert f"`{ServerConfig.env_name(option.name)}`" in page
    for variable in native_deps.ENVIRONMENT:
        assert f"`{variable}`" in page
    for command in ("hotloop setup", "hotloop bench agent", "hotloop bench load", "hotloop docs"):
        assert f"## `{command}`" in page
    # Each engine's options get its own section.
    for engine in ENGINES:
        assert f"### `--engine {engine}`" in page


def test_a_flag_added_to_the_parser_reaches_the_page() -> None:
    parser = argument_parser(lab=True)
    before = configuration_page(parser, ENGINES)
    setup = next(
        action.choices["setup"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    setup.add_argument("--dry-run-of-a-new-flag", default=3, help="a flag someone added")
    after = configuration_page(parser, ENGINES)
    assert after != before
    assert "| `--dry-run-of-a-new-flag` | 3 | a flag someone added |" in after


def test_hotloop_docs_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    main(["docs", "configuration"])
    assert capsys.readouterr().out == configuration_page(argument_parser(lab=True), ENGINES)
