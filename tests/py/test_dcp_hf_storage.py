"""ckptool on directories written by torch.distributed.checkpoint's HuggingFaceStorageWriter
(docs/formats.md §9.10; model/open_dcp_safetensors.cpp), judged by PyTorch's own reader:

* ``save_distributed=True`` in 1 and 2 gloo processes (DTensors Shard(0) uneven, Shard(1),
  Replicate, a zero-size box, a 0-dim tensor, two files per rank): ``inspect --json``
  lists what ``HuggingFaceStorageReader.read_metadata()`` lists (dtype, global shape),
  ``materialize -o`` equals ``dcp.load`` through that reader and the saved state dict bit
  for bit, ``verify`` passes;
* corrupt twins are refused with exit 3: a lost rank file (a gap), a box moved onto
  another (overlap), a box listed twice, a DCP_SHARDING_INFO that misses a key;
* ``save_distributed=False``: one process gives an ordinary set read as one; two processes
  write one file name over each other, which is refused (exit 3), never read as a model.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")

try:
    from torch.distributed.checkpoint import HuggingFaceStorageReader
except ImportError:  # before 2.8
    HuggingFaceStorageReader = None

pytestmark = pytest.mark.skipif(HuggingFaceStorageReader is None, reason="this torch has no HuggingFaceStorageWriter")


@pytest.fixture(scope="session")
def written(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    root = Path(reuse) / "hfstorage" if reuse else tmp_path_factory.mktemp("hfstorage")
    out = {}
    for world in (1, 2):
        d = root / f"w{world}"
        if not (d / "source.pt").exists():
            shutil.rmtree(d, ignore_errors=True)
            rc, log = dcp_fixtures.run_bounded([HERE / "dcp_hf_fixture.py", d, world], 240)
            assert rc == 0 and (d / "source.pt").exists(), log[-3000:]
        out[world] = d
    return out


def inspect_json(path) -> dict:
    rc, out, err = run_ckptool("inspect", "--json", path, timeout=120)
    assert rc == 0, err
    return json.loads(out)


def reference(d: Path) -> dict:
    """What dcp.load gives through PyTorch's own reader of this layout, in full."""
    md = HuggingFaceStorageReader(str(d)).read_metadata()
    sd = {k: torch.zeros(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(str(d)))
    return sd


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("world", [1, 2])
def test_inspect_lists_what_the_reader_lists(written, world):
    d = written[world] / "dist"
    doc = inspect_json(d)
    assert doc["layout"] == "dcp" and doc["format"] == "safetensors" and doc["index"] is None
    md = HuggingFaceStorageReader(str(d)).read_metadata().state_dict_metadata
    keys = {k["key"]: k for k in doc["keys"]}
    assert sorted(keys) == sorted(md)
    for k, v in md.items():
        assert keys[k]["dtype"] == str(v.properties.dtype).removeprefix("torch."), k
        assert keys[k]["shape"] == list(v.size), k
    if world == 2:
        assert len(keys["embed.weight"]["pieces"]) == 2 and len(keys["proj.weight"]["pieces"]) == 2


@pytest.mark.parametrize("world", [1, 2])
def test_materialize_equals_dcp_load_and_the_source(written, world, tmp_path):
    d = written[world] / "dist"
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want, source = reference(d), torch.load(written[world] / "source.pt", weights_only=True)
    assert sorted(got) == sorted(want) == sorted(source)
    for k in source:
        assert same_bits(got[k], want[k]), k
        assert same_bits(got[k], source[k]), k
    rc, _, err = run_ckptool("verify", d, timeout=120)
    assert rc == 0, err


def test_text_report(written):
    rc, out, err = run_ckptool("inspect", written[2] / "dist", timeout=60)
    assert rc == 0, err
    assert "torch.distributed.checkpoint, safetensors pieces" in out and "assembled from chunks" in out


def test_without_distributed_one_process_reads_two_are_refused(written, tmp_path):
    """One process: an ordinary set (every box whole, at offset 0), read as one. Two: both
    ranks wrote model-00001-of-00001.safetensors; whichever won, the set is not the model (a
    missing key, a box at nonzero offsets, bytes past the last tensor, or pieces missing
    from total_size), and the index names every key, so it must not be read as a set."""
    d = written[1] / "nodist"
    assert inspect_json(d)["layout"] == "hf-shard-set"
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got, source = torch.load(out, weights_only=True), torch.load(written[1] / "source.pt", weights_only=True)
    assert sorted(got) == sorted(source) and all(same_bits(got[k], source[k]) for k in source)
    d = written[2] / "nodist"
    for verb in (["inspect", "--json"], ["materialize", "--device", "meta"]):
        rc, _, err = run_ckptool(*verb, d, timeout=60)
        assert rc == 3, (verb, err)
    # Which rank's file survived decides between corrupt (verify: 1) and unsupported (3).
    rc, out, err = run_ckptool("verify", d, timeout=60)
    assert (rc == 1 and "corrupt" in out) or (rc == 3 and "unsupported" in err), (out, err)


# --- corrupt twins -----------------------------------------------------------------------

def rewrite_info(path: Path, edit) -> None:
    """Rewrites one file's DCP_SHARDING_INFO (edit(dict) -> dict), keeping the data."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
    header["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(edit(info))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def twin(written, tmp_path) -> Path:
    d = tmp_path / "twin"
    shutil.copytree(written[2] / "dist", d)
    return d


def refused(d: Path, words: str) -> None:
    """inspect and materialize refuse it (exit 3); verify lists it as a problem (exit 1)."""
    for verb in (["inspect", "--json"], ["materialize", "--device", "meta"]):
        rc, out, err = run_ckptool(*verb, d, timeout=60)
        assert rc == 3 and out == "", (verb, err)
        assert words in err and ".safetensors" in err, (verb, err)
    rc, out, err = run_ckptool("verify", d, timeout=60)
    assert rc == 1 and words in out and "corrupt" in out, (out, err)


def test_intact_twin_is_read(written, tmp_path):
    rc, _, err = run_ckptool("verify", twin(written, tmp_path), timeout=60)
    assert rc == 0, err


def test_lost_rank_file_is_a_gap(written, tmp_path):
    d = twin(written, tmp_path)
    (d / "shard-00001-model-00001-of-00002.safetensors").unlink()
    refused(d, "tensor '")


def test_overlapping_boxes_are_refused(written, tmp_path):
    d = twin(written, tmp_path)
    rewrite_info(d / "shard-00002-model-00001-of-00002.safetensors",
                 lambda i: {**i, "embed.weight": {"saved_offsets": [3, 0]}})
    refused(d, "embed.weight")


def test_box_listed_twice_is_refused(written, tmp_path):
    d = twin(written, tmp_path)
    shutil.copy(d / "shard-00002-model-00002-of-00002.safetensors", d / "shard-00003-model-00002-of-00002.safetensors")
    refused(d, "is also in")


def test_missing_sharding_entry_is_refused(written, tmp_path):
    d = twin(written, tmp_path)
    rewrite_info(d / "shard-00001-model-00001-of-00002.safetensors",
                 lambda i: {k: v for k, v in i.items() if k != "big"})
    refused(d, "no entry in __metadata__ DCP_SHARDING_INFO")


def test_rekey_is_refused_as_unsupported(written, tmp_path):
    rc, _, err = run_ckptool("rekey", written[2] / "dist", "--strip-prefix", "embed.", "-o", tmp_path / "o", timeout=60)
    assert rc == 3 and "HuggingFaceStorageWriter" in err, err
    assert not (tmp_path / "o").exists()


def test_convert_writes_whole_tensors_without_the_box_map(written, tmp_path):
    """convert reads the pieces through the model: the safetensors output holds whole
    tensors, so it must not carry the pieces' DCP_SHARDING_INFO (HuggingFaceStorageReader
    would place them by it); --to dcp loads with dcp.load."""
    d, source = written[2] / "dist", torch.load(written[2] / "source.pt", weights_only=True)
    out = tmp_path / "out.safetensors"
    rc, _, err = run_ckptool("convert", d, "--to", "safetensors", "-o", out, timeout=120)
    assert rc == 0, err
    from safetensors import safe_open
    with safe_open(str(out), framework="pt") as f:
        assert "DCP_SHARDING_INFO" not in (f.metadata() or {})
        assert sorted(f.keys()) == sorted(source)
        for k in source:
            assert same_bits(f.get_tensor(k), source[k]), k
    rc, _, err = run_ckptool("convert", d, "--to", "dcp", "--ranks", "2", "-o", tmp_path / "dcp", timeout=120)
    assert rc == 0, err
    sd = {k: torch.zeros_like(v) for k, v in source.items()}
    dcp.load(sd, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert all(same_bits(sd[k], source[k]) for k in source)
