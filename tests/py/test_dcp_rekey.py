"""Rekeying a DCP directory (ckpt/dcp_rekey.h), judged by PyTorch's own reader and loader.

* compiled2 (dcp_fixtures.py): a whole model torch.compile'd over FSDP2 in 2 gloo
  processes, saved with its state_dict(), so every key carries ``_orig_mod.`` (torchtitan
  #2622), with FQN-keyed Adam state. After ``--strip-compiled``, ``dcp.load`` in 2
  processes fills the UNCOMPILED model's state dict (and the optimizer state under the
  plain names), bit for bit equal to what was saved; the input directory itself fails
  that load (the test is real). ``dcp_to_torch_save``, which rebuilds the nesting from
  planner_data, gives the uncompiled nesting. The .distcp files are byte-identical.
* planner_data forms flatten_state_dict makes (a mapping key with dots in it, a level of its
  own, a list index on the path): the rewritten paths equal what flatten_state_dict gives
  for the renamed state dict.
* Refusals, with nothing written: a collision, a .metadata with a __reduce__ payload
  (refused unsafe, never run), a custom planner's planner_data, an edit spanning several
  nesting levels, an unknown Metadata field or a BYTE_IO value naming a renamed key,
  rank-local metadata left beside a .metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", HERE.parents[1] / "build"))
TOOL = BUILD_DIR / "tests" / "dcp_rekey_tool"


def rekey(src, out, *ops) -> tuple[int, dict | None, str]:
    p = subprocess.run([str(TOOL), *map(str, ops), str(src), str(out)], capture_output=True, timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None), err


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_md(d: Path):
    return FileSystemReader(str(d)).read_metadata()


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["compiled2", "fsdp2", "shard2", "threads2", "perfile2", "zstd2"])


def need(dcp_dirs, name) -> Path:
    if name not in dcp_dirs:
        pytest.skip(dcp_fixtures.skip_reason(name) or f"{name} not built")
    return dcp_dirs[name]


# --- the case: compiled FSDP2 model, loaded back uncompiled in 2 processes ----------

LOADER = r'''
import os, sys, torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
sys.path.insert(0, sys.argv[3])
import dcp_fixtures

def main(rank, world, port, ckpt, expected, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    model = dcp_fixtures.compiled2_model()
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model[0], mesh=mesh); fully_shard(model, mesh=mesh)
    sd = model.state_dict()            # the uncompiled names: "0.weight", ...
    for v in sd.values():
        v.to_local().fill_(float("nan"))  # whatever was there must be overwritten
    optim = {"state": {k: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(v), "exp_avg_sq": torch.zeros_like(v)}
                       for k, v in sd.items()}}
    state = {"model": sd, "optim": optim, "epoch": 0}
    try:
        dcp.load(state, checkpoint_id=ckpt)
    except BaseException as e:  # CheckpointException is a BaseException
        if rank == 0:
            open(result, "w").write("FAIL " + type(e).__name__ + ": " + str(e)[:2000])
        dist.destroy_process_group()
        return
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    got_model = {k: full(v) for k, v in sd.items()}
    got_optim = {k: {s: full(t) for s, t in st.items()} for k, st in optim["state"].items()}
    if rank == 0:
        exp = torch.load(expected, weights_only=True)
        bad = []
        for k, v in exp["model"].items():
            k2 = k.removeprefix("_orig_mod.")
            if not torch.equal(got_model[k2].view(torch.int32), v.view(torch.int32)): bad.append(k2)
        for k, st in exp["optim"].items():
            k2 = k.removeprefix("_orig_mod.")
            for s, t in st.items():
                g = got_optim[k2][s]
                if g.dtype != t.dtype or not torch.equal(g.view(torch.int32), t.view(torch.int32)): bad.append(k2 + "/" + s)
        if state["epoch"] != 3: bad.append("epoch")
        open(result, "w").write("OK" if not bad else "MISMATCH " + ",".join(bad))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = __import__("socket").socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(main, args=(2, port, sys.argv[1], sys.argv[2], sys.argv[4]), nprocs=2, join=True)
'''


def load_uncompiled(tmp_path, ckpt: Path, expected: Path) -> str:
    script = tmp_path / "load_uncompiled.py"
    script.write_text(LOADER)
    result = tmp_path / f"result-{ckpt.name}.txt"
    try:
        _, log = dcp_fixtures.run_bounded([script, ckpt, expected, HERE, result], timeout=300)
    except TimeoutError:
        pytest.fail("the 2-process dcp.load did not finish within 300 s")
    assert result.exists(), log[-3000:]
    return result.read_text()


def test_strip_compiled_loads_into_uncompiled_model(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    expected = Path(str(src) + ".expected.pt")
    out = tmp_path / "plain"
    rc, res, err = rekey(src, out, "--strip-compiled")
    assert rc == 0, err
    assert res["mapping"]["model._orig_mod.0.weight"] == "model.0.weight"
    assert res["mapping"]["optim.state._orig_mod.2.bias.exp_avg"] == "optim.state.2.bias.exp_avg"
    assert res["storage_renamed"] > 0 and res["planner_renamed"] == res["changed"]
    assert "epoch" in res["byte_items"]

    # The data files: the same names, the same bytes.
    distcp = sorted(p.name for p in src.glob("*.distcp"))
    assert distcp and sorted(p.name for p in out.glob("*.distcp")) == distcp == sorted(res["data_files"])
    for name in distcp:
        assert sha(out / name) == sha(src / name), name

    md = read_md(out)
    assert not any("_orig_mod" in k for k in md.state_dict_metadata)
    assert not any("_orig_mod" in k.fqn for k in md.storage_data)
    for k, path in md.planner_data.items():
        assert ".".join(map(str, path)) == k and "_orig_mod" not in k
    assert md.planner_data["model.0.weight"] == ("model", "0.weight")
    assert md.planner_data["optim.state.0.weight.exp_avg"] == ("optim", "state", "0.weight", "exp_avg")
    # Read raw: read_metadata stamps a fresh load_id. The bytes are what CPython's own
    # pickler writes for that object at protocol 2.
    raw_out = pickle.loads((out / ".metadata").read_bytes())
    assert pickle.dumps(raw_out, protocol=2) == (out / ".metadata").read_bytes()
    raw_in = pickle.loads((src / ".metadata").read_bytes())
    assert raw_out.storage_meta == raw_in.storage_meta and raw_out.version == raw_in.version
    assert list(raw_out.state_dict_metadata.values()) == list(raw_in.state_dict_metadata.values())
    assert list(raw_out.storage_data.values()) == list(raw_in.storage_data.values())

    # The real test: PyTorch loads it into the uncompiled model, in 2 processes.
    assert load_uncompiled(tmp_path, out, expected) == "OK"
    # ... which the input cannot do.
    failed = load_uncompiled(tmp_path, src, expected)
    assert failed.startswith("FAIL") and "0.weight" in failed, failed


def test_dcp_to_torch_save_nesting(dcp_dirs, tmp_path):
    """planner_data is what dcp_to_torch_save (_EmptyStateDictLoadPlanner) rebuilds the
    nesting from: the renamed paths give the uncompiled model's nesting."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    src = need(dcp_dirs, "compiled2")
    out = tmp_path / "plain"
    rc, _, err = rekey(src, out, "--strip-compiled")
    assert rc == 0, err
    dcp_to_torch_save(str(out), str(tmp_path / "full.pt"))
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    exp = torch.load(Path(str(src) + ".expected.pt"), weights_only=True)
    assert set(full) == {"model", "optim", "epoch"} and full["epoch"] == 3
    assert list(full["model"]) == [k.removeprefix("_orig_mod.") for k in exp["model"]]
    for k, v in exp["model"].items():
        assert torch.equal(full["model"][k.removeprefix("_orig_mod.")], v)
    assert set(full["optim"]["state"]) == {k.removeprefix("_orig_mod.") for k in exp["optim"]}
    assert full["optim"]["param_groups"][0]["lr"] == 1e-3


def test_compiled_submodule(dcp_dirs, tmp_path):
    """fsdp2: only model[2] compiled ("model.2._orig_mod.weight"); integer-keyed Adam state
    is left alone."""
    src = need(dcp_dirs, "fsdp2")
    out = tmp_path / "out"
    rc, res, err = rekey(src, out, "--strip-compiled")
    assert rc == 0, err
    assert res["mapping"] == {"model.2._orig_mod.weight": "model.2.weight", "model.2._orig_mod.bias": "model.2.bias"}
    md, before = read_md(out), read_md(src)
    assert list(md.state_dict_metadata) == [res["mapping"].get(k, k) for k in before.state_dict_metadata]
    assert md.planner_data["model.2.weight"] == ("model", "2.weight")
    for k, v in before.state_dict_metadata.items():
        assert md.state_dict_metadata[res["mapping"].get(k, k)] == v
    # Loading every key back by the new names: dcp.load with the renamed state dict.
    sd = {}
    for k, v in md.state_dict_metadata.items():
        if hasattr(v, "size"):
            sd[k] = torch.empty(v.size, dtype=v.properties.dtype)
    dcp.load(sd, checkpoint_id=str(out), no_dist=True)
    ref = {}
    for k, v in before.state_dict_metadata.items():
        if hasattr(v, "size"):
            ref[k] = torch.empty(v.size, dtype=v.properties.dtype)
    dcp.load(ref, checkpoint_id=str(src), no_dist=True)
    for k, v in ref.items():
        assert torch.equal(sd[res["mapping"].get(k, k)], v), k


def load_flat(d: Path, md) -> dict:
    """Every item of a directory by its own key, in one process (DCP reshards)."""
    sd = {k: (torch.empty(v.size, dtype=v.properties.dtype) if hasattr(v, "size") else None)
          for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, checkpoint_id=str(d), no_dist=True)
    return sd


@pytest.mark.parametrize("name", ["shard2", "threads2", "perfile2", "zstd2"])
def test_every_layout_loads_by_new_names(dcp_dirs, tmp_path, name):
    """Several data files per rank, one per item, the zstd transform: a prefix
    added to every key, and every item (tensors and BYTE_IO values) loads by its new name
    with the value it had under the old one."""
    src = need(dcp_dirs, name)
    out = tmp_path / "out"
    rc, res, err = rekey(src, out, "--add-prefix", "run.")
    assert rc == 0, err
    before, after = read_md(src), read_md(out)
    assert list(after.state_dict_metadata) == ["run." + k for k in before.state_dict_metadata]
    for k, path in after.planner_data.items():
        assert ".".join(map(str, path)) == k
    for f in src.iterdir():
        if f.name != ".metadata":
            assert sha(out / f.name) == sha(f), f.name
    if name == "zstd2":
        # The zstd value is inflated and searched like any other (test_zstd_byte_value_...).
        assert res["unchecked_byte_items"] == []
    old, new = load_flat(src, before), load_flat(out, after)
    for k, v in old.items():
        w = new["run." + k]
        assert (torch.equal(w, v) and w.dtype == v.dtype) if isinstance(v, torch.Tensor) else w == v, k


# --- planner_data forms ------------------------------------------------------------------

def save_single(d: Path, state: dict) -> Path:
    dcp.save(state, checkpoint_id=str(d), no_dist=True)
    return d


def nested_state():
    t = lambda *s: torch.arange(int(torch.tensor(s).prod()), dtype=torch.float32).reshape(s)
    return {
        "model": {"_orig_mod.enc.w": t(2, 3), "_orig_mod": {"dec.w": t(3)}},  # dots in a key; a level of its own
        "layers": [{"_orig_mod.w": t(2)}, {"_orig_mod.w": t(4)}],          # list indices on the path
        "_orig_mod.top": t(1),
        "note": "kept",
    }


def test_planner_paths_match_flatten(tmp_path):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    src = save_single(tmp_path / "in", nested_state())
    out = tmp_path / "out"
    rc, res, err = rekey(src, out, "--strip-compiled")
    assert rc == 0, err
    md = read_md(out)
    target = {"model": {"enc.w": 0, "dec.w": 0}, "layers": [{"w": 0}, {"w": 0}], "top": 0, "note": 0}
    _, mappings = flatten_state_dict(target)
    assert dict(md.planner_data) == mappings
    # And dcp.load by the new names reads the values saved under the old ones.
    sd = {"model": {"enc.w": torch.zeros(2, 3), "dec.w": torch.zeros(3)},
          "layers": [{"w": torch.zeros(2)}, {"w": torch.zeros(4)}], "top": torch.zeros(1), "note": ""}
    dcp.load(sd, checkpoint_id=str(out), no_dist=True)
    ref = nested_state()
    assert torch.equal(sd["model"]["enc.w"], ref["model"]["_orig_mod.enc.w"])
    assert torch.equal(sd["model"]["dec.w"], ref["model"]["_orig_mod"]["dec.w"])
    assert torch.equal(sd["layers"][1]["w"], ref["layers"][1]["_orig_mod.w"])
    assert sd["note"] == "kept"


def test_edit_spanning_levels_refused(tmp_path):
    src = save_single(tmp_path / "in", nested_state())
    out = tmp_path / "out"
    rc, _, err = rekey(src, out, "--rename", r"^model\._orig_mod\.enc=m.enc")
    assert rc == 3, err
    assert "planner_data" in err and "more than one level" in err and ".metadata" in err, err
    assert list(out.iterdir()) == []
    # A list index is a position: renaming it is refused too.
    rc, _, err = rekey(src, tmp_path / "out2", "--rename", r"^layers\.0\.=layers.1.")
    assert rc != 0, err


# --- refusals ------------------------------------------------------------------------------

def test_collision_refused(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "shard2")
    out = tmp_path / "out"
    rc, _, err = rekey(src, out, "--rename", r"^model\.layer2\.=model.layer.")
    assert rc == 1, err
    assert "'model.layer.weight' <- model.layer.weight, model.layer2.weight" in err, err
    assert list(out.iterdir()) == []


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def test_reduce_payload_refused_never_run(tmp_path):
    src = save_single(tmp_path / "in", {"_orig_mod.w": torch.ones(2)})
    md = read_md(src)
    marker = tmp_path / "marker"
    md.storage_meta.checkpoint_id = Payload(marker)
    (src / ".metadata").write_bytes(pickle.dumps(md))
    out = tmp_path / "out"
    rc, _, err = rekey(src, out, "--strip-compiled")
    assert rc == 3, err
    assert "would import and run" in err and "system" in err, err
    assert not marker.exists(), "the payload ran"
    assert list(out.iterdir()) == []
    # It does run under PyTorch's reader: the test is real.
    read_md(src)
    assert marker.exists()


def test_custom_planner_data_refused(tmp_path):
    src = save_single(tmp_path / "in", {"_orig_mod.w": torch.ones(2)})
    md = read_md(src)
    md.planner_data = ["a custom planner's", "data"]
    (src / ".metadata").write_bytes(pickle.dumps(md))
    rc, _, err = rekey(src, tmp_path / "out", "--strip-compiled")
    assert rc == 3 and "custom planner" in err, err
    # Renaming nothing copies it as it is.
    rc, res, err = rekey(src, tmp_path / "same", "--strip-prefix", "nothing.")
    assert rc == 0 and res["changed"] == 0, err
    assert sha(tmp_path / "same" / ".metadata") == sha(src / ".metadata")


def test_unknown_field(tmp_path):
    """Megatron-Core's Metadata.mcore_data: kept when it names no renamed key, refused when
    it does."""
    src = save_single(tmp_path / "in", {"_orig_mod.w": torch.ones(2), "b": torch.zeros(1)})
    md = read_md(src)
    md.mcore_data = {"b": {"nd_reformulated_orig_global_shape": (1,)}}
    (src / ".metadata").write_bytes(pickle.dumps(md))
    rc, res, err = rekey(src, tmp_path / "ok", "--strip-compiled")
    assert rc == 0 and res["unknown_fields"] == ["mcore_data"], err
    assert read_md(tmp_path / "ok").mcore_data == md.mcore_data
    md.mcore_data = {"_orig_mod.w": {"nd_reformulated_orig_global_shape": (2,)}}
    (src / ".metadata").write_bytes(pickle.dumps(md))
    rc, _, err = rekey(src, tmp_path / "no", "--strip-compiled")
    assert rc == 3 and "mcore_data" in err, err


def test_other_files_copied_rank_local_refused(dcp_dirs, tmp_path):
    src = tmp_path / "in"
    shutil.copytree(need(dcp_dirs, "fsdp2"), src)
    (src / "meta.pt").write_bytes(b"Lightning's meta.pt, copied as it is")
    out = tmp_path / "out"
    rc, res, err = rekey(src, out, "--strip-compiled", "--dry-run")
    assert rc == 0 and res["other_files"] == ["meta.pt"] and not out.exists(), err
    rc, res, err = rekey(src, out, "--strip-compiled")
    assert rc == 0, err
    assert res["other_files"] == ["meta.pt"] and sha(out / "meta.pt") == sha(src / "meta.pt")
    # Rank-local files beside .metadata are another save's leftovers (dcp.load reads
    # .metadata); a directory of rank-local files only is rekeyed (test_dcp_rank_local.py).
    (src / "__0.metadata").write_bytes((src / ".metadata").read_bytes())
    rc, _, err = rekey(src, tmp_path / "out2", "--strip-compiled")
    assert rc == 3 and "rank-local metadata beside .metadata" in err and "__0.metadata" in err, err


def test_data_files_checked(dcp_dirs, tmp_path):
    """A data file storage_data points into must be there and long enough: a copy of a
    directory that cannot load is no rekey."""
    src = tmp_path / "in"
    shutil.copytree(need(dcp_dirs, "fsdp2"), src)
    f = sorted(src.glob("*.distcp"))[-1]
    f.write_bytes(f.read_bytes()[:-1])
    rc, _, err = rekey(src, tmp_path / "out", "--strip-compiled")
    assert rc == 3 and f.name in err and "reaches byte" in err and ".metadata: byte " in err, err
    f.unlink()
    rc, _, err = rekey(src, tmp_path / "out2", "--strip-compiled")
    assert rc == 3 and f"'{f.name}', which is not in the directory" in err, err


def test_staging_directory_must_be_empty(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "fsdp2")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "stale").write_bytes(b"x")
    rc, _, err = rekey(src, staging, "--existing", "--strip-compiled")
    assert rc == 2 and "not empty" in err, err
    (staging / "stale").unlink()
    rc, res, err = rekey(str(src) + "/", staging, "--existing", "--strip-compiled")
    assert rc == 0 and res["changed"] == 2, err


def test_byte_value_naming_a_renamed_key_refused(tmp_path):
    """An optimizer's param_groups listing parameter FQNs is a BYTE_IO value (a torch.save
    blob dcp.load unpickles); rekey copies it unopened, so it would keep the old names."""
    state = {"model": {"_orig_mod.w": torch.ones(2)},
             "optim": {"param_groups": [{"lr": 0.1, "params": ["_orig_mod.w"]}]}}
    src = save_single(tmp_path / "in", state)
    out = tmp_path / "out"
    rc, _, err = rekey(src, out, "--strip-compiled")
    assert rc == 3, err
    assert "optim.param_groups.0.params" in err and "'_orig_mod.w'" in err and ".distcp" in err, err
    assert list(out.iterdir()) == []
    # Strings that name no renamed key are fine; the value's globals are reported.
    state["optim"]["param_groups"][0]["params"] = ["w"]
    state["optim"]["sched"] = torch.optim.lr_scheduler.ConstantLR  # a class: weights_only refuses it
    src2 = save_single(tmp_path / "in2", state)
    rc, res, err = rekey(src2, tmp_path / "out2", "--strip-compiled")
    assert rc == 0, err
    assert res["byte_item_globals"] == ["optim.sched: torch.optim.lr_scheduler.ConstantLR"], res
    sd = {"model": {"w": torch.zeros(2)}, "optim": {"param_groups": [{"lr": 0.0, "params": None}], "sched": None}}
    dcp.load(sd, checkpoint_id=str(tmp_path / "out2"), no_dist=True)
    assert torch.equal(sd["model"]["w"], torch.ones(2)) and sd["optim"]["param_groups"][0]["params"] == ["w"]


def test_zstd_byte_value_naming_a_renamed_key_refused(tmp_path):
    """A BYTE_IO value behind the zstd stream transform is inflated and searched as any other
    (formats.md §9.7): one naming a renamed key is refused, naming the .distcp file and the
    item; one that names none is renamed, its bytes copied, and loads by its new name."""
    try:
        from torch.distributed.checkpoint._extension import ZStandard
        import zstandard  # noqa: F401
    except ImportError:
        pytest.skip("no zstd extension in this torch (or no zstandard module)")
    from conftest import run_ckptool

    def save_zstd(d: Path, state: dict) -> Path:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d), _extensions=[ZStandard()]), no_dist=True)
        return d

    state = {"model": {"_orig_mod.w": torch.ones(2)},
             "optim": {"param_groups": [{"lr": 0.1, "params": ["_orig_mod.w"]}]}}
    src = save_zstd(tmp_path / "in", state)
    assert all(s.transform_descriptors for s in read_md(src).storage_data.values())
    out = tmp_path / "out"
    rc, _, err = run_ckptool("rekey", src, "--strip-compiled", "-o", out, timeout=60)
    assert rc == 3, err
    assert "optim.param_groups.0.params" in err and "'_orig_mod.w'" in err and "stream.zstd/1" in err, err
    assert ".distcp" in err, err
    assert not out.exists() or list(out.iterdir()) == []
    state["optim"]["param_groups"][0]["params"] = ["w"]
    src2 = save_zstd(tmp_path / "in2", state)
    rc, res, err = run_ckptool("rekey", src2, "--strip-compiled", "-o", tmp_path / "out2", "--json", timeout=60)
    assert rc == 0, err
    assert "not searched" not in err and json.loads(res)["unchecked_byte_items"] == [], (err, res)
    sd = {"model": {"w": torch.zeros(2)}, "optim": {"param_groups": [{"lr": 0.0, "params": None}]}}
    dcp.load(sd, checkpoint_id=str(tmp_path / "out2"), no_dist=True)
    assert torch.equal(sd["model"]["w"], torch.ones(2)) and sd["optim"]["param_groups"][0]["params"] == ["w"]


# --- the verb: ckptool rekey DIR -o OUTDIR (the output-directory policy, formats.md §11) ----

CKPTOOL = Path(os.environ.get("CKPTOOL", HERE.parents[1] / "build" / "ckptool"))


def ck_rekey(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(CKPTOOL), "rekey", *map(str, args)], capture_output=True, text=True, timeout=120)


def tree_hashes(d: Path) -> dict:
    return {p.name: sha(p) for p in sorted(d.iterdir()) if p.is_file()}


def test_cli_strip_compiled_loads_into_uncompiled_model(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    before = tree_hashes(src)
    out = tmp_path / "plain"
    p = ck_rekey("--strip-compiled", "--json", src, "-o", out)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["layout"] == "dcp" and res["files"][-1] == ".metadata"
    mapping = {m["old"]: m["new"] for m in res["mapping"]}
    assert mapping["model._orig_mod.0.weight"] == "model.0.weight"
    assert sorted(x.name for x in out.iterdir()) == sorted(res["files"])
    assert tree_hashes(src) == before
    for name in res["files"][:-1]:
        assert sha(out / name) == sha(src / name), name
    assert load_uncompiled(tmp_path, out, Path(str(src) + ".expected.pt")) == "OK"


def test_cli_dry_run_and_text_report(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    out = tmp_path / "never"
    p = ck_rekey("--strip-compiled", "--dry-run", src, "-o", out)
    assert p.returncode == 0, p.stderr
    assert "model._orig_mod.0.weight" in p.stdout and "dry run: nothing written" in p.stdout
    assert not out.exists()


def test_cli_output_directory_policy(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    before = tree_hashes(src)
    # Inside the input, or the input itself: refused, nothing written.
    for bad in (src / "sub", src):
        p = ck_rekey("--strip-compiled", src, "-o", bad)
        assert p.returncode == 2, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    assert tree_hashes(src) == before and not (src / "sub").exists()
    # An OUTDIR holding something else: refused without --force ...
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    p = ck_rekey("--strip-compiled", src, "-o", out)
    assert p.returncode == 2 and "--force" in p.stderr, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["notes.txt"]
    # ... and with it, the set goes in beside it; a second run replaces only that set.
    p = ck_rekey("--strip-compiled", "--force", src, "-o", out)
    assert p.returncode == 0, p.stderr
    p = ck_rekey("--add-prefix", "m.", "--force", src, "-o", out)
    assert p.returncode == 0, p.stderr
    assert (out / "notes.txt").read_text() == "mine"
    md = read_md(out)
    assert all(k.startswith("m.") for k in md.state_dict_metadata)
    assert not [x for x in out.iterdir() if x.name.startswith(".out.ckptool")]
    assert tree_hashes(src) == before
    # A .distcp file .metadata does not name is not of the previous set: never removed.
    (out / "backup.distcp").write_bytes(b"mine")
    p = ck_rekey("--strip-compiled", src, "-o", out)
    assert p.returncode == 2 and "'backup.distcp'" in p.stderr, p.stderr
    p = ck_rekey("--strip-compiled", "--force", src, "-o", out)
    assert p.returncode == 0 and (out / "backup.distcp").read_bytes() == b"mine", p.stderr
    # A .metadata that cannot be read names no set: refused even with --force, nothing touched.
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / ".metadata").write_bytes(b"junk")
    (junk / "__0_0.distcp").write_bytes(b"mine")
    (junk / "notes.distcp").write_bytes(b"mine too")
    p = ck_rekey("--strip-compiled", "--force", src, "-o", junk)
    assert p.returncode == 2 and "cannot be read" in p.stderr, p.stderr
    assert sorted(x.name for x in junk.iterdir()) == [".metadata", "__0_0.distcp", "notes.distcp"]
    assert (junk / "__0_0.distcp").read_bytes() == b"mine"
    # A .metadata naming a file that is no checkpoint data: refused, the file kept.
    named = tmp_path / "named"
    shutil.copytree(out, named)
    (named / "backup.distcp").unlink()
    first = sorted(x.name for x in named.iterdir() if x.name.endswith(".distcp"))[0]
    (named / first).write_text("not a torch.save archive")
    p = ck_rekey("--strip-compiled", "--force", src, "-o", named)
    assert p.returncode == 2 and "is not a torch.save or safetensors file" in p.stderr, p.stderr
    assert (named / first).read_text() == "not a torch.save archive"


def test_cli_unsafe_flags_refused(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    p = ck_rekey("--strip-compiled", "--keep-unsafe", src, "-o", tmp_path / "o")
    assert p.returncode == 2 and not (tmp_path / "o").exists(), p.stderr
    # --match with DCP inputs and targets: test_dcp_match.py. Matched to itself, no key moves.
    p = ck_rekey("--match", src, src, "--dry-run")
    assert p.returncode == 0 and "0 of " in p.stdout and "the keys already match" in p.stderr, p.stdout + p.stderr


def test_cli_save_map_beside_the_set_never_inside(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    out, saved = tmp_path / "plain", tmp_path / "map.json"
    p = ck_rekey("--strip-compiled", src, "-o", out, "--save-map", saved)
    assert p.returncode == 0, p.stderr
    doc = json.loads(saved.read_text())
    assert "model._orig_mod.0.weight" in json.dumps(doc)
    assert saved.stat().st_mode & 0o777 == (src / ".metadata").stat().st_mode & 0o777
    # Inside OUTDIR it would become a file of the set: refused, nothing written.
    out.mkdir(exist_ok=True)
    p = ck_rekey("--strip-compiled", "--force", src, "-o", out, "--save-map", out / "map.json")
    assert p.returncode == 2 and "inside the output directory" in p.stderr, p.stderr
    assert not (out / "map.json").exists()
