"""The golden ids of tests/golden/tokenizers/ (written once from each family's reference
encoder by tests/golden/make_tokenizer_golden.py), checked through the Python API; the
same files are checked by `cargo test` (rust/tests/tokenizer_golden.rs)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from hotloop import Tokenizer, native_deps

GOLDEN = Path(__file__).parent / "golden" / "tokenizers"


def _load(source: dict[str, str]) -> Tokenizer:
    ((kind, where),) = source.items()
    path = Path(
        where.replace("<cache>", str(native_deps.cache_root())).replace(
            "<site>", sysconfig.get_paths()["purelib"]
        )
    )
    if kind == "gguf":
        return Tokenizer.from_gguf(path)
    if kind == "sentencepiece":
        return Tokenizer.from_sentencepiece_model(path.read_bytes())
    if kind == "tekken":
        return Tokenizer.from_tekken(path.read_text())
    return Tokenizer.from_tokenizer_json(path.read_text())


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden_ids(path: Path) -> None:
    doc: dict[str, Any] = json.loads(path.read_text())
    tok = _load(doc["source"])
    assert len(doc["cases"]) > 50
    for case in doc["cases"]:
        assert tok.encode(case["text"]) == case["ids"], (path.stem, case["text"][:80])
