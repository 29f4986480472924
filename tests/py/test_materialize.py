"""`ckptool materialize` (issue 4) checked against real PyTorch: every output is read back
with torch.load(weights_only=True) / torch.jit.load and compared with what PyTorch itself
loads from the input (torch.load, safetensors.torch.load_file, torch.jit.load), never with
ckptool's own reader.

  * every fixture of the foundation set on `cpu` (-o OUT): each tensor by name (state-dict
    key, '/'-joined path outside the state dict) bit for bit, with its dtype, shape, stride
    and storage offset; storages shared in OUT exactly where they are shared in the input;
    `--mmap` and `--threads` give the same OUT; `--device meta` exits 0, reports 0 bytes and
    reads no tensor data (/proc/self/io rchar of the reaped child); quantized tensors (every
    quantizer torch.save writes) equal torch.load's, quantizer included; hostile quantizers
    refused (3);
  * `--dtype bfloat16`: floating tensors equal torch's `.to(torch.bfloat16)`, others
    untouched; tied weights stay tied;
  * `--model`: a scripted model filled from a real Lightning checkpoint of its compiled twin
    and from a real DDP(torch.compile(m)) state dict: OUT loads with torch.jit.load, its
    weights equal the checkpoint's, `--run evaluation_step` / `forward` checksums equal what
    Python computes from the same inputs; strict missing key, --no-strict fill from the model
    file, unexpected keys, shape mismatch, --dtype, meta;
  * `--check-finite`; errors (cuda without a GPU: 4, bogus device: 2, corrupt input: 3);
  * tests/tools_torch/api_example.cpp (the README's C++ API example) run on the same files;
  * CUDA (skipped without a GPU): every fixture on cuda against torch.load(map_location=
    "cuda"), a ~330 MB checkpoint larger than the pinned ring (chunking, coalescing, ring
    reuse), --dtype / --check-finite / --model --run on the device, the API example.

Run on a GPU machine:  CKPTOOL=build/ckptool CKPTOOL_BUILD_DIR=build \\
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/py/test_materialize.py -k cuda
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fixtures as fxmod
from conftest import CKPTOOL, TIME_SCALE, run_ckptool

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", CKPTOOL.parent))
API_EXAMPLE = BUILD_DIR / "tests" / "api_example"
HAS_CUDA = torch.cuda.is_available()
TEMP_RE = re.compile(r"^\..*\.ckptool-")
cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")

# --------------------------------------------------------------------------- helpers


def tload(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=True, **kw)


def jit_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.load(str(path), **kw)


def materialize(*args, rc: int = 0, timeout: float = 120):
    """ckptool materialize ARGS...; asserts the exit code, returns (stdout, stderr)."""
    got, so, se = run_ckptool("materialize", *map(str, args), timeout=timeout * TIME_SCALE)
    assert got == rc, (f"ckptool materialize {' '.join(map(str, args))}: exit {got}, expected {rc}\n"
                       f"stdout: {so[-3000:]}\nstderr: {se[-3000:]}")
    return so, se


def materialize_json(*args, rc: int = 0, timeout: float = 120) -> dict:
    so, se = materialize(*args, "--json", rc=rc, timeout=timeout)
    try:
        return json.loads(so)
    except json.JSONDecodeError as e:
        raise AssertionError(f"materialize {args} --json: stdout is not JSON ({e}): {so[:500]!r}") from None


def no_leftovers(directory: Path, name: str):
    assert not (directory / name).exists(), f"{name} was written although materialize failed"
    assert not [n for n in os.listdir(directory) if TEMP_RE.match(n)], \
        f"temporary files left in {directory}: {os.listdir(directory)}"


def elem_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of every element of t (shape t.shape + (itemsize,)), read through its own
    storage, offset and strides: works for every dtype, float8 and bits types included."""
    t = t.detach()
    isz = t.element_size()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return torch.as_strided(raw, (*t.shape, isz), (*[s * isz for s in t.stride()], 1),
                            t.storage_offset() * isz).cpu()


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """All the bytes of t's storage, as a uint8 tensor on the CPU."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.detach().untyped_storage()).cpu()


def assert_same_tensor(ref: torch.Tensor, got: torch.Tensor, what: str, whole_storage: bool = True):
    assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__}, expected a tensor"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, expected {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert got.stride() == ref.stride(), f"{what}: stride {got.stride()}, expected {ref.stride()}"
    assert got.storage_offset() == ref.storage_offset(), \
        f"{what}: storage offset {got.storage_offset()}, expected {ref.storage_offset()}"
    assert (got.device.type == "meta") == (ref.device.type == "meta"), \
        f"{what}: on {got.device}, PyTorch has it on {ref.device}"
    if ref.device.type == "meta":
        return
    assert torch.equal(elem_bytes(ref), elem_bytes(got)), f"{what}: values differ (bitwise)"
    if whole_storage:
        assert got.untyped_storage().nbytes() == ref.untyped_storage().nbytes(), \
            f"{what}: storage of {got.untyped_storage().nbytes()} bytes, expected {ref.untyped_storage().nbytes()}"
        assert torch.equal(storage_bytes(ref), storage_bytes(got)), f"{what}: storage bytes differ"


def sharing_groups(named: dict) -> list[frozenset]:
    """Partition of the names whose tensors share a (non-empty, non-meta) storage."""
    groups: dict = {}
    for k, v in named.items():
        if v.device.type == "meta" or v.untyped_storage().nbytes() == 0:
            continue
        groups.setdefault((v.device, v.untyped_storage().data_ptr()), set()).add(k)
    return sorted((frozenset(g) for g in groups.values()), key=lambda g: sorted(g))


def assert_same_sharing(ref: dict, got: dict, what: str):
    a = [g for g in sharing_groups(ref)]
    b = [g for g in sharing_groups({k: got[k] for k in ref if k in got})]
    assert a == b, (f"{what}: storage sharing differs\n  PyTorch  {[sorted(g) for g in a if len(g) > 1]}\n"
                    f"  ckptool  {[sorted(g) for g in b if len(g) > 1]}")


def walk(obj, path=()):
    """(path, tensor) for every tensor of a torch.load result, in order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk(v, path + (i,))


def names_for(obj, sd_path) -> dict:
    """name -> tensor as materialize names them: state-dict keys for the tensors of the state
    dict at sd_path (None: none), '/'-joined paths for the others."""
    out = {}
    for path, t in walk(obj):
        if sd_path is not None and len(path) == len(sd_path) + 1 and list(path[:-1]) == list(sd_path):
            name = str(path[-1])
        else:
            name = "/".join(str(p) for p in path)
        assert name not in out, f"reference naming collision on {name!r}"
        out[name] = t
    return out


# The state dict ckptool is expected to pick where fixtures.py does not say (ANY).
SD_PATH = {"nested": None, "tensor_root": None, "list_root": None}

# The foundation set (plus the other readable fixtures); quantized is refused, malicious and
# whole_module are not weights_only-loadable, surrogate_key has no valid UTF-8 name.
CPU_CASES = ["plain", "tied", "tied_params", "views", "dtypes", "dtypes_exotic", "scalars_empty",
             "keys", "nested", "tensor_root", "list_root", "training", "compiled", "ddp_compiled",
             "wrapped_keys", "params_dict", "lightning", "safetensors", "legacy", "meta", "scripted"]


def reference(fx: fxmod.Fixture, device: str = "cpu") -> dict:
    """What PyTorch loads from the fixture, named as materialize names it."""
    if fx.load == fxmod.SAFETENSORS:
        from safetensors.torch import load_file
        return dict(load_file(str(fx.path), device=device))
    if fx.load == fxmod.TORCHSCRIPT:
        # TorchScript: the module's tensors, by attribute path ('bn/weight').
        m = jit_load(fx.path, map_location=device)
        return {k.replace(".", "/"): v for k, v in m.state_dict(keep_vars=True).items()}
    assert fx.load == fxmod.WEIGHTS_ONLY, fx.name
    obj = tload(fx.path, map_location=device)
    sd = SD_PATH.get(fx.name) if fx.state_dict is fxmod.ANY else fx.state_dict
    return names_for(obj, sd)


def assert_matches_reference(ref: dict, out: dict, what: str, whole_storage: bool = True):
    missing = [k for k in ref if k not in out]
    extra = [k for k in out if k not in ref]
    assert not missing and not extra, (f"{what}: names differ\n  missing from OUT: {missing!r}\n"
                                       f"  not in PyTorch's load: {extra!r}")
    for k in ref:
        assert_same_tensor(ref[k], out[k], f"{what}[{k!r}]", whole_storage=whole_storage)
    assert_same_sharing(ref, out, what)


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return -1


def children_rchar(args, env=None) -> tuple[int, int, str]:
    """Runs ckptool ARGS; returns (exit code, bytes its process read, stderr). A reaped
    child's I/O counters are added to its parent's, so /proc/self/io measures it (plus the
    few KB of stdout we read from the pipe)."""
    before = rchar()
    e = dict(os.environ)
    e.setdefault("ASAN_OPTIONS", "detect_leaks=0")  # as run_ckptool: LSan's exit scan is not this test's
    e.update(env or {})
    p = subprocess.run([str(CKPTOOL), *map(str, args)], capture_output=True, timeout=120 * TIME_SCALE, env=e)
    return p.returncode, rchar() - before, p.stderr.decode(errors="replace")


# --------------------------------------------------------------------------- 1. fixtures on cpu


_cpu_outputs: dict = {}


def cpu_output(fx: fxmod.Fixture, directory: Path) -> Path:
    """materialize FX --device cpu -o OUT, once per session."""
    if fx.name not in _cpu_outputs:
        out = directory / f"{fx.name}.cpu.pt"
        materialize(fx.path, "--device", "cpu", "-o", out)
        _cpu_outputs[fx.name] = out
    return _cpu_outputs[fx.name]


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("materialize_out")


@pytest.mark.parametrize("name", CPU_CASES)
def test_cpu_matches_torch(name, fixture_set, out_dir):
    fx = fixture_set[name]
    out = cpu_output(fx, out_dir)
    assert_matches_reference(reference(fx), tload(out), f"materialize {name} --device cpu")


@pytest.mark.parametrize("name", ["plain", "views", "dtypes", "legacy", "safetensors", "scripted"])
def test_mmap_same_output(name, fixture_set, out_dir, tmp_path):
    fx = fixture_set[name]
    a, b = cpu_output(fx, out_dir), tmp_path / "mmap.pt"
    materialize(fx.path, "--mmap", "-o", b)
    assert_matches_reference(reference(fx), tload(b), f"materialize {name} --mmap")
    assert a.read_bytes() == b.read_bytes(), f"{name}: --mmap wrote a different OUT than without"


# The foundation issue's set.
FOUNDATION = ["plain", "tied", "views", "dtypes", "scalars_empty", "compiled", "ddp_compiled",
              "lightning", "safetensors", "legacy", "meta", "scripted"]


@pytest.mark.parametrize("name", FOUNDATION)
def test_meta_dry_run(name, fixture_set):
    fx = fixture_set[name]
    r = materialize_json(fx.path, "--device", "meta")
    assert r["device"] == "meta"
    assert r["bytes"] == 0, f"{name} on meta: reports {r['bytes']} bytes copied"
    assert r["tensors"] == len(reference(fx)), f"{name} on meta: {r['tensors']} tensors, PyTorch has {len(reference(fx))}"


def test_meta_reads_no_data(big_fixture, tmp_path):
    size = big_fixture.path.stat().st_size
    rc, read_meta, err = children_rchar(["materialize", big_fixture.path, "--device", "meta"])
    assert rc == 0, err
    # userfaultfd copies (the default where the kernel allows) are no read() calls, and
    # rchar counts only those: the pread path shows that the counter sees a real load.
    rc, read_cpu, err = children_rchar(["materialize", big_fixture.path, "--device", "cpu"],
                                       env={"CKPTOOL_NO_USERFAULTFD": "1"})
    assert rc == 0, err
    assert read_cpu >= size * 0.95, f"cpu read {read_cpu} bytes of a {size}-byte file?"
    assert read_meta < 1 << 20, f"--device meta read {read_meta} bytes of a {size}-byte file"
    rc, read_mmap, err = children_rchar(["materialize", big_fixture.path, "--mmap"])
    assert rc == 0, err
    assert read_mmap < 1 << 20, f"--mmap read() {read_mmap} bytes: it should map, not read"


def test_big_cpu_threads_mmap(big_fixture, tmp_path):
    fx = big_fixture
    ref = reference(fx)
    outs = {}
    for label, extra in [("default", []), ("threads1", ["--threads", "1"]), ("threads3", ["--threads", "3"]),
                         ("mmap", ["--mmap"])]:
        outs[label] = tmp_path / f"{label}.pt"
        materialize(fx.path, *extra, "-o", outs[label])
    assert_matches_reference(ref, tload(outs["default"]), "materialize big")
    first = outs["default"].read_bytes()
    for label, p in outs.items():
        assert p.read_bytes() == first, f"big: OUT with {label} differs from the default"


def quantized_checkpoint(path: Path) -> dict:
    """Every quantizer torch.save writes: per tensor, per channel on either axis (saved as
    per_channel_affine with scales and zero points as tensors of their own), the
    float-qparams variant, a packed 4-bit dtype, a view at an offset and a tied name."""
    x = torch.linspace(-1, 1, 24).reshape(4, 6)
    whole = torch.quantize_per_tensor(x, 0.01, 3, torch.qint8)
    obj = {
        "qint8": whole,
        "quint8": torch.quantize_per_tensor(x, 0.02, 128, torch.quint8),
        "qint32": torch.quantize_per_tensor(x, 0.001, -7, torch.qint32),
        "quint4x2": torch.quantize_per_tensor(x, 0.1, 2, torch.quint4x2),
        "per_channel": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                                  torch.tensor([0, 1, 2, 3]), 0, torch.qint8),
        "per_channel_axis1": torch.quantize_per_channel(x, torch.linspace(0.01, 0.06, 6),
                                                        torch.arange(6), 1, torch.quint8),
        "float_qparams": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                                    torch.tensor([0.0, 1.0, 2.0, 3.0]), 0, torch.quint8),
        "view": whole[1:3],
    }
    obj["tied"] = obj["view"]
    torch.save(obj, path)
    return obj


def assert_same_quantized(ref: dict, out: dict):
    assert list(out) == list(ref)
    for k, x in ref.items():
        y = out[k]
        assert y.is_quantized and y.dtype == x.dtype and y.qscheme() == x.qscheme(), k
        assert (y.shape, y.stride(), y.storage_offset()) == (x.shape, x.stride(), x.storage_offset()), k
        assert torch.equal(y.int_repr(), x.int_repr()), k
        assert bytes(y.untyped_storage()) == bytes(x.untyped_storage()), k
        if x.qscheme() == torch.per_tensor_affine:
            assert (y.q_scale(), y.q_zero_point()) == (x.q_scale(), x.q_zero_point()), k
        else:
            assert y.q_per_channel_axis() == x.q_per_channel_axis(), k
            for a, b in ((x.q_per_channel_scales(), y.q_per_channel_scales()),
                         (x.q_per_channel_zero_points(), y.q_per_channel_zero_points())):
                assert a.dtype == b.dtype and torch.equal(a, b), k
    assert out["tied"].untyped_storage().data_ptr() == out["view"].untyped_storage().data_ptr()
    assert out["view"].untyped_storage().data_ptr() == out["qint8"].untyped_storage().data_ptr()


@pytest.mark.parametrize("extra", [[], ["--mmap"], ["--threads", "1"]], ids=["default", "mmap", "threads1"])
def test_quantized_matches_torch(extra, tmp_path):
    src = tmp_path / "quantized.pt"
    quantized_checkpoint(src)
    out = tmp_path / "out.pt"
    materialize(src, "--device", "cpu", *extra, "-o", out)
    assert_same_quantized(tload(src), tload(out))


def test_quantized_fixture_and_meta(fixture_set, tmp_path):
    fx = fixture_set["quantized"]
    materialize(fx.path, "-o", tmp_path / "q.pt")
    ref = tload(fx.path)
    out = tload(tmp_path / "q.pt")
    for k, x in ref.items():
        assert torch.equal(out[k].int_repr(), x.int_repr()) and out[k].qscheme() == x.qscheme(), k
    so, _ = materialize(fx.path, "--device", "meta", "--json")
    assert json.loads(so)["tensors"] == len(ref)


def test_quantized_inspect_names_the_quantizer(tmp_path):
    src = tmp_path / "quantized.pt"
    obj = quantized_checkpoint(src)
    rc, so, se = run_ckptool("inspect", "--json", str(src))
    assert rc == 0, se
    rows = {r["path"][0]: r for r in json.loads(so)["tensors"]}
    assert rows["qint32"]["quantization"] == {"scheme": "per_tensor_affine", "scale": 0.001, "zero_point": -7}
    assert rows["quint4x2"]["nbytes"] == obj["quint4x2"].untyped_storage().nbytes() == 12
    pc = rows["per_channel_axis1"]["quantization"]
    assert pc["scheme"] == "per_channel_affine" and pc["axis"] == 1
    assert pc["scales"]["dtype"] == "float64" and pc["zero_points"]["dtype"] == "int64"
    assert all("quantization" in r for r in rows.values())


class QTensorWithParams:
    """Pickles as _rebuild_qtensor(storage of `t`, ..., `params`): any quantizer_params,
    including the list form older writers used and forms torch.save never writes."""

    def __init__(self, t, params):
        self.t, self.params = t, params

    def __reduce_ex__(self, proto):
        storage = torch.storage.TypedStorage(wrap_storage=self.t.untyped_storage(), dtype=self.t.dtype,
                                             _internal=True)
        return (torch._utils._rebuild_qtensor,
                (storage, 0, tuple(self.t.shape), self.t.stride(), self.params, False, OrderedDict()))


def test_quantized_list_quantizer_matches_torch(tmp_path):
    """Per-channel scales and zero points saved as lists: torch.load makes float64/int64
    tensors of them (float32 for the float-qparams variant); so does materialize."""
    x = torch.quantize_per_tensor(torch.linspace(-1, 1, 24).reshape(4, 6), 0.1, 0, torch.qint8)
    src = tmp_path / "lists.pt"
    torch.save({"w": QTensorWithParams(x, (torch.per_channel_affine, [0.1, 0.2, 0.3, 0.4], [0, 1, 2, 3], 0)),
                "f": QTensorWithParams(x, (torch.per_channel_affine_float_qparams, [0.1, 0.2, 0.3, 0.4],
                                           [0.5, 1.0, 2.0, 3.0], 0))}, src)
    out = tmp_path / "out.pt"
    materialize(src, "-o", out)
    ref, got = tload(src), tload(out)
    for k in ref:
        assert got[k].qscheme() == ref[k].qscheme(), k
        assert torch.equal(got[k].int_repr(), ref[k].int_repr()), k
        for a, b in ((ref[k].q_per_channel_scales(), got[k].q_per_channel_scales()),
                     (ref[k].q_per_channel_zero_points(), got[k].q_per_channel_zero_points())):
            assert a.dtype == b.dtype and torch.equal(a, b), k


def test_quantized_hostile_quantizer(tmp_path):
    """A per-channel quantizer whose scales do not match the channel count, whose axis is
    out of range, that mixes a list with a tensor, or an unknown scheme: refused (3) with
    the byte offset, before LibTorch sees it."""
    x = torch.quantize_per_tensor(torch.ones(4, 6), 0.1, 0, torch.qint8)
    for label, params in [
        ("scales", (torch.per_channel_affine, torch.ones(3, dtype=torch.double), torch.zeros(4, dtype=torch.long), 0)),
        ("axis", (torch.per_channel_affine, torch.ones(4, dtype=torch.double), torch.zeros(4, dtype=torch.long), 2)),
        ("mixed", (torch.per_channel_affine, [0.1, 0.2, 0.3, 0.4], torch.zeros(4, dtype=torch.long), 0)),
        ("scheme", (torch.per_tensor_symmetric, 0.1, 0)),
    ]:
        p = tmp_path / f"{label}.pt"
        torch.save({"w": QTensorWithParams(x, params)}, p)
        _, se = materialize(p, rc=3)
        assert "byte" in se and se.strip().count("\n") == 0, f"{label}: {se!r}"


# --------------------------------------------------------------------------- 2. --dtype


@pytest.mark.parametrize("name", ["dtypes", "views", "scalars_empty", "legacy"])
def test_dtype_bfloat16(name, fixture_set, tmp_path):
    fx = fixture_set[name]
    out = tmp_path / "bf16.pt"
    materialize(fx.path, "--dtype", "bfloat16", "-o", out)
    ref, got = reference(fx), tload(out)
    assert sorted(got) == sorted(ref), f"{name}: names differ: {sorted(set(got) ^ set(ref))}"
    for k, r in ref.items():
        g = got[k]
        what = f"{name} --dtype bfloat16 [{k!r}]"
        if r.dtype.is_floating_point:
            assert g.dtype == torch.bfloat16, f"{what}: dtype {g.dtype}"
            assert g.shape == r.shape, f"{what}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
            assert torch.equal(elem_bytes(g), elem_bytes(r.to(torch.bfloat16))), \
                f"{what}: values differ from torch's .to(torch.bfloat16)"
        else:
            assert_same_tensor(r, g, what, whole_storage=False)


def test_dtype_keeps_ties(fixture_set, tmp_path):
    """model.to(torch.bfloat16) keeps embed.weight and lm_head.weight one tensor; so must
    materialize --dtype (one allocation per storage)."""
    fx = fixture_set["tied"]
    out = tmp_path / "bf16.pt"
    materialize(fx.path, "--dtype", "bfloat16", "-o", out)
    got = tload(out)
    assert got["embed.weight"].dtype == torch.bfloat16
    assert got["embed.weight"].untyped_storage().data_ptr() == got["lm_head.weight"].untyped_storage().data_ptr(), \
        "--dtype bfloat16 untied embed.weight and lm_head.weight (two storages in OUT)"


def test_dtype_reported(fixture_set):
    r = materialize_json(fixture_set["plain"].path, "--dtype", "bfloat16")
    assert r["dtype_converted"], "the report lists no dtype-converted tensors although every tensor was cast"


def test_dtype_not_floating_refused(fixture_set):
    materialize(fixture_set["plain"].path, "--dtype", "int8", rc=2)


# --------------------------------------------------------------------------- 3. --model


def _lit_class():
    import lightning as L

    class LitScriptNet(L.LightningModule):
        """The Lightning module around the compiled twin of fixtures.ScriptNet."""

        def __init__(self):
            super().__init__()
            self.model = torch.compile(fxmod.ScriptNet(), backend="eager")

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return LitScriptNet


def _ddp_state_dict(sd: dict, d: Path) -> tuple[dict, str]:
    """DDP(torch.compile(ScriptNet)) with `sd` loaded: module._orig_mod.* keys."""
    import torch.distributed as dist

    plain = fxmod.ScriptNet()
    plain.load_state_dict(sd)
    compiled = torch.compile(plain, backend="eager")
    made = False
    try:
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"file://{d / '.pg_store'}", rank=0, world_size=1)
            made = True
        return nn.parallel.DistributedDataParallel(compiled).state_dict(), "DDP on gloo"
    except Exception as e:
        return {"module." + k: v for k, v in compiled.state_dict().items()}, f"key edit ({type(e).__name__})"
    finally:
        if made:
            dist.destroy_process_group()


def _save(obj, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path)
    return path


PREFIX = "model._orig_mod."


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict:
    """A scripted ScriptNet (eval mode, and one in training mode), a real Lightning
    checkpoint of its compiled twin, a real DDP state dict, and edited variants."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    d = tmp_path_factory.mktemp("materialize_models")
    out: dict = {"dir": d}
    for lg in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(lg).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(40)
        data = TensorDataset(torch.randn(16, 3), torch.randn(16, 2))
        trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(_lit_class()(), DataLoader(data, batch_size=4))
        trainer.save_checkpoint(str(d / "lit.ckpt"))
        torch.manual_seed(41)  # other weights than the checkpoint's
        torch.jit.script(fxmod.ScriptNet().eval()).save(str(d / "scripted.pt"))
        torch.manual_seed(42)
        torch.jit.script(fxmod.ScriptNet()).save(str(d / "scripted_train.pt"))
    out["lit"] = d / "lit.ckpt"
    out["scripted"] = d / "scripted.pt"
    out["scripted_train"] = d / "scripted_train.pt"
    ck = tload(out["lit"])
    sd = ck["state_dict"]
    assert all(k.startswith(PREFIX) for k in sd), list(sd)
    out["weights"] = OrderedDict((k[len(PREFIX):], v) for k, v in sd.items())  # the model's names
    ddp, how = _ddp_state_dict(out["weights"], d)
    out["ddp_how"] = how
    assert all(k.startswith("module._orig_mod.") for k in ddp), list(ddp)
    out["ddp"] = _save(ddp, d / "ddp.pt")

    def variant(name, edit):
        c = dict(ck)
        c["state_dict"] = OrderedDict(sd)
        edit(c["state_dict"])
        out[name] = _save(c, d / f"{name}.ckpt")

    variant("missing", lambda s: s.pop(PREFIX + "fc.bias"))
    variant("unexpected", lambda s: s.update({PREFIX + "extra.weight": torch.ones(3), "aux_head.bias": torch.ones(2)}))
    variant("shape", lambda s: s.update({PREFIX + "fc.weight": torch.ones(2, 4)}))

    def nonfinite(s):
        w = s[PREFIX + "fc.weight"].clone()
        w[0, 1] = float("nan")
        s[PREFIX + "fc.weight"] = w
        s[PREFIX + "bn.bias"] = torch.tensor([1.0, float("inf"), 0.0])

    variant("nonfinite", nonfinite)
    return out


def inputs_like_ckptool(specs) -> list[torch.Tensor]:
    """--input SHAPE[:DTYPE] as src/torch/materialize.cpp builds them: floating ones drawn
    with torch.randn from one CPU generator seeded 0, in argument order, in float32 then
    cast; integer ones zeros."""
    g = torch.Generator().manual_seed(0)
    xs = []
    for shape, dtype in specs:
        if dtype.is_floating_point:
            xs.append(torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype))
        else:
            xs.append(torch.zeros(*shape, dtype=dtype))
    return xs


def spec_args(specs) -> list[str]:
    args = []
    for shape, dtype in specs:
        args += ["--input", "x".join(map(str, shape)) + ":" + str(dtype).removeprefix("torch.")]
    return args


def checksum(t: torch.Tensor) -> float:
    return t.detach().to(torch.float64).sum().item()


def reference_model(weights: dict, train: bool = False) -> nn.Module:
    m = fxmod.ScriptNet()
    m.load_state_dict(weights)
    return m.train(train)


def assert_module_weights(m, weights: dict, what: str, model_file=None):
    """m (torch.jit.load of OUT) holds exactly `weights`, as parameters and buffers where
    the model file has them."""
    sd = m.state_dict()
    assert list(sorted(sd)) == list(sorted(weights)), f"{what}: keys {sorted(sd)}, expected {sorted(weights)}"
    for k, v in weights.items():
        assert_same_tensor(v, sd[k], f"{what}[{k}]", whole_storage=False)
    if model_file is not None:
        # named_parameters() lists a tensor once however many names it has: equal lists mean
        # parameters stayed parameters, buffers buffers, and one tensor object stayed one.
        ref = jit_load(model_file)
        for kind in ("named_parameters", "named_buffers"):
            a = sorted(n for n, _ in getattr(ref, kind)())
            b = sorted(n for n, _ in getattr(m, kind)())
            assert a == b, f"{what}: {kind}() gives {b}, the model file's {a}"
        for n, p in m.named_parameters():
            assert p.requires_grad, f"{what}: parameter {n} lost requires_grad"


EVAL_INPUTS = [((5, 3), torch.float32), ((5, 2), torch.float32)]


def test_model_lightning_compiled_twin(models, tmp_path):
    out = tmp_path / "filled.pt"
    r = materialize_json(models["lit"], "--model", models["scripted"], "--device", "cpu", "-o", out,
                         "--run", "evaluation_step", *spec_args(EVAL_INPUTS))
    assert r["missing"] == [] and r["unexpected"] == [] and r["shape_mismatched"] == [], r
    assert "_orig_mod" in r["key_edit"] and "model." in r["key_edit"], f"key edit: {r['key_edit']!r}"
    assert r["tensors"] == len(models["weights"])
    assert r["bytes"] == sum(v.untyped_storage().nbytes() for v in models["weights"].values())
    m = jit_load(out)
    assert_module_weights(m, models["weights"], "OUT", models["scripted"])
    # --run: the checksum Python gets with the same inputs.
    xs = inputs_like_ckptool(EVAL_INPUTS)
    with torch.no_grad():
        expected = checksum(reference_model(models["weights"]).eval().evaluation_step(*xs))
        from_out = checksum(m.evaluation_step(*xs))
    assert r["run"]["method"] == "evaluation_step"
    (o,) = r["run"]["outputs"]
    assert o["dtype"] == "float32" and o["shape"] == [], o
    assert o["checksum"] == pytest.approx(expected, rel=1e-6, abs=1e-7), \
        f"--run evaluation_step checksum {o['checksum']}, Python computes {expected}"
    assert from_out == pytest.approx(expected, rel=1e-6, abs=1e-7), "OUT's evaluation_step differs from Python's"


def test_model_run_forward(models):
    specs = [((4, 3), torch.float32)]
    r = materialize_json(models["lit"], "--model", models["scripted"], "--run", "forward", *spec_args(specs))
    with torch.no_grad():
        y = reference_model(models["weights"]).eval()(*inputs_like_ckptool(specs))
    (o,) = r["run"]["outputs"]
    assert o["shape"] == list(y.shape) and o["dtype"] == "float32", o
    assert o["checksum"] == pytest.approx(checksum(y), rel=1e-6, abs=1e-6)


def test_model_integer_inputs_samples(tmp_path):
    """samples/: the scripted TinyNet twin of the compiled Lightning sample, with int64
    inputs (zeros) to evaluation_step(ids, target)."""
    from conftest import SOURCE_DIR
    ckpt, model = SOURCE_DIR / "samples" / "compiled_lightning.ckpt", SOURCE_DIR / "samples" / "scripted.pt"
    specs = [((3, 6), torch.int64), ((3,), torch.int64)]
    out = tmp_path / "tiny.pt"
    r = materialize_json(ckpt, "--model", model, "-o", out, "--run", "evaluation_step", *spec_args(specs))
    sd = tload(ckpt)["state_dict"]
    weights = {k[len(PREFIX):]: v for k, v in sd.items() if k.startswith(PREFIX)}
    m = jit_load(out)
    assert_module_weights(m, weights, "samples OUT", model)
    ref = jit_load(model)
    ref.load_state_dict(weights)
    with torch.no_grad():
        expected = checksum(ref.evaluation_step(*inputs_like_ckptool(specs)))
    assert r["run"]["outputs"][0]["checksum"] == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_model_ddp_prefixed(models, tmp_path):
    out = tmp_path / "ddp_filled.pt"
    r = materialize_json(models["ddp"], "--model", models["scripted"], "-o", out)
    assert r["missing"] == [] and r["unexpected"] == [], r
    assert "module." in r["key_edit"] and "_orig_mod" in r["key_edit"], f"key edit ({models['ddp_how']}): {r['key_edit']!r}"
    assert_module_weights(jit_load(out), models["weights"], "DDP OUT", models["scripted"])


def test_model_strict_missing(models, tmp_path):
    so, se = materialize(models["missing"], "--model", models["scripted"], "-o", tmp_path / "m.pt", rc=1)
    assert "fc.bias" in se, f"the missing key is not named: {se!r}"
    no_leftovers(tmp_path, "m.pt")
    so, se = materialize(models["missing"], "--model", models["scripted"], "--strict", "-o", tmp_path / "m.pt", rc=1)
    no_leftovers(tmp_path, "m.pt")


def test_model_no_strict_fills_from_model_file(models, tmp_path):
    out = tmp_path / "ns.pt"
    r = materialize_json(models["missing"], "--model", models["scripted"], "--no-strict", "-o", out)
    assert r["missing"] == ["fc.bias"], r["missing"]
    assert r["filled_from_model"] == ["fc.bias"], r["filled_from_model"]
    own = jit_load(models["scripted"]).state_dict()["fc.bias"]
    expected = dict(models["weights"])
    expected["fc.bias"] = own
    assert not torch.equal(own, models["weights"]["fc.bias"])  # the test tells them apart
    assert_module_weights(jit_load(out), expected, "--no-strict OUT", models["scripted"])
    so, _ = materialize(models["missing"], "--model", models["scripted"], "--no-strict")
    assert "fc.bias" in so, f"the text report does not list the filled tensor:\n{so}"


def test_model_unexpected_listed(models, tmp_path):
    out = tmp_path / "u.pt"
    r = materialize_json(models["unexpected"], "--model", models["scripted"], "-o", out)
    assert sorted(r["unexpected"]) == sorted([PREFIX + "extra.weight", "aux_head.bias"]), r["unexpected"]
    assert r["missing"] == []
    assert_module_weights(jit_load(out), models["weights"], "OUT with unexpected keys")


def test_model_shape_mismatch(models, tmp_path):
    so, se = materialize(models["shape"], "--model", models["scripted"], "-o", tmp_path / "s.pt", rc=1)
    assert "fc.weight" in se, se
    no_leftovers(tmp_path, "s.pt")


def test_model_run_does_not_change_saved_weights(models, tmp_path):
    """A model saved in training mode: --run evaluation_step updates BatchNorm's running
    statistics; -o must still write the checkpoint's weights."""
    out = tmp_path / "t.pt"
    materialize(models["lit"], "--model", models["scripted_train"], "-o", out,
                "--run", "evaluation_step", *spec_args(EVAL_INPUTS))
    assert_module_weights(jit_load(out), models["weights"], "OUT after --run of a training-mode model")


def test_model_dtype_bfloat16(models, tmp_path):
    out = tmp_path / "bf.pt"
    r = materialize_json(models["lit"], "--model", models["scripted"], "--dtype", "bfloat16", "-o", out,
                         "--run", "forward", "--input", "4x3:bfloat16")
    floating = [k for k, v in models["weights"].items() if v.dtype.is_floating_point]
    assert len(r["dtype_converted"]) == len(floating), r["dtype_converted"]
    sd = jit_load(out).state_dict()
    for k, v in models["weights"].items():
        if v.dtype.is_floating_point:
            assert sd[k].dtype == torch.bfloat16 and torch.equal(sd[k], v.to(torch.bfloat16)), k
        else:
            assert_same_tensor(v, sd[k], k, whole_storage=False)
    ref = reference_model(models["weights"]).eval().to(torch.bfloat16)
    with torch.no_grad():
        y = ref(*inputs_like_ckptool([((4, 3), torch.bfloat16)]))
    assert r["run"]["outputs"][0]["checksum"] == pytest.approx(checksum(y), rel=1e-2, abs=1e-2)


def test_model_meta(models, tmp_path):
    r = materialize_json(models["lit"], "--model", models["scripted"], "--device", "meta")
    assert r["device"] == "meta" and r["missing"] == []
    assert r["bytes"] == 0, f"--model --device meta reports {r['bytes']} bytes copied"


def test_model_meta_run(models):
    """PyTorch runs this model on meta (torch.jit.load(map_location='meta')); a dry run with
    --run should give the output shapes."""
    r = materialize_json(models["lit"], "--model", models["scripted"], "--device", "meta",
                         "--run", "forward", "--input", "5x3")
    assert r["run"]["outputs"][0]["shape"] == [5, 2], r["run"]


@pytest.fixture(scope="session")
def tied_model(tmp_path_factory) -> Path:
    """The scripted TiedLM (lm_head.weight is embed.weight), other weights than the fixtures'."""
    p = tmp_path_factory.mktemp("tied_model") / "tiedlm.pt"
    torch.manual_seed(43)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(fxmod.TiedLM().eval()).save(str(p))
    return p


@pytest.mark.parametrize("name", ["tied", "tied_params"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_model_tied(name, dtype, fixture_set, tied_model, tmp_path):
    """tied: two tensors on one storage; tied_params: the same Parameter under both keys (a
    pickle alias). Either way both model weights are filled, and stay one tensor."""
    out = tmp_path / "tied_out.pt"
    materialize(fixture_set[name].path, "--model", tied_model, "-o", out, *(["--dtype", dtype] if dtype else []))
    m = jit_load(out)
    weights = dict(tload(fixture_set[name].path))
    if dtype:
        weights = {k: v.to(getattr(torch, dtype)) for k, v in weights.items()}
    assert_module_weights(m, weights, f"{name} into the scripted TiedLM", tied_model)
    assert m.embed.weight.untyped_storage().data_ptr() == m.lm_head.weight.untyped_storage().data_ptr(), \
        f"{name}{' --dtype ' + dtype if dtype else ''}: embed.weight and lm_head.weight are no longer tied in OUT"


def test_model_not_torchscript(models, fixture_set):
    materialize(models["lit"], "--model", fixture_set["plain"].path, rc=2)


# --------------------------------------------------------------------------- 4. --check-finite


def test_check_finite(models):
    so, se = materialize(models["nonfinite"], "--check-finite", rc=1)
    for k in (PREFIX + "fc.weight", PREFIX + "bn.bias"):
        assert k in so, f"{k} (NaN/Inf) not named:\n{so}"
    r = materialize_json(models["nonfinite"], "--check-finite", rc=1)
    assert sorted(r["non_finite"]) == sorted([PREFIX + "fc.weight", PREFIX + "bn.bias"]), r["non_finite"]
    r = materialize_json(models["lit"], "--check-finite")
    assert r["non_finite"] == []
    r = materialize_json(models["nonfinite"], "--check-finite", "--model", models["scripted"], rc=1)
    assert sorted(r["non_finite"]) == ["bn.bias", "fc.weight"], r["non_finite"]


def test_check_finite_every_floating_dtype(fixture_set):
    """float8 kinds have no isfinite kernel in LibTorch: they are checked all the same (as
    float32 here)."""
    fx = fixture_set["dtypes"]
    ref = reference(fx)
    expected = sorted(k for k, v in ref.items()
                      if v.dtype.is_floating_point and not bool(torch.isfinite(v.float()).all()))
    r = materialize_json(fx.path, "--check-finite", rc=1 if expected else 0)
    assert sorted(r["non_finite"]) == expected, r["non_finite"]


# --------------------------------------------------------------------------- 5. errors


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is available")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_cuda_unavailable(device, fixture_set, tmp_path):
    so, se = materialize(fixture_set["plain"].path, "--device", device, "-o", tmp_path / "c.pt", rc=4)
    assert se.strip() and se.strip().count("\n") == 0, f"not a one-line message: {se!r}"
    assert "cuda" in se.lower(), se
    no_leftovers(tmp_path, "c.pt")


@cuda
def test_cuda_no_such_index(fixture_set):
    so, se = materialize(fixture_set["plain"].path, "--device", f"cuda:{torch.cuda.device_count()}", rc=4)
    assert se.strip().count("\n") == 0, se


@pytest.mark.parametrize("device", ["bogus", "tpu"])
def test_bad_device(device, fixture_set):
    so, se = materialize(fixture_set["plain"].path, "--device", device, rc=2)
    assert se.strip().count("\n") == 0, se


def test_meta_with_output_refused(fixture_set, tmp_path):
    materialize(fixture_set["plain"].path, "--device", "meta", "-o", tmp_path / "x.pt", rc=2)
    no_leftovers(tmp_path, "x.pt")


def test_corrupt_inputs(fixture_set, tmp_path):
    data = fixture_set["plain"].path.read_bytes()
    cases = {
        "truncated.pt": data[: len(data) // 2],
        "garbage.pt": bytes(range(256)) * 8,
    }
    st = fixture_set["safetensors"].path.read_bytes()
    cases["short.safetensors"] = st[:-10]
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        so, se = materialize(p, "-o", tmp_path / "o.pt", rc=3)
        assert se.strip().count("\n") == 0, se
        no_leftovers(tmp_path, "o.pt")


# --------------------------------------------------------------------------- 6. the C++ API example


def run_api_example(*args, rc: int = 0) -> str:
    if not API_EXAMPLE.exists():
        pytest.fail(f"{API_EXAMPLE} not built (ninja api_example; set CKPTOOL_BUILD_DIR)")
    p = subprocess.run([str(API_EXAMPLE), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == rc, (f"api_example {' '.join(map(str, args))}: exit {p.returncode}, expected {rc}\n"
                                f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p.stdout + p.stderr


def check_api_example(models, device: str):
    text = run_api_example(models["scripted"], models["lit"], device, 3)
    n_tensors = len(list(walk(tload(models["lit"]))))
    assert f"tensors: {n_tensors}\n" in text, text
    m = re.search(r"forward: \[2, 2\] sum (\S+)", text)
    assert m, text
    with torch.no_grad():
        y = reference_model(models["weights"]).eval()(torch.ones(2, 3))
    assert float(m.group(1)) == pytest.approx(y.sum().item(), rel=1e-5, abs=1e-6), text


def test_api_example(models):
    check_api_example(models, "cpu")
    text = run_api_example(models["scripted"], models["missing"], "cpu", rc=1)
    assert "fc.bias" in text, text


# --------------------------------------------------------------------------- 7. CUDA

@cuda
@pytest.mark.parametrize("name", CPU_CASES)
def test_cuda_matches_torch(name, fixture_set, tmp_path):
    fx = fixture_set[name]
    out = tmp_path / "out.pt"
    r = materialize_json(fx.path, "--device", "cuda", "-o", out)
    assert r["device"].startswith("cuda"), r
    ref = reference(fx, device="cuda")
    assert_matches_reference(ref, tload(out), f"materialize {name} --device cuda")


@pytest.fixture(scope="session")
def ring_checkpoint(tmp_path_factory) -> Path:
    """~330 MB, larger than the pinned ring (4 x 64 MiB): thousands of small tensors
    (coalesced reads), mid-size ones, and big ones split across several chunks; a tied pair
    and views."""
    d = tmp_path_factory.mktemp("ring")
    g = torch.Generator().manual_seed(7)
    obj = OrderedDict()
    for i in range(3000):
        n = int(torch.randint(1, 4096, (1,), generator=g))
        obj[f"small.{i}"] = torch.randn(n, generator=g)
        if i % 7 == 0:
            obj[f"small_i.{i}"] = torch.randint(-100, 100, (n,), generator=g, dtype=torch.int32)
    obj["big.a"] = torch.randn(40_000_000, generator=g)  # 160 MB: three 64 MiB chunks
    obj["big.b"] = torch.randn(4096, 4096, generator=g).to(torch.bfloat16)  # 32 MiB
    obj["big.tied"] = obj["big.b"].detach()  # another tensor on the same storage, as state_dict() gives
    obj["big.view"] = obj["big.a"][12345:12345 + 1000 * 7].view(1000, 7).t()
    for i in range(8):
        obj[f"mid.{i}"] = torch.randn(3_000_000 + i * 123_457, generator=g)  # ~12 MB each
    obj["tail.f16"] = torch.randn(2_000_001, generator=g).to(torch.float16)
    return _save(obj, d / "ring.pt")


@cuda
def test_cuda_larger_than_ring(ring_checkpoint, tmp_path):
    size = ring_checkpoint.stat().st_size
    assert size > 280e6
    out = tmp_path / "ring_out.pt"
    materialize(ring_checkpoint, "--device", "cuda", "-o", out, timeout=300)
    ref = names_for(tload(ring_checkpoint, map_location="cuda"), [])
    assert_matches_reference(ref, tload(out), "ring checkpoint on cuda")


@cuda
def test_cuda_dtype_on_device(fixture_set, tmp_path):
    fx = fixture_set["dtypes"]
    out = tmp_path / "bf.pt"
    materialize(fx.path, "--device", "cuda", "--dtype", "bfloat16", "-o", out)
    ref, got = reference(fx, device="cuda"), tload(out)
    for k, r in ref.items():
        if r.dtype.is_floating_point:
            assert got[k].dtype == torch.bfloat16
            assert torch.equal(elem_bytes(got[k]), elem_bytes(r.to(torch.bfloat16))), k
        else:
            assert_same_tensor(r, got[k], k, whole_storage=False)


@cuda
def test_cuda_check_finite(models):
    r = materialize_json(models["nonfinite"], "--device", "cuda", "--check-finite", rc=1)
    assert sorted(r["non_finite"]) == sorted([PREFIX + "fc.weight", PREFIX + "bn.bias"])


@cuda
def test_cuda_model_run(models, tmp_path):
    out = tmp_path / "cuda_model.pt"
    r = materialize_json(models["lit"], "--model", models["scripted"], "--device", "cuda", "-o", out,
                         "--run", "evaluation_step", *spec_args(EVAL_INPUTS))
    m = jit_load(out, map_location="cuda")
    assert all(p.is_cuda for p in m.parameters())
    assert_module_weights(m.cpu(), models["weights"], "cuda OUT", models["scripted"])
    xs = inputs_like_ckptool(EVAL_INPUTS)
    with torch.no_grad():
        expected = checksum(reference_model(models["weights"]).eval().cuda().evaluation_step(*[x.cuda() for x in xs]))
    assert r["run"]["outputs"][0]["checksum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)


@cuda
def test_cuda_api_example(models):
    check_api_example(models, "cuda")


# --------------------------------------------------------------------------- CUDA half on demand

def _libraries_loaded(tmp_path: Path, *args) -> tuple[int, str, set[str]]:
    """Runs ckptool with the dynamic loader logging every library it opens."""
    log = tmp_path / "ld"
    rc, so, se = run_ckptool(*args, env={"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(log)})
    names = set()
    for f in tmp_path.glob("ld.*"):
        names |= set(re.findall(r"file=(\S+?\.so[.\d]*)", f.read_text(errors="replace")))
    return rc, se, {Path(n).name for n in names}


@pytest.mark.skipif(not (CKPTOOL.parent / "libckptool_torch_cuda.so").exists(), reason="built without CUDA")
def test_cpu_work_never_loads_libtorch_cuda(tmp_path):
    """LibTorch's CUDA libraries cost ~0.1 s and ~119 MiB per process: --device cpu must not
    load them; naming a CUDA device loads them through libckptool_torch_cuda.so."""
    ckpt = tmp_path / "m.pt"
    torch.save({"w": torch.arange(6.0)}, ckpt)
    rc, se, libs = _libraries_loaded(tmp_path, "materialize", "--device", "cpu", ckpt)
    assert rc == 0, se
    assert "libckptool_torch.so" in libs
    assert not {"libtorch_cuda.so", "libckptool_torch_cuda.so"} & libs, sorted(libs)
    for f in tmp_path.glob("ld.*"):
        f.unlink()
    rc, se, libs = _libraries_loaded(tmp_path, "materialize", "--device", "cuda", ckpt)
    assert {"libtorch_cuda.so", "libckptool_torch_cuda.so"} <= libs, sorted(libs)
    if torch.cuda.is_available():
        assert rc == 0, se
    else:
        assert rc == 4 and "no CUDA device is available" in se, se


class TiedHead(nn.Module):
    """An embedding tied to its output head: one Parameter under two names."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.emb(x))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    d = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    torch.jit.script(TiedHead()).save(str(d / "model.pt"))
    torch.manual_seed(1)
    sd = TiedHead().state_dict()
    variants = {"both": dict(sd), "head_only": {"head.weight": sd["head.weight"]},
                "emb_only": {"emb.weight": sd["emb.weight"]}, "neither": {"other": torch.ones(1)},
                "different": {"emb.weight": sd["emb.weight"], "head.weight": sd["head.weight"].clone() * 0 + 5}}
    for name, v in variants.items():
        torch.save(v, d / f"{name}.pt")
    return d


@pytest.mark.parametrize("name", ["both", "head_only", "emb_only", "neither"])
def test_a_tie_is_filled_from_whichever_name_the_checkpoint_holds(tied, tmp_path, name):
    # load_state_dict(strict=False) copies every name it finds into the one tensor; with
    # neither name, the model keeps its own value.
    ref = torch.jit.load(str(tied / "model.pt"))
    ref.load_state_dict(torch.load(tied / f"{name}.pt"), strict=False)
    out = tmp_path / "o.pt"
    r = materialize_json(tied / f"{name}.pt", "--model", tied / "model.pt", "--no-strict", "--device", "cpu", "-o", out)
    got = torch.jit.load(str(out))
    assert torch.equal(got.emb.weight, ref.emb.weight) and got.emb.weight is got.head.weight
    filled = set(r.get("filled_from_model", []))
    assert filled == ({"emb.weight"} if name == "neither" else set()), r


def test_a_tie_given_different_values_is_refused(tied, tmp_path):
    # torch keeps whichever name it copies last; ckptool does not pick.
    out = tmp_path / "o.pt"
    so, se = materialize(tied / "different.pt", "--model", tied / "model.pt", "--device", "cpu", "-o", out, rc=1)
    assert "the model ties emb.weight, head.weight" in se and "different values" in se and not out.exists(), se
    materialize(tied / "different.pt", "--model", tied / "model.pt", "--device", "meta")  # no values to tell apart


def test_float8_cast_of_a_tensor_requiring_grad_is_refused(tmp_path):
    # torch.load cannot rebuild such a tensor (_rebuild_tensor_v3 sets its dtype in place).
    torch.save({"p": torch.randn(3).requires_grad_(), "w": nn.Parameter(torch.randn(3))}, tmp_path / "g.pt")
    out = tmp_path / "o.pt"
    so, se = materialize(tmp_path / "g.pt", "--device", "cpu", "--dtype", "float8_e4m3fn", "-o", out, rc=3)
    assert "tensor p: a float8_e4m3fn tensor that requires grad" in se and not out.exists(), se
    torch.save({"w": nn.Parameter(torch.randn(3))}, tmp_path / "p.pt")
    materialize(tmp_path / "p.pt", "--device", "cpu", "--dtype", "float8_e4m3fn", "-o", out)
    assert torch.load(out, weights_only=True)["w"].dtype == torch.float8_e4m3fn
