"""Benchmark fixtures, written by real PyTorch and safetensors (issue 6).

Every tensor holds random bytes (torch's generator), never zeros and never the holes of
`skip_data`: sparse holes read as zeros without touching the disk and would fake cold
numbers. Floating values are kept finite by clearing the top exponent bit (|x| < 2), so
the bytes stay random but no NaN or Inf appears.

Fixtures (sizes in bytes of tensor payload, close to the requested size):
  llm_bf16.{pt,ts,safetensors}  LLM-like state dict (model.layers.{i}.self_attn.q_proj.weight,
                                 ...; 24 layers, ~300 tensors), bf16. The .pt and TorchScript
                                 forms hold one tied pair (lm_head.weight is
                                 model.embed_tokens.weight) and one non-contiguous view
                                 (model.rotary_emb.cos_even = cos_cached[:, ::2]); safetensors
                                 cannot share storage, so there the tied copy is left out (as
                                 transformers does) and the view is saved contiguous.
  llm_fp32.{pt,safetensors}     the same layout in fp32 at the same byte size.
  compiled_bf16.{pt,safetensors} the llm_bf16 layout (llm_bf16's own tensors when the sizes
                                 agree) under torch.compile keys (_orig_mod.model.layers...),
                                 for rekey --strip-compiled; --s5-size bytes.
  s3_{N}.{pt,safetensors}       the same total bytes as N tensors (N = 8, ~300, 20000, 100000).
  hf_many/, dcp_many/, hf_big/, dcp_big/  sharded checkpoints (S6): see gen_sharded.py.
  dcp_hf_big/                   dcp_big through HuggingFaceStorageWriter (S7, `--what ...,s7`).

Writes manifest.json in the output directory: per fixture its path, format, file size,
payload bytes (unique storage bytes) and tensor count. Every file is fsynced, so that
posix_fadvise(DONTNEED) can drop it from the page cache afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

LAYERS = 24  # ~300 tensors: 24 x 12 per layer + 5


def random_tensor(shape, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bytes, finite values: int64 random words viewed as dtype, with the top exponent
    bit cleared for floating types."""
    numel = 1
    for s in shape:
        numel *= s
    esize = torch.empty(0, dtype=dtype).element_size()
    nbytes = numel * esize
    words = (nbytes + 7) // 8
    raw = torch.empty(words, dtype=torch.int64).random_(generator=gen)
    b = raw.view(torch.uint8)[:nbytes]
    if dtype in (torch.bfloat16, torch.float16):
        b.view(torch.int16).bitwise_and_(-16385)  # 0xBFFF: clear the top exponent bit
    elif dtype == torch.float32:
        b.view(torch.int32).bitwise_and_(-1073741825)  # 0xBFFFFFFF
    t = b.view(dtype).view(*shape)
    return t


def llm_layout(total_bytes: int, esize: int, layers: int = LAYERS):
    """(hidden, kv, inter, vocab) so that embed + layers x per-layer ~= total_bytes."""
    def per_layer(h):
        kv, inter = max(h // 4, 8), (h * 11) // 4
        return (2 * h + h * h + h + 2 * (kv * h + kv) + h * h + 3 * h * inter) * esize
    h = 64
    for cand in (4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64):
        if layers * per_layer(cand) <= 0.9 * total_bytes:
            h = cand
            break
    kv, inter = max(h // 4, 8), (h * 11) // 4
    rest = total_bytes - layers * per_layer(h) - (h + 2 * 128 * (h // 8)) * esize
    vocab = max(16, rest // (h * esize))
    return h, kv, inter, vocab


def llm_state_dict(total_bytes: int, dtype: torch.dtype, gen: torch.Generator, layers: int = LAYERS):
    esize = torch.empty(0, dtype=dtype).element_size()
    h, kv, inter, vocab = llm_layout(total_bytes, esize, layers)
    sd: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    sd["model.embed_tokens.weight"] = random_tensor((vocab, h), dtype, gen)
    for i in range(layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = random_tensor((h,), dtype, gen)
        sd[p + "self_attn.q_proj.weight"] = random_tensor((h, h), dtype, gen)
        sd[p + "self_attn.q_proj.bias"] = random_tensor((h,), dtype, gen)
        sd[p + "self_attn.k_proj.weight"] = random_tensor((kv, h), dtype, gen)
        sd[p + "self_attn.k_proj.bias"] = random_tensor((kv,), dtype, gen)
        sd[p + "self_attn.v_proj.weight"] = random_tensor((kv, h), dtype, gen)
        sd[p + "self_attn.v_proj.bias"] = random_tensor((kv,), dtype, gen)
        sd[p + "self_attn.o_proj.weight"] = random_tensor((h, h), dtype, gen)
        sd[p + "post_attention_layernorm.weight"] = random_tensor((h,), dtype, gen)
        sd[p + "mlp.gate_proj.weight"] = random_tensor((inter, h), dtype, gen)
        sd[p + "mlp.up_proj.weight"] = random_tensor((inter, h), dtype, gen)
        sd[p + "mlp.down_proj.weight"] = random_tensor((h, inter), dtype, gen)
    sd["model.norm.weight"] = random_tensor((h,), dtype, gen)
    cos = random_tensor((128, h // 8 * 2), dtype, gen)
    sd["model.rotary_emb.cos_cached"] = cos
    sd["model.rotary_emb.cos_even"] = cos[:, ::2]  # non-contiguous view of cos_cached
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied pair
    return sd


def many_state_dict(total_bytes: int, count: int, gen: torch.Generator) -> "OrderedDict[str, torch.Tensor]":
    """`count` bf16 tensors of equal size with MoE-like keys, about total_bytes together."""
    per = max(2, total_bytes // count // 2)  # elements per tensor
    cols = 64 if per >= 64 else per
    rows = max(1, per // cols)
    big = random_tensor((count * rows * cols,), torch.bfloat16, gen)
    parts = big.view(count, rows, cols).unbind(0)
    sd: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    if count <= 16:
        for i, t in enumerate(parts):
            sd[f"model.layers.{i}.mlp.experts.weight"] = t.clone()
        return sd
    experts = max(1, -(-count // (3 * 48)))
    i = 0
    for layer in range(10 ** 9):
        for e in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                if i == count:
                    return sd
                sd[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"] = parts[i].clone()
                i += 1
    return sd


class Holder(nn.Module):
    pass


def scripted(sd) -> torch.jit.ScriptModule:
    """A TorchScript module whose state_dict() is sd (parameters for weights and biases,
    buffers for the rest), tied pair and view kept."""
    root = Holder()
    for key, t in sd.items():
        parts = key.split(".")
        m = root
        for p in parts[:-1]:
            if not hasattr(m, p):
                setattr(m, p, Holder())
            m = getattr(m, p)
        if parts[-1] in ("weight", "bias"):
            m.register_parameter(parts[-1], nn.Parameter(t, requires_grad=False))
        else:
            m.register_buffer(parts[-1], t)
    return torch.jit.script(root)


def for_safetensors(sd):
    """safetensors holds no shared storage: drop a tensor that is an exact alias of an earlier
    one (the tied copy, as transformers does), and save other views as contiguous copies."""
    out = OrderedDict()
    seen = {}
    for k, v in sd.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key in seen:
            continue
        seen[key] = k
        out[k] = v
    owner = {}
    for k, v in list(out.items()):
        sp = v.untyped_storage().data_ptr()
        full = v.is_contiguous() and v.storage_offset() == 0 and \
            v.numel() * v.element_size() == v.untyped_storage().nbytes()
        if sp in owner or not full:
            out[k] = v.contiguous().clone()
        else:
            owner[sp] = k
    return out


def payload_bytes(sd) -> int:
    seen, total = set(), 0
    for v in sd.values():
        s = v.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Holder(torch.nn.Module):
    """Parameters only; the forward uses each once so that export lifts them all."""

    def forward(self, x):
        acc = x
        for p in self.parameters():
            acc = acc + p.flatten()[0].float()
        return acc


def export_holding(sd):
    """An ExportedProgram whose state dict is exactly `sd` (a tie is one parameter under two
    names, as nn.Module.state_dict gives it)."""
    import warnings

    root = _Holder()
    seen = {}
    for key, t in sd.items():
        *path, leaf = key.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                setattr(m, part, torch.nn.Module())
            m = getattr(m, part)
        p = seen.get(t.data_ptr())
        if p is None:
            p = seen[t.data_ptr()] = torch.nn.Parameter(t, requires_grad=False)
        m.register_parameter(leaf, p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(root, (torch.zeros(1),))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", type=int, required=True, help="bytes of the llm_* fixtures")
    ap.add_argument("--s3-size", type=int, required=True)
    ap.add_argument("--s3-counts", default="8,300,20000,100000")
    ap.add_argument("--s5-size", type=int, default=0, help="bytes of compiled_bf16 (default: --size)")
    ap.add_argument("--what", default="llm_bf16,llm_fp32,compiled_bf16,s3")
    ap.add_argument("--no-torchscript", action="store_true")
    ap.add_argument("--s6-count", type=int, default=20000, help="tensors of hf_many and keys of dcp_many")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gen = torch.Generator().manual_seed(6)
    what = set(args.what.split(","))
    manifest = {}
    t_all = time.perf_counter()

    def record(name, fmt, path, sd, count):
        fsync_path(path)
        manifest[f"{name}.{fmt}"] = {"name": name, "format": fmt, "path": str(path),
                                     "file_size": path.stat().st_size, "payload": payload_bytes(sd),
                                     "tensors": count}
        print(f"  {path.name}: {path.stat().st_size / 2**20:.1f} MiB, {count} tensors", flush=True)

    def write_three(name, sd, torchscript=True, st=True):
        p = d / f"{name}.pt"
        torch.save(sd, p)
        record(name, "pt", p, sd, len(sd))
        if torchscript and not args.no_torchscript:
            p = d / f"{name}.ts"
            scripted(sd).save(str(p))
            record(name, "ts", p, sd, len(sd))
        if st:
            s = for_safetensors(sd)
            p = d / f"{name}.safetensors"
            save_file(s, str(p))
            record(name, "safetensors", p, s, len(s))

    # One small tensor: the fixed cost of starting each tool (process, libraries, CUDA).
    write_three("startup", OrderedDict([("model.norm.weight", random_tensor((2048,), torch.bfloat16, gen))]))
    s5_size = args.s5_size or args.size
    if "llm_bf16" in what or "compiled_bf16" in what:
        sd = llm_state_dict(args.size, torch.bfloat16, gen) if "llm_bf16" in what or s5_size == args.size else None
        if "llm_bf16" in what:
            write_three("llm_bf16", sd)
        if "compiled_bf16" in what:
            src = sd if s5_size == args.size else llm_state_dict(s5_size, torch.bfloat16, gen)
            csd = OrderedDict(("_orig_mod." + k, v) for k, v in src.items())
            write_three("compiled_bf16", csd, torchscript=False)
            del src, csd
        del sd
    if "llm_fp32" in what:
        sd = llm_state_dict(args.size, torch.float32, gen)
        write_three("llm_fp32", sd, torchscript=False)
        del sd
    if "s3" in what:
        for count in [int(c) for c in args.s3_counts.split(",") if c]:
            if 200 <= count <= 400:
                sd = llm_state_dict(args.s3_size, torch.bfloat16, gen,
                                    layers=max(1, (count - 5) // 12))
                sd = for_safetensors(sd)  # the same tensors in both forms
            else:
                sd = many_state_dict(args.s3_size, count, gen)
            write_three(f"s3_{count}", sd, torchscript=False)
            del sd
    if "s6" in what:
        import gen_sharded

        def record_dir(name, fmt, path, payload, count):
            size = gen_sharded.dir_size(path)
            manifest[name] = {"name": name, "format": fmt, "path": str(path), "file_size": size,
                              "payload": payload, "tensors": count}
            print(f"  {path.name}/: {size / 2**20:.1f} MiB, {count} tensors", flush=True)
        gen_sharded.write_all(d, args.size, args.s6_count, gen, record_dir, hf_dcp="s7" in what)
    if "s11" in what:
        # S11 (issue 16): a torch.export archive of ~300 weights and a torch.save zip of the
        # same weights, the size of the llm_* fixtures.
        sd = llm_state_dict(args.size, torch.bfloat16, gen, layers=max(1, (300 - 5) // 12))
        p = d / "s11.pt2"
        torch.export.save(export_holding(sd), p)
        record("s11", "pt2", p, sd, len(sd))
        p = d / "s11.pt"
        torch.save(sd, p)
        record("s11", "pt", p, sd, len(sd))
        del sd
    manifest_path = d / "manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=1))
    print(f"  fixtures written in {time.perf_counter() - t_all:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
