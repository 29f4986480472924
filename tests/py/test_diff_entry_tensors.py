"""`ckptool diff` leaves no tensor uncompared behind an "equivalent" (docs/formats.md §12.4).

* A tensor inside a DCP BYTE_IO item: real dcp.save (no_dist, one process) keeps a tuple,
  and any object, whole (torch/distributed/checkpoint/_traverse.py: only dicts, and lists
  holding dicts, tensors or such lists, are walked into), so a tensor inside one is written
  into the item's torch.save archive. Its values are compared as any tensor's.
* A training checkpoint written by real torch.save against its twin written by real
  dcp.save from the same dict: DCP flattens the optimizer's state into keys
  (`optim.state.0.exp_avg`) that are entries of the .pt (`optim/state/0/exp_avg`); diff
  pairs them by DCP's own flattening, for opt.state_dict() and for the FQN-keyed form
  torch.distributed.checkpoint.state_dict.get_state_dict gives.
"""

from __future__ import annotations

import copy
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import run_ckptool  # noqa: E402
from test_diff_values import diff_json  # noqa: E402

warnings.filterwarnings("ignore")


def changed(doc) -> dict:
    return {(t["key_a"], t["key_b"]): t for t in doc["tensors"]}


@dataclass
class Holder:
    """A user object holding a tensor: DCP stores it whole, as a BYTE_IO item."""

    t: torch.Tensor
    name: str


def byte_io_state(t: torch.Tensor, u: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(3, 4, generator=g), "extra": (t, 3), "holder": Holder(u, "h"), "epoch": 2}


@pytest.fixture(scope="module")
def byte_io(tmp_path_factory) -> dict:
    import torch.distributed.checkpoint as dcp
    d = tmp_path_factory.mktemp("byte_io")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    u = torch.linspace(-1, 1, 5, dtype=torch.float64)
    t_elem, u_elem, t_near = t.clone(), u.clone(), t.clone()
    t_elem[1, 2] = 99.0
    u_elem[4] = -2.0
    t_near[0, 1] += 1e-6
    out = {}
    for name, (a, b) in {"a": (t, u), "same": (t.clone(), u.clone()), "tuple_elem": (t_elem, u),
                         "object_elem": (t, u_elem), "near": (t_near, u)}.items():
        dcp.save(byte_io_state(a.clone(), b.clone()), checkpoint_id=str(d / name), no_dist=True)
        out[name] = d / name
    # The items really are BYTE_IO: .metadata says so, and the archive holds the tensor.
    md = dcp.FileSystemReader(str(d / "a")).read_metadata().state_dict_metadata
    assert type(md["extra"]).__name__ == "BytesStorageMetadata"
    assert type(md["holder"]).__name__ == "BytesStorageMetadata"
    return out


def test_byte_io_tensors_equal_are_equivalent(byte_io):
    rc, doc = diff_json(byte_io["a"], byte_io["same"])
    assert rc == 0 and doc["entries"] == [] and doc["entries_compared_by_summary"] == 0, doc
    # w, and the two tensors inside items, each compared by value.
    assert doc["paired"] == 3 and doc["values"]["identical"] == 3


def test_byte_io_tuple_tensor_element_changed(byte_io):
    rc, doc = diff_json(byte_io["a"], byte_io["tuple_elem"])
    assert rc == 1 and doc["entries"] == [], doc
    t = changed(doc)[("extra/0", "extra/0")]
    assert t["values"] == "different" and t["outside_tolerance"] == 1 and t["first_outside"] == 5
    assert t["max_abs_error"] == 94.0 and t["dtype_a"] == "float32" and t["shape_a"] == [2, 3]
    rc, out, _ = run_ckptool("diff", byte_io["a"], byte_io["tuple_elem"])
    assert rc == 1 and "values: extra/0: 1 of 6 elements outside tolerance (first at index 5)" in out, out


def test_byte_io_object_tensor_element_changed(byte_io):
    rc, doc = diff_json(byte_io["a"], byte_io["object_elem"])
    assert rc == 1 and doc["entries"] == [], doc
    (t,) = doc["tensors"]
    assert t["key_a"] == t["key_b"] and t["key_a"].startswith("holder/") and t["key_a"].endswith("/t"), t
    assert t["values"] == "different" and t["first_outside"] == 4 and t["dtype_a"] == "float64"


def test_byte_io_tensor_tolerances(byte_io):
    rc, doc = diff_json(byte_io["a"], byte_io["near"])
    assert rc == 1 and changed(doc)[("extra/0", "extra/0")]["values"] == "different"
    rc, doc = diff_json(byte_io["a"], byte_io["near"], "--atol", "1e-5")
    assert rc == 0 and doc["values"]["close"] == 1, doc


def test_byte_io_metadata_only_reads_no_tensor(byte_io):
    rc, doc = diff_json(byte_io["a"], byte_io["tuple_elem"], "--metadata-only")
    assert rc == 0 and doc["bytes_compared"] == 0 and doc["paired"] == 3


def test_byte_io_tensor_behind_zstd_transform(tmp_path):
    # FileSystemWriter's stream transform compresses each item: the tensor is read from
    # the item once the transform is undone.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    for name, v in (("a", 1.0), ("same", 1.0), ("b", 2.0)):
        u = torch.arange(6.0)
        u[3] = v
        dcp.save({"w": torch.ones(2), "extra": (u, 3)}, no_dist=True,
                 storage_writer=dcp.FileSystemWriter(str(tmp_path / name), _extensions=[ZStandard()]))
    rc, doc = diff_json(tmp_path / "a", tmp_path / "same")
    assert rc == 0 and doc["paired"] == 2 and doc["values"]["identical"] == 2, doc
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b")
    assert rc == 1 and changed(doc)[("extra/0", "extra/0")]["first_outside"] == 3, doc


def test_byte_io_sparse_tensor_refused_not_equivalent(tmp_path):
    # Values diff cannot read exactly are refused (exit 3), as a sparse key's are.
    import torch.distributed.checkpoint as dcp
    sp = torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse()
    dcp.save({"w": torch.ones(2), "extra": (sp, 1)}, checkpoint_id=str(tmp_path / "a"), no_dist=True)
    dcp.save({"w": torch.ones(2), "extra": (sp * 2, 1)}, checkpoint_id=str(tmp_path / "b"), no_dist=True)
    rc, _, err = run_ckptool("diff", tmp_path / "a", tmp_path / "b")
    assert rc == 3 and "'extra/0' is a sparse COO tensor" in err, err
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b", "--metadata-only")
    assert rc == 0 and doc["paired"] == 2


@pytest.mark.parametrize("form", ["root", "nested"])
def test_lightning_meta_pt_tensors_compared(byte_io, tmp_path, form):
    # Lightning's FSDP strategy writes meta.pt with torch.save beside its DCP files; a
    # tensor at its root makes ckptool's reader take the root for a state dict.
    import shutil

    def meta(v):
        if form == "root":
            return {"epoch": 1, "ema": torch.full((4,), v)}
        return {"epoch": 1, "callbacks": {"MC": {"best_model_score": torch.tensor(v), "dirpath": "x"}}}

    for name, v in (("a", 1.0), ("same", 1.0), ("b", 2.0)):
        shutil.copytree(byte_io["a"], tmp_path / name)
        torch.save(meta(v), tmp_path / name / "meta.pt")
    key = "meta.pt/ema" if form == "root" else "meta.pt/callbacks/MC/best_model_score"
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b")
    assert rc == 1 and changed(doc)[(key, key)]["outside_tolerance"] == (4 if form == "root" else 1), doc
    rc, doc = diff_json(tmp_path / "a", tmp_path / "same")
    assert rc == 0 and doc["paired"] == 4 and doc["entries_compared_by_summary"] == 0, doc


# --- a .pt training checkpoint and its DCP twin ---------------------------------------------


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    d = tmp_path_factory.mktemp("twins")
    model, opt = trained()
    plain = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 5}
    msd, osd = get_state_dict(model, opt)
    fqn = {"model": msd, "optim": osd, "epoch": 5}
    assert "0.weight" in osd["state"]  # keyed by parameter names, not numbers
    out = {}
    for name, s, key in (("plain", plain, 0), ("fqn", fqn, "0.weight")):
        torch.save(s, d / f"{name}.pt")
        dcp.save(copy.deepcopy(s), checkpoint_id=str(d / f"{name}_dcp"), no_dist=True)
        s2 = copy.deepcopy(s)
        s2["optim"]["state"][key]["exp_avg"][1, 2] += 0.5
        dcp.save(s2, checkpoint_id=str(d / f"{name}_dcp_changed"), no_dist=True)
        out[name] = (d / f"{name}.pt", d / f"{name}_dcp", d / f"{name}_dcp_changed", key)
    return out


@pytest.mark.parametrize("form", ["plain", "fqn"])
def test_training_checkpoint_and_its_dcp_twin_are_equivalent(twins, form):
    pt, twin, _, _ = twins[form]
    for a, b in ((pt, twin), (twin, pt)):
        rc, doc = diff_json(a, b)
        assert rc == 0, doc
        # 4 model tensors, 4 parameters' step, exp_avg, exp_avg_sq: all compared by value.
        assert doc["paired"] == 16 and doc["values"]["identical"] == 16, doc
        assert doc["only_in_a"] == doc["only_in_b"] == [] and doc["renamed"] is None
        assert doc["entries"] == [] and doc["entries_compared_by_summary"] == 0


@pytest.mark.parametrize("form", ["plain", "fqn"])
def test_changed_exp_avg_element_against_the_pt(twins, form):
    pt, _, changed_dcp, key = twins[form]
    rc, doc = diff_json(pt, changed_dcp)
    assert rc == 1 and doc["entries"] == [] and doc["only_in_a"] == doc["only_in_b"] == [], doc
    (t,) = doc["tensors"]
    assert (t["key_a"], t["key_b"]) == (f"optim/state/{key}/exp_avg", f"optim.state.{key}.exp_avg")
    assert t["values"] == "different" and t["outside_tolerance"] == 1 and t["first_outside"] == 1 * 4 + 2
    rc, doc = diff_json(changed_dcp, pt)
    (t,) = doc["tensors"]
    assert rc == 1 and (t["key_a"], t["key_b"]) == (f"optim.state.{key}.exp_avg", f"optim/state/{key}/exp_avg")


def test_twin_with_a_missing_optimizer_tensor_is_different(twins, tmp_path):
    import torch.distributed.checkpoint as dcp
    model, opt = trained()
    s = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 5}
    del s["optim"]["state"][1]["exp_avg_sq"]
    dcp.save(s, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    rc, doc = diff_json(twins["plain"][0], tmp_path / "dcp")
    assert rc == 1 and [e["path"] for e in doc["entries"]] == ["optim/state/1/exp_avg_sq"], doc
    assert doc["only_in_a"] == doc["only_in_b"] == []


def test_tensors_only_inside_entries_pair_with_the_same_entries_beside_keys(tmp_path):
    # A has no keys at all, its one tensor inside a tuple; B has a key too. The tuple's
    # tensor is mixed/0 on both sides, compared by value, whichever side has keys.
    import torch.distributed.checkpoint as dcp
    t = torch.tensor([9.0, 1.0])
    dcp.save({"mixed": (t, 3)}, checkpoint_id=str(tmp_path / "alone"), no_dist=True)
    dcp.save({"x": torch.ones(1), "mixed": (t + 1, 3)}, checkpoint_id=str(tmp_path / "beside"), no_dist=True)
    torch.save({"mixed": (t, 3)}, tmp_path / "alone.pt")
    torch.save({"x": torch.ones(1), "mixed": (t + 1, 3)}, tmp_path / "beside.pt")
    for a, b in (("alone", "beside"), ("beside", "alone"), ("alone.pt", "beside.pt"), ("alone", "beside.pt")):
        rc, doc = diff_json(tmp_path / a, tmp_path / b)
        assert rc == 1, (a, b, doc)
        only = doc["only_in_b"] if a == "alone" or a == "alone.pt" else doc["only_in_a"]
        assert only == ["x"] and doc["only_in_a" if only is doc["only_in_b"] else "only_in_b"] == [], (a, b, doc)
        (v,) = doc["tensors"]
        assert (v["key_a"], v["key_b"]) == ("mixed/0", "mixed/0") and v["first_outside"] == 0, (a, b, doc)
    rc, doc = diff_json(tmp_path / "alone", tmp_path / "alone.pt")
    assert rc == 0, doc


def test_optimizer_state_alone_and_its_dcp_twin(tmp_path):
    # No state dict in the .pt (only an optimizer's): its tensors are named by their paths.
    import torch.distributed.checkpoint as dcp
    _, opt = trained()
    s = {"optim": opt.state_dict(), "epoch": 1}
    torch.save(s, tmp_path / "a.pt")
    dcp.save(copy.deepcopy(s), checkpoint_id=str(tmp_path / "same"), no_dist=True)
    s["optim"]["state"][2]["exp_avg_sq"][0, 0] *= 2
    dcp.save(s, checkpoint_id=str(tmp_path / "other"), no_dist=True)
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "same")
    assert rc == 0 and doc["paired"] == 12 and doc["values"]["identical"] == 12 and doc["entries"] == [], doc
    rc, doc = diff_json(tmp_path / "other", tmp_path / "a.pt")
    assert rc == 1 and doc["entries"] == [] and doc["only_in_a"] == doc["only_in_b"] == [], doc
    (t,) = doc["tensors"]
    assert (t["key_a"], t["key_b"]) == ("optim.state.2.exp_avg_sq", "optim/state/2/exp_avg_sq")
    assert t["first_outside"] == 0


@pytest.fixture(scope="module")
def fsdp_dirs(tmp_path_factory) -> dict:
    import os
    import dcp_fixtures
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["fsdp2", "compiled2"])


@pytest.mark.parametrize("name,key", [("fsdp2", "0"), ("compiled2", "_orig_mod.0.weight")])
def test_fsdp_dcp_and_pytorchs_own_consolidation(fsdp_dirs, tmp_path, name, key):
    # Two real FSDP ranks wrote the DCP (DTensor shards; compiled2's optimizer state keyed
    # by parameter name); PyTorch's dcp_to_torch_save wrote the nested dict back as a .pt.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    if name not in fsdp_dirs:
        pytest.skip(f"{name}: not runnable with this torch")
    d = fsdp_dirs[name]
    dcp_to_torch_save(str(d), str(tmp_path / "full.pt"))
    rc, doc = diff_json(tmp_path / "full.pt", d)
    assert rc == 0 and doc["paired"] == 16 and doc["values"]["identical"] == 16, doc
    sd = torch.load(tmp_path / "full.pt", weights_only=True)
    # dcp_to_torch_save gives back the state's keys as DCP stored them: str(0) is "0".
    sd["optim"]["state"][key]["exp_avg"].view(-1)[3] += 1.0
    torch.save(sd, tmp_path / "changed.pt")
    rc, doc = diff_json(d, tmp_path / "changed.pt")
    assert rc == 1 and doc["entries"] == [], doc
    (t,) = doc["tensors"]
    assert (t["key_a"], t["key_b"]) == (f"optim.state.{key}.exp_avg", f"optim/state/{key}/exp_avg")
    assert t["first_outside"] == 3 and t["outside_tolerance"] == 1
