"""Rank-local DCP metadata (docs/formats.md §9.8): ``dcp.save(..., use_collectives=False)``
(PyTorch 2.9+) writes ``__{rank}.metadata`` per rank and no ``.metadata``. Judged by
PyTorch's own reader and loader, never by ours:

* nocoll2 (dcp_fixtures.py, 2 gloo ranks: Shard(0), Shard(1), Replicate, a zero-size
  chunk, a plain tensor, a non-tensor value): ``inspect --json`` lists the union of what
  ``read_metadata(rank=r)`` lists; ``materialize`` equals what ``dcp.load`` (each rank
  reading its own file, in the fixture's ranks) gave, gathered in full; ``verify`` passes
  and names a flipped byte of rank 1's chunk;
* nocolldiff2: one plain tensor name holding different values on the two ranks has no
  single value: materialize and verify refuse it (exit 3) naming both files;
* a lost rank file, files that disagree on a key's dtype or shape, an entry pointing into
  another rank's data file: refused (exit 3), naming the file;
* ``rekey`` rewrites every rank's file; ``dcp.load`` in 2 processes reads the renamed keys
  and gets the saved values.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["nocoll2", "nocolldiff2"])


def need(dcp_dirs, name) -> Path:
    if name not in dcp_dirs:
        pytest.skip(dcp_fixtures.skip_reason(name) or f"{name} not built")
    return dcp_dirs[name]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rank_tensor_items(d: Path) -> dict:
    """What PyTorch's reader lists, every rank's file together."""
    out = {}
    for f in sorted(d.glob("__*.metadata")):
        rank = int(f.name[2:-len(".metadata")])
        md = FileSystemReader(str(d)).read_metadata(rank=rank)
        for k, v in md.state_dict_metadata.items():
            if isinstance(v, TensorStorageMetadata):
                out.setdefault(k, v)
    return out


def test_the_writer_wrote_rank_local_files(dcp_dirs):
    d = need(dcp_dirs, "nocoll2")
    assert not (d / ".metadata").exists()
    assert sorted(p.name for p in d.glob("__*.metadata")) == ["__0.metadata", "__1.metadata"]


def test_inspect_lists_every_rank_key(dcp_dirs):
    d = need(dcp_dirs, "nocoll2")
    rc, out, err = run_ckptool("inspect", "--json", d, timeout=120)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["layout"] == "dcp" and doc["index"] == str(d / "__0.metadata")
    items = rank_tensor_items(d)
    assert sorted(k["key"] for k in doc["keys"]) == sorted(items)
    for k in doc["keys"]:
        ref = items[k["key"]]
        assert k["dtype"] == str(ref.properties.dtype).removeprefix("torch."), k["key"]
        assert k["shape"] == list(ref.size), k["key"]
    assert any("rank-local" in w for w in doc["warnings"]), doc["warnings"]
    rc, out, err = run_ckptool("inspect", d, timeout=120)
    assert rc == 0 and "step" in out and "42" in out, out + err


def test_materialize_equals_dcp_load(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want = torch.load(str(d) + ".expected.pt", weights_only=True)["tensors"]
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k].view(torch.uint8), w.view(torch.uint8)), k


def test_verify_intact_and_a_flipped_chunk(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    rc, out, err = run_ckptool("verify", "--json", d, timeout=120)
    assert rc == 0, out + err
    assert json.loads(out)["tensors"] == len(rank_tensor_items(d))
    bad = copy(d, tmp_path / "flipped")
    rc, out, _ = run_ckptool("inspect", "--json", "--chunks", bad, timeout=120)
    doc = json.loads(out)
    w = next(k for k in doc["keys"] if k["key"] == "model.w")
    piece = next(p for p in w["pieces"] if p["offsets"] == [3, 0])  # rank 1's box
    path = Path(doc["files"][piece["file"]]["path"])
    assert path.name == "__1_0.distcp"
    data = bytearray(path.read_bytes())
    data[piece["offset"] + 1] ^= 0x01
    path.write_bytes(data)
    rc, out, err = run_ckptool("verify", bad, timeout=120)
    assert rc == 1 and "CRC-32 mismatch" in out and str(path) in out, out + err


def test_replicas_that_differ_have_no_single_value(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocolldiff2")
    md0 = FileSystemReader(str(d)).read_metadata(rank=0)
    md1 = FileSystemReader(str(d)).read_metadata(rank=1)
    assert "shared_name" in md0.state_dict_metadata and "shared_name" in md1.state_dict_metadata
    rc, _, err = run_ckptool("inspect", d, timeout=120)  # metadata alone: no data compared
    assert rc == 0, err
    for verb in (["materialize", "--device", "cpu", "-o", tmp_path / "o.pt"], ["verify"]):
        rc, out, err = run_ckptool(*verb, d, timeout=120)
        # verify reports what it found (exit 1); materialize refuses the input (exit 3).
        said = out if verb == ["verify"] else err
        assert rc == (1 if verb == ["verify"] else 3), (verb, out, err)
        assert "'shared_name'" in said and "__1.metadata" in said and "__0.metadata" in said, said
        assert "no single one" in said and str(d / "__1_0.distcp") in said, said
    assert not (tmp_path / "o.pt").exists()


def test_a_lost_rank_file_is_refused(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    one = copy(d, tmp_path / "no1")
    (one / "__1.metadata").unlink()
    rc, _, err = run_ckptool("inspect", one, timeout=120)
    assert rc == 3 and str(one / "__1_0.distcp") in err and "no __1.metadata" in err, err
    zero = copy(d, tmp_path / "no0")
    (zero / "__0.metadata").unlink()
    rc, _, err = run_ckptool("inspect", zero, timeout=120)
    assert rc == 3 and "without __0.metadata" in err, err


def rewrite(path: Path, edit):
    md = pickle.loads(path.read_bytes())  # our own fixture, written by dcp.save
    edit(md)
    path.write_bytes(pickle.dumps(md))


def test_files_that_disagree_are_refused(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    shape = copy(d, tmp_path / "shape")
    rewrite(shape / "__1.metadata", lambda md: setattr(md.state_dict_metadata["model.b"], "size", torch.Size([5])))
    rc, _, err = run_ckptool("inspect", shape, timeout=120)
    assert rc == 3 and str(shape / "__1.metadata") in err and "'model.b'" in err and "(5,)" in err, err

    def to_bytes_item(md):
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata
        md.state_dict_metadata["model.plain"] = BytesStorageMetadata()
    kind = copy(d, tmp_path / "kind")
    rewrite(kind / "__1.metadata", to_bytes_item)
    rc, _, err = run_ckptool("inspect", kind, timeout=120)
    assert rc == 3 and str(kind / "__1.metadata") in err and "'model.plain'" in err, err

    def into_rank0_file(md):
        for info in md.storage_data.values():
            info.relative_path = "__0_0.distcp"
    other = copy(d, tmp_path / "other")
    rewrite(other / "__1.metadata", into_rank0_file)
    rc, _, err = run_ckptool("inspect", other, timeout=120)
    assert rc == 3 and str(other / "__1.metadata") in err and "this rank's own __1_" in err, err

    gap = copy(d, tmp_path / "gap")  # rank 1's box of a Shard(0) tensor lost from its file

    def drop_w(md):
        del md.state_dict_metadata["model.w"]
        md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != "model.w"}
    rewrite(gap / "__1.metadata", drop_w)
    rc, _, err = run_ckptool("inspect", gap, timeout=120)
    assert rc == 3 and "'model.w'" in err and "no chunk holds the elements at offsets (3, 0)" in err, err


# --- rekey ----------------------------------------------------------------------------------

LOADER = r'''
import os, sys, torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

def main(rank, world, port, ckpt, expected, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    exp = torch.load(expected, weights_only=True)
    place = {"w": [Shard(0)], "c": [Shard(1)], "b": [Replicate()], "tiny": [Shard(0)]}
    net = {k: distribute_tensor(torch.zeros_like(exp["tensors"]["model." + k]), mesh, place[k]) for k in place}
    net["plain"] = torch.zeros(3, dtype=torch.int64)
    state = {"net": net, "step": 0}
    try:
        dcp.load(state, checkpoint_id=ckpt)   # no .metadata: each rank reads __{rank}.metadata
    except BaseException as e:
        if rank == 0: open(result, "w").write("FAIL " + type(e).__name__ + ": " + str(e)[:2000])
        dist.destroy_process_group(); return
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in net.items()}
    if rank == 0:
        bad = [k for k, v in full.items() if not torch.equal(v, exp["tensors"]["model." + k])]
        if state["step"] != 42: bad.append("step")
        open(result, "w").write("OK" if not bad else "MISMATCH " + ",".join(bad))
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    s = __import__("socket").socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(main, args=(2, port, sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2, join=True)
'''


def load_renamed(tmp_path, ckpt: Path, expected: Path) -> str:
    script = tmp_path / "load_renamed.py"
    script.write_text(LOADER)
    result = tmp_path / "result.txt"
    try:
        _, log = dcp_fixtures.run_bounded([script, ckpt, expected, result], timeout=300)
    except TimeoutError:
        pytest.fail("the 2-process dcp.load did not finish within 300 s")
    assert result.exists(), log[-3000:]
    return result.read_text()


def test_rekey_rewrites_every_rank_file(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    out = tmp_path / "out"
    rc, stdout, err = run_ckptool("rekey", d, "--rename", "^model\\.=net.", "--json", "-o", out, timeout=120)
    assert rc == 0, err
    doc = json.loads(stdout)
    assert doc["changed"] == 5 and "__0.metadata" in doc["files"] and "__1.metadata" in doc["files"], doc
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in d.iterdir())
    for f in d.glob("*.distcp"):
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    for r in (0, 1):
        keys = set(FileSystemReader(str(out)).read_metadata(rank=r).state_dict_metadata)
        assert keys == {"net.w", "net.c", "net.b", "net.tiny", "net.plain", "step"}, keys
    assert load_renamed(tmp_path, out, Path(str(d) + ".expected.pt")) == "OK"
    # N files cannot replace N files in place by one rename: an existing OUTDIR is refused.
    rc, _, err = run_ckptool("rekey", d, "--rename", "^model\\.=m.", "-o", out, "--force", timeout=120)
    assert rc == 2 and "only to a new directory" in err, err
    assert set(FileSystemReader(str(out)).read_metadata(rank=0).state_dict_metadata) >= {"net.w"}


def test_rekey_collision_across_ranks_is_refused(dcp_dirs, tmp_path):
    """r0.w lives only in rank 0's file, r1.w only in rank 1's: one name for both is a
    collision no single file shows."""
    d = need(dcp_dirs, "nocolldiff2")
    rc, _, err = run_ckptool("rekey", d, "--rename", "^r[01]\\.=", "-o", tmp_path / "out", timeout=120)
    assert rc == 1 and "different ranks" in err and "'w'" in err, err
    assert not (tmp_path / "out").exists()


def test_a_slice_sees_only_the_replicas_it_reads(dcp_dirs, tmp_path):
    """A tensor-parallel rank opens only the chunks its slice meets (formats.md §16.3): the
    copies of `shared_name` (shape [1]) that differ are refused by the rank that reads its
    element, and not seen by a rank whose slice of it is empty."""
    d = need(dcp_dirs, "nocolldiff2")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"*": "Shard(0)"}))
    rc, _, err = run_ckptool("materialize", d, "--plan", plan, "--rank", "0", "--world", "3", "-o", tmp_path / "r0.pt",
                             timeout=120)
    assert rc == 3 and "'shared_name'" in err and "no single one" in err, err
    assert not (tmp_path / "r0.pt").exists()
    rc, _, err = run_ckptool("materialize", d, "--plan", plan, "--rank", "1", "--world", "3", "-o", tmp_path / "r1.pt",
                             timeout=120)
    assert rc == 0, err
    got = torch.load(tmp_path / "r1.pt", weights_only=True)
    assert got["shared_name"].numel() == 0
