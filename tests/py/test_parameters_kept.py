"""Issue 12 item 8: `materialize -o` keeps what torch.load gives of each tensor besides its
values: nn.Parameter stays nn.Parameter, requires_grad stays as saved (on Parameters and on
plain tensors), and one tensor object under several names (tied Parameters) stays one
object. Each output is read with torch.load(weights_only=True) and compared with torch.load
of the input written by real torch.save: type, requires_grad, dtype, shape, values bit for bit.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import run_ckptool

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


def _load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=True, map_location="cpu")


def _materialize(src: Path, out: Path, *extra: str) -> None:
    rc, _, err = run_ckptool("materialize", "--device", "cpu", *extra, "-o", out, src, timeout=30)
    assert rc == 0, err


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _compare(ref: dict, got: dict) -> None:
    assert list(got) == list(ref)
    for k, r in ref.items():
        g = got[k]
        assert type(g) is type(r), f"{k}: {type(g).__name__} vs torch.load's {type(r).__name__}"
        assert g.requires_grad == r.requires_grad, f"{k}: requires_grad {g.requires_grad} vs {r.requires_grad}"
        assert _same_bits(g, r), k


def test_module_state_dict_with_parameters(tmp_path):
    """A state dict of Parameters as people save it: {k: p for k, p in named_parameters()}
    (what optimizers' param groups and many training scripts pickle), plus buffers."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    m[2].bias.requires_grad_(False)  # a frozen parameter: Parameter, requires_grad False
    sd = OrderedDict(m.named_parameters())
    sd.update(m.named_buffers())
    src = tmp_path / "params.pt"
    torch.save(sd, src)
    ref = _load(src)
    assert isinstance(ref["0.weight"], nn.Parameter) and ref["0.weight"].requires_grad
    out = tmp_path / "out.pt"
    _materialize(src, out)
    _compare(ref, _load(out))


def test_plain_tensor_requires_grad(tmp_path):
    """A plain tensor saved with requires_grad=True (torch.save records it in
    _rebuild_tensor_v2) comes back with it; one without stays without."""
    src = tmp_path / "grad.pt"
    torch.save({"leaf": torch.arange(6.0).reshape(2, 3).requires_grad_(),
                "plain": torch.ones(3), "ints": torch.arange(4)}, src)
    ref = _load(src)
    out = tmp_path / "out.pt"
    _materialize(src, out)
    _compare(ref, _load(out))


def test_tied_parameters_stay_one_object(tmp_path):
    """A Parameter under two names is one object in torch.load's result: so in OUT."""
    w = nn.Parameter(torch.randn(5, 2))
    src = tmp_path / "tied.pt"
    torch.save({"emb.weight": w, "head.weight": w, "bias": nn.Parameter(torch.zeros(5))}, src)
    ref = _load(src)
    assert ref["emb.weight"] is ref["head.weight"]
    out = tmp_path / "out.pt"
    _materialize(src, out)
    got = _load(out)
    _compare(ref, got)
    assert got["emb.weight"] is got["head.weight"]


def test_parameters_kept_with_dtype_cast(tmp_path):
    """--dtype casts the values and keeps the Parameter and its requires_grad."""
    src = tmp_path / "p.pt"
    torch.save({"w": nn.Parameter(torch.randn(3, 3)), "f": nn.Parameter(torch.randn(2), requires_grad=False)}, src)
    ref = _load(src)
    out = tmp_path / "out.pt"
    _materialize(src, out, "--dtype", "bfloat16")
    got = _load(out)
    for k, r in ref.items():
        assert type(got[k]) is nn.Parameter and got[k].requires_grad == r.requires_grad, k
        assert _same_bits(got[k], r.detach().to(torch.bfloat16)), k


def test_parameters_in_nested_checkpoint(tmp_path):
    """Outside a state dict too (a Lightning-like {'state_dict': ..., 'extra': [...]})."""
    src = tmp_path / "nested.pt"
    torch.save({"state_dict": {"a": nn.Parameter(torch.randn(2, 2))},
                "params": [nn.Parameter(torch.ones(3), requires_grad=False)]}, src)
    ref = _load(src)
    out = tmp_path / "out.pt"
    _materialize(src, out)
    got = _load(out)
    assert type(got["a"]) is nn.Parameter and got["a"].requires_grad
    assert _same_bits(got["a"], ref["state_dict"]["a"])
    assert type(got["params/0"]) is nn.Parameter and not got["params/0"].requires_grad
    assert _same_bits(got["params/0"], ref["params"][0])


def test_python_attributes_kept(tmp_path):
    """Attributes set on a Parameter or a tensor (torch.save pickles them as the object's
    state: _rebuild_parameter_with_state, _rebuild_from_type_v2) come back from OUT."""
    p = nn.Parameter(torch.randn(3))
    p.note, p.shard = "frozen-by-hand", [0, 2]
    t = torch.arange(4.0)
    t.scale = 2.5
    src = tmp_path / "attrs.pt"
    torch.save({"p": p, "t": t}, src)
    ref = _load(src)
    out = tmp_path / "out.pt"
    _materialize(src, out)
    got = _load(out)
    _compare(ref, got)
    assert got["p"].note == "frozen-by-hand" and got["p"].shard == [0, 2]
    assert got["t"].scale == 2.5


def test_unwritable_attributes_refused(tmp_path):
    """An attribute holding an object (here a torch.device) is not a plain value: -o is
    refused as unsupported (3), nothing written, instead of silently dropping it."""
    t = torch.ones(2)
    t.where = torch.device("cpu")
    src = tmp_path / "obj_attr.pt"
    torch.save({"t": t}, src)
    assert _load(src)["t"].where == torch.device("cpu")
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", out, src, timeout=30)
    assert rc == 3, err
    assert err.startswith("ckptool: unsupported: ") and "Python attributes" in err and err.count("\n") == 1, err
    assert not out.exists()
