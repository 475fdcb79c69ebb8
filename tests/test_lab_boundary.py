"""The product apart from its laboratory: no module of hotloop outside `hotloop.lab`
imports it, not even inside a function or for type checking, and a server built and
run as `hotloop serve` builds it has no module of the laboratory loaded. The laboratory
(benchmarks, fakes and models of engines and peers, launchers of test servers) imports
the server, never the other way round."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import hotloop

PACKAGE = Path(hotloop.__file__).resolve().parent
LAB = "hotloop.lab"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(source: str, module: str, package: str) -> set[str]:
    """Every module `source` (module `module` of `package`) imports, wherever the
    statement is (module level, inside a function, under `if TYPE_CHECKING`), relative
    imports resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            # `from hotloop import lab` names the module in the alias.
            found.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return found


def _imported_by(path: Path) -> set[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imported(path.read_text(), module, package)


def _in_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def _runtime_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _in_lab(_module_name(path)) and "__pycache__" not in path.parts
    ]


def test_no_module_of_the_server_imports_the_laboratory() -> None:
    runtime = _runtime_modules()
    assert len(runtime) > 50  # the whole server was read, not an empty glob
    arrows = {
        _module_name(path): sorted(name for name in _imported_by(path) if _in_lab(name))
        for path in runtime
    }
    assert {module: names for module, names in arrows.items() if names} == {}


def test_the_walk_sees_every_kind_of_import() -> None:
    """It would have caught the arrows the server had: `cli.py` imported the laboratory
    at module level, `engines/sim.py` inside a function."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import hotloop.lab.proc\n"
        "if TYPE_CHECKING:\n    from ..lab import peer\n"
        "def f():\n    from hotloop.lab.open_model import QWEN3_TOKENS\n"
        "def g():\n    from hotloop import lab\n"
    )
    found = _imported(source, "hotloop.engines.example", "hotloop.engines")
    assert {name for name in found if _in_lab(name)} == {
        "hotloop.lab",
        "hotloop.lab.proc",
        "hotloop.lab.peer",
        "hotloop.lab.open_model",
        "hotloop.lab.open_model.QWEN3_TOKENS",
    }


# Imports the modules of the server named on its command line, builds the application
# `hotloop serve` runs (`create_app`, from the environment) over the sim in every one of
# its formats, and the command line: then lists what of the laboratory is loaded.
SERVER = """
import importlib, os, sys
os.environ.update(HOTLOOP_ENGINE="sim", HOTLOOP_DATA_DIR=sys.argv[1])
for name in sys.argv[2:]:
    importlib.import_module(name)
from hotloop import cli
from hotloop.engines.sim import SIM_FORMATS
for name in SIM_FORMATS:
    os.environ["HOTLOOP_SIM_FORMAT"] = name
    cli.create_app()
cli.argument_parser().parse_args(["serve", "--engine", "sim"])
print(sorted(m for m in sys.modules if m == "hotloop.lab" or m.startswith("hotloop.lab.")))
"""


def test_the_server_runs_with_no_module_of_the_laboratory_loaded(tmp_path: Path) -> None:
    # Every module of the server but the converter `hotloop setup vllm` runs in vLLM's own
    # virtualenv (it needs torch).
    modules = [_module_name(path) for path in _runtime_modules()]
    modules.remove("hotloop.gguf_to_safetensors")
    out = subprocess.run(
        [sys.executable, "-c", SERVER, str(tmp_path), *modules],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines()[-1] == "[]"
