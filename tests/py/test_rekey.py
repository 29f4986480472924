"""`ckptool rekey` (issue 3) checked against the real clients: every output is read back with
torch.load(weights_only=True) / safetensors and compared with what PyTorch reads from the
input, never with ckptool's own reader.

  * per fixture kind (plain, compiled at the root, compiled submodules, DDP + compiled,
    Lightning with optimizer state, safetensors, views, wrapper stacks): every tensor
    bit-identical under its new name (dtype, shape, stride, storage offset, storage bytes),
    the expected key list, tied weights still sharing storage, every non-tensor entry equal,
    `_metadata` renamed as torch.nn.modules.utils.consume_prefix_in_state_dict_if_present
    renames it (and as the real target model's state_dict() has it), the output loading into
    the real target module with load_state_dict(strict=True);
  * the --strip-compiled / --add-compiled '' round trip;
  * --match against a TorchScript model and against checkpoints, ambiguous and unmatched
    cases refused;
  * collisions, no-op warnings, --dry-run (table and JSON), --save-map / --map replay and
    inversion;
  * safety: OUT naming IN (path, hard link, symlink), --force, unsafe globals (refused,
    --keep-unsafe, --drop-unsafe), TorchScript input refused;
  * fault injection (CKPTOOL_FAULT_INJECT=OP:N:ERRNO) at every write step, and SIGINT /
    SIGKILL at random points of a ~200 MB rekey.

The malicious fixture is never loaded with weights_only=False: only
torch.serialization.get_unsafe_globals_in_checkpoint and zipfile look at it.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

import fixtures as fxmod
from conftest import CKPTOOL, TIME_SCALE, run_ckptool, sha256

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TEMP_RE = re.compile(r"^\..*\.ckptool-")


# --------------------------------------------------------------------------- helpers


def tload(path, weights_only: bool = True, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=weights_only, map_location="cpu", **kw)


def temp_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TEMP_RE.match(n))


def rekey(inp, out, *ops, rc: int = 0, env=None, timeout: float = 60):
    """ckptool rekey IN -o OUT OPS...; asserts the exit code, returns (stdout, stderr)."""
    args = ["rekey", str(inp)] + (["-o", str(out)] if out is not None else []) + [str(o) for o in ops]
    got, so, se = run_ckptool(*args, env=env, timeout=timeout * TIME_SCALE)
    assert got == rc, (f"ckptool {' '.join(map(repr, args))}: exit {got}, expected {rc}\n"
                       f"stdout: {so[-2000:]}\nstderr: {se[-2000:]}")
    return so, se


def storage_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.untyped_storage())


def assert_same_tensor(a: torch.Tensor, b: torch.Tensor, what: str):
    assert type(a) is type(b), f"{what}: type {type(b).__name__}, expected {type(a).__name__}"
    assert a.dtype == b.dtype, f"{what}: dtype {b.dtype}, expected {a.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(b.shape)}, expected {tuple(a.shape)}"
    assert a.stride() == b.stride(), f"{what}: stride {b.stride()}, expected {a.stride()}"
    assert a.storage_offset() == b.storage_offset(), \
        f"{what}: storage offset {b.storage_offset()}, expected {a.storage_offset()}"
    assert a.requires_grad == b.requires_grad, f"{what}: requires_grad differs"
    assert storage_bytes(a) == storage_bytes(b), f"{what}: storage bytes differ"
    try:
        eq = torch.equal(a, b)
    except RuntimeError:
        eq = None  # no comparison kernel for this dtype (float8, complex32): the bytes decide
    # False only for NaN (bits equal, values unequal): the storage bytes already decided.
    assert eq is not False or a.dtype.is_floating_point or a.dtype.is_complex, f"{what}: values differ"


def deep_equal(a, b, path: str = "<root>"):
    """Structural equality: same types, same dict key order, tensors bit-identical."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b).__name__}, expected a tensor"
        assert_same_tensor(a, b, path)
        return
    assert type(a) is type(b), f"{path}: type {type(b).__name__}, expected {type(a).__name__}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(b.keys())}, expected {list(a.keys())}"
        for k in a:
            deep_equal(a[k], b[k], f"{path}/{k!r}")
        ma, mb = getattr(a, "_metadata", None), getattr(b, "_metadata", None)
        assert (ma is None) == (mb is None), f"{path}: _metadata present in only one"
        if ma is not None:
            assert dict(ma) == dict(mb), f"{path}._metadata: {dict(mb)}, expected {dict(ma)}"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(b)}, expected {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            deep_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: {b!r}, expected nan"
    else:
        assert a == b, f"{path}: {b!r}, expected {a!r}"


def sharing(sd: dict, keys) -> dict:
    """key -> id of its storage group (keys whose tensors share one storage get one id)."""
    ptr = {}
    out = {}
    for k in keys:
        v = sd[k]
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            out[k] = ptr.setdefault(v.untyped_storage().data_ptr(), len(ptr))
    return out


def assert_rekeyed_sd(sd_in: dict, sd_out: dict, new_name, what: str):
    """sd_out is sd_in with every key k renamed new_name(k), in order, values unchanged,
    storage sharing unchanged."""
    expected = [new_name(k) for k in sd_in]
    assert list(sd_out.keys()) == expected, (
        f"{what}: keys\n  got      {list(sd_out.keys())}\n  expected {expected}")
    for k in sd_in:
        deep_equal(sd_in[k], sd_out[new_name(k)], f"{what}[{k!r} -> {new_name(k)!r}]")
    g_in = sharing(sd_in, list(sd_in))
    g_out = sharing(sd_out, [new_name(k) for k in sd_in])
    tensor_keys = list(g_in)
    for i, a in enumerate(tensor_keys):
        for b in tensor_keys[i + 1:]:
            shared_in = g_in[a] == g_in[b]
            shared_out = g_out[new_name(a)] == g_out[new_name(b)]
            assert shared_in == shared_out, (
                f"{what}: {a!r} and {b!r} {'share' if shared_in else 'do not share'} a storage in the "
                f"input, but {new_name(a)!r} and {new_name(b)!r} "
                f"{'do' if shared_out else 'do not'} in the output")


def copy_sd(sd):
    """A shallow copy keeping _metadata (deep-copied), as state_dict() returns it."""
    c = OrderedDict(sd)
    if hasattr(sd, "_metadata"):
        c._metadata = copy.deepcopy(sd._metadata)
    return c


def consumed_meta(sd, *steps) -> dict:
    """sd._metadata after consume_prefix_in_state_dict_if_present, applied for each step in
    turn. A step is a prefix (applied at the root) or (parent, prefix): applied to the
    submodule at module path `parent`, i.e. to its own state dict's _metadata."""
    meta = OrderedDict(copy.deepcopy(sd._metadata))
    for step in steps:
        parent, prefix = ("", step) if isinstance(step, str) else step
        if not parent:
            holder = OrderedDict()
            holder._metadata = meta
            consume_prefix_in_state_dict_if_present(holder, prefix)
            meta = holder._metadata
            continue
        sub, rest = OrderedDict(), OrderedDict()
        for k, v in meta.items():
            if k == parent:
                sub[""] = v
            elif k.startswith(parent + "."):
                sub[k[len(parent) + 1:]] = v
            else:
                rest[k] = v
        holder = OrderedDict()
        holder._metadata = sub
        consume_prefix_in_state_dict_if_present(holder, prefix)
        for k, v in holder._metadata.items():
            rest[parent + ("." + k if k else "")] = v
        meta = rest
    return dict(meta)


def assert_metadata(sd_out, expected: dict, what: str):
    assert hasattr(sd_out, "_metadata"), f"{what}: output state dict has no _metadata"
    got = dict(sd_out._metadata)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
    assert not (missing or extra or wrong), (
        f"{what}: _metadata differs: missing {missing}, unexpected {extra}, "
        f"different values {[(k, got[k], expected[k]) for k in wrong]}\n"
        f"  got      {list(sd_out._metadata.items())}\n  expected {list(expected.items())}")


def module_paths_follow_tensors(sd_in, sd_out, new_name, what):
    """Every module that holds a tensor in the output has the _metadata entry its module had
    in the input (the version load_state_dict hands to _load_from_state_dict)."""
    for k in sd_in:
        old_mod, new_mod = k.rpartition(".")[0], new_name(k).rpartition(".")[0]
        if old_mod in sd_in._metadata:
            assert new_mod in sd_out._metadata, f"{what}: _metadata has no entry {new_mod!r} (for {new_name(k)!r})"
            assert sd_out._metadata[new_mod] == sd_in._metadata[old_mod], (
                f"{what}: _metadata[{new_mod!r}] = {sd_out._metadata[new_mod]}, "
                f"expected input's _metadata[{old_mod!r}] = {sd_in._metadata[old_mod]}")


def strict_load(module: nn.Module, sd, what: str):
    try:
        res = module.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise AssertionError(f"{what}: load_state_dict(strict=True) failed: {e}") from None
    assert not res.missing_keys and not res.unexpected_keys, f"{what}: {res}"
    msd = module.state_dict()
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(msd[k], v), f"{what}: {k} not loaded"


# --------------------------------------------------------------------------- models


def plain_model() -> nn.Module:
    """The architecture of fixtures.build_plain."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))


class Holder(nn.Module):
    """`name` holds `inner` (a wrapper module, a LightningModule's self.model, ...)."""

    def __init__(self, name: str, inner: nn.Module):
        super().__init__()
        setattr(self, name, inner)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)  # _metadata version 2: a value that matters when loading
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.proj(x)))


class Outer(nn.Module):
    """Two compiled submodules (enc, lm: the tied LM) and an uncompiled head."""

    def __init__(self, compiled: bool):
        super().__init__()
        enc, lm = Encoder(), fxmod.TiedLM(vocab=7, dim=6)
        self.enc = torch.compile(enc, backend="eager") if compiled else enc
        self.lm = torch.compile(lm, backend="eager") if compiled else lm
        self.head = nn.Linear(6, 3)


def _nontrivial(m: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, b in m.named_buffers():
            if b.dtype.is_floating_point:
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            else:
                b.fill_(7)
    return m


def save(obj, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path)
    return path


@pytest.fixture(scope="session")
def extra(fixture_set, tmp_path_factory) -> dict:
    """Inputs beyond the shared fixture set, written by real torch."""
    d = tmp_path_factory.mktemp("rekey_inputs")
    out: dict = {"dir": d}
    torch.manual_seed(21)
    # Compiled submodules: keys enc._orig_mod.proj.weight, lm._orig_mod.embed.weight (tied).
    outer_c = _nontrivial(Outer(compiled=True), 1)
    out["compiled_sub"] = save(outer_c.state_dict(), d / "compiled_sub.pt")
    # The same weights, uncompiled (the input of --add-compiled enc / lm).
    outer_u = Outer(compiled=False)
    outer_u.load_state_dict({k.replace("_orig_mod.", ""): v for k, v in outer_c.state_dict().items()})
    out["outer_plain"] = save(outer_u.state_dict(), d / "outer_plain.pt")
    # Tied LM compiled at the root.
    out["compiled_tied"] = save(torch.compile(fxmod.TiedLM(), backend="eager").state_dict(),
                                d / "compiled_tied.pt")
    # TorchScript of the uncompiled twin of the Lightning fixture's model (TinyMLP(hidden=8)).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = torch.jit.script(fxmod.TinyMLP(hidden=8))
        ts.save(str(d / "tiny_scripted.pt"))
    out["tiny_scripted"] = d / "tiny_scripted.pt"
    # --match: a source whose keys become ambiguous, targets that cannot match.
    out["ambiguous"] = save({"a._orig_mod.w": torch.ones(2), "a.w": torch.zeros(2)}, d / "ambiguous.pt")
    out["ambiguous_target"] = save({"a.w": torch.ones(2)}, d / "ambiguous_target.pt")
    out["tiny5"] = save(fxmod.TinyMLP(hidden=5).state_dict(), d / "tiny5.pt")
    out["unrelated"] = save({"x.weight": torch.ones(3), "y.bias": torch.ones(1)}, d / "unrelated.pt")
    return out


# --------------------------------------------------------------------------- 1. per kind


def strip_compiled(k: str) -> str:
    return k.replace("_orig_mod.", "")


def strip_wrappers_ref(k: str) -> str:
    segs = k.split(".")
    keep = []
    prev_wrapper = True  # "module." counts only leading or right after another wrapper
    for i, s in enumerate(segs):
        last = i == len(segs) - 1
        if not last and s in ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module",
                               "_forward_module"):
            prev_wrapper = True
            continue
        if not last and s == "module" and prev_wrapper:
            continue
        prev_wrapper = False
        keep.append(s)
    return ".".join(keep)


# name: (input, ops, key rename (Python reference), state-dict path in the file,
#        expected _metadata: ("consume", steps) | ("target",) | ("follow",) | None,
#        target module factory for the strict load, or None)
CASES = {
    "plain-add-prefix": (
        "plain", ["--add-prefix", "net."], lambda k: "net." + k, None,
        ("target",), lambda: Holder("net", plain_model())),
    "plain-rename": (
        "plain", ["--rename", r"^(\d+)\.=layers.$1."], lambda k: re.sub(r"^(\d+)\.", r"layers.\1.", k),
        None, ("follow",), lambda: Holder("layers", plain_model())),
    "compiled-root-strip": (
        "compiled", ["--strip-compiled"], strip_compiled, None,
        ("consume", ["_orig_mod."]), lambda: fxmod.TinyMLP()),
    "compiled-tied-strip": (
        "x:compiled_tied", ["--strip-compiled"], strip_compiled, None,
        ("consume", ["_orig_mod."]), lambda: fxmod.TiedLM()),
    "tied-add-compiled-root": (
        "tied", ["--add-compiled", ""], lambda k: "_orig_mod." + k, None,
        ("target",), lambda: torch.compile(fxmod.TiedLM(), backend="eager")),
    "compiled-sub-strip": (
        "x:compiled_sub", ["--strip-compiled"], strip_compiled, None,
        ("consume", [("enc", "_orig_mod."), ("lm", "_orig_mod.")]), lambda: Outer(compiled=False)),
    "compiled-sub-strip-wrappers": (
        "x:compiled_sub", ["--strip-wrappers"], strip_compiled, None,
        ("consume", [("enc", "_orig_mod."), ("lm", "_orig_mod.")]), lambda: Outer(compiled=False)),
    "sub-add-compiled": (
        "x:outer_plain", ["--add-compiled", "enc", "--add-compiled", "lm"],
        lambda k: re.sub(r"^(enc|lm)\.", r"\1._orig_mod.", k), None,
        ("target",), lambda: Outer(compiled=True)),
    "ddp-compiled-strip-wrappers": (
        "ddp_compiled", ["--strip-wrappers"], lambda k: k.replace("module._orig_mod.", ""), None,
        ("consume", ["module.", "_orig_mod."]), lambda: fxmod.TinyMLP()),
    "ddp-compiled-strip-prefix-then-compiled": (
        "ddp_compiled", ["--strip-prefix", "module.", "--strip-compiled"],
        lambda k: k.replace("module._orig_mod.", ""), None,
        ("consume", ["module.", "_orig_mod."]), lambda: fxmod.TinyMLP()),
    "ddp-compiled-strip-compiled-only": (
        "ddp_compiled", ["--strip-compiled"], strip_compiled, None,
        ("consume", [("module", "_orig_mod.")]), lambda: Holder("module", fxmod.TinyMLP())),
    "lightning-strip-compiled": (
        "lightning", ["--strip-compiled"], strip_compiled, "state_dict",
        ("consume", [("model", "_orig_mod.")]), lambda: Holder("model", fxmod.TinyMLP(hidden=8))),
    "lightning-to-bare-model": (
        "lightning", ["--strip-compiled", "--strip-prefix", "model."],
        lambda k: strip_compiled(k).removeprefix("model."), "state_dict",
        ("consume", [("model", "_orig_mod."), "model."]), lambda: fxmod.TinyMLP(hidden=8)),
    "wrapped-keys-strip-wrappers": (
        "wrapped_keys", ["--strip-wrappers"], strip_wrappers_ref, "model_state_dict", None, None),
    "training-add-ddp": (
        "training", ["--add-prefix", "module."], lambda k: "module." + k, "model",
        ("target",), lambda: Holder("module", fxmod.TinyMLP())),
    "views-add-prefix": (
        "views", ["--add-prefix", "v."], lambda k: "v." + k, None, None, None),
    "dtypes-rename": (
        "dtypes", ["--rename", r"\.strided$=_strided"], lambda k: re.sub(r"\.strided$", "_strided", k),
        None, None, None),
}


# Inputs with tensors sharing a storage (tied weights, views).
TIED_CASES = {"compiled-tied-strip", "tied-add-compiled-root", "compiled-sub-strip",
              "compiled-sub-strip-wrappers", "sub-add-compiled", "views-add-prefix"}


def input_path(name: str, fixture_set, extra) -> Path:
    return extra[name[2:]] if name.startswith("x:") else fixture_set[name].path


@pytest.mark.parametrize("case", list(CASES))
def test_rekey_against_torch(case, fixture_set, extra, tmp_path):
    src_name, ops, new_name, sd_path, meta_rule, target = CASES[case]
    src = input_path(src_name, fixture_set, extra)
    out = tmp_path / ("out" + src.suffix)
    before = sha256(src)
    rekey(src, out, *ops)
    assert sha256(src) == before, "the input changed"
    assert temp_files(tmp_path) == []

    obj_in, obj_out = tload(src), tload(out)
    sd_in = obj_in if sd_path is None else obj_in[sd_path]
    sd_out = obj_out if sd_path is None else obj_out[sd_path]
    assert_rekeyed_sd(sd_in, sd_out, new_name, case)
    if case in TIED_CASES:  # the sharing check above is not vacuous here
        groups = sharing(sd_in, list(sd_in))
        assert len(set(groups.values())) < len(groups), f"{case}: no shared storage in the input"

    # Everything outside the state dict: equal, in order.
    if sd_path is not None:
        assert list(obj_out.keys()) == list(obj_in.keys())
        rest_in = {k: v for k, v in obj_in.items() if k != sd_path}
        rest_out = {k: v for k, v in obj_out.items() if k != sd_path}
        deep_equal(rest_in, rest_out, f"{case}: outside {sd_path!r}")

    if target is not None:
        strict_load(target(), sd_out, case)

    if meta_rule is not None:
        module_paths_follow_tensors(sd_in, sd_out, new_name, case)
        if meta_rule[0] == "consume":
            # As consume_prefix_in_state_dict_if_present renames it ...
            assert_metadata(sd_out, consumed_meta(sd_in, *meta_rule[1]), case + " (vs consume_prefix)")
        if meta_rule[0] in ("consume", "target"):
            # ... and as the real target module's own state_dict() has it.
            assert_metadata(sd_out, dict(target().state_dict()._metadata), case + " (vs target model)")


def test_lightning_optimizer_state_unchanged(fixture_set, tmp_path):
    """Lightning: optimizer states (tensors and param_groups), lr_schedulers, loops,
    hyper_parameters, epoch, global_step: exactly as in the input."""
    src = fixture_set["lightning"].path
    out = tmp_path / "out.ckpt"
    rekey(src, out, "--strip-compiled")
    a, b = tload(src), tload(out)
    for key in ("epoch", "global_step", "pytorch-lightning_version", "loops", "callbacks",
                "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"):
        if key in a:
            assert key in b, f"{key} missing from the output"
            deep_equal(a[key], b[key], key)
    # Not vacuous: Adam state with tensors (step, exp_avg, exp_avg_sq) per parameter.
    states = b["optimizer_states"][0]["state"]
    assert len(states) == 4 and all(isinstance(s["exp_avg"], torch.Tensor) for s in states.values())


SAFETENSORS_CASES = {
    "strip-prefix": (["--strip-prefix", "model."], lambda k: k.removeprefix("model.")),
    "add-prefix": (["--add-prefix", "enc."], lambda k: "enc." + k),
    "rename": (["--rename", "^t_(.*)$=typed.$1"], lambda k: re.sub(r"^t_(.*)$", r"typed.\1", k)),
    "add-compiled-root": (["--add-compiled", ""], lambda k: "_orig_mod." + k),
}


def _st_header(path):
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@pytest.mark.parametrize("case", list(SAFETENSORS_CASES))
def test_rekey_safetensors(case, fixture_set, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    ops, new_name = SAFETENSORS_CASES[case]
    src = fixture_set["safetensors"].path
    out = tmp_path / "out.safetensors"
    before = sha256(src)
    rekey(src, out, *ops)
    assert sha256(src) == before
    a, b = load_file(str(src)), load_file(str(out))
    assert sorted(b) == sorted(new_name(k) for k in a)
    for k, t in a.items():
        assert_same_tensor(t, b[new_name(k)], f"{k} -> {new_name(k)}")
    with safe_open(str(src), "pt") as f:
        meta_in, order_in = f.metadata(), list(f.keys())
    with safe_open(str(out), "pt") as f:
        meta_out, order_out = f.metadata(), list(f.keys())
    assert meta_out == meta_in, f"__metadata__ {meta_out}, expected {meta_in}"
    assert meta_out and meta_out.get("note") == "ünïcode ✓"
    # Data buffer copied as is; every header entry the same but for its name.
    h_in, data_in = _st_header(src)
    h_out, data_out = _st_header(out)
    assert data_out == data_in, "the data buffer differs"
    assert {new_name(k): v for k, v in h_in.items() if k != "__metadata__"} == \
        {k: v for k, v in h_out.items() if k != "__metadata__"}
    assert sorted(order_out) == sorted(new_name(k) for k in order_in)


# --------------------------------------------------------------------------- 2. round trip


def test_round_trip_strip_then_add_compiled(fixture_set, tmp_path):
    src = fixture_set["compiled"].path
    mid, back = tmp_path / "mid.pt", tmp_path / "back.pt"
    rekey(src, mid, "--strip-compiled")
    rekey(mid, back, "--add-compiled", "")
    a, b = tload(src), tload(back)
    assert list(b.keys()) == list(a.keys())
    for k in a:
        assert_same_tensor(a[k], b[k], k)
    assert_metadata(b, dict(a._metadata), "round trip")
    strict_load(torch.compile(fxmod.TinyMLP(), backend="eager"), b, "round trip")


def test_round_trip_compiled_submodules(extra, tmp_path):
    src = extra["compiled_sub"]
    mid, back = tmp_path / "mid.pt", tmp_path / "back.pt"
    rekey(src, mid, "--strip-compiled")
    rekey(mid, back, "--add-compiled", "enc", "--add-compiled", "lm")
    a, b = tload(src), tload(back)
    assert_rekeyed_sd(a, b, lambda k: k, "round trip (submodules)")
    assert_metadata(b, dict(a._metadata), "round trip (submodules)")


# --------------------------------------------------------------------------- 3. --match


def test_match_torchscript_target(fixture_set, extra, tmp_path):
    src = fixture_set["lightning"].path
    out = tmp_path / "matched.ckpt"
    so, se = rekey(src, out, "--match", extra["tiny_scripted"])
    # It names the edit it chose.
    line = next((l for l in (so + se).splitlines() if "edit" in l), "")
    assert "_orig_mod" in line and "model" in line, f"the chosen edit is not named: {so}\n{se}"
    a, b = tload(src), tload(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.load(str(extra["tiny_scripted"]))
    target_keys = list(scripted.state_dict().keys())
    new_name = lambda k: strip_compiled(k).removeprefix("model.")  # noqa: E731
    assert sorted(b["state_dict"].keys()) == sorted(target_keys)
    assert_rekeyed_sd(a["state_dict"], b["state_dict"], new_name, "--match torchscript")
    strict_load(scripted, b["state_dict"], "--match torchscript (into the scripted module)")
    deep_equal({k: v for k, v in a.items() if k != "state_dict"},
               {k: v for k, v in b.items() if k != "state_dict"}, "outside state_dict")


def test_match_metadata_follows_edit(fixture_set, extra, tmp_path):
    """The edit --match chose (remove 'model.' and '_orig_mod.') renames _metadata as the
    equivalent consume_prefix calls do: also the paths of modules that hold no tensor
    (model._orig_mod.act -> act) and the wrappers' own entries."""
    src = fixture_set["lightning"].path
    out = tmp_path / "matched.ckpt"
    rekey(src, out, "--match", extra["tiny_scripted"])
    a, b = tload(src), tload(out)
    assert_metadata(b["state_dict"], consumed_meta(a["state_dict"], ("model", "_orig_mod."), "model."),
                    "--match torchscript")


def test_match_checkpoint_target(fixture_set, tmp_path):
    """compiled (_orig_mod.*) against a training checkpoint whose model is plain."""
    src = fixture_set["compiled"].path
    target = fixture_set["training"].path
    out = tmp_path / "matched.pt"
    rekey(src, out, "--match", target)
    a, b, t = tload(src), tload(out), tload(target)
    assert list(b.keys()) == list(t["model"].keys())
    assert_rekeyed_sd(a, b, strip_compiled, "--match checkpoint")
    strict_load(fxmod.TinyMLP(), b, "--match checkpoint")


def test_match_moves_wrappers(fixture_set, tmp_path):
    """DDP + compiled (module._orig_mod.*) against the Lightning checkpoint
    (model._orig_mod.*): the wrapper segments are moved."""
    src = fixture_set["ddp_compiled"].path
    target = fixture_set["lightning"].path
    out = tmp_path / "matched.pt"
    rekey(src, out, "--match", target)
    a, b, t = tload(src), tload(out), tload(target)
    assert sorted(b.keys()) == sorted(t["state_dict"].keys())
    assert_rekeyed_sd(a, b, lambda k: "model." + k.removeprefix("module."), "--match lightning")


def test_match_ambiguous_refused(extra, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(extra["ambiguous"], out, "--match", extra["ambiguous_target"], rc=1)
    assert "ambiguous" in se.lower(), se
    assert "a._orig_mod.w" in se and "a.w" in se, se
    assert not out.exists()
    assert temp_files(tmp_path) == []


def test_match_shape_mismatch_refused(fixture_set, extra, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(fixture_set["compiled"].path, out, "--match", extra["tiny5"], rc=1)
    assert "shape" in se.lower(), se
    assert not out.exists()


def test_match_nothing_refused(fixture_set, extra, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(fixture_set["plain"].path, out, "--match", extra["unrelated"], rc=1)
    assert "x.weight" in se or "unmatched" in se, se
    assert not out.exists()
    assert temp_files(tmp_path) == []


# --------------------------------------------------------------------------- 4. collisions, no-ops, dry runs


def test_collision_refused(fixture_set, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(fixture_set["plain"].path, out, "--rename", r"^[0-9]+\.=", rc=1)
    # 0.weight, 2.weight, 3.weight, 4.weight -> weight (and the biases -> bias)
    assert "'weight'" in se and "0.weight" in se and "2.weight" in se, se
    assert "'bias'" in se, se
    assert not out.exists()
    assert temp_files(tmp_path) == []


def test_collision_strip_compiled(extra, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(extra["ambiguous"], out, "--strip-compiled", rc=1)
    assert "a._orig_mod.w" in se and "'a.w'" in se, se
    assert not out.exists()


def test_noop_operation_warns(fixture_set, tmp_path):
    src = fixture_set["plain"].path
    out = tmp_path / "out.pt"
    so, se = rekey(src, out, "--strip-compiled", "--strip-prefix", "nosuch.")
    assert "warning" in se.lower() and "--strip-compiled" in se and "nosuch." in se, se
    a, b = tload(src), tload(out)
    assert_rekeyed_sd(a, b, lambda k: k, "no-op")
    assert_metadata(b, dict(a._metadata), "no-op")


def test_partly_used_operations(fixture_set, tmp_path):
    """Only the operation that touched nothing is warned about."""
    src = fixture_set["ddp_compiled"].path
    so, se = rekey(src, tmp_path / "o.pt", "--strip-prefix", "module.", "--strip-prefix", "model.")
    assert "'model.'" in se and "'module.'" not in se, se


def test_dry_run_table(fixture_set, tmp_path):
    src = fixture_set["compiled"].path
    out = tmp_path / "never.pt"
    so, se = rekey(src, out, "--strip-compiled", "--dry-run")
    assert not out.exists() and os.listdir(tmp_path) == []
    for k in tload(src):
        assert re.search(re.escape(k) + r"\s+->\s+" + re.escape(strip_compiled(k)), so), so


def test_dry_run_json(fixture_set, tmp_path):
    src = fixture_set["lightning"].path
    out = tmp_path / "never.ckpt"
    so, se = rekey(src, out, "--strip-compiled", "--strip-prefix", "model.", "--dry-run", "--json")
    assert not out.exists() and os.listdir(tmp_path) == []
    doc = json.loads(so)
    assert doc["dry_run"] is True
    keys = list(tload(src)["state_dict"].keys())
    assert doc["mapping"] == [{"old": k, "new": strip_compiled(k).removeprefix("model.")} for k in keys]
    assert doc["unused_operations"] == []


def test_dry_run_without_output(fixture_set, tmp_path):
    so, se = rekey(fixture_set["compiled"].path, None, "--strip-compiled", "--dry-run", "--json")
    assert json.loads(so)["output"] is None


# --------------------------------------------------------------------------- 5. maps


def test_save_map_then_map_replays(fixture_set, tmp_path):
    src = fixture_set["lightning"].path
    a_out, b_out, m = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "map.json"
    rekey(src, a_out, "--strip-compiled", "--strip-prefix", "model.", "--save-map", m)
    doc = json.loads(m.read_text())
    keys = list(tload(src)["state_dict"].keys())
    assert doc["mapping"] == {k: strip_compiled(k).removeprefix("model.") for k in keys}
    rekey(src, b_out, "--map", m)
    a, b = tload(a_out), tload(b_out)
    assert list(b["state_dict"].keys()) == list(a["state_dict"].keys())
    deep_equal({k: v for k, v in a.items() if k != "state_dict"},
               {k: v for k, v in b.items() if k != "state_dict"}, "outside state_dict")
    for k in a["state_dict"]:
        assert_same_tensor(a["state_dict"][k], b["state_dict"][k], k)


def test_map_replays_metadata(fixture_set, tmp_path):
    """The replayed file reads back equal to the first, _metadata included (modules without
    tensors, like model._orig_mod.act, and the wrappers' own entries too)."""
    src = fixture_set["lightning"].path
    a_out, b_out, m = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "map.json"
    rekey(src, a_out, "--strip-compiled", "--strip-prefix", "model.", "--save-map", m)
    rekey(src, b_out, "--map", m)
    a, b = tload(a_out), tload(b_out)
    assert_metadata(b["state_dict"], dict(a["state_dict"]._metadata), "--map replay")


def test_inverted_map_restores_keys(extra, tmp_path):
    src = extra["compiled_sub"]
    out, back, m, inv = tmp_path / "o.pt", tmp_path / "back.pt", tmp_path / "m.json", tmp_path / "inv.json"
    rekey(src, out, "--strip-compiled", "--save-map", m)
    mapping = json.loads(m.read_text())["mapping"]
    inv.write_text(json.dumps({"ckptool_key_map": 1, "mapping": {v: k for k, v in mapping.items()}}))
    rekey(out, back, "--map", inv)
    a, b = tload(src), tload(back)
    assert_rekeyed_sd(a, b, lambda k: k, "inverted map")
    strict_load(Outer(compiled=True), b, "inverted map")


# --------------------------------------------------------------------------- 6. safety


def _copy_in(fixture_set, tmp_path, name="plain") -> Path:
    p = tmp_path / ("in" + fixture_set[name].path.suffix)
    shutil.copyfile(fixture_set[name].path, p)
    return p


def test_out_is_in_refused(fixture_set, tmp_path):
    p = _copy_in(fixture_set, tmp_path)
    before = sha256(p)
    for spelled in (p, tmp_path / "sub" / ".." / p.name):
        (tmp_path / "sub").mkdir(exist_ok=True)
        so, se = rekey(p, spelled, "--add-prefix", "x.", rc=2)
        assert "--force" in se, se
        assert sha256(p) == before
    assert temp_files(tmp_path) == []


def test_out_is_in_forced(fixture_set, tmp_path):
    p = _copy_in(fixture_set, tmp_path)
    original = tload(p)
    ino = os.stat(p).st_ino
    rekey(p, p, "--add-prefix", "x.", "--force")
    assert temp_files(tmp_path) == []
    assert os.stat(p).st_ino != ino, "not replaced by a rename (same inode)"
    assert_rekeyed_sd(original, tload(p), lambda k: "x." + k, "--force in place")


def test_out_hard_link_refused(fixture_set, tmp_path):
    p = _copy_in(fixture_set, tmp_path)
    link = tmp_path / "hard.pt"
    os.link(p, link)
    before = sha256(p)
    so, se = rekey(p, link, "--add-prefix", "x.", rc=2)
    assert sha256(p) == before and sha256(link) == before
    assert os.stat(p).st_ino == os.stat(link).st_ino
    assert temp_files(tmp_path) == []


def test_out_symlink_refused(fixture_set, tmp_path):
    p = _copy_in(fixture_set, tmp_path)
    link = tmp_path / "sym.pt"
    os.symlink(p, link)
    before = sha256(p)
    so, se = rekey(p, link, "--add-prefix", "x.", rc=2)
    assert link.is_symlink() and sha256(p) == before
    # IN as the symlink, OUT the file itself: the same.
    so, se = rekey(link, p, "--add-prefix", "x.", rc=2)
    assert sha256(p) == before
    assert temp_files(tmp_path) == []


def _unsafe_globals(path) -> list[str]:
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))


def test_unsafe_refused(fixture_set, tmp_path):
    fx = fixture_set["malicious"]
    out = tmp_path / "never.pt"
    names = _unsafe_globals(fx.path)
    assert names, "the fixture should name an unsafe global"
    so, se = rekey(fx.path, out, "--rename", "^weight$=w", rc=3)
    for n in names:
        assert n in se, f"{n} not named: {se}"
    assert not out.exists()
    assert not fx.marker.exists()


def _zip_data_records(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}


def test_keep_unsafe(fixture_set, tmp_path):
    fx = fixture_set["malicious"]
    out = tmp_path / "kept.pt"
    rekey(fx.path, out, "--rename", "^weight$=w", "--keep-unsafe")
    assert not fx.marker.exists()
    assert _unsafe_globals(out) == _unsafe_globals(fx.path)
    assert _zip_data_records(out) == _zip_data_records(fx.path)
    with pytest.raises(Exception):  # still refused by the safe loader
        tload(out, weights_only=True)
    assert not fx.marker.exists()


def test_drop_unsafe(fixture_set, tmp_path):
    fx = fixture_set["malicious"]
    out = tmp_path / "dropped.pt"
    so, se = rekey(fx.path, out, "--rename", "^weight$=w", "--drop-unsafe")
    assert "payload" in se, f"the removed entry is not named: {se}"
    assert _unsafe_globals(out) == []
    obj = tload(out, weights_only=True)
    assert list(obj.keys()) == ["w"]
    assert_same_tensor(torch.ones(2, 2), obj["w"], "w")
    assert not fx.marker.exists()


def test_torchscript_input_refused(fixture_set, tmp_path):
    out = tmp_path / "never.pt"
    so, se = rekey(fixture_set["scripted"].path, out, "--add-prefix", "x.", rc=3)
    assert "materialize --model" in se, se
    assert not out.exists()


# --------------------------------------------------------------------------- 7. fault injection

FAULT_OPS = ["open", "write", "fsync", "rename", "close"]
FAULT_FILES = {"torch-zip": ("lightning", ["--strip-compiled"]),
               "safetensors": ("safetensors", ["--strip-prefix", "model."])}


def _setup_fault_dir(fixture_set, d: Path, fmt: str) -> tuple[Path, Path, list]:
    name, ops = FAULT_FILES[fmt]
    src = fixture_set[name].path
    d.mkdir(parents=True, exist_ok=True)
    inp = d / ("in" + src.suffix)
    shutil.copyfile(src, inp)
    return inp, d / ("out" + src.suffix), ops


@pytest.fixture(scope="session")
def fault_counts(fixture_set, tmp_path_factory) -> dict:
    """fmt -> op -> how many calls of op one rekey makes (the largest N whose fault fails it)."""
    counts: dict = {}
    base = tmp_path_factory.mktemp("fault_counts")
    for fmt in FAULT_FILES:
        counts[fmt] = {}
        for op in FAULT_OPS + ["dirfsync"]:
            n = 1
            while True:
                d = base / f"{fmt}-{op}-{n}"
                inp, out, ops = _setup_fault_dir(fixture_set, d, fmt)
                rc, so, se = run_ckptool("rekey", inp, "-o", out, *ops,
                                         env={"CKPTOOL_FAULT_INJECT": f"{op}:{n}:EIO"})
                shutil.rmtree(d)
                if rc == 0:
                    break
                assert rc == 4, f"{op}:{n}:EIO on {fmt}: exit {rc}, expected 4 or 0: {se}"
                n += 1
                assert n < 400, f"{op}: every call up to {n} failed"
            counts[fmt][op] = n - 1
    return counts


def _check_loads(out: Path, fmt: str, fixture_set):
    name, ops = FAULT_FILES[fmt]
    if fmt == "safetensors":
        from safetensors.torch import load_file
        a, b = load_file(str(fixture_set[name].path)), load_file(str(out))
        assert sorted(b) == sorted(k.removeprefix("model.") for k in a)
    else:
        a, b = tload(fixture_set[name].path), tload(out)
        assert_rekeyed_sd(a["state_dict"], b["state_dict"], strip_compiled, "after fault")


@pytest.mark.parametrize("preexisting", [False, True], ids=["new-out", "out-existed"])
@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
@pytest.mark.parametrize("pos", ["1", "2", "last"])
@pytest.mark.parametrize("op", FAULT_OPS)
@pytest.mark.parametrize("fmt", list(FAULT_FILES))
def test_fault_injection(fmt, op, pos, err, preexisting, fault_counts, fixture_set, tmp_path):
    count = fault_counts[fmt][op]
    assert count >= 1, f"rekey of {fmt} never calls {op} through the fault-injection seam"
    n = {"1": 1, "2": 2, "last": count}[pos]
    inp, out, ops = _setup_fault_dir(fixture_set, tmp_path, fmt)
    in_sum = sha256(inp)
    old = b"previous contents of OUT\n" * 100
    if preexisting:
        out.write_bytes(old)
    rc, so, se = run_ckptool("rekey", inp, "-o", out, *ops, env={"CKPTOOL_FAULT_INJECT": f"{op}:{n}:{err}"})
    assert sha256(inp) == in_sum, "the input changed"
    assert temp_files(tmp_path) == [], f"temporary file left: {temp_files(tmp_path)}"
    if n > count:  # fewer calls than that: no fault, a normal run
        assert rc == 0, f"{op}:{n}:{err} (only {count} calls): exit {rc}: {se}"
        _check_loads(out, fmt, fixture_set)
        return
    assert rc == 4, f"{op}:{n}:{err}: exit {rc}, expected 4\nstderr: {se}"
    expected_msg = {"ENOSPC": "No space left on device", "EIO": "Input/output error"}[err]
    assert expected_msg in se, se
    if preexisting:
        assert out.read_bytes() == old, "OUT was modified"
    else:
        assert not out.exists(), "OUT exists after a failed write"
    assert sorted(os.listdir(tmp_path)) == sorted([inp.name] + ([out.name] if preexisting else []))


@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
@pytest.mark.parametrize("fmt", list(FAULT_FILES))
def test_fault_dirfsync(fmt, err, fault_counts, fixture_set, tmp_path):
    """The directory fsync fails after the rename: exit 4, but OUT is complete."""
    assert fault_counts[fmt]["dirfsync"] == 1
    inp, out, ops = _setup_fault_dir(fixture_set, tmp_path, fmt)
    in_sum = sha256(inp)
    rc, so, se = run_ckptool("rekey", inp, "-o", out, *ops, env={"CKPTOOL_FAULT_INJECT": f"dirfsync:1:{err}"})
    assert rc == 4, f"exit {rc}: {se}"
    assert sha256(inp) == in_sum
    assert temp_files(tmp_path) == []
    _check_loads(out, fmt, fixture_set)


def test_fault_save_map(fixture_set, tmp_path):
    """The --save-map file goes through the same atomic writer (its open is the second)."""
    inp, out, ops = _setup_fault_dir(fixture_set, tmp_path, "torch-zip")
    m = tmp_path / "map.json"
    rc, so, se = run_ckptool("rekey", inp, "-o", out, *ops, "--save-map", m,
                             env={"CKPTOOL_FAULT_INJECT": "open:2:ENOSPC"})
    assert rc == 4, f"exit {rc}: {se}"
    assert not m.exists()
    assert temp_files(tmp_path) == []


# --------------------------------------------------------------------------- interrupts

BIG_TENSORS = 25
BIG_NUMEL = 4 << 20  # 8 MiB of bf16 each: ~200 MiB


@pytest.fixture(scope="session")
def big_bf16(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big_bf16")
    g = torch.Generator().manual_seed(5)
    sd = {f"_orig_mod.layers.{i}.weight":
          torch.randint(-(1 << 15), 1 << 15, (BIG_NUMEL,), dtype=torch.int16, generator=g)
          .view(torch.bfloat16).reshape(2048, -1)
          for i in range(BIG_TENSORS)}
    return save(sd, d / "big.pt")


def _check_big_output(src: Path, out: Path, what: str):
    a = tload(src, mmap=True)
    b = tload(out, mmap=True)
    assert list(b.keys()) == [strip_compiled(k) for k in a], what
    for k, t in a.items():
        u = b[strip_compiled(k)]
        assert u.dtype == t.dtype and u.shape == t.shape and u.stride() == t.stride(), what
        assert torch.equal(u.view(torch.int16), t.view(torch.int16)), f"{what}: {k} differs"


def test_interrupts(big_bf16, tmp_path):
    """SIGINT / SIGKILL at random points of a ~200 MB rekey: OUT is absent or complete.
    After SIGINT no temporary file remains (the handler removes it). After SIGKILL the
    temporary file can remain (no handler runs; nothing can remove it): it is never at OUT,
    and it is removed here."""
    src = big_bf16
    in_sum = sha256(src)
    seed = int(os.environ.get("CKPTOOL_TEST_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")

    def start(out):
        return subprocess.Popen([str(CKPTOOL), "rekey", str(src), "-o", str(out), "--strip-compiled"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    # An uninterrupted run: its duration spaces the interrupts.
    t0 = time.perf_counter()
    p = start(tmp_path / "full.pt")
    _, err = p.communicate(timeout=120 * TIME_SCALE)
    duration = time.perf_counter() - t0
    assert p.returncode == 0, err.decode()
    _check_big_output(src, tmp_path / "full.pt", "uninterrupted run")
    os.unlink(tmp_path / "full.pt")

    plan = []
    for sig in [signal.SIGINT] * 6 + [signal.SIGKILL] * 4:
        # From the start (some late enough to land in the commit or after it), or once the
        # temporary file exists (so that some surely land in the middle of the copy).
        anchor = rng.choice(["start", "temp"])
        plan.append((sig, anchor, rng.uniform(0.0, 1.15 if anchor == "start" else 0.9) * duration))
    outcomes = []
    for i, (sig, anchor, delay) in enumerate(plan):
        out = tmp_path / f"out{i}.pt"
        what = f"seed {seed}, run {i}: {signal.Signals(sig).name} {delay * 1000:.0f} ms after {anchor}"
        p = start(out)
        if anchor == "temp":
            deadline = time.perf_counter() + 30
            while not temp_files(tmp_path) and p.poll() is None and time.perf_counter() < deadline:
                time.sleep(0.0005)
        time.sleep(delay if anchor == "start" else delay / 2)
        had_temp = bool(temp_files(tmp_path))
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        rc = p.returncode
        assert rc in (0, -sig), f"{what}: exit {rc}: {err.decode()[-500:]}"
        if out.exists():
            _check_big_output(src, out, what)
            os.unlink(out)
        left = temp_files(tmp_path)
        if sig == signal.SIGINT:
            assert left == [], f"{what}: temporary file left after SIGINT: {left}"
        for n in left:  # SIGKILL: documented leftover
            os.unlink(tmp_path / n)
        outcomes.append((signal.Signals(sig).name, "finished" if rc == 0 else "killed", had_temp))
    assert sha256(src) == in_sum, "the input changed"
    print(f"seed {seed}, uninterrupted {duration * 1000:.0f} ms; outcomes {outcomes}")


# --------------------------------------------------------------------------- progress on a terminal

def _rekey_with_stderr_on(stderr_is_tty: bool, src: Path, out: Path) -> tuple[int, bytes]:
    import pty

    if not stderr_is_tty:
        p = subprocess.run([str(CKPTOOL), "rekey", str(src), "-o", str(out), "--strip-compiled"],
                           capture_output=True, timeout=60 * TIME_SCALE)
        return p.returncode, p.stderr
    master, slave = pty.openpty()
    try:
        p = subprocess.run([str(CKPTOOL), "rekey", str(src), "-o", str(out), "--strip-compiled"],
                           stdout=subprocess.DEVNULL, stderr=slave, timeout=60 * TIME_SCALE)
    finally:
        os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return p.returncode, seen


def test_progress_bar_only_on_a_terminal(tmp_path):
    src = tmp_path / "in.pt"
    torch.save({"_orig_mod.w": torch.arange(1 << 20, dtype=torch.float32)}, src)
    rc, err = _rekey_with_stderr_on(True, src, tmp_path / "tty.pt")
    assert rc == 0, err
    assert b"rekey [" in err and b"100%" in err, err
    assert err.rstrip(b"\r\n").endswith(b"\x1b[K"), err  # the bar is erased at the end
    rc, err = _rekey_with_stderr_on(False, src, tmp_path / "pipe.pt")
    assert rc == 0 and err == b"", err
    for name in ("tty.pt", "pipe.pt"):
        assert torch.equal(torch.load(tmp_path / name, weights_only=True)["w"], torch.arange(1 << 20, dtype=torch.float32))


def test_fqn_keyed_optimizer_groups_are_renamed_with_its_state(tmp_path):
    """get_state_dict's optimizer state names parameters by FQN in "state" and in each
    param group's "params": rekey renamed the first and left the second, so the file named
    each parameter one way in one place and another in the other."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.1},
                             {"params": model[2].parameters(), "lr": 0.01}])
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    assert "0.weight" in osd["state"] and osd["param_groups"][0]["params"] == ["0.weight", "0.bias"]
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"model": msd, "optim": osd}, src)
    rc, _, err = run_ckptool("rekey", src, "-o", out, "--add-prefix", "net.")
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    assert sorted(got["model"]) == sorted("net." + k for k in msd)
    assert sorted(got["optim"]["state"]) == sorted("net." + k for k in osd["state"])
    for g_got, g_in in zip(got["optim"]["param_groups"], osd["param_groups"]):
        assert g_got["params"] == ["net." + p for p in g_in["params"]]
        assert g_got["lr"] == g_in["lr"]
    # Loads into the wrapped model, group by group.
    wrapped = nn.Sequential()
    wrapped.add_module("net", nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    opt2 = torch.optim.AdamW([{"params": wrapped.net[0].parameters(), "lr": 1.0},
                              {"params": wrapped.net[2].parameters(), "lr": 1.0}])
    set_state_dict(wrapped, opt2, model_state_dict=got["model"], optim_state_dict=got["optim"])
    assert [g["lr"] for g in opt2.param_groups] == [0.1, 0.01]
    assert torch.equal(opt2.state[wrapped.net[0].weight]["exp_avg"], osd["state"]["0.weight"]["exp_avg"])
