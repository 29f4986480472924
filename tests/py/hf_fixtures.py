"""Hugging Face shard sets written by the real writers (issue 14), for tests and benchmarks.

Every set here comes from transformers' `save_pretrained` or huggingface_hub's
`save_torch_state_dict`, never from ckptool's own writer, so the reader is judged against
what users actually download. Tiny random GPT-2 and Llama configs, seeded, with a
`max_shard_size` small enough for several shards each.

transformers 5.x writes safetensors only (`safe_serialization=False` is accepted and
ignored, checked in test_hf_index.py), so the `.bin` sets (torch.save zips) come from
huggingface_hub.save_torch_state_dict(safe_serialization=False), the same function
transformers 4.x used to write them.

Library use:  `sets = write_all(root)` -> {name: HfSet}; `write_set(name, dir)` for one.
Command line: `python hf_fixtures.py OUTDIR [--only NAME ...] [--list]`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

# Small enough for 3+ shards of the tiny models below (decimal units, as both writers parse).
SHARD_SIZE = "20KB"


@dataclasses.dataclass
class HfSet:
    name: str
    directory: Path
    index: Path          # the *.index.json
    writer: str          # "save_pretrained" or "save_torch_state_dict"
    serialization: str   # "safetensors" or "bin"
    model_class: str     # transformers class that from_pretrained loads it into, or ""


def _quiet() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def gpt2_model():
    _quiet()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(14)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def llama_model():
    _quiet()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(15)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def _plain_state_dict(model):
    # save_torch_state_dict refuses shared storages in safetensors; GPT-2 ties lm_head to
    # wte, which save_pretrained drops itself. Drop it the same way for the hub writer.
    sd = model.state_dict()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    for k in (tied.keys() if isinstance(tied, dict) else tied):
        sd.pop(k, None)
    return {k: v.contiguous() for k, v in sd.items()}


def _index_in(directory: Path) -> Path:
    found = sorted(directory.glob("*.index.json"))
    if len(found) != 1:
        raise RuntimeError(f"{directory}: expected one *.index.json, found {[p.name for p in found]}")
    return found[0]


def _pretrained(model, directory: Path) -> None:
    model.save_pretrained(directory, max_shard_size=SHARD_SIZE)


def _hub(model, directory: Path, safe: bool) -> None:
    from huggingface_hub import save_torch_state_dict
    save_torch_state_dict(_plain_state_dict(model), directory, max_shard_size=SHARD_SIZE,
                          safe_serialization=safe)


# name -> (model factory, writer, serialization, from_pretrained class)
SETS = {
    "gpt2_pretrained": (gpt2_model, "save_pretrained", "safetensors", "GPT2LMHeadModel"),
    "llama_pretrained": (llama_model, "save_pretrained", "safetensors", "LlamaForCausalLM"),
    "gpt2_hub_st": (gpt2_model, "save_torch_state_dict", "safetensors", ""),
    "gpt2_hub_bin": (gpt2_model, "save_torch_state_dict", "bin", ""),
    "llama_hub_bin": (llama_model, "save_torch_state_dict", "bin", ""),
}


def write_set(name: str, directory: Path) -> HfSet:
    factory, writer, serialization, cls = SETS[name]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = factory()
    if writer == "save_pretrained":
        _pretrained(model, directory)
    else:
        _hub(model, directory, safe=(serialization == "safetensors"))
    return HfSet(name, directory, _index_in(directory), writer, serialization, cls)


def write_all(root: Path, only=None) -> dict[str, HfSet]:
    root = Path(root)
    return {n: write_set(n, root / n) for n in SETS if not only or n in only}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--only", action="append", choices=sorted(SETS))
    ap.add_argument("--list", action="store_true", help="print the set names and exit")
    a = ap.parse_args(argv)
    if a.list or not a.outdir:
        print("\n".join(SETS))
        return 0
    for s in write_all(Path(a.outdir), a.only).values():
        shards = sorted(set(json.loads(s.index.read_text())["weight_map"].values()))
        print(f"{s.name}: {s.index} ({len(shards)} shards, {s.writer}, {s.serialization})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
