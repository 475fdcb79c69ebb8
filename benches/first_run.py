"""First-run times, as a new user meets them: wall time of `make serve` until the
server answers, then of `make test`, in a fresh clone with an empty native cache.

    python benches/first_run.py [--serve-only] [--keep] [--fresh-machine]

Clones this checkout's HEAD into a temporary directory, points HOTLOOP_NATIVE_CACHE at
an empty one (pip's and cargo's download caches stay as they are, unless
`--fresh-machine`), runs `make serve` until `GET /health` answers 200 (polled every
second: a server start pushes no event to wait on), stops it, then runs `make test` in
the same clone (so the native cache then holds what `make serve` built, as it would for
that user; with `--fresh-machine`, in a fresh clone of its own). Prints each phase's
wall time and the load average at its start and end: on a shared machine the load
explains most of the spread. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PORT = 18765
SERVE_TIMEOUT = 3600.0


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def time_serve(clone: Path, env: dict[str, str], log: Path) -> float:
    start = time.monotonic()
    with open(log, "w") as out:
        make = subprocess.Popen(
            ["make", "serve", f"PORT={PORT}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while not answers(f"http://127.0.0.1:{PORT}/health"):
                if make.poll() is not None:
                    raise SystemExit(f"make serve exited with {make.returncode}; see {log}")
                if time.monotonic() - start > SERVE_TIMEOUT:
                    raise SystemExit(f"make serve did not answer in {SERVE_TIMEOUT} s")
                time.sleep(1.0)
            return time.monotonic() - start
        finally:
            os.killpg(make.pid, signal.SIGTERM)
            make.wait()


def time_test(clone: Path, env: dict[str, str], log: Path) -> tuple[float, int]:
    start = time.monotonic()
    with open(log, "w") as out:
        status = subprocess.run(
            ["make", "test"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    return time.monotonic() - start, status


def prepare(work: Path, name: str, fresh_machine: bool) -> tuple[Path, dict[str, str]]:
    """A clone of this checkout's HEAD and the environment its first run sees: an empty
    native cache; with `fresh_machine` also an empty cargo home (every crate downloaded
    again; rustup's toolchain stays) and no pip cache."""
    clone, cache = work / name, work / f"{name}-native-cache"
    cache.mkdir()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["HOTLOOP_NATIVE_CACHE"] = str(cache)
    if fresh_machine:
        env["CARGO_HOME"] = str(work / f"{name}-cargo-home")
        env["PIP_NO_CACHE_DIR"] = "1"
    print(f"clone {clone}, native cache {cache}", file=sys.stderr)
    return clone, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-only", action="store_true", help="skip `make test`")
    parser.add_argument("--keep", action="store_true", help="keep the clones and the caches")
    parser.add_argument(
        "--fresh-machine",
        action="store_true",
        help="no cargo or pip caches either, and `make test` in a clone of its own: "
        "each command timed as the first one run on a new machine",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hotloop-first-run-"))
    try:
        clone, env = prepare(work, "serve", args.fresh_machine)
        before = load()
        serve = time_serve(clone, env, work / "serve.log")
        print(f"make serve until it answers: {serve / 60:.1f} min (load {before} -> {load()})")
        if not args.serve_only:
            if args.fresh_machine:
                clone, env = prepare(work, "test", args.fresh_machine)
            before = load()
            test, status = time_test(clone, env, work / "test.log")
            print(f"make test: {test / 60:.1f} min, exit {status} (load {before} -> {load()})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
