"""ckptool on torch.distributed.checkpoint directories (the reader, model/open_dcp.cpp),
judged by PyTorch's own reader, never by ours:

* every directory dcp_fixtures.py writes with the real ``dcp.save`` (2 and 4 gloo
  processes): ``inspect --json`` lists every tensor item of ``read_metadata()`` with its
  dtype and global shape; with ``--chunks`` every piece's byte range, read straight from the
  ``.distcp`` file, equals that box of the tensor ``dcp.load`` gives;
* ``materialize -o`` equals ``dcp.load`` for every key, one piece or assembled from chunks;
* ``verify`` passes intact directories and names a chunk whose data was flipped;
* a ``.metadata`` with a ``__reduce__`` payload is refused as unsafe and never run (the
  payload would create a file, and does under PyTorch's reader); a BYTE_IO value whose
  pickle names ``os.system`` is shown with it as unsafe, never run;
* inspect reads ``.metadata`` only: under 1% of a directory's bytes;
* unknown stream transforms are refused (rekey: test_dcp_rekey.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")

SCENARIOS = ["shard2", "grid4", "threads2", "perfile2", "fsdp2", "zstd2"]


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, SCENARIOS)


def scenario(dcp_dirs, name) -> Path:
    if name not in dcp_dirs:
        pytest.skip(f"{name}: not written by this torch")
    return dcp_dirs[name]


def inspect_json(path, *flags) -> dict:
    rc, out, err = run_ckptool("inspect", "--json", *flags, path, timeout=120)
    assert rc == 0, err
    return json.loads(out)


def tensor_items(d) -> dict:
    md = FileSystemReader(str(d)).read_metadata()
    return {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def loaded(d) -> dict:
    """Every tensor item as dcp.load gives it whole (single process, no process group)."""
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in tensor_items(d).items()}
    dcp.load(sd, checkpoint_id=str(d))
    return sd


def dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")


def piece_tensor(doc, d: Path, piece) -> torch.Tensor:
    """The bytes a piece names, read from its file, viewed as its tensor record says."""
    f = doc["files"][piece["file"]]
    t = doc["tensors"][piece["tensor"]]
    with open(f["path"], "rb") as fh:
        if "within" in f:
            # An item decompressed in memory (zstd): the range is in the inflated archive.
            import zstandard
            fh.seek(f["offset"])
            inflated = zstandard.ZstdDecompressor().stream_reader(fh.read(f["size"])).read()
            raw = inflated[piece["offset"]:piece["offset"] + piece["nbytes"]]
        else:
            fh.seek(piece["offset"])
            raw = fh.read(piece["nbytes"])
    assert len(raw) == piece["nbytes"]
    dt = getattr(torch, t["dtype"])
    flat = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.empty(0, dtype=dt)
    return torch.as_strided(flat, t["shape"], t["stride"], t["storage_offset"])


def box_of(full: torch.Tensor, offsets, sizes) -> torch.Tensor:
    v = full
    for dim, (o, s) in enumerate(zip(offsets, sizes)):
        v = v.narrow(dim, o, s)
    return v


# --- inspect against PyTorch's reader -------------------------------------------------------

@pytest.mark.parametrize("name", SCENARIOS)
def test_inspect_lists_what_read_metadata_lists(dcp_dirs, name):
    d = scenario(dcp_dirs, name)
    doc = inspect_json(d)
    assert doc["layout"] == "dcp" and doc["index"] == str(d / ".metadata")
    assert doc["writer"] == getattr(FileSystemReader(str(d)).read_metadata(), "version", None)
    items = tensor_items(d)
    assert [k["key"] for k in doc["keys"]] == list(items)
    for k in doc["keys"]:
        ref = items[k["key"]]
        assert k["dtype"] == dtype_name(ref.properties.dtype), k["key"]
        assert k["shape"] == list(ref.size), k["key"]
        # From metadata alone a piece names its chunk's archive, never data.
        assert all(p["data"] is False for p in k["pieces"])
    disk = sorted(p.name for p in d.iterdir() if p.suffix == ".distcp")
    assert sorted(Path(f["path"]).name for f in doc["files"] if "within" not in f) == disk
    assert doc["file_size"] == sum((d / n).stat().st_size for n in disk)


@pytest.mark.parametrize("name", SCENARIOS)
def test_chunk_ranges_hold_what_dcp_load_gives(dcp_dirs, name):
    d = scenario(dcp_dirs, name)
    doc = inspect_json(d, "--chunks")
    full = loaded(d)
    checked = 0
    for k in doc["keys"]:
        ref = full[k["key"]]
        covered = 0
        for p in k["pieces"]:
            assert p["data"] is True
            t = doc["tensors"][p["tensor"]]
            assert t["dtype"] == dtype_name(ref.dtype)
            got = piece_tensor(doc, d, p)
            want = box_of(ref, p["offsets"], p["sizes"])
            assert torch.equal(got, want), (k["key"], p)
            covered += got.numel()
            checked += 1
        assert covered == ref.numel(), k["key"]
    assert checked > 0
    if name == "zstd2":  # the pieces lie in inflated archives, not in the files
        assert all("within" in doc["files"][p["file"]] for k in doc["keys"] for p in k["pieces"])


def test_values_are_shown_never_run(dcp_dirs):
    d = scenario(dcp_dirs, "shard2")
    doc = inspect_json(d)
    entries = {tuple(e["path"]): (e["type"], e["value"]) for e in doc["entries"]}
    assert entries[("step",)] == ("int", "42")
    assert entries[("name",)] == ("str", "'hello'")
    assert entries[("epochs",)] == ("list", "[1, 2, 3]")
    assert doc["unsafe_globals"] == []
    # Nested keys keep the path planner_data gives them.
    tensors = {tuple(t["path"]) for t in doc["tensors"]}
    assert ("model", "layer.weight") in tensors


def test_text_report(dcp_dirs):
    d = scenario(dcp_dirs, "shard2")
    rc, out, err = run_ckptool("inspect", d)
    assert rc == 0, err
    assert "dcp (torch.distributed.checkpoint, version 1.0.0)" in out
    assert "model.layer.weight" in out and "[5, 4]" in out and "2 chunks" in out
    rc, out, err = run_ckptool("inspect", "--chunks", "--filter", "model.layer.weight", d)
    assert rc == 0, err
    assert "offsets (3, 0), sizes (2, 4) in __1_0.distcp, data at bytes [" in out


# --- materialize and verify -----------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory) -> Path:
    """One process, plain tensors (one chunk each, a transposed one among them), large
    enough that metadata is well under 1% of the bytes."""
    d = tmp_path_factory.mktemp("plain") / "ckpt"
    g = torch.Generator().manual_seed(0)
    sd = {"enc.weight": torch.randn(512, 1024, generator=g),
          "enc.bias": torch.randn(1024, generator=g).to(torch.bfloat16),
          "head.weight_t": torch.randn(64, 256, generator=g).t(),
          "ids": torch.arange(100, dtype=torch.int32),
          "scalar": torch.tensor(3.5), "epoch": 4}
    dcp.save(sd, checkpoint_id=str(d))
    return d


def test_inspect_reads_metadata_only(plain_dir):
    doc = inspect_json(plain_dir)
    total = doc["file_size"] + (plain_dir / ".metadata").stat().st_size
    assert doc["io"]["bytes_read"] < total / 100, (doc["io"], total)


def test_materialize_one_piece_keys(plain_dir, tmp_path):
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", plain_dir, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want = loaded(plain_dir)
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("name", SCENARIOS)
def test_materialize_equals_dcp_load(dcp_dirs, name, tmp_path):
    """Every key, one piece or assembled from chunks (dim 0, dim 1, grids, uneven and
    zero-size chunks, zstd), equals what dcp.load gives, bit for bit, in dcp.load's keys."""
    d = scenario(dcp_dirs, name)
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got, want = torch.load(out, weights_only=True), loaded(d)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k].view(torch.uint8) if got[k].dim() else got[k], want[k].view(torch.uint8)
                           if want[k].dim() else want[k]), k


def userfaultfd_available() -> bool:
    """Whether this process may open a userfaultfd for its own faults (Linux 5.11's
    UFFD_USER_MODE_ONLY needs no privilege), as ckptool's page filler does."""
    import ctypes
    number = {"x86_64": 323, "aarch64": 282}.get(os.uname().machine)
    if number is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (os.O_CLOEXEC | 1, os.O_CLOEXEC):
        fd = libc.syscall(number, flags)
        if fd >= 0:
            os.close(fd)
            return True
    return False


def materialize_rchar(d: Path, out: Path, env=None) -> int:
    """Bytes ckptool materialize D -o OUT read through read(): a reaped child's I/O counters
    are added to its parent's, so /proc/self/io measures it."""
    def rchar() -> int:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))
    before = rchar()
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "-o", out, timeout=120, env=env)
    assert rc == 0, err
    return rchar() - before


def test_dim0_chunks_are_copied_from_mappings(dcp_dirs, tmp_path):
    """The dim-0 chunks of a tensor over a megabyte ("big": 2.4 MB of rows of 4000 bytes, the
    second chunk starting mid-page) are copied page by page from mappings of the .distcp
    files (piece_reader.cpp), the page the chunks share assembled from both: the process
    reads through read() far less than the tensor, the pread path reads all of it, and both
    give dcp.load's values bit for bit."""
    if not userfaultfd_available():
        pytest.skip("no userfaultfd here: the loader reads with pread")
    d = scenario(dcp_dirs, "shard2")
    want = loaded(d)
    big = want["model.big"].numel() * want["model.big"].element_size()
    mapped, pread = tmp_path / "mapped.pt", tmp_path / "pread.pt"
    read_mapped = materialize_rchar(d, mapped)
    read_pread = materialize_rchar(d, pread, env={"CKPTOOL_NO_USERFAULTFD": "1"})
    assert read_pread >= big, f"the pread path read {read_pread} bytes for a {big}-byte tensor?"
    assert read_mapped < big // 4, f"read() {read_mapped} bytes for a {big}-byte tensor: its chunks were not mapped"
    for out in (mapped, pread):
        got = torch.load(out, weights_only=True)
        assert sorted(got) == sorted(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            assert torch.equal(got[k].view(torch.uint8) if got[k].dim() else got[k],
                               want[k].view(torch.uint8) if want[k].dim() else want[k]), (out.name, k)


def test_json_times_the_open_apart(dcp_dirs):
    """--json reports open_seconds (reading .metadata and every chunk's archive) beside
    seconds (the load): the benchmark adds the two to compare with a Python loader's call."""
    d = scenario(dcp_dirs, "shard2")
    rc, so, err = run_ckptool("materialize", d, "--device", "cpu", "--json", timeout=120)
    assert rc == 0, err
    doc = json.loads(so)
    assert isinstance(doc["open_seconds"], float) and 0 < doc["open_seconds"] < 60, doc
    assert isinstance(doc["seconds"], float) and doc["seconds"] >= 0, doc


@pytest.mark.parametrize("name", ["shard2", "grid4"])
def test_materialize_assembled_dtype_and_meta(dcp_dirs, name, tmp_path):
    d = scenario(dcp_dirs, name)
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "--device", "cpu", "--dtype", "float64", "-o", out, timeout=120)
    assert rc == 0, err
    got, want = torch.load(out, weights_only=True), loaded(d)
    for k in want:
        if want[k].is_floating_point():
            assert torch.equal(got[k], want[k].to(torch.float64)), k
    rc, _, err = run_ckptool("materialize", d, "--device", "meta", timeout=120)
    assert rc == 0, err


@pytest.mark.parametrize("name", SCENARIOS)
def test_verify_intact(dcp_dirs, name):
    d = scenario(dcp_dirs, name)
    rc, out, err = run_ckptool("verify", "--json", d, timeout=120)
    assert rc == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] and doc["records_checked"] > 0
    assert doc["tensors"] == len(tensor_items(d))


def test_verify_names_a_flipped_chunk(plain_dir, tmp_path):
    import shutil
    d = tmp_path / "flipped"
    shutil.copytree(plain_dir, d)
    doc = inspect_json(d, "--chunks")
    piece = next(k for k in doc["keys"] if k["key"] == "enc.weight")["pieces"][0]
    path = Path(doc["files"][piece["file"]]["path"])
    data = bytearray(path.read_bytes())
    data[piece["offset"] + 100] ^= 0x01
    path.write_bytes(data)
    rc, out, err = run_ckptool("verify", d, timeout=120)
    assert rc == 1, out + err
    assert "CRC-32 mismatch in archive/data/0 of " + str(path) in out
    assert "(the archive at byte " in out


# --- hostile directories --------------------------------------------------------------------

class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def test_malicious_metadata_is_refused_never_run(plain_dir, tmp_path):
    import shutil
    d = tmp_path / "evil"
    shutil.copytree(plain_dir, d)
    marker = tmp_path / "marker"
    md = FileSystemReader(str(d)).read_metadata()
    md.storage_meta.checkpoint_id = Payload(marker)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    for verb in (["inspect"], ["inspect", "--json"], ["verify"], ["materialize", "--device", "meta"]):
        rc, out, err = run_ckptool(*verb, d)
        # verify reports what it found (exit 1); the other verbs refuse the input (exit 3).
        said = out if verb == ["verify"] else err
        assert rc == (1 if verb == ["verify"] else 3), (verb, out, err)
        assert "unsafe" in said and ("posix.system" in said or "os.system" in said), said
        assert str(d / ".metadata") in said
    assert not marker.exists(), "ckptool ran the payload"
    # PyTorch's reader does run it: the test is real.
    code = "import sys; from torch.distributed.checkpoint import FileSystemReader; FileSystemReader(sys.argv[1]).read_metadata()"
    subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, timeout=120)
    assert marker.exists()


def test_unsafe_value_is_listed_never_run(tmp_path):
    d = tmp_path / "evil_value"
    marker = tmp_path / "marker"
    dcp.save({"w": torch.ones(3), "hook": Payload(marker)}, checkpoint_id=str(d))
    assert not marker.exists()
    doc = inspect_json(d)
    assert any(g in ("posix.system", "os.system") for g in doc["unsafe_globals"]), doc["unsafe_globals"]
    rc, out, err = run_ckptool("verify", d)
    assert rc == 1 and "unsafe global" in out, out + err
    assert not marker.exists(), "ckptool ran the payload"


def test_unknown_transform_is_refused(plain_dir, tmp_path):
    import shutil
    d = tmp_path / "foo"
    shutil.copytree(plain_dir, d)
    md = FileSystemReader(str(d)).read_metadata()
    for info in md.storage_data.values():
        info.transform_descriptors = ["stream.foo/1"]
    (d / ".metadata").write_bytes(pickle.dumps(md))
    rc, out, err = run_ckptool("verify", d)
    assert rc == 3 and "stream.foo/1" in err and "unsupported" in err, out + err


def test_lightning_meta_pt_entries(tmp_path):
    """Lightning's FSDP strategy writes the model and optimizer with DCP and the rest of its
    checkpoint with torch.save into meta.pt beside them (fabric/strategies/fsdp.py
    save_checkpoint); here the same two writers, called as it calls them."""
    d = tmp_path / "lightning"
    dcp.save({"model": {"w": torch.ones(2, 3)}}, checkpoint_id=str(d))
    torch.save({"epoch": 3, "global_step": 120, "hyper_parameters": {"lr": 0.1}}, d / "meta.pt")
    doc = inspect_json(d)
    assert doc["lightning"] is True
    entries = {tuple(e["path"]): e["value"] for e in doc["entries"]}
    assert entries[("meta.pt", "epoch")] == "3" and entries[("meta.pt", "global_step")] == "120"
    assert [k["key"] for k in doc["keys"]] == ["model.w"]
    assert str(d / "meta.pt") in [f["path"] for f in doc["files"]]
    rc, out, err = run_ckptool("verify", d)
    assert rc == 0, out + err
