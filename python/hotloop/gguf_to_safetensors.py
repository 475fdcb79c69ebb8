"""Convert a GGUF model to a bf16 safetensors model directory vLLM's CPU build loads
(`hotloop setup vllm`; see native_deps.ensure_vllm_model).

Runs inside vLLM's own virtualenv (transformers, torch, gguf, accelerate, safetensors),
never in hotloop's: it imports nothing from hotloop. Usage:
`python gguf_to_safetensors.py GGUF_FILE OUT_DIR`, with `native_deps.OFFLINE_ENV` set.

`save_pretrained` refuses a model loaded from GGUF (it counts as quantized even when
dequantized), so the pieces are written by hand: the weights with safetensors (without
`lm_head.weight` when the embeddings are tied: vLLM ties them itself), `config.json`
without the quantization entry and with the architecture the dump leaves null, the
generation config, and the tokenizer (tokenizer.json, tokenizer_config.json and
chat_template.jinja).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

ARCHITECTURE = "LlamaForCausalLM"


def convert(gguf: Path, out: Path) -> None:
    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
        **kwargs,
    )
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [ARCHITECTURE]
    config["dtype"] = "bfloat16"
    config["torch_dtype"] = "bfloat16"
    state = {name: t.contiguous() for name, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
