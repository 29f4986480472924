"""The DCP `.metadata` decoder (ckpt/dcp.h) against PyTorch's own reader.

* Every DCP directory dcp_fixtures.py writes with the real ``dcp.save`` (2 and 4 gloo
  processes): ``dcp_metadata_dump`` (tests/tools/dcp_metadata_dump.cpp) must give, for
  every key and every storage item, what ``FileSystemReader(dir).read_metadata()`` gives.
* Hand-built ``Metadata`` objects (the real dataclasses, pickled by CPython at protocols
  2-5) for the forms no local writer produces: the zstd transform descriptors, pre-2.7
  ``_StorageInfo`` without them, pre-2.9 without ``version``, pre-2.4 without
  ``storage_meta``, Megatron-Core's extra ``mcore_data`` field, Python 3.13's PosixPath.
* A malicious ``.metadata``: CPython's pickle (and so ``read_metadata``) runs its payload,
  which creates a marker file; we refuse it as unsafe (exit 3) and the marker never appears.
* Truncated and corrupt files: one line naming the file and byte offset, exit 3.
* The coverage check on hand-made chunk lists: out of bounds, overlap, gap, missing storage,
  each with a success twin.
"""

from __future__ import annotations

import copyreg
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import json
from pathlib import Path, PurePosixPath

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", HERE.parents[1] / "build"))
DUMP = BUILD_DIR / "tests" / "dcp_metadata_dump"


def dump(path, *flags) -> tuple[int, dict | None, str]:
    p = subprocess.run([str(DUMP), *flags, str(path)], capture_output=True, timeout=60)
    err = p.stderr.decode("utf-8", "replace")
    out = json.loads(p.stdout) if p.returncode == 0 else None
    return p.returncode, out, err


# --- what PyTorch's reader gives, in the dump's shape --------------------------------------

def _size(s) -> list[int]:
    return [int(d) for d in s]


def reference(md: Metadata) -> dict:
    items = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            items[fqn] = {"type": "bytes"}
            continue
        p = m.properties
        items[fqn] = {"type": "tensor", "dtype": str(p.dtype).removeprefix("torch."), "size": _size(m.size),
                      "chunks": [{"offsets": _size(c.offsets), "sizes": _size(c.sizes)} for c in m.chunks],
                      "layout": str(p.layout), "requires_grad": bool(p.requires_grad),
                      "memory_format": {torch.contiguous_format: 0, torch.channels_last: 1,
                                        torch.preserve_format: 2}[p.memory_format],
                      "pin_memory": bool(p.pin_memory)}
    storage = [{"fqn": k.fqn, "offsets": None if k.offset is None else _size(k.offset), "index": k.index,
                "relative_path": v.relative_path, "offset": v.offset, "length": v.length,
                "transform_descriptors": list(getattr(v, "transform_descriptors", None) or [])}
               for k, v in md.storage_data.items()]
    pd = md.planner_data
    planner = None if pd is None else {k: list(v) for k, v in pd.items()}
    sm = getattr(md, "storage_meta", None)
    smj = None if sm is None else {"checkpoint_id": str(sm.checkpoint_id or ""), "save_id": sm.save_id or "",
                                   "load_id": sm.load_id, "modules": list(getattr(sm, "modules", None) or [])}
    return {"version": getattr(md, "version", None), "items": items, "storage": storage,
            "planner_data": planner, "storage_meta": smj}


def assert_same(ours: dict, ref: dict, where: str):
    assert ours["version"] == ref["version"], where
    assert list(ours["items"]) == list(ref["items"]), f"{where}: keys differ"
    for k in ref["items"]:
        assert ours["items"][k] == ref["items"][k], f"{where}: item {k}"
    assert len(ours["storage"]) == len(ref["storage"]), f"{where}: storage_data sizes"
    for a, b in zip(ours["storage"], ref["storage"]):
        assert a == b, f"{where}: storage item {b['fqn']} {b['offsets']}"
    assert ours["planner_data"] == ref["planner_data"], f"{where}: planner_data"
    assert ours["storage_meta"] == ref["storage_meta"], f"{where}: storage_meta"


# --- real directories ----------------------------------------------------------------------

@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out)


@pytest.mark.parametrize("name", list(dcp_fixtures.SCENARIOS))
def test_matches_read_metadata(dcp_dirs, name):
    if name not in dcp_dirs:
        pytest.skip(f"{name}: {dcp_fixtures.skipped(dcp_dirs_root(dcp_dirs)).get(name, 'not written')}")
    d = dcp_dirs[name]
    files = dcp_fixtures.metadata_files(d)
    assert files
    for f in files:
        # The global .metadata, or (use_collectives=False) each rank's __{r}.metadata.
        rank = None if f.name == ".metadata" else int(f.name[2:].split(".")[0])
        rc, ours, err = dump(f, "--check")
        assert rc == 0, err
        ref = reference(FileSystemReader(str(d)).read_metadata(rank=rank))
        # read_metadata stamps its own load_id on storage_meta; the file holds the writer's.
        with open(f, "rb") as fh:
            written = pickle.load(fh)  # our own fixture, written just now by dcp.save
        ref["storage_meta"]["load_id"] = written.storage_meta.load_id
        assert_same(ours, ref, f"{name}/{f.name}")
        assert ours["unknown_fields"] == []
        assert ours["protocol"] >= 2


def dcp_dirs_root(dcp_dirs) -> Path:
    return next(iter(dcp_dirs.values())).parent


def test_fixtures_cover_the_cases(dcp_dirs):
    """The scenarios hold what the brief asks for, as PyTorch itself reports it."""
    md = FileSystemReader(str(dcp_dirs["shard2"])).read_metadata()
    tiny = md.state_dict_metadata["model.tiny"]
    assert any(0 in c.sizes for c in tiny.chunks), "zero-size chunk"
    assert isinstance(md.state_dict_metadata["step"], BytesStorageMetadata)
    assert md.state_dict_metadata["optim.state.step"].size == torch.Size([])
    g = FileSystemReader(str(dcp_dirs["grid4"])).read_metadata()
    assert len(g.state_dict_metadata["w"].chunks) == 4
    assert len({v.relative_path for v in g.storage_data.values()}) == 4
    t = FileSystemReader(str(dcp_dirs["threads2"])).read_metadata()
    assert len({v.relative_path for v in t.storage_data.values()}) > 2
    if "fsdp2" in dcp_dirs:
        f = FileSystemReader(str(dcp_dirs["fsdp2"])).read_metadata()
        assert any("._orig_mod." in k for k in f.state_dict_metadata)
        assert any(k.startswith("optim.state.") for k in f.state_dict_metadata)


# --- hand-built metadata -------------------------------------------------------------------

def tensor(dtype, size, boxes):
    return TensorStorageMetadata(properties=TensorProperties(dtype=dtype), size=torch.Size(size),
                                 chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
                                         for o, s in boxes])


def make_md(tensors: dict, byte_items=(), transforms=None, **extra) -> Metadata:
    sdm, storage, pos = {}, {}, 0
    for fqn, t in tensors.items():
        sdm[fqn] = t
        for i, c in enumerate(t.chunks):
            storage[MetadataIndex(fqn, c.offsets, i)] = _StorageInfo("__0_0.distcp", pos, 100, transforms)
            pos += 100
    for fqn in byte_items:
        sdm[fqn] = BytesStorageMetadata()
        storage[MetadataIndex(fqn)] = _StorageInfo("__1_0.distcp", pos, 50, transforms)
        pos += 50
    md = Metadata(state_dict_metadata=sdm, planner_data={k: tuple(k.split(".")) for k in sdm},
                  storage_data=storage, **extra)
    return md


def write(tmp_path, md, protocol=4, pickler=pickle.Pickler, name=".metadata") -> Path:
    p = tmp_path / name
    with open(p, "wb") as f:
        pickler(f, protocol=protocol).dump(md)
    return p


class Pre27Pickler(pickle.Pickler):
    """Pickles _StorageInfo as 2.4-2.6 did: its plain __dict__ of three fields."""

    def reducer_override(self, obj):
        if isinstance(obj, _StorageInfo):
            return (copyreg.__newobj__, (_StorageInfo,),
                    {"relative_path": obj.relative_path, "offset": obj.offset, "length": obj.length})
        return NotImplemented


class Py313PathPickler(pickle.Pickler):
    """Pickles the checkpoint path as Python 3.13 does: pathlib._local.PosixPath('/a/b')."""

    def reducer_override(self, obj):
        if isinstance(obj, PurePosixPath):
            return (_py313_path, (str(obj),))
        return NotImplemented


def _py313_path(s):  # stands in for pathlib._local.PosixPath in the pickle
    return Path(s)


_py313_path.__module__ = "pathlib._local"
_py313_path.__qualname__ = "PosixPath"


def write_py313(tmp_path, md) -> Path:
    """The pickler checks that the global it names imports; below 3.13 there is no
    pathlib._local, so stand one in while pickling."""
    import types
    saved = sys.modules.get("pathlib._local")
    if saved is None:
        fake = types.ModuleType("pathlib._local")
        fake.PosixPath = _py313_path
        sys.modules["pathlib._local"] = fake
    try:
        return write(tmp_path, md, 4, Py313PathPickler)
    finally:
        if saved is None:
            del sys.modules["pathlib._local"]


def base_tensors():
    return {"model.w": tensor(torch.bfloat16, (5, 4), [((0, 0), (3, 4)), ((3, 0), (2, 4))]),
            "model.b": tensor(torch.float8_e4m3fn, (4,), [((0,), (4,))]),
            "step": tensor(torch.float32, (), [((), ())])}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_protocols(tmp_path, protocol):
    md = make_md(base_tensors(), ["lr", "name"],
                 storage_meta=StorageMeta(checkpoint_id=Path("/ckpt/run1"), save_id="abc", modules=["m"]),
                 version="1.0.0")
    p = write(tmp_path, md, protocol)
    rc, ours, err = dump(p, "--check")
    assert rc == 0, err
    assert_same(ours, reference(pickle.loads(p.read_bytes())), f"protocol {protocol}")


def test_zstd_descriptors(tmp_path):
    md = make_md(base_tensors(), ["lr"], transforms=["stream.zstd/1"])
    p = write(tmp_path, md)
    rc, ours, err = dump(p, "--check")
    assert rc == 0, err
    assert all(s["transform_descriptors"] == ["stream.zstd/1"] for s in ours["storage"])
    assert_same(ours, reference(pickle.loads(p.read_bytes())), "zstd")


def test_older_writers(tmp_path):
    """2.4-2.6 _StorageInfo (3 fields), no version (before 2.9), no storage_meta (before
    2.4), planner_data None (flatten_state_dict=False)."""
    md = make_md(base_tensors(), ["lr"])
    md.planner_data = None
    md.storage_meta = None
    del md.version
    p = write(tmp_path, md, 2, Pre27Pickler)
    assert b"transform_descriptors" not in p.read_bytes() and b"version" not in p.read_bytes()
    rc, ours, err = dump(p, "--check")
    assert rc == 0, err
    assert ours["version"] is None and ours["planner_data"] is None and ours["storage_meta"] is None
    assert_same(ours, reference(pickle.loads(p.read_bytes())), "pre-2.7")


def test_unknown_fields_tolerated(tmp_path):
    """Megatron-Core sets Metadata.mcore_data dynamically (NVIDIA/Megatron-LM#2345)."""
    md = make_md(base_tensors(), ["lr"])
    md.mcore_data = {"model.w": {"nd_reformulated_orig_global_shape": (5, 4)}}
    p = write(tmp_path, md)
    rc, ours, err = dump(p, "--check")
    assert rc == 0, err
    assert ours["unknown_fields"] == ["mcore_data"]
    assert_same(ours, reference(pickle.loads(p.read_bytes())), "mcore")


def test_python313_path(tmp_path):
    md = make_md(base_tensors(), storage_meta=StorageMeta(checkpoint_id=Path("/ckpt/run 2"), save_id="s"))
    p = write_py313(tmp_path, md)
    assert b"pathlib._local" in p.read_bytes()
    rc, ours, err = dump(p)
    assert rc == 0, err
    assert ours["storage_meta"]["checkpoint_id"] == "/ckpt/run 2"


# --- hostile -------------------------------------------------------------------------------

class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _python_loads(path: Path):
    code = ("import sys; from torch.distributed.checkpoint import FileSystemReader; "
            "FileSystemReader(sys.argv[1]).read_metadata()")
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=120)


def test_malicious_reduce_payload(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    marker = tmp_path / "marker"
    md = make_md(base_tensors(), storage_meta=StorageMeta(checkpoint_id=Payload(marker), save_id="x"))
    write(d, md)
    rc, ours, err = dump(d)
    assert rc == 3, err
    assert "would import and run" in err and ("posix.system" in err or "os.system" in err), err
    assert str(d / ".metadata") in err and len(err.strip().splitlines()) == 1
    assert not marker.exists(), "ckptool ran the payload"
    # The same file does run code under PyTorch's reader: the test is real.
    _python_loads(d)
    assert marker.exists(), "the payload should run under FileSystemReader.read_metadata"


def test_popped_payload_is_still_refused(tmp_path):
    """A call whose result is popped off the stack still ran under pickle.load."""
    marker = tmp_path / "popped"
    good = pickle.dumps(make_md(base_tensors()), protocol=2)
    evil = good[:2] + f"cos\nsystem\n(Vtouch {marker}\ntR0".encode() + good[2:]
    d = tmp_path / "evil2"
    d.mkdir()
    (d / ".metadata").write_bytes(evil)
    rc, _, err = dump(d)
    assert rc == 3 and "os.system" in err, err
    assert not marker.exists()
    _python_loads(d)
    assert marker.exists()


ONE_LINE = re.compile(r"^\S.*: byte \d+: .+$")


def _corrupt_case(tmp_path, data: bytes, want: str, rc_want: int = 3):
    p = tmp_path / ".metadata"
    p.write_bytes(data)
    rc, _, err = dump(p)
    assert rc == rc_want, f"exit {rc}: {err}"
    line = err.strip()
    assert len(line.splitlines()) == 1 and str(p) in line, line
    assert re.search(want, line), line
    return line


@pytest.mark.parametrize("cut", [0, 1, 2, 50, -20, -1])
def test_truncated(tmp_path, cut):
    data = pickle.dumps(make_md(base_tensors(), ["lr"]), protocol=4)
    n = cut if cut >= 0 else len(data) + cut
    line = _corrupt_case(tmp_path, data[:n], r"corrupt|truncated|end of|empty|STOP|no ")
    if n > 0:
        assert ONE_LINE.match(line), line


def _mutated(mutate) -> bytes:
    md = make_md(base_tensors(), ["lr"])
    mutate(md)
    return pickle.dumps(md, protocol=4)


CORRUPT = [
    ("root-not-metadata", lambda: pickle.dumps({"state_dict_metadata": {}}), r"must be a Metadata"),
    ("size-not-torch-size", lambda: _mutated(lambda m: setattr(m.state_dict_metadata["model.w"], "size", [5, 4])),
     r"model\.w.*size must be a torch\.Size"),
    ("negative-length", lambda: _mutated(lambda m: setattr(next(iter(m.storage_data.values())), "length", -1)),
     r"length is negative"),
    ("path-escapes", lambda: _mutated(lambda m: setattr(next(iter(m.storage_data.values())), "relative_path",
                                                         "../../etc/passwd")),
     r"not a file name inside the checkpoint directory"),
    ("chunk-rank", lambda: _mutated(lambda m: setattr(m.state_dict_metadata["model.w"].chunks[0], "sizes",
                                                      torch.Size([3]))),
     r"box of rank"),
    ("entry-wrong-class", lambda: _mutated(lambda m: m.state_dict_metadata.__setitem__("x", 3)),
     r"must be a TensorStorageMetadata"),
    ("no-storage-data", lambda: _mutated(lambda m: delattr(m, "storage_data")), r"storage_data' is missing"),
]


@pytest.mark.parametrize("name,make,want", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt(tmp_path, name, make, want):
    line = _corrupt_case(tmp_path, make(), want)
    if name != "no-storage-data":
        assert ONE_LINE.match(line), line


def test_size_limit(tmp_path):
    """A .metadata over the pickle size limit is refused before it is read (exit 3)."""
    p = tmp_path / ".metadata"
    p.write_bytes(_mutated(lambda m: None))
    n = p.stat().st_size
    rc, _, err = dump(p, "--max-pickle-bytes", str(n - 1))
    assert rc == 3 and "over the pickle size limit" in err and str(p) in err, err
    rc, _, err = dump(p, "--max-pickle-bytes", str(n))
    assert rc == 0, err


def test_corrupt_twin_decodes(tmp_path):
    """The unmutated file the corrupt cases start from decodes and checks cleanly."""
    p = tmp_path / ".metadata"
    p.write_bytes(_mutated(lambda m: None))
    rc, _, err = dump(p, "--check")
    assert rc == 0, err


# --- coverage ------------------------------------------------------------------------------

COVERAGE = [
    # name, global size, boxes, expected error (None: the success twin)
    ("rows", (5, 4), [((0, 0), (3, 4)), ((3, 0), (2, 4))], None),
    ("rows-overlap", (5, 4), [((0, 0), (3, 4)), ((2, 0), (3, 4))],
     r"tensor 'w': chunk \(offsets \(2, 0\), sizes \(3, 4\)\) overlaps chunk \(offsets \(0, 0\), sizes \(3, 4\)\)"),
    ("grid", (3, 4), [((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (1, 2)), ((2, 2), (1, 2))], None),
    ("grid-gap", (3, 4), [((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (1, 2))],
     r"tensor 'w': no chunk holds the elements at offsets \(2, 2\), sizes \(1, 2\) of global shape \(3, 4\)"),
    ("cols", (3, 6), [((0, 0), (3, 3)), ((0, 3), (3, 3))], None),
    ("cols-out-of-bounds", (3, 6), [((0, 0), (3, 3)), ((0, 3), (3, 4))],
     r"tensor 'w': chunk 1 \(offsets \(0, 3\), sizes \(3, 4\)\) lies outside the global shape \(3, 6\)"),
    ("zero-size", (1, 3), [((0, 0), (1, 3)), ((1, 0), (0, 3))], None),
    ("zero-size-out-of-bounds", (1, 3), [((0, 0), (1, 3)), ((2, 0), (0, 3))], r"chunk 1 .* lies outside"),
    ("replicated-twice", (4,), [((0,), (4,)), ((0,), (4,))], None),
    ("replicated-partial-overlap", (4,), [((0,), (4,)), ((1,), (3,))], r"overlaps"),
    ("scalar", (), [((), ())], None),
    ("scalar-missing", (), [], r"no chunk holds the elements at offsets \(\), sizes \(\)"),
    ("empty-tensor", (0, 4), [((0, 0), (0, 4))], None),
]


@pytest.mark.parametrize("name,size,boxes,want", COVERAGE, ids=[c[0] for c in COVERAGE])
def test_coverage(tmp_path, name, size, boxes, want):
    md = make_md({"w": tensor(torch.float32, size, boxes)})
    if name == "replicated-twice":
        # make_md gave both chunks an entry under the same MetadataIndex: one survives.
        assert len(md.storage_data) == 1
    p = write(tmp_path, md)
    rc, _, err = dump(p)  # decoding alone never judges the boxes
    assert rc == 0, err
    rc, _, err = dump(p, "--check")
    if want is None:
        assert rc == 0, err
    else:
        assert rc == 3, err
        assert re.search(want, err), err
        assert len(err.strip().splitlines()) == 1


def test_storage_index_checked(tmp_path):
    md = make_md(base_tensors(), ["lr"])
    key = next(k for k in md.storage_data if k.fqn == "model.w" and k.offset == torch.Size([3, 0]))
    del md.storage_data[key]
    rc, _, err = dump(write(tmp_path, md), "--check")
    assert rc == 3 and "tensor 'model.w': storage_data has no entry for its chunk at offsets (3, 0)" in err, err
    md = make_md(base_tensors(), ["lr"])
    md.storage_data[MetadataIndex("ghost")] = _StorageInfo("__0_0.distcp", 0, 1)
    rc, _, err = dump(write(tmp_path, md), "--check")
    assert rc == 3 and "'ghost' matches no chunk or item" in err, err


class PropsPickler(pickle.Pickler):
    """Pickles TensorProperties with a chosen state instead of its 5-tuple."""

    def __init__(self, f, protocol, state):
        super().__init__(f, protocol=protocol)
        self.state = state

    def reducer_override(self, obj):
        if isinstance(obj, TensorProperties):
            return (copyreg.__newobj__, (TensorProperties,), self.state)
        return NotImplemented


@pytest.mark.parametrize("state,want", [
    ({"dtype": torch.float32}, r"TensorProperties state must be a 5-tuple"),
    ((torch.float32, torch.strided, False), r"TensorProperties state must be a 5-tuple"),
    ((torch.float32, torch.sparse_coo, False, None, False), r"layout torch.sparse_coo is not supported"),
    ((torch.float32, torch.strided, False, None, False), r"memory_format must be a _MEM_FORMAT_ENCODING"),
], ids=["dict", "3-tuple", "sparse", "no-memory-format"])
def test_tensor_properties_refused(tmp_path, state, want):
    """PyTorch's __setstate__ unpacks exactly 5 and rejects unknown memory formats, so these
    fail there too (or, for a sparse layout, describe no dense boxes): refused, not guessed."""
    p = tmp_path / ".metadata"
    with open(p, "wb") as f:
        PropsPickler(f, 4, state).dump(make_md(base_tensors()))
    rc, _, err = dump(p)
    assert rc == 3 and re.search(want, err), err
    if "sparse" not in want:
        with pytest.raises(Exception):
            pickle.loads(p.read_bytes())
