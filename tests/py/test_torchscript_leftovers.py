"""Issue 12 item 2: the tensors of a TorchScript module that no state dict holds.

Plain tensor attributes (`self.x = torch.tensor(...)`, neither parameter nor buffer) and the
code's tensor constants (CONSTANTS.cN: tensor default arguments, tensors captured by scripting
or tracing) used to stay on meta after `materialize --model`: -o wrote a module whose forward
failed, --run failed, the report said nothing. And a module whose submodules have tensor
defaults could not be inspected at all (aten::equal on meta while LibTorch loads it).

Every model here is scripted or traced by real PyTorch; its checkpoint is the state dict of
an instance with other weights. The reference is torch.jit.load(MODEL) given the checkpoint
with load_state_dict; the output of `materialize -o` must run every exported method with the
same results, bit for bit, and hold no tensor anywhere but on the device.
"""

import json
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn

from conftest import run_ckptool

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


# --------------------------------------------------------------------------- models


@torch.jit.script
class Holder:
    def __init__(self, t: torch.Tensor):
        self.t = t


class Scaled(nn.Module):
    """A submodule with a plain tensor attribute and a tensor default argument."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = torch.randn(3)

    def forward(self, x, offset: torch.Tensor = torch.tensor([0.5, 0.25, 0.125])):
        return self.lin(x) * self.scale + offset


class Leftovers(nn.Module):
    """Tensor attributes of every kind TorchScript allows, and constants in graphs and
    schemas. Two instances of one submodule class with a tensor default is what made
    LibTorch's meta load run aten::equal."""

    opt: Optional[torch.Tensor]
    use_a: bool

    def __init__(self):
        super().__init__()
        self.use_a = True
        self.a = Scaled()
        self.b = Scaled()
        base = torch.randn(12, dtype=torch.float64)
        self.v1 = base[:6].view(2, 3)  # two views of one storage
        self.v2 = base[6:]
        self.xs: List[torch.Tensor] = [torch.randn(3), torch.randn(3)]
        self.d: Dict[str, torch.Tensor] = {"k.1": torch.tensor([1, 2, 3]), "mask": torch.tensor([True, False, True])}
        self.tup: Tuple[torch.Tensor, int] = (torch.randn(3), 5)
        self.opt = torch.randn(3)
        self.h = Holder(torch.randn(3))
        self.register_buffer("buf", torch.randn(3))

    def forward(self, x):
        # CONSTANTS.c0 (a's default) is a constant node inside these blocks.
        if self.use_a:
            y = self.a(x)
        else:
            y = -self.a(x)
        y = y + self.b(x, torch.ones_like(x[0]))
        y = y + self.v1.sum(0).float() + self.v2[:3].float() + self.xs[1] + self.d["k.1"]
        y = y + self.tup[0] + self.h.t + self.buf
        y = torch.where(self.d["mask"], y, -y)
        o = self.opt
        if o is not None:
            y = y + o
        return y

    @torch.jit.export
    def shifted(self, x, k: torch.Tensor = torch.tensor([1.0, -1.0, 2.0])):
        return self.a(x) * k + self.xs[0]


class ParameterView(nn.Module):
    """An attribute that is a view of a parameter's storage: after load_state_dict it shows
    the checkpoint's values, so it must after materialize too."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.row = self.lin.weight.detach()[1]

    def forward(self, x):
        return self.lin(x) + self.row[:3].sum()


@torch.jit.script
class Boxed:
    """Pickled through its own __getstate__: the model file stores a tuple, not attributes."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def __getstate__(self) -> Tuple[torch.Tensor, int]:
        return (self.t, 0)

    def __setstate__(self, state: Tuple[torch.Tensor, int]):
        self.t = state[0]


class WithBoxed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.box = Boxed(torch.randn(3))

    def forward(self, x):
        return self.lin(x) + self.box.t


class Traced(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        # Tracing captures this tensor as a constant of the graph (CONSTANTS.c0).
        return self.lin(x) * torch.tensor([2.0, -1.0, 0.5])


def _script(name: str, seed: int) -> torch.jit.ScriptModule:
    torch.manual_seed(seed)
    if name == "leftovers":
        return torch.jit.script(Leftovers())
    if name == "parameter_view":
        return torch.jit.script(ParameterView())
    if name == "boxed":
        return torch.jit.script(WithBoxed())
    if name == "traced":
        return torch.jit.trace(Traced(), torch.randn(2, 3))
    raise KeyError(name)


METHODS = {"leftovers": ["forward", "shifted"], "parameter_view": ["forward"], "traced": ["forward"]}
FROM_MODEL_FILE = {
    "leftovers": {"v1", "v2", "xs[0]", "xs[1]", "d['k.1']", "d['mask']", "tup[0]", "opt", "h.t",
                  "a.scale", "b.scale", "CONSTANTS.c0", "CONSTANTS.c1"},
    "parameter_view": {"row"},
    "traced": {"CONSTANTS.c0"},
}


def _write(tmp_path: Path, name: str) -> Tuple[Path, Path]:
    model = tmp_path / f"{name}.pt"
    _script(name, seed=1).save(str(model))
    # The checkpoint: other weights, written by torch.save as people do.
    ckpt = tmp_path / f"{name}.ckpt"
    torch.save(_script(name, seed=2).state_dict(), ckpt)
    return model, ckpt


def _reference(model: Path, ckpt: Path):
    ref = torch.jit.load(str(model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.load_state_dict(torch.load(ckpt, weights_only=True))
    return ref


def _saved_tensor_locations(path: Path) -> List[str]:
    """The device of every tensor in the archive's pickles (data.pkl: attributes of every
    module and object; constants.pkl: the code's constants), as torch.jit.load reads them."""
    locations: List[str] = []

    class _Any:
        def __init__(self, *a, **k):
            pass

        def __setstate__(self, state):
            pass

    class _Reader(pickle.Unpickler):
        def persistent_load(self, pid):
            locations.append(pid[3])
            return None

        def find_class(self, module, name):
            if module.startswith("__torch__"):
                return _Any
            return lambda *a, **k: None

    with zipfile.ZipFile(path) as z:
        for rec in z.namelist():
            if rec.endswith("/data.pkl") or rec.endswith("/constants.pkl"):
                _Reader(z.open(rec)).load()
    return locations


def _materialize(*args, expect_rc: int = 0) -> Tuple[str, str]:
    rc, out, err = run_ckptool("materialize", *map(str, args), timeout=120)
    assert rc == expect_rc, f"rc {rc}, expected {expect_rc}\nstdout: {out}\nstderr: {err}"
    return out, err


def _inputs():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(4, 3, generator=g), torch.randn(1, 3, generator=g)]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(METHODS))
def test_output_runs_like_the_reference(tmp_path, name):
    model, ckpt = _write(tmp_path, name)
    out = tmp_path / "out.pt"
    report, _ = _materialize(ckpt, "--model", model, "--device", "cpu", "-o", out, "--json")
    locations = _saved_tensor_locations(out)
    assert locations and set(locations) == {"cpu"}, locations

    ref, got = _reference(model, ckpt), torch.jit.load(str(out))
    for t in got.state_dict().values():
        assert t.device.type == "cpu"
    for method in METHODS[name]:
        for x in _inputs():
            want, have = getattr(ref, method)(x), getattr(got, method)(x)
            assert torch.equal(want, have), f"{method}: {want} vs {have}"
    # The attributes themselves, bit for bit.
    if name == "leftovers":
        for attr in ("v1", "v2", "opt"):
            assert torch.equal(getattr(got, attr), getattr(ref, attr)), attr
        assert torch.equal(got.a.scale, ref.a.scale) and torch.equal(got.b.scale, ref.b.scale)
        assert torch.equal(got.d["mask"], ref.d["mask"]) and got.d["mask"].dtype == torch.bool
        assert all(torch.equal(g, r) for g, r in zip(got.xs, ref.xs))
        # The two views still share their storage, as in the model file.
        assert got.v1.untyped_storage().data_ptr() == got.v2.untyped_storage().data_ptr()
    doc = json.loads(report)
    assert set(doc["from_model_file"]) == FROM_MODEL_FILE[name]
    assert doc["missing"] == [] and doc["filled_from_model"] == []


def test_attribute_view_of_a_parameter_follows_the_checkpoint(tmp_path):
    model, ckpt = _write(tmp_path, "parameter_view")
    out = tmp_path / "out.pt"
    _materialize(ckpt, "--model", model, "--device", "cpu", "-o", out)
    got = torch.jit.load(str(out))
    weight = torch.load(ckpt, weights_only=True)["lin.weight"]
    assert torch.equal(got.row, weight[1])
    assert got.row.untyped_storage().data_ptr() == got.lin.weight.untyped_storage().data_ptr()


def test_run_on_cpu_and_meta(tmp_path):
    model, ckpt = _write(tmp_path, "leftovers")
    for device in ("cpu", "meta"):
        report, _ = _materialize(ckpt, "--model", model, "--device", device, "--run", "forward", "--input", "4x3", "--json")
        doc = json.loads(report)
        assert set(doc["from_model_file"]) == FROM_MODEL_FILE["leftovers"]
        (output,) = doc["run"]["outputs"]
        assert output["shape"] == [4, 3] and output["dtype"] == "float32"
    text, _ = _materialize(ckpt, "--model", model, "--device", "cpu", "--run", "shifted", "--input", "2x3")
    assert "from the model file (attributes and constants no state dict holds) (13):" in text
    assert "  CONSTANTS.c1\n" in text


def test_strict_fails_only_for_the_checkpoint_tensors(tmp_path):
    model, ckpt = _write(tmp_path, "leftovers")
    sd = torch.load(ckpt, weights_only=True)
    del sd["a.lin.bias"]
    partial = tmp_path / "partial.ckpt"
    torch.save(sd, partial)
    _, err = _materialize(partial, "--model", model, "--device", "cpu", expect_rc=1)
    assert "1 model tensors are missing from the checkpoint (a.lin.bias)" in err
    report, _ = _materialize(partial, "--model", model, "--device", "cpu", "--no-strict", "--json")
    doc = json.loads(report)
    assert doc["filled_from_model"] == ["a.lin.bias"]
    assert set(doc["from_model_file"]) == FROM_MODEL_FILE["leftovers"]


def test_dtype_casts_parameters_and_buffers_only(tmp_path):
    """--dtype does what Module.to(dtype) does: attributes and constants keep their dtype."""
    model, ckpt = _write(tmp_path, "leftovers")
    out = tmp_path / "out.pt"
    _materialize(ckpt, "--model", model, "--device", "cpu", "--dtype", "bfloat16", "-o", out)
    got, ref = torch.jit.load(str(out)), torch.jit.load(str(model))
    assert got.a.lin.weight.dtype == torch.bfloat16 and got.buf.dtype == torch.bfloat16
    assert got.a.scale.dtype == torch.float32 and got.v1.dtype == torch.float64
    assert torch.equal(got.a.scale, ref.a.scale)
    assert "offset: Tensor=CONSTANTS.c0" in got.a.code  # the default is still the saved constant
    assert set(_saved_tensor_locations(out)) == {"cpu"}


def test_inspect_module_with_submodule_tensor_defaults(tmp_path):
    """Loading it on meta ran aten::equal (constant pooling) and failed; the schema's tensor
    default could not be printed either."""
    model, _ = _write(tmp_path, "leftovers")
    rc, out, err = run_ckptool("inspect", "--json", model, timeout=120)
    assert rc == 0, err
    doc = json.loads(out)
    ts = doc["module"]
    schemas = {m["name"]: m["schema"] for m in ts["methods"] + ts["submodule_methods"]}
    assert schemas["shifted"].endswith("Leftovers self, Tensor x, Tensor k=<tensor float32[3]>) -> Tensor")
    assert "Tensor offset=<tensor float32[3]>" in schemas["a.forward"]
    rc, out, err = run_ckptool("inspect", model, "--input", "2x3", timeout=120)
    assert rc == 0, err
    assert "[2, 3]" in out


def test_attribute_that_cannot_be_placed_is_refused(tmp_path):
    """A tensor whose record cannot be told from the model file (an object restored by its
    own __setstate__) is refused, naming it, rather than written on meta with exit 0."""
    model, ckpt = _write(tmp_path, "boxed")
    out = tmp_path / "out.pt"
    _, err = _materialize(ckpt, "--model", model, "--device", "cpu", "--allow-code", "-o", out, expect_rc=3)
    assert "tensor box.t (neither parameter nor buffer): its record in the model file cannot be told exactly" in err
    assert not out.exists()
