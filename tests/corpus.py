"""The tokenizer test corpus: real text found on this machine plus pathological inputs.

Owns the deterministic selection of documents that exactness tests and encode
benchmarks run on: Python and Rust sources, JSON, logs, man pages (several of them in
non-Latin scripts), CJK reference texts, emoji, and inputs built to break tokenizers
(long runs of one character, a base64 blob, long digit runs, mixed newlines). The same
machine always yields the same corpus; files are taken in sorted order with a fixed
stride and a byte budget per source.
"""

from __future__ import annotations

import base64
import functools
import gzip
import random
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

Document = tuple[str, str]
"""(label, text): the label says where the text came from, for failure messages."""

_MAX_DOCUMENT = 128 * 1024


def _read(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")[:_MAX_DOCUMENT]
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _select(paths: Iterable[Path], budget: int, stride: int = 1) -> Iterator[Document]:
    """Every `stride`-th readable file of `paths` (sorted), until `budget` bytes."""
    used = 0
    for path in sorted(paths)[::stride]:
        text = _read(path)
        if not text:
            continue
        yield str(path), text
        used += len(text.encode())
        if used >= budget:
            return


def _generated_scripts(rng: random.Random) -> Iterator[Document]:
    """Words in scripts and emoji that real files on a build machine rarely hold."""
    blocks = {
        "cyrillic": (0x0410, 0x044F),
        "greek": (0x03B1, 0x03C9),
        "arabic": (0x0621, 0x064A),
        "hebrew": (0x05D0, 0x05EA),
        "devanagari": (0x0905, 0x0939),
        "thai": (0x0E01, 0x0E2E),
        "hangul": (0xAC00, 0xD7A3),
        "cjk": (0x4E00, 0x9FFF),
        "hiragana": (0x3041, 0x3096),
    }
    for name, (lo, hi) in blocks.items():
        words = [
            "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9))) for _ in range(3000)
        ]
        yield f"generated:{name}", " ".join(words)
    emoji = [
        "🙂",
        "👍🏽",
        "👨‍👩‍👧‍👦",
        "🏳️‍🌈",
        "🇫🇷",
        "🇯🇵",
        "1️⃣",
        "❤️",
        "🧑🏿‍💻",
        "🫠",
        "e\u0301",
        "\u200b",
        "\ufeff",
    ]
    yield (
        "generated:emoji",
        "".join(rng.choice([*emoji, " ", "\n", "ok ", "!"]) for _ in range(20_000)),
    )


def pathological(size: int) -> list[Document]:
    """Inputs that make naive BPE or regex splitting quadratic, each `size` bytes."""
    blob = base64.b64encode(random.Random(7).randbytes(size * 3 // 4)).decode()
    newlines = "".join(
        random.Random(8).choice(["\n", "\r\n", "\r", " \n", "\t\r\n", "x"]) for _ in range(size)
    )
    return [
        ("pathological:A", "A" * size),
        ("pathological:spaces", " " * size),
        ("pathological:base64", blob[:size]),
        ("pathological:digits", "".join(str(i % 10) for i in range(size))),
        ("pathological:newlines", newlines[:size]),
        ("pathological:tabs-and-spaces", " \t" * (size // 2)),
        ("pathological:punctuation", "!?" * (size // 2)),
        ("pathological:combining", "a" + "\u0301" * (size // 2)),
    ]


@functools.cache
def documents() -> tuple[Document, ...]:
    """The corpus, several MB, always the same on one machine."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    man = Path("/usr/share/man")
    docs: list[Document] = []
    docs += _select(stdlib.glob("*.py"), 1_200_000, stride=3)
    docs += _select((stdlib / "test" / "cjkencodings").glob("*-utf8.txt"), 200_000)
    docs += _select(site.rglob("*.json"), 400_000, stride=2)
    docs += _select((REPO / "rust").rglob("*.rs"), 300_000)
    docs += _select((Path.home() / ".cargo" / "registry" / "src").rglob("*.rs"), 600_000, stride=97)
    for lang in ("ja", "ko", "ru", "uk", "zh_CN", "zh_TW", "de", "fr", "pl"):
        docs += _select((man / lang).rglob("*.gz"), 150_000, stride=5)
    docs += _select((man / "man1").glob("*.gz"), 400_000, stride=7)
    docs += _select(Path("/var/log").glob("*.log"), 300_000)
    docs += _generated_scripts(random.Random(0))
    docs += pathological(100_000)
    return tuple(docs)


def total_bytes(docs: Iterable[Document]) -> int:
    return sum(len(text.encode()) for _, text in docs)


if __name__ == "__main__":
    corpus = documents()
    print(f"{len(corpus)} documents, {total_bytes(corpus) / 1e6:.1f} MB", file=sys.stderr)
