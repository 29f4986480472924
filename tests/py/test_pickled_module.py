"""Issue 12 item 5: a whole nn.Module pickled by torch.save(model), in the zip format and
in the legacy one (where each class is also a persistent id ('module', class, file,
source) beside the storages), at protocol 2 and, below it, through
copy_reg._reconstructor, and the Python 2 pickler's form.

ckptool must read its tensors, name the pickled classes as unsafe globals, present the
state dict under the keys model.state_dict() gives (parameters, persistent buffers only,
submodules depth first, a tied parameter under both names), so that `materialize -o`
output goes into load_state_dict(strict=True), and refuse to rekey the pickled module
itself (its keys are attribute names its class's code uses). The reference is
torch.load(weights_only=False) of the file and state_dict() of what it returns.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import pickle
import pytest
import torch
import torch.nn as nn

import py2_pickle
import reference
from conftest import inspect_json, run_ckptool

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("scale", torch.full((d,), 2.0))
        self.register_buffer("cache", torch.arange(3.0), persistent=False)  # not in state_dict()
        self.register_buffer("unset", None)  # None: not in state_dict()

    def forward(self, x):
        return self.lin(x) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(4), Block(4)])
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.BatchNorm1d(4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter under two keys
        self.plain = torch.ones(2)  # a plain tensor attribute: not in state_dict()
        self.register_parameter("missing", None)
        self.note = "whole model"

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.seq(x))


CASES = {  # name: (zip format, pickle module, protocol)
    "zip": (True, pickle, 2),
    "legacy": (False, pickle, 2),
    "legacy-proto1": (False, pickle, 1),  # copy_reg._reconstructor, the class a persistent id
    "legacy-py2": (False, py2_pickle, 2),  # hooks' OrderedDicts as [key, value] pairs
}


def _as_torch_1x(model: nn.Module) -> nn.Module:
    """Before torch 2.0 a module's registries were OrderedDicts, which Python 2 pickled as
    OrderedDict([[name, value], ...])."""
    for m in model.modules():
        for registry in ("_parameters", "_buffers", "_modules"):
            setattr(m, registry, OrderedDict(getattr(m, registry)))
    return model


def _save(obj, path: Path, case: str) -> Path:
    zip_format, module, protocol = CASES[case]
    if module is py2_pickle:
        obj = _as_torch_1x(obj)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, pickle_module=module, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=zip_format)
    return path


def _load(path: Path, weights_only: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=weights_only, map_location="cpu")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


@pytest.fixture(scope="module", params=list(CASES))
def saved(request, tmp_path_factory) -> tuple[Path, nn.Module]:
    path = _save(Net(), tmp_path_factory.mktemp("pickled_module") / f"{request.param}.pt", request.param)
    model = _load(path, weights_only=False)
    assert isinstance(model, Net)
    return path, model


def test_inspect_json_gives_state_dict_keys(saved):
    path, model = saved
    want = model.state_dict()
    assert "blocks.0.cache" not in want and "head.weight" in want  # what state_dict() gives
    doc = inspect_json(path)
    pm = doc.get("pickled_module")
    assert pm, "no pickled_module in inspect --json"
    assert pm["class"] == f"{Net.__module__}.Net"
    assert pm["weights_only"] is False
    assert [e["key"] for e in pm["state_dict_keys"]] == list(want)
    for e in pm["state_dict_keys"]:
        t = reference.resolve(model, e["path"])
        assert isinstance(t, torch.Tensor) and _same_bits(t, want[e["key"]]), e
    assert doc["state_dict"] == []
    # Every tensor of the file is listed by path, as torch.load reaches it.
    py_tensors, _ = reference.walk(model)
    assert {tuple(t["path"]) for t in doc["tensors"]} == set(py_tensors)
    for cls in (f"{Net.__module__}.Net", f"{Net.__module__}.Block", "torch.nn.modules.linear.Linear",
                "torch.nn.modules.container.ModuleList", "torch.nn.modules.container.Sequential"):
        assert cls in doc["unsafe_globals"], cls


def test_inspect_text_says_pickled_module(saved):
    path, model = saved
    rc, out, err = run_ckptool("inspect", path)
    assert rc == 0, err
    n = len(model.state_dict())
    assert f"state dict: the root, {n} keys, {n - 1} tensors" in out, out
    assert f"pickled nn.Module: {Net.__module__}.Net" in out
    assert "weights_only=False" in out and "unsafe" in out
    keyed, _, others = out.partition("other tensors:")
    assert "blocks.0.lin.weight" in keyed and "\n  _modules/" not in keyed, out
    # What state_dict() leaves out is still shown, by path.
    assert "_modules/blocks/_modules/0/_buffers/cache" in others, out


def test_materialize_output_loads_strictly(saved, tmp_path):
    path, model = saved
    out = tmp_path / "sd.pt"
    rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", out, path, timeout=60)
    assert rc == 0, err
    got = _load(out, weights_only=True)
    want = model.state_dict()
    assert list(got) == list(want)
    for k, v in want.items():
        # state_dict() holds detached tensors: plain, requires_grad False.
        assert type(got[k]) is torch.Tensor and not got[k].requires_grad, k
        assert _same_bits(got[k], v), k
    # The tied pair is still one tensor.
    assert got["head.weight"].untyped_storage().data_ptr() == got["embed.weight"].untyped_storage().data_ptr()
    fresh = Net()
    fresh.load_state_dict(got, strict=True)
    ids = torch.tensor([1, 2, 3])
    model.eval()
    fresh.eval()
    assert torch.equal(fresh(ids), model(ids))


def test_rekey_refuses_with_reason(saved, tmp_path):
    path, _ = saved
    rc, out, err = run_ckptool("rekey", "--keep-unsafe", "--add-prefix", "model.", "-o", tmp_path / "r.pt", path)
    assert rc == 3, (rc, out, err)
    assert not (tmp_path / "r.pt").exists()
    if path.stem.startswith("legacy"):
        return  # legacy files are refused as such first
    assert "pickled nn.Module" in err and "materialize" in err, err


def test_module_under_a_holder_key(tmp_path):
    """{'model': model, 'epoch': 3}: the module's keys, the rest by path."""
    path = _save({"model": Net(), "epoch": 3, "ema": torch.zeros(2)}, tmp_path / "holder.pt", "zip")
    ref = _load(path, weights_only=False)
    doc = inspect_json(path)
    assert doc["state_dict"] == ["model"]
    assert [e["key"] for e in doc["pickled_module"]["state_dict_keys"]] == list(ref["model"].state_dict())
    out = tmp_path / "sd.pt"
    rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", out, path, timeout=60)
    assert rc == 0, err
    got = _load(out, weights_only=True)
    assert list(got) == list(ref["model"].state_dict()) + ["ema"]


def test_module_inside_itself_has_no_state_dict(tmp_path):
    """torch.load reads it, state_dict() never returns: no keys to give, tensors by path."""
    inner = nn.Sequential(nn.Linear(2, 2))
    outer = nn.Sequential(inner)
    inner.add_module("back", outer)
    path = _save(outer, tmp_path / "cycle.pt", "zip")
    with pytest.raises(RecursionError):
        _load(path, weights_only=False).state_dict()
    doc = inspect_json(path)
    assert doc["state_dict"] is None and doc["pickled_module"]["state_dict_keys"] == []
    assert "contains itself" in doc["pickled_module"]["unread"]
    assert {tuple(t["path"]) for t in doc["tensors"]} == set(reference.walk(_load(path, weights_only=False))[0])


def test_module_shared_exponentially_is_a_limit(tmp_path):
    """Each level holds the one below twice: 2^40 keys from a few KiB of pickle."""
    m = nn.Linear(1, 1)
    for _ in range(40):
        s = nn.Module()
        s.add_module("a", m)
        s.add_module("b", m)
        m = s
    path = _save(m, tmp_path / "dag.pt", "zip")
    rc, _, err = run_ckptool("inspect", path, timeout=60)
    assert rc == 3 and "raise with --max-tensors" in err, (rc, err)


def test_module_that_saves_its_state_dict_its_own_way(tmp_path):
    """Quantized modules override _save_to_state_dict (packed weights, scale, zero_point):
    the file cannot say their keys, so none are made up; tensors stay listed by path."""
    try:
        model = nn.Sequential(nn.Linear(2, 2), torch.ao.nn.quantized.Linear(2, 2))
        path = _save(model, tmp_path / "quantized.pt", "zip")
        want = list(_load(path, weights_only=False).state_dict())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no quantized Linear in this torch build: {e}")
    assert "1._packed_params._packed_params" in want
    doc = inspect_json(path)
    assert doc["state_dict"] is None
    assert "torch.ao.nn.quantized.modules.linear.Linear" in doc["pickled_module"]["unread"]
    rc, out, err = run_ckptool("inspect", path)
    assert rc == 0 and "state_dict() keys the file cannot tell" in out, (rc, out, err)
