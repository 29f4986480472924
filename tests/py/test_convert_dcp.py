"""``ckptool convert --to dcp [--ranks K]`` judged by PyTorch's own DCP reader:

* torch.save -> DCP for 1, 2 and 3 ranks: ``dcp.load`` in one process, and in K processes
  (gloo on 127.0.0.1, bounded by dcp_fixtures.run_bounded) into plain tensors and into
  Shard(0) / Shard(1) DTensors, gives every tensor bit for bit (every dtype, 0-dim, empty,
  one-row tensors that leave ranks empty, views, ties);
* the layout is DTensor's Shard(0): each tensor's boxes are what
  ``Shard.local_shard_size_and_offset`` gives rank r of K, one ``__{r}_0.distcp`` per rank,
  and ``.metadata`` is exactly what CPython's pickler writes for the object it holds;
* a real 4-rank DCP (dcp_fixtures grid4) resharded to 3 ranks and loaded by ``dcp.load``
  in 3 processes; a DCP of our own resharded again, band by band, under a memory bound
  smaller than its largest tensor;
* ckptool reads every output back equal (after the torch check, never instead of it);
* an OUTDIR that exists follows the output-directory rules (formats.md §11.1).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import CKPTOOL, peak_rss_mib, run_ckptool, SANITIZED  # noqa: E402

warnings.filterwarnings("ignore")


def sample() -> dict:
    torch.manual_seed(17)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    w = torch.randn(7, 3)
    sd = {
        "f32": torch.randn(10, 4),
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "f16": torch.randn(9).to(torch.float16),
        "f64": torch.randn(4, 2, 3, dtype=torch.float64),
        "f8": torch.randn(6, 2).to(torch.float8_e4m3fn),
        "i64": torch.arange(2**33, 2**33 + 12, dtype=torch.int64).reshape(6, 2),
        "i32": torch.arange(-5, 10, dtype=torch.int32).reshape(5, 3),
        "u8": torch.arange(11, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True, True]),
        "c64": torch.randn(3, 2, dtype=torch.complex64),
        "one_row": torch.tensor([[1.5, 2.5, 3.5]]),   # 1 row: ranks past 0 hold nothing
        "two_rows": torch.tensor([[1, 2], [3, 4]], dtype=torch.int16),
        "scalar": torch.tensor(3.25),
        "scalar_i": torch.tensor(-7),
        "empty": torch.empty(0, 3),
        "transposed": base.t(),                      # a strided view, gathered band by band
        "slice": base[1:, 2:],
        "tie.a": w,
        "tie.b": w,                                   # the same tensor under two keys
    }
    return sd


def bits(t: torch.Tensor) -> bytes:
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k, v in want.items():
        g = got[k]
        assert g.dtype == v.dtype, (k, g.dtype, v.dtype)
        assert tuple(g.shape) == tuple(v.shape), (k, g.shape, v.shape)
        assert bits(g) == bits(v), k


def convert(src, out, *flags, ok=True):
    rc, stdout, err = run_ckptool("convert", src, "-o", out, *flags, timeout=120)
    if ok:
        assert rc == 0, f"exit {rc}: {err}"
    return rc, stdout, err


def read_md(d: Path):
    from torch.distributed.checkpoint import FileSystemReader
    return FileSystemReader(str(d)).read_metadata()


def dcp_loaded(d: Path) -> dict:
    """dcp.load in this one process into plain tensors of the metadata's shapes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = read_md(d)
    sd = {k: torch.full(tuple(v.size), 0, dtype=v.properties.dtype) if v.properties.dtype != torch.float8_e4m3fn
          else torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=str(d), no_dist=True)
    return sd


def ckptool_reads_back(d: Path, tmp: Path, *flags) -> dict:
    """ckptool's own reading of a DCP directory, as a torch.save file torch.load reads."""
    out = tmp / f"{d.name}.readback.pt"
    convert(d, out, "--to", "torch", *flags)
    return torch.load(out, weights_only=True)


# ---------------------------------------------------------------- K processes

LOADER = r'''
import os, sys, torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""

def main(rank, world, port, ckpt, expected, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world,))
    exp = torch.load(expected, weights_only=True)
    bad = []
    # Once into plain tensors (every rank reads every box), once into DTensors split
    # another way than the file (Shard(1) where there is a dim 1, else Shard(0), over this
    # world): dcp.load reshards. DTensors are made from local blanks (no collective: gloo
    # has no float8 or complex) and compared shard by shard.
    def blank(shape, dtype):
        return torch.zeros(shape, dtype=dtype) if dtype != torch.float8_e4m3fn else torch.empty(shape, dtype=dtype)
    for mode in ("plain", "dtensor"):
        sd, where = {}, {}
        for k, v in exp.items():
            if mode == "dtensor" and v.dim() >= 1:
                d = 1 if v.dim() >= 2 else 0
                size, off = Shard.local_shard_size_and_offset(v.shape[d], world, rank)
                shape = list(v.shape); shape[d] = size
                sd[k] = DTensor.from_local(blank(shape, v.dtype), mesh, [Shard(d)], run_check=False,
                                           shape=v.shape, stride=v.contiguous().stride())
                where[k] = (d, off, size)
            else:
                sd[k] = blank(v.shape, v.dtype)
        try:
            dcp.load(sd, checkpoint_id=ckpt)
        except BaseException as e:
            bad.append(f"{mode}: {type(e).__name__}: {str(e)[:1500]}")
            continue
        for k, v in exp.items():
            g = sd[k]
            if k in where:
                d, off, size = where[k]
                g, v = g.to_local(), v.narrow(d, off, size)
            if g.dtype != v.dtype or tuple(g.shape) != tuple(v.shape) or bits(g) != bits(v):
                bad.append(f"{mode}:{k}")
    open(f"{result}.{rank}", "w").write("OK" if not bad else "MISMATCH " + ",".join(bad))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    world = int(sys.argv[4])
    s = __import__("socket").socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    # fork: the ranks inherit the imported torch instead of importing it again each.
    mp.start_processes(main, args=(world, port, sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=world, join=True,
                       start_method="fork")
'''


def load_in_processes(tmp: Path, ckpt: Path, expected: Path, world: int) -> list[str]:
    script = tmp / "dcp_load_k.py"
    script.write_text(LOADER)
    result = tmp / f"result-{ckpt.name}-{world}"
    try:
        _, log = dcp_fixtures.run_bounded([script, ckpt, expected, result, world], timeout=240)
    except TimeoutError:
        pytest.fail(f"the {world}-process dcp.load did not finish within 240 s")
    out = []
    for r in range(world):
        p = Path(f"{result}.{r}")
        assert p.exists(), log[-3000:]
        out.append(p.read_text())
    return out


# ---------------------------------------------------------------- torch.save input


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("convert_dcp")
    torch.save(sample(), d / "sample.pt")
    return d


def expected_boxes(shape, world):
    from torch.distributed.tensor import Shard
    if len(shape) == 0:
        return [((), ())]
    boxes, seen = [], set()
    for r in range(world):
        size, off = Shard.local_shard_size_and_offset(shape[0], world, r)
        if off in seen:
            continue
        seen.add(off)
        boxes.append(((off,) + (0,) * (len(shape) - 1), (size,) + tuple(shape[1:])))
    return boxes


@pytest.mark.parametrize("world", [1, 2, 3])
def test_torch_save_to_dcp(work, world):
    out = work / f"dcp{world}"
    flags = ["--to", "dcp"] + (["--ranks", str(world)] if world > 1 else [])
    _, stdout, _ = convert(work / "sample.pt", out, *flags)
    want = sample()
    # PyTorch first: dcp.load in one process.
    assert_same(dcp_loaded(out), want)
    # FileSystemWriter's names: one data file per rank, .metadata.
    assert sorted(p.name for p in out.iterdir()) == sorted([".metadata"] + [f"__{r}_0.distcp" for r in range(world)])
    md = read_md(out)
    assert md.version == "1.0.0" and md.storage_meta is not None
    for k, v in want.items():
        tsm = md.state_dict_metadata[k]
        got = [(tuple(c.offsets), tuple(c.sizes)) for c in tsm.chunks]
        assert got == expected_boxes(tuple(v.shape), world), k
        assert md.planner_data[k] == (k,)
    # Each box lives in the file of a rank holding it: rank r its Shard(0) rows; an empty
    # box, which several ranks hold, one of them (which one, dedup_save_plans decides:
    # test_convert_dcp_placements.py compares that with dcp.save's own choice).
    from torch.distributed.tensor import Shard
    for idx, info in md.storage_data.items():
        shape = tuple(want[idx.fqn].shape)
        if shape:
            holders = [f"__{r}_0.distcp" for r in range(world)
                       if Shard.local_shard_size_and_offset(shape[0], world, r)[1] == idx.offset[0]]
            assert info.relative_path in holders, (idx, info)
    # The pickle is exactly what CPython writes for the object it holds.
    raw = (out / ".metadata").read_bytes()
    assert pickle.dumps(pickle.loads(raw), protocol=2) == raw
    # Then ckptool's own reader, and its CRC check of every record.
    assert_same(ckptool_reads_back(out, work), want)
    rc, _, err = run_ckptool("verify", out)
    assert rc == 0, err


@pytest.mark.parametrize("world", [2, 3])
def test_loaded_in_k_processes(work, tmp_path, world):
    out = work / f"dcpk{world}"
    convert(work / "sample.pt", out, "--to", "dcp", "--ranks", str(world))
    res = load_in_processes(tmp_path, out, work / "sample.pt", world)
    assert res == ["OK"] * world, res


def test_edits_select_and_dtype(work, tmp_path):
    out = tmp_path / "edited"
    convert(work / "sample.pt", out, "--to", "dcp", "--ranks", "2", "--select", "f*", "--rename", "f=g",
            "--dtype", "bfloat16")
    got = dcp_loaded(out)
    want = {k.replace("f", "g", 1): v.to(torch.bfloat16) if v.is_floating_point() else v
            for k, v in sample().items() if k.startswith("f")}
    assert_same(got, want)


def test_outdir_rules(work, tmp_path):
    out = tmp_path / "o"
    convert(work / "sample.pt", out, "--to", "dcp", "--ranks", "3")
    # A new set over a previous DCP set: replaced whole, the stale rank files removed.
    convert(work / "sample.pt", out, "--to", "dcp", "--ranks", "2")
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert_same(dcp_loaded(out), sample())
    # A file that is not of the set: refused without --force, left alone with it.
    (out / "notes.txt").write_text("mine")
    rc, _, err = convert(work / "sample.pt", out, "--to", "dcp", ok=False)
    assert rc == 2 and "notes.txt" in err, err
    convert(work / "sample.pt", out, "--to", "dcp", "--force")
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "notes.txt"]
    # A shard set (an index) is another layout: refused even with --force, nothing written.
    hf = tmp_path / "hf"
    convert(work / "sample.pt", hf, "--to", "hf", "--select", "f*", "--max-shard-size", "200")
    before = sorted(p.name for p in hf.iterdir())
    assert "model.safetensors.index.json" in before
    rc, _, err = convert(work / "sample.pt", hf, "--to", "dcp", "--force", ok=False)
    assert rc == 2, err
    assert sorted(p.name for p in hf.iterdir()) == before
    # OUTDIR inside the input DCP directory: refused.
    rc, _, err = convert(out, out / "inner", "--to", "dcp", ok=False)
    assert rc == 2 and not (out / "inner").exists(), err
    # --ranks belongs to --to dcp.
    rc, _, err = convert(work / "sample.pt", tmp_path / "x.pt", "--to", "torch", "--ranks", "2", ok=False)
    assert rc == 2 and "--ranks" in err, err


# ---------------------------------------------------------------- DCP input


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["grid4", "shard2", "zstd2"])


def test_reshard_4_to_3(dcp_dirs, tmp_path):
    if "grid4" not in dcp_dirs:
        pytest.skip(dcp_fixtures.skip_reason("grid4") or "grid4 not built")
    src = dcp_dirs["grid4"]
    want = dcp_loaded(src)
    out = tmp_path / "grid3"
    convert(src, out, "--to", "dcp", "--ranks", "3")
    assert sorted(p.name for p in out.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    assert_same(dcp_loaded(out), want)
    # rank_count, a BYTE_IO item, is carried byte for byte: dcp.load gives it back.
    md_in, md_out = read_md(src), read_md(out)
    blob = lambda d, md: next((d / i.relative_path).read_bytes()[i.offset:i.offset + i.length]
                              for k, i in md.storage_data.items() if k.fqn == "rank_count")
    assert blob(out, md_out) == blob(src, md_in)
    import torch.distributed.checkpoint as dcp
    holder = {"rank_count": None}
    dcp.load(holder, checkpoint_id=str(out), no_dist=True)
    assert holder["rank_count"] == 4
    # Dropped on request, with key edits (whose effect on a value convert cannot check).
    rc, _, err = convert(src, tmp_path / "renamed", "--to", "dcp", "--add-prefix", "m.", ok=False)
    assert rc == 3 and "rank_count" in err and not (tmp_path / "renamed").exists(), err
    expected = tmp_path / "grid4.expected.pt"
    torch.save(want, expected)
    res = load_in_processes(tmp_path, out, expected, 3)
    assert res == ["OK"] * 3, res
    assert_same(ckptool_reads_back(out, tmp_path, "--drop-other"), want)


def flat(x, p=""):
    if isinstance(x, (dict, list)):
        out = {}
        for k, v in (x.items() if isinstance(x, dict) else enumerate(x)):
            out.update(flat(v, f"{p}{k}."))
        return out
    return {p[:-1]: x}


@pytest.mark.parametrize("name", ["shard2", "zstd2"])
def test_reshard_keeps_nesting_and_byte_items(dcp_dirs, tmp_path, name):
    """dcp_to_torch_save (_EmptyStateDictLoadPlanner: planner_data nests, BYTE_IO values are
    unpickled) gives the same nested state from the resharded directory as from the source:
    Shard(0)/Shard(1)/Replicate/zero-size/0-dim tensors, optimizer-like nesting with list
    indices, ints, strings and lists as BYTE_IO items (zstd2: behind the zstd transform,
    carried compressed with its descriptor)."""
    if name not in dcp_dirs:
        pytest.skip(dcp_fixtures.skip_reason(name) or f"{name} not built")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    src = dcp_dirs[name]
    out = tmp_path / "r3"
    convert(src, out, "--to", "dcp", "--ranks", "3")
    dcp_to_torch_save(str(src), str(tmp_path / "a.pt"))
    dcp_to_torch_save(str(out), str(tmp_path / "b.pt"))
    a = torch.load(tmp_path / "a.pt", weights_only=False)
    b = torch.load(tmp_path / "b.pt", weights_only=False)
    fa, fb = flat(a), flat(b)
    assert list(a) == list(b) and sorted(fa) == sorted(fb)
    for k, v in fa.items():
        if isinstance(v, torch.Tensor):
            assert fb[k].dtype == v.dtype and tuple(fb[k].shape) == tuple(v.shape) and bits(fb[k]) == bits(v), k
        else:
            assert fb[k] == v, k
    if name == "zstd2":
        assert any(i.transform_descriptors for i in read_md(out).storage_data.values())


def test_shard_set_to_dcp(tmp_path):
    """A Hugging Face set written by huggingface_hub, resharded for 2 ranks."""
    from huggingface_hub import save_torch_state_dict
    want = {k: v for k, v in sample().items() if k not in ("c64", "f8", "tie.b")}
    want = {k: v.contiguous() for k, v in want.items()}
    (tmp_path / "hf").mkdir()
    save_torch_state_dict(want, tmp_path / "hf", max_shard_size=300)
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    out = tmp_path / "d2"
    convert(tmp_path / "hf", out, "--to", "dcp", "--ranks", "2")
    assert_same(dcp_loaded(out), want)
    assert_same(ckptool_reads_back(out, tmp_path), want)


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time")
@pytest.mark.skipif(SANITIZED, reason="ASan's shadow memory is not the program's")
def test_reshard_band_by_band_bounded(tmp_path):
    # One 128 MiB tensor, in 4 pieces (our own 4-rank DCP), rewritten for 8 ranks: bands of
    # 16 MiB, so the bound is 16 x 2 + 64 = 96 MiB, below the tensor's size.
    n = 4096
    t = torch.arange(n * 2 * n, dtype=torch.int32).reshape(2 * n, n)
    torch.save({"w": t, "b": torch.ones(3)}, tmp_path / "big.pt")
    convert(tmp_path / "big.pt", tmp_path / "d4", "--to", "dcp", "--ranks", "4")
    peak = peak_rss_mib(["convert", tmp_path / "d4", "-o", tmp_path / "d8", "--to", "dcp", "--ranks", "8"])
    assert peak <= 96, f"peak RSS {peak:.0f} MiB"
    md = read_md(tmp_path / "d8")
    assert len(md.state_dict_metadata["w"].chunks) == 8
    got = dcp_loaded(tmp_path / "d8")
    assert torch.equal(got["w"], t) and torch.equal(got["b"], torch.ones(3))


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time")
@pytest.mark.skipif(SANITIZED, reason="ASan's shadow memory is not the program's")
def test_band_of_transposed_view_windowed(tmp_path):
    # A 96 MiB transposed view cut in 4 bands of 24 MiB: each band's elements reach across
    # the whole storage (more than the band + 64 MiB), so the span is read in 64 MiB
    # windows rather than element by element or whole: bound 24 x 2 + 64 = 112 MiB.
    t = torch.arange(4096 * 6144, dtype=torch.int32).reshape(4096, 6144)
    torch.save({"tt": t.t()}, tmp_path / "t.pt")
    peak = peak_rss_mib(["convert", tmp_path / "t.pt", "-o", tmp_path / "d4", "--to", "dcp", "--ranks", "4"])
    assert peak <= 112, f"peak RSS {peak:.0f} MiB"
    got = dcp_loaded(tmp_path / "d4")
    assert torch.equal(got["tt"], t.t())
