"""Reference checkpoints written by the real clients (torch, lightning, safetensors).

Every ``build_<name>(directory)`` writes one file (or a few) into ``directory`` and returns a
:class:`Fixture` that says how the reference client loads it and what ckptool is expected to
find by construction (format, main state dict). The tests compare ``ckptool inspect --json``
with what torch / safetensors report for the file; nothing here looks at ckptool's output.

Run as a script to build the whole set into a directory:

    .venv/bin/python tests/py/fixtures.py OUTDIR [--zip64]
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ANY = object()  # "no expectation" marker for Fixture.state_dict

# Load modes for the reference client.
WEIGHTS_ONLY = "weights_only"  # torch.load(weights_only=True)
FULL = "full"  # torch.load(weights_only=False): only for files we wrote from trusted classes
NEVER = "never"  # must never be loaded by Python (the malicious pickle)
SAFETENSORS = "safetensors"
TORCHSCRIPT = "torchscript"


@dataclass
class Fixture:
    name: str
    path: Path
    format: str  # expected "format" in the JSON
    load: str  # one of the load modes above
    state_dict: Any = ANY  # expected JSON "state_dict" path (list), None, or ANY
    may_refuse: bool = False  # ckptool may exit 3 (unsupported) instead of reading it
    marker: Path | None = None  # file the malicious payload would create
    notes: str = ""
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- models


class TinyMLP(nn.Module):
    def __init__(self, d_in: int = 4, hidden: int = 8, d_out: int = 2):
        super().__init__()
        self.enc = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.dec = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.dec(self.act(self.enc(x)))


class TiedLM(nn.Module):
    """Embedding and lm_head share one Parameter (weight tying, as in GPT-2)."""

    def __init__(self, vocab: int = 11, dim: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(self.norm(self.embed(ids)))


class WholeNet(nn.Module):
    """Pickled whole by torch.save(model): needs weights_only=False to load."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))
        self.note = "whole module"

    def forward(self, x):
        return self.head(self.bn(self.fc(x)))


class ScriptNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.fc = nn.Linear(3, 2)
        self.register_buffer("scale", torch.full((2,), 0.5))

    def forward(self, x):
        return self.fc(self.bn(x)) * self.scale

    @torch.jit.export
    def evaluation_step(self, x, y):
        return F.mse_loss(self.forward(x), y)


class Evil:
    """A pickle payload: unpickling it runs os.system("touch MARKER")."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


# --------------------------------------------------------------------------- helpers


def _seed(n: int = 0) -> None:
    torch.manual_seed(n)


def _full(dtype: torch.dtype, shape=(2, 3)) -> torch.Tensor:
    """A tensor of `dtype` with non-trivial contents."""
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(shape)
    if dtype.is_complex:
        if dtype == torch.complex32:
            return torch.randn(*shape, dtype=torch.complex64).to(torch.complex32)
        return torch.randn(*shape, dtype=dtype)
    if dtype.is_floating_point:
        if dtype.itemsize == 1:  # float8 kinds
            return (torch.randn(*shape) * 2).to(dtype)
        return torch.randn(*shape, dtype=torch.float64).to(dtype)
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return torch.arange(n, dtype=torch.int64).reshape(shape).to(dtype)
    return (torch.arange(n, dtype=torch.int64) - n // 2).reshape(shape).to(dtype)


def _save(obj, path: Path, **kw) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, **kw)
    return path


# --------------------------------------------------------------------------- fixtures


def build_plain(d: Path) -> Fixture:
    _seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    p = _save(model.state_dict(), d / "plain.pt")
    return Fixture("plain", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_tied(d: Path) -> Fixture:
    _seed(2)
    p = _save(TiedLM().state_dict(), d / "tied.pt")
    return Fixture("tied", p, "torch-zip", WEIGHTS_ONLY, state_dict=[],
                   notes="embed.weight and lm_head.weight: two tensors, one storage")


def build_tied_params(d: Path) -> Fixture:
    """The very same Parameter object under two keys: a pickle memo hit (an alias)."""
    _seed(3)
    m = TiedLM()
    params = dict(m.named_parameters(remove_duplicate=False))
    p = _save(params, d / "tied_params.pt")
    return Fixture("tied_params", p, "torch-zip", WEIGHTS_ONLY, state_dict=[],
                   notes="lm_head.weight is an alias of embed.weight")


def build_views(d: Path) -> Fixture:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    other = torch.arange(40, dtype=torch.float64)
    big = torch.arange(100, dtype=torch.int32)
    obj = {
        "base": base,
        "transposed": base.t(),  # stride (1, 6)
        "slice": base[1:, 2:],  # offset 8, stride (6, 1)
        "column": base[:, 3],  # offset 3, stride (6,)
        "every_other": base[::2, ::3],  # stride (12, 3)
        "expanded": torch.arange(3, dtype=torch.float32).unsqueeze(0).expand(5, 3),  # stride (0, 1)
        "as_strided": torch.as_strided(other, (3, 4), (1, 3), 5),
        "as_strided_overlap": torch.as_strided(other, (4, 4), (2, 1), 1),  # overlapping windows
        "lonely_slice": big[37:41],  # only a view of big is saved: storage is all of big
        "channels_last": torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "scalar_view": base[2, 5],  # 0-d view, offset 17
    }
    p = _save(obj, d / "views.pt")
    return Fixture("views", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


DTYPE_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]


def build_dtypes(d: Path) -> Fixture:
    _seed(4)
    obj = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in DTYPE_NAMES:
            dt = getattr(torch, name, None)
            if dt is None:
                continue
            obj[name] = _full(dt, (2, 3))
            obj[name + ".strided"] = _full(dt, (3, 4))[1:, ::2]  # offset 4, stride (4, 2)
    p = _save(obj, d / "dtypes.pt")
    return Fixture("dtypes", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_dtypes_exotic(d: Path) -> Fixture:
    """Bit-packed and raw-bits dtypes torch.save also writes (as UntypedStorage)."""
    obj = {}
    raw = torch.arange(8, dtype=torch.uint8)
    for name in ["float4_e2m1fn_x2", "bits8", "bits1x8", "bits2x4", "bits4x2"]:
        dt = getattr(torch, name, None)
        if dt is not None:
            obj[name] = raw.clone().view(dt)
    if hasattr(torch, "bits16"):
        obj["bits16"] = torch.arange(4, dtype=torch.int16).view(torch.bits16)
    p = _save(obj, d / "dtypes_exotic.pt")
    return Fixture("dtypes_exotic", p, "torch-zip", WEIGHTS_ONLY, state_dict=[], may_refuse=True)


def build_quantized(d: Path) -> Fixture:
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    obj = {
        "qint8": torch.quantize_per_tensor(x, 0.01, 3, torch.qint8),
        "quint8": torch.quantize_per_tensor(x, 0.02, 128, torch.quint8),
        "qint32": torch.quantize_per_tensor(x, 0.001, 0, torch.qint32),
        "per_channel": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3]),
                                                  torch.tensor([0, 1, 2]), 0, torch.qint8),
    }
    p = _save(obj, d / "quantized.pt")
    return Fixture("quantized", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY, may_refuse=True)


def build_scalars_empty(d: Path) -> Fixture:
    obj = {
        "scalar_f32": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7),
        "scalar_bool": torch.tensor(True),
        "scalar_bf16": torch.tensor(1.25, dtype=torch.bfloat16),
        "empty": torch.empty(0),
        "empty_3x0": torch.empty(3, 0, dtype=torch.int32),
        "empty_0x4_bf16": torch.empty(0, 4, dtype=torch.bfloat16),
        "empty_2x0x3": torch.zeros(2, 0, 3, dtype=torch.float64),
        "one": torch.ones(1),
        "ones_1x1x1": torch.ones(1, 1, 1),
    }
    p = _save(obj, d / "scalars_empty.pt")
    return Fixture("scalars_empty", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


LONG_KEY = "layers." + "x" * 10240 + ".weight"
LONG_UTF8_KEY = "é" * 5200 + ".bias"  # > 10 KB in UTF-8
NON_ASCII_KEYS = [
    "日本語.重み",
    "émoji_🔥.weight",
    "Ωmega.β",
    "e\u0301.combining",
    "tab\there.new\nline",
    "quote\"back\\slash",
    "nul\x00inside",
    "",  # the empty key
]


def build_keys(d: Path) -> Fixture:
    obj = {}
    for i, k in enumerate(NON_ASCII_KEYS):
        obj[k] = torch.full((2,), float(i))
    obj[LONG_KEY] = torch.zeros(3)
    obj[LONG_UTF8_KEY] = torch.ones(2, dtype=torch.float16)
    p = _save(obj, d / "keys.pt")
    return Fixture("keys", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_surrogate_key(d: Path) -> Fixture:
    """A key Python can pickle but that is not valid UTF-8 (lone surrogate)."""
    p = _save({"bad\udc80key": torch.ones(2), "ok": torch.zeros(1)}, d / "surrogate_key.pt")
    return Fixture("surrogate_key", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY, may_refuse=True)


def build_nested(d: Path) -> Fixture:
    t1 = torch.randn(3)
    obj = {
        "a": [t1, (torch.ones(2, 2), {"x": torch.zeros(4, dtype=torch.int16)})],
        7: torch.arange(5),
        -1: {"neg": torch.ones(1)},
        "none": None,
        "alias_of_t1": t1,  # the same object again: an alias
        "view_of_t1": t1[1:],  # another tensor object on t1's storage
        "meta_info": {"name": "nested", "version": 3, "ratio": 0.5, "flags": [True, False]},
        "blob": b"\x00\x01bytes",
        "aset": {1, 2, 3},
    }
    p = _save(obj, d / "nested.pt")
    return Fixture("nested", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY)


def build_tensor_root(d: Path) -> Fixture:
    p = _save(torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), d / "tensor_root.pt")
    return Fixture("tensor_root", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY)


def build_list_root(d: Path) -> Fixture:
    p = _save([torch.ones(2), (torch.zeros(1, 3), "label"), 5], d / "list_root.pt")
    return Fixture("list_root", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY)


def build_training_ckpt(d: Path) -> Fixture:
    """The usual hand-written training checkpoint: model / optimizer / epoch."""
    _seed(5)
    model = TinyMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    for _ in range(2):
        loss = model(torch.randn(3, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    obj = {
        "epoch": 2,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "best_acc": 0.875,
        "arch": "TinyMLP",
        "args": {"lr": 1e-3, "layers": [4, 8, 2], "amp": False, "note": None},
    }
    p = _save(obj, d / "training.pt")
    return Fixture("training", p, "torch-zip", WEIGHTS_ONLY, state_dict=["model"])


def build_compiled_sd(d: Path) -> Fixture:
    _seed(6)
    compiled = torch.compile(TinyMLP(), backend="eager")
    compiled(torch.randn(2, 4))
    p = _save(compiled.state_dict(), d / "compiled.pt")
    return Fixture("compiled", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_ddp_compiled(d: Path) -> Fixture:
    """module._orig_mod.* keys: a compiled module inside DDP (real gloo group, one process)."""
    import torch.distributed as dist

    _seed(7)
    compiled = torch.compile(TinyMLP(), backend="eager")
    made_group = False
    try:
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"file://{d / '.pg_store'}", rank=0,
                                    world_size=1)
            made_group = True
        ddp = nn.parallel.DistributedDataParallel(compiled)
        sd = ddp.state_dict()
        how = "DistributedDataParallel(torch.compile(m)) on gloo"
    except Exception as e:  # no gloo here: the same keys by editing a real state dict
        sd = {"module." + k: v for k, v in compiled.state_dict().items()}
        how = f"key edit ({type(e).__name__})"
    finally:
        if made_group:
            dist.destroy_process_group()
        try:
            os.unlink(d / ".pg_store")
        except OSError:
            pass
    p = _save(sd, d / "ddp_compiled.pt")
    return Fixture("ddp_compiled", p, "torch-zip", WEIGHTS_ONLY, state_dict=[], notes=how)


def build_wrapped_keys(d: Path) -> Fixture:
    """Every wrapper segment ckptool knows, by key edits of a real state dict."""
    _seed(8)
    sd = TinyMLP().state_dict()
    out = {}
    for k, v in sd.items():
        out["_forward_module.module._orig_mod." + k] = v
    out["_fsdp_wrapped_module.layer._checkpoint_wrapped_module.weight"] = torch.ones(2)
    out["_fsdp_wrapped_module.layer._checkpoint_wrapped_module.bias"] = torch.zeros(2)
    out["plain.weight"] = torch.ones(1)
    p = _save({"model_state_dict": out, "step": 10}, d / "wrapped_keys.pt")
    return Fixture("wrapped_keys", p, "torch-zip", WEIGHTS_ONLY, state_dict=["model_state_dict"])


def build_params_dict(d: Path) -> Fixture:
    _seed(9)
    obj = {
        "p": nn.Parameter(torch.randn(2, 3)),
        "frozen": nn.Parameter(torch.randn(3), requires_grad=False),
        "grad_tensor": torch.randn(2, requires_grad=True),
        "plain": torch.randn(2),
        "param_bf16": nn.Parameter(torch.randn(4).to(torch.bfloat16)),
        "param_view": nn.Parameter(torch.randn(4, 4)[1:3].t()),
    }
    p = _save(obj, d / "params_dict.pt")
    return Fixture("params_dict", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_whole_module(d: Path) -> Fixture:
    _seed(10)
    m = WholeNet()
    m(torch.randn(5, 3))  # update BatchNorm running stats
    p = _save(m, d / "whole_module.pt")
    return Fixture("whole_module", p, "torch-zip", FULL, state_dict=ANY,
                   notes=f"globals include {WholeNet.__module__}.WholeNet and torch.nn classes")


def build_meta(d: Path) -> Fixture:
    obj = {
        "w": torch.empty(3, device="meta"),
        "b": torch.empty(2, 4, device="meta", dtype=torch.float16),
        "t": torch.empty(4, 2, device="meta").t(),
        "real": torch.ones(2),
    }
    p = _save(obj, d / "meta.pt")
    return Fixture("meta", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_malicious(d: Path) -> Fixture:
    marker = d / "PWNED_marker"
    p = _save({"weight": torch.ones(2, 2), "payload": Evil(marker)}, d / "malicious.pt")
    return Fixture("malicious", p, "torch-zip", NEVER, state_dict=ANY, marker=marker)


def build_legacy(d: Path) -> Fixture:
    _seed(11)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    model = TinyMLP()
    obj = {
        "model": model.state_dict(),
        "epoch": 3,
        "views": {"base": base, "t": base.t(), "slice": base[1:, 1:]},
        "dtypes": {
            "bool": torch.tensor([True, False]),
            "uint8": torch.arange(3, dtype=torch.uint8),
            "int64": torch.arange(3),
            "float16": torch.ones(2, dtype=torch.float16),
            "bfloat16": torch.ones(2, dtype=torch.bfloat16),
            "float64": torch.ones(2, dtype=torch.float64),
            "complex64": torch.ones(2, dtype=torch.complex64),
        },
        "scalar": torch.tensor(2.5),
        "param": nn.Parameter(torch.ones(3)),
    }
    p = _save(obj, d / "legacy.pt", _use_new_zipfile_serialization=False)
    return Fixture("legacy", p, "torch-legacy", WEIGHTS_ONLY, state_dict=["model"])


def build_torchscript(d: Path) -> Fixture:
    _seed(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = torch.jit.script(ScriptNet())
        p = d / "scripted.pt"
        m.save(str(p))
    return Fixture("scripted", p, "torchscript", TORCHSCRIPT, state_dict=ANY)


def build_safetensors(d: Path) -> Fixture:
    from safetensors.torch import save_file

    _seed(13)
    tensors = {}
    for name in ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
                 "complex64"]:
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        t = _full(dt, (2, 3))
        try:
            save_file({"x": t}, str(d / ".probe.safetensors"))
        except Exception:
            continue  # this safetensors version has no such dtype
        tensors["t_" + name] = t
    try:
        os.unlink(d / ".probe.safetensors")
    except OSError:
        pass
    tensors["model.layers.0.weight"] = torch.randn(4, 3)
    tensors["scalar"] = torch.tensor(1.5)
    tensors["empty"] = torch.empty(0, 3)
    tensors["日本語"] = torch.ones(2)
    p = d / "model.safetensors"
    save_file(tensors, str(p), metadata={"format": "pt", "note": "ünïcode ✓", "step": "12"})
    return Fixture("safetensors", p, "safetensors", SAFETENSORS, state_dict=[])


def _lightning_module_class():
    import lightning as L

    class LitTiny(L.LightningModule):
        def __init__(self, hidden: int = 8, lr: float = 1e-2, name: str = "tiny"):
            super().__init__()
            self.save_hyperparameters()
            self.model = torch.compile(TinyMLP(hidden=hidden), backend="eager")

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    LitTiny.__module__ = __name__
    LitTiny.__qualname__ = "LitTiny"
    return LitTiny


def write_lightning_checkpoint(path: Path, hidden: int = 8, steps: int = 2) -> Path:
    """Real Lightning Trainer.fit on a compiled submodule, then trainer.save_checkpoint."""
    import logging

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    for lg in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(lg).setLevel(logging.ERROR)
    _seed(14)
    LitTiny = _lightning_module_class()
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    loader = DataLoader(data, batch_size=4)
    model = LitTiny(hidden=hidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(model, loader)
        trainer.save_checkpoint(str(path))
    return path


def build_lightning(d: Path) -> Fixture:
    p = write_lightning_checkpoint(d / "lightning.ckpt")
    return Fixture("lightning", p, "torch-zip", WEIGHTS_ONLY, state_dict=["state_dict"])


def build_zip64(d: Path, n: int = 70_000) -> Fixture:
    """More than 65,535 zip records: one tiny storage per tensor."""
    obj = {f"t{i}": torch.tensor([float(i)]) for i in range(n)}
    p = _save(obj, d / "zip64.pt")
    return Fixture("zip64", p, "torch-zip", WEIGHTS_ONLY, state_dict=[])


def build_big(d: Path, mbytes: int = 50) -> Fixture:
    """~50 MB checkpoint for the metadata-only checks."""
    _seed(15)
    n = mbytes * (1 << 20) // 4
    obj = {
        "embed.weight": torch.randn(n // 2 // 512, 512),
        "proj.weight": torch.randn(n // 4 // 256, 256),
        "proj.bias": torch.randn(256),
        "layers": [torch.randn(n // 16) for _ in range(4)],
    }
    p = _save(obj, d / "big.pt")
    return Fixture("big", p, "torch-zip", WEIGHTS_ONLY, state_dict=ANY)


# Built by build_all, in this order. zip64 and big are built on demand (see conftest).
BUILDERS: dict[str, Callable[[Path], Fixture]] = {
    "plain": build_plain,
    "tied": build_tied,
    "tied_params": build_tied_params,
    "views": build_views,
    "dtypes": build_dtypes,
    "dtypes_exotic": build_dtypes_exotic,
    "quantized": build_quantized,
    "scalars_empty": build_scalars_empty,
    "keys": build_keys,
    "surrogate_key": build_surrogate_key,
    "nested": build_nested,
    "tensor_root": build_tensor_root,
    "list_root": build_list_root,
    "training": build_training_ckpt,
    "compiled": build_compiled_sd,
    "ddp_compiled": build_ddp_compiled,
    "wrapped_keys": build_wrapped_keys,
    "params_dict": build_params_dict,
    "whole_module": build_whole_module,
    "meta": build_meta,
    "malicious": build_malicious,
    "legacy": build_legacy,
    "scripted": build_torchscript,
    "safetensors": build_safetensors,
    "lightning": build_lightning,
}
LAZY_BUILDERS: dict[str, Callable[[Path], Fixture]] = {
    "zip64": build_zip64,
    "big": build_big,
}


def build_all(d: Path, names=None, verbose: bool = False) -> dict[str, Fixture]:
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, fn in BUILDERS.items():
        if names is not None and name not in names:
            continue
        t0 = time.perf_counter()
        out[name] = fn(d)
        if verbose:
            print(f"{name:15s} {time.perf_counter() - t0:6.2f}s  {out[name].path}", file=sys.stderr)
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--zip64", action="store_true", help="also build the 70,000-record file")
    ap.add_argument("--big", action="store_true", help="also build the ~50 MB file")
    a = ap.parse_args()
    t0 = time.perf_counter()
    fx = build_all(Path(a.outdir), verbose=True)
    for flag, name in ((a.zip64, "zip64"), (a.big, "big")):
        if flag:
            t1 = time.perf_counter()
            f = LAZY_BUILDERS[name](Path(a.outdir))
            print(f"{name:15s} {time.perf_counter() - t1:6.2f}s  {f.path}", file=sys.stderr)
    print(f"total {time.perf_counter() - t0:.2f}s", file=sys.stderr)
