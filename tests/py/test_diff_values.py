"""`ckptool diff` of what is not a state-dict tensor (docs/formats.md §12.4): a training
checkpoint's epoch, hyper-parameters and optimizer state written by real torch.save after a
real AdamW step, the same items written by real dcp.save (no_dist, one process) as BYTE_IO
items, and safetensors __metadata__ written by safetensors' own save_file. Each difference
is reported at its path, with exit 1; the same values are equivalent in any format.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import run_ckptool  # noqa: E402
from test_many_tensors import run_wait4  # noqa: E402

warnings.filterwarnings("ignore")


def diff_json(a, b, *flags) -> tuple[int, dict]:
    rc, out, err = run_ckptool("diff", "--json", *flags, a, b)
    assert rc in (0, 1), f"diff {a} {b}: exit {rc}: {err}"
    doc = json.loads(out)
    assert doc["equivalent"] == (rc == 0)
    return rc, doc


def entries(doc) -> dict:
    return {e["path"]: (e["a"], e["b"]) for e in doc["entries"]}


def training_state() -> dict:
    """A model after one real AdamW step, and the usual companions of its state dict."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    opt.param_groups[0]["tag"] = "g1"  # a string deep inside the optimizer's state_dict()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "lr": 0.1,
            "name": "run1", "hist": [1, [2, 3]], "sched": None, "note": "x" * 300 + "a"}


class Evil:
    """Pickles as a call of os.system: diff must name it, never make it."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.fixture(scope="module")
def pt_pairs(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("pt_values")
    base = training_state()
    out = {}

    def save(name, s):
        torch.save(s, d / f"{name}.pt")
        out[name] = d / f"{name}.pt"

    save("a", base)
    save("same", copy.deepcopy(base))
    s = copy.deepcopy(base)
    s["epoch"], s["lr"] = 4, 0.2
    save("epoch_lr", s)
    s = copy.deepcopy(base)
    s["optimizer"]["param_groups"][0]["warmup"] = 10
    save("group_key", s)
    s = copy.deepcopy(base)
    s["optimizer"]["param_groups"][0]["lr"] = 0.05
    s["optimizer"]["param_groups"][0]["betas"] = list(s["optimizer"]["param_groups"][0]["betas"])
    save("group_values", s)
    s = copy.deepcopy(base)
    s["name"], s["sched"], s["note"] = "run2", "cosine", "x" * 300 + "b"
    s["optimizer"]["param_groups"][0]["tag"] = "g2"
    save("strings", s)
    s = copy.deepcopy(base)
    s["hist"][1][1] = 4
    save("nested", s)
    s = copy.deepcopy(base)
    s["optimizer"]["state"][2]["exp_avg"][1, 0] += 1e-3
    s["optimizer"]["state"][0]["step"] = torch.tensor(2.0)
    save("opt_tensor", s)
    marker = d / "executed"
    for name, cmd in (("evil_a", f"touch {marker}"), ("evil_b", f"touch {marker}.b")):
        s = copy.deepcopy(base)
        s["hook"] = Evil(cmd)
        save(name, s)
    out["marker"] = marker
    return out


def test_identical_training_checkpoints_are_equivalent_optimizer_state_included(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["same"])
    assert rc == 0 and doc["entries"] == [] and doc["entries_compared_by_summary"] == 0
    # The optimizer's 12 state tensors are compared as tensors, by their paths.
    keys = {t["key_a"] for t in doc["tensors"]}
    assert doc["paired"] == 4 + 12 and doc["values"]["identical"] == 16 and keys == set()


def test_epoch_and_lr_changed(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["epoch_lr"])
    assert rc == 1
    assert entries(doc) == {"epoch": ({"type": "int", "value": "3"}, {"type": "int", "value": "4"}),
                            "lr": ({"type": "float", "value": "0.1"}, {"type": "float", "value": "0.2"})}
    assert doc["values"]["identical"] == 16


def test_param_group_key_added(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["group_key"])
    assert rc == 1
    assert entries(doc) == {"optimizer/param_groups/0/warmup": (None, {"type": "int", "value": "10"})}
    rc, out, _ = run_ckptool("diff", pt_pairs["a"], pt_pairs["group_key"])
    assert rc == 1 and "  entry: optimizer/param_groups/0/warmup: (absent) vs int 10" in out


def test_param_group_values_and_container_type_changed(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["group_values"])
    assert rc == 1
    e = entries(doc)
    assert e["optimizer/param_groups/0/lr"] == ({"type": "float", "value": "0.1"}, {"type": "float", "value": "0.05"})
    # A tuple that became a list is a difference, though its elements are equal.
    assert e["optimizer/param_groups/0/betas"] == ({"type": "tuple", "value": "(0.9, 0.999)"},
                                                   {"type": "list", "value": "[0.9, 0.999]"})
    assert set(e) == {"optimizer/param_groups/0/lr", "optimizer/param_groups/0/betas"}


def test_string_and_none_changed(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["strings"])
    assert rc == 1
    e = entries(doc)
    assert set(e) == {"name", "sched", "note", "optimizer/param_groups/0/tag"}
    assert e["optimizer/param_groups/0/tag"] == ({"type": "str", "value": "'g1'"}, {"type": "str", "value": "'g2'"})
    assert e["name"] == ({"type": "str", "value": "'run1'"}, {"type": "str", "value": "'run2'"})
    assert e["sched"] == ({"type": "None", "value": "None"}, {"type": "str", "value": "'cosine'"})
    # Differing past what a report shows (200 characters): found, and shown cut.
    assert e["note"][0]["value"] == e["note"][1]["value"] and e["note"][0]["value"].endswith("...")


def test_nested_list_element_changed(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["nested"])
    assert rc == 1
    assert entries(doc) == {"hist/1/1": ({"type": "int", "value": "3"}, {"type": "int", "value": "4"})}


def test_optimizer_state_tensors_compared_by_value(pt_pairs):
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["opt_tensor"])
    assert rc == 1 and doc["entries"] == []
    t = {x["key_a"]: x for x in doc["tensors"]}
    assert set(t) == {"optimizer/state/2/exp_avg", "optimizer/state/0/step"}
    assert t["optimizer/state/2/exp_avg"]["values"] == "different"
    assert t["optimizer/state/2/exp_avg"]["first_outside"] == 1 * 3 + 0
    assert t["optimizer/state/0/step"]["values"] == "different"
    # Within a tolerance that covers the change, only the step (1.0 vs 2.0) stays different.
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["opt_tensor"], "--atol", "0.01")
    assert rc == 1 and [x["key_a"] for x in doc["tensors"] if x["values"] == "different"] == ["optimizer/state/0/step"]


def test_unsafe_object_compared_by_name_and_arguments_never_called(pt_pairs):
    rc, doc = diff_json(pt_pairs["evil_a"], pt_pairs["evil_b"])
    assert rc == 1
    e = entries(doc)
    assert list(e) == ["hook/(args)/0"], e
    a, b = e["hook/(args)/0"]
    assert a["type"] == "str" and a["value"].endswith("executed'") and b["value"].endswith("executed.b'")
    rc, doc = diff_json(pt_pairs["a"], pt_pairs["evil_a"], "--metadata-only")
    assert rc == 1 and entries(doc)["hook"][1]["type"] in ("posix.system", "os.system")
    assert not pt_pairs["marker"].exists() and not Path(str(pt_pairs["marker"]) + ".b").exists()


# --- DCP: the same kinds of items as BYTE_IO entries ---------------------------------------


def dcp_state(epoch=3, lr=0.1, hist=(1, [2, 3]), name="run1", note="a") -> dict:
    s = training_state()
    s["note"] = "x" * 300 + note  # a BYTE_IO item longer than inspect's summary
    s["epoch"], s["name"], s["hist"] = epoch, name, [hist[0], list(hist[1])]
    s["optimizer"]["param_groups"][0]["lr"] = lr
    return s


@pytest.fixture(scope="module")
def dcp_pairs(tmp_path_factory) -> dict:
    import torch.distributed.checkpoint as dcp
    d = tmp_path_factory.mktemp("dcp_values")
    out = {}
    for name, s in (("a", dcp_state()), ("same", dcp_state()),
                    ("b", dcp_state(epoch=4, lr=0.05, hist=(1, [2, 4]), name="run2", note="b"))):
        dcp.save(s, checkpoint_id=str(d / name), no_dist=True)
        out[name] = d / name
    return out


def test_dcp_identical_pair_is_equivalent(dcp_pairs):
    rc, doc = diff_json(dcp_pairs["a"], dcp_pairs["same"])
    assert rc == 0 and doc["entries"] == [] and doc["entries_compared_by_summary"] == 0
    assert doc["paired"] == 4 + 12


def test_dcp_byte_items_differ_at_their_paths(dcp_pairs):
    rc, doc = diff_json(dcp_pairs["a"], dcp_pairs["b"], "--metadata-only")
    assert rc == 1
    # Differing past the 200 characters shown: both sides show the same cut repr.
    cut = entries(doc)["note"][0]
    assert cut["type"] == "str" and cut["value"].startswith("'xxx") and cut["value"].endswith("x...")
    assert entries(doc) == {
        "optimizer/param_groups/0/lr": ({"type": "float", "value": "0.1"}, {"type": "float", "value": "0.05"}),
        "epoch": ({"type": "int", "value": "3"}, {"type": "int", "value": "4"}),
        "name": ({"type": "str", "value": "'run1'"}, {"type": "str", "value": "'run2'"}),
        "hist/1/1": ({"type": "int", "value": "3"}, {"type": "int", "value": "4"}),
        "note": (cut, cut),
    }


def test_items_equal_across_pt_and_dcp(tmp_path):
    # One flat dict of tensors and plain values: DCP stores each value as its own BYTE_IO
    # item (a dict flattened into paths, a list of plain values kept whole), torch.save
    # pickles it whole; diff sees the same leaves in both.
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(1)
    sd = {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g), "epoch": 7,
          "cfg": {"lr": 0.1, "betas": (0.9, 0.99), "names": ["x", "y"], "warm": None}}
    torch.save(sd, tmp_path / "a.pt")
    dcp.save(copy.deepcopy(sd), checkpoint_id=str(tmp_path / "same"), no_dist=True)
    sd["cfg"]["names"][1] = "z"
    dcp.save(sd, checkpoint_id=str(tmp_path / "other"), no_dist=True)
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "same")
    assert rc == 0 and doc["paired"] == 2 and doc["entries"] == [], doc
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "other")
    assert rc == 1 and entries(doc) == {"cfg/names/1": ({"type": "str", "value": "'y'"},
                                                       {"type": "str", "value": "'z'"})}


def test_pt_and_its_convert_dcp_twin(tmp_path):
    # A state dict alone converts to an equivalent DCP directory; a training checkpoint's
    # other entries are not carried (--drop-other), and diff lists exactly those.
    s = training_state()
    torch.save(s["model"], tmp_path / "sd.pt")
    torch.save(s, tmp_path / "train.pt")
    for src, out, flags in (("sd.pt", "sd_dcp", ()), ("train.pt", "train_dcp", ("--drop-other",))):
        rc, _, err = run_ckptool("convert", tmp_path / src, "-o", tmp_path / out, "--to", "dcp", *flags, timeout=120)
        assert rc == 0, err
    rc, doc = diff_json(tmp_path / "sd.pt", tmp_path / "sd_dcp")
    assert rc == 0
    rc, doc = diff_json(tmp_path / "train.pt", tmp_path / "train_dcp")
    assert rc == 1 and doc["only_in_a"] == [] and doc["only_in_b"] == [] and doc["values"]["identical"] == 4
    only_a = {e["path"] for e in doc["entries"] if e["b"] is None}
    assert only_a == {e["path"] for e in doc["entries"]}
    assert {"epoch", "lr", "name", "sched", "hist", "hist/1/0", "optimizer/param_groups/0/lr",
            "optimizer/state/0/exp_avg"} <= only_a


# --- safetensors __metadata__ --------------------------------------------------------------


def test_safetensors_metadata_differences(tmp_path):
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    save_file(sd, str(tmp_path / "a.safetensors"), metadata={"format": "pt", "note": "x", "step": "10"})
    save_file(sd, str(tmp_path / "same.safetensors"), metadata={"format": "pt", "note": "x", "step": "10"})
    save_file(sd, str(tmp_path / "b.safetensors"), metadata={"format": "pt", "note": "y", "epoch": "1"})
    save_file(sd, str(tmp_path / "none.safetensors"))
    rc, doc = diff_json(tmp_path / "a.safetensors", tmp_path / "same.safetensors")
    assert rc == 0 and doc["entries"] == []
    rc, doc = diff_json(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert rc == 1 and doc["values"]["identical"] == 1
    assert entries(doc) == {"__metadata__/note": ({"type": "str", "value": "'x'"}, {"type": "str", "value": "'y'"}),
                            "__metadata__/step": ({"type": "str", "value": "'10'"}, None),
                            "__metadata__/epoch": (None, {"type": "str", "value": "'1'"})}
    rc, doc = diff_json(tmp_path / "none.safetensors", tmp_path / "a.safetensors", "--metadata-only")
    assert rc == 1 and set(entries(doc)) == {"__metadata__/format", "__metadata__/note", "__metadata__/step"}
    rc, doc = diff_json(tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--ignore-metadata")
    assert rc == 0
    # A .pt has no __metadata__ to compare: its safetensors twin is equivalent.
    torch.save(sd, tmp_path / "a.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "a.safetensors")
    assert rc == 0


def test_shard_set_metadata(tmp_path):
    from huggingface_hub import save_torch_state_dict
    g = torch.Generator().manual_seed(2)
    sd = {f"l{i}.weight": torch.randn(8, 8, generator=g) for i in range(4)}
    for name, meta in (("a", {"origin": "run1"}), ("b", {"origin": "run2"})):
        (tmp_path / name).mkdir()
        save_torch_state_dict(sd, str(tmp_path / name), max_shard_size=600, metadata=meta)
    assert len(list((tmp_path / "a").glob("*.safetensors"))) > 1
    # huggingface_hub writes metadata= into the index (its total_size is not compared: it
    # counts the shards); each shard's __metadata__ is its format: pt.
    (tmp_path / "c").mkdir()
    save_torch_state_dict(sd, str(tmp_path / "c"), max_shard_size=300, metadata={"origin": "run1"})
    assert len(list((tmp_path / "c").glob("*.safetensors"))) != len(list((tmp_path / "a").glob("*.safetensors")))
    rc, doc = diff_json(tmp_path / "a", tmp_path / "c")
    assert rc == 0, doc
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b")
    assert rc == 1 and doc["values"]["identical"] == 4
    assert entries(doc) == {"index/metadata/origin": ({"type": "str", "value": "'run1'"},
                                                      {"type": "str", "value": "'run2'"})}
    # One shard's __metadata__ changed: shown shard by shard.
    shard = sorted((tmp_path / "b").glob("*.safetensors"))[0]
    from safetensors.torch import load_file
    save_file(load_file(str(shard)), str(shard), metadata={"format": "np"})
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b", "--metadata-only")
    e = entries(doc)
    assert rc == 1 and set(e) == {"index/metadata/origin", "__metadata__/format"}
    assert e["__metadata__/format"][0] == {"type": "str", "value": "'pt'"}
    assert e["__metadata__/format"][1]["type"] == "str per shard" and "'np'" in e["__metadata__/format"][1]["value"]
    rc, doc = diff_json(tmp_path / "a", tmp_path / "b", "--ignore-metadata")
    assert rc == 0


# --- hostile values -------------------------------------------------------------------------


def test_shared_list_bomb_refused_and_cycles_compared(tmp_path):
    # 40 levels of one list shared twice: a few hundred bytes of pickle, 2^40 leaves.
    bomb = [1]
    for _ in range(40):
        bomb = [bomb, bomb]
    torch.save({"w": torch.ones(2), "bomb": bomb}, tmp_path / "bomb.pt")
    # Refused from a count of its 41 distinct lists: it once made 4 M leaves first (16 s and
    # 1.7 GB; past 60 s under ASan).
    rc, out, err, cpu, peak = run_wait4(["diff", tmp_path / "bomb.pt", tmp_path / "bomb.pt"], timeout=60)
    assert rc == 3 and out == "" and "--ignore-entries" in err and "bomb.pt" in err, (rc, err)
    assert cpu < 5 and peak < 256 << 20, (cpu, peak)
    rc, _, _ = run_ckptool("diff", "--ignore-entries", tmp_path / "bomb.pt", tmp_path / "bomb.pt")
    assert rc == 0
    # A list that contains itself is one leaf where it recurs, not an endless walk.
    loop = [1]
    loop.append(loop)
    torch.save({"w": torch.ones(2), "loop": loop, "n": 1}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(2), "loop": loop, "n": 2}, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "a.pt")
    assert rc == 0
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1 and set(entries(doc)) == {"n"}
