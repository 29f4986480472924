"""Issue 12 items 3 and 4: tensors that torch.save writes as something other than one strided
view. Sparse tensors (COO, CSR, CSC, BSR, BSC) are read as the tensors they are: inspect
shows one tensor with its layout, logical shape and parts, materialize builds the same
LibTorch tensor, `-o` writes it as torch.save does, rekey renames it. Strided and jagged
nested tensors are described by inspect and refused by materialize as unsupported. A DTensor
(single-process gloo group, world size 1 and 2) is its local tensor, with mesh and placements
shown. Any other tensor subclass is "unsupported: tensor subclass X", never "corrupt".
Every fixture is written by real torch.save and every result compared with torch.load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.tensor  # noqa: F401  (torch.load(weights_only=True) of DTensors needs it)

from conftest import inspect_json, run_ckptool

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


def _load(path: Path, weights_only: bool = True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=weights_only, map_location="cpu")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _dense() -> torch.Tensor:
    torch.manual_seed(0)
    d = torch.randn(4, 6)
    d[d.abs() < 0.8] = 0
    return d


def _sparse(layout: str) -> torch.Tensor:
    d = _dense()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "coo": lambda: d.to_sparse(),
            # Not coalesced: a repeated index, saved with is_coalesced False.
            "coo_uncoalesced": lambda: torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [2, 3, 2]]),
                                                               torch.tensor([1.0, 2.0, 3.0]), (2, 4)),
            # A hybrid tensor: two sparse dimensions, one dense.
            "coo_hybrid": lambda: torch.randn(3, 4, 2).to_sparse(2),
            "csr": lambda: d.to_sparse_csr(),
            "csc": lambda: d.to_sparse_csc(),
            "bsr": lambda: d.to_sparse_bsr((2, 3)),
            "bsc": lambda: d.to_sparse_bsc((2, 3)),
            "csr_int32": lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2], dtype=torch.int32),
                                                         torch.tensor([1, 0], dtype=torch.int32),
                                                         torch.tensor([5.0, 6.0], dtype=torch.float64), (2, 3)),
        }[layout]()


def _parts(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The components torch.save pickles, under the names inspect gives them."""
    if t.layout == torch.sparse_coo:
        return [("indices", t._indices()), ("values", t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [("crow_indices", t.crow_indices()), ("col_indices", t.col_indices()), ("values", t.values())]
    return [("ccol_indices", t.ccol_indices()), ("row_indices", t.row_indices()), ("values", t.values())]


SPARSE = ["coo", "coo_uncoalesced", "coo_hybrid", "csr", "csc", "bsr", "bsc", "csr_int32"]


@pytest.mark.parametrize("layout", SPARSE)
def test_sparse_inspect(tmp_path, layout):
    """One tensor with its layout, logical shape and parts, not its parts as loose tensors."""
    src = tmp_path / f"{layout}.pt"
    torch.save({"w": _sparse(layout), "b": torch.ones(3)}, src)
    ref = _load(src)["w"]
    j = inspect_json(src)
    assert [t["path"] for t in j["tensors"]] == [["w"], ["b"]], "sparse parts listed as tensors of their own"
    t = j["tensors"][0]
    assert t["layout"] == str(ref.layout).removeprefix("torch.")
    assert t["shape"] == list(ref.shape)
    assert t["dtype"] == str(ref.dtype).removeprefix("torch.")
    k = t["kind"]
    assert [(p["name"], p["dtype"], p["shape"]) for p in k["components"]] == [
        (n, str(p.dtype).removeprefix("torch."), list(p.shape)) for n, p in _parts(ref)]
    if ref.layout == torch.sparse_coo:
        assert k["coalesced"] == ref.is_coalesced()
    assert t["nbytes"] == sum(p.numel() * p.element_size() for _, p in _parts(ref))
    assert j["state_dict"] == []

    rc, out, err = run_ckptool("inspect", src)
    assert rc == 0, err
    line = next(l for l in out.splitlines() if l.strip().startswith("w "))
    assert "sparse " + str(ref.layout).removeprefix("torch.sparse_").upper() in line, line


@pytest.mark.parametrize("layout", SPARSE)
def test_sparse_materialize_writes_what_torch_save_does(tmp_path, layout):
    """materialize builds the LibTorch tensor of the same layout; -o writes it so that
    torch.load gives an equal tensor: layout, shape, coalesced flag, parts bit for bit."""
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"w": _sparse(layout)}, src)
    rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", out, src, timeout=60)
    assert rc == 0, err
    ref, got = _load(src)["w"], _load(out)["w"]
    assert got.layout == ref.layout and got.shape == ref.shape and got.dtype == ref.dtype
    if ref.layout == torch.sparse_coo:
        assert got.is_coalesced() == ref.is_coalesced()
    for (name, r), (_, g) in zip(_parts(ref), _parts(got)):
        assert _same_bits(g, r), name
    # The dry run on meta and the --dtype cast accept it too.
    rc, _, err = run_ckptool("materialize", "--device", "meta", src)
    assert rc == 0, err


def test_sparse_rekey_renames_and_copies(tmp_path):
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"enc.w": _sparse("csr"), "enc.b": torch.ones(2)}, src)
    rc, _, err = run_ckptool("rekey", "--add-prefix", "model.", src, "-o", out)
    assert rc == 0, err
    ref, got = _load(src), _load(out)
    assert list(got) == ["model.enc.w", "model.enc.b"]
    for (name, r), (_, g) in zip(_parts(ref["enc.w"]), _parts(got["model.enc.w"])):
        assert _same_bits(g, r), name


def test_sparse_with_bad_indices_is_corrupt(tmp_path):
    """torch.load builds it unchecked (invariant checks are off by default); LibTorch's
    kernels would then read out of bounds. materialize checks and refuses."""
    src = tmp_path / "bad.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = torch.sparse_coo_tensor(torch.tensor([[0, 7]]), torch.tensor([1.0, 2.0]), (3,), check_invariants=False)
    torch.save({"w": bad}, src)
    _load(src)  # torch.load accepts it
    rc, _, err = run_ckptool("materialize", "--device", "cpu", src)
    assert rc == 3, err
    assert "corrupt" in err and "sparse COO tensor w" in err, err


def _nested(layout) -> torch.Tensor:
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=layout)


def test_strided_nested_inspect_and_refusal(tmp_path):
    src = tmp_path / "nested.pt"
    torch.save({"w": _nested(torch.strided)}, src)
    ref = _load(src)["w"]
    j = inspect_json(src)
    assert [t["path"] for t in j["tensors"]] == [["w"]]
    t = j["tensors"][0]
    assert t["layout"] == "nested" and t["dtype"] == "float32"
    assert t["shape"] == [ref.size(0), -1, -1]
    parts = {p["name"]: p["shape"] for p in t["kind"]["components"]}
    assert parts == {"buffer": [ref.values().numel()], "sizes": list(ref._nested_tensor_size().shape),
                     "strides": list(ref._nested_tensor_strides().shape),
                     "storage_offsets": list(ref._nested_tensor_storage_offsets().shape)}
    rc, _, err = run_ckptool("materialize", "--device", "cpu", src)
    assert rc == 3 and "unsupported" in err and "nested tensor w" in err, err


def test_jagged_nested_inspect_and_refusal(tmp_path):
    src = tmp_path / "jagged.pt"
    torch.save({"w": _nested(torch.jagged)}, src)
    ref = _load(src)["w"]
    j = inspect_json(src)
    assert [t["path"] for t in j["tensors"]] == [["w"]]
    t = j["tensors"][0]
    assert t["layout"] == "jagged" and t["kind"]["ragged_dim"] == ref._ragged_idx
    assert j["unsafe_globals"] == []  # torch.load(weights_only=True) read it above
    assert t["shape"] == [ref.size(0), -1, ref.size(2)]
    parts = {p["name"]: p["shape"] for p in t["kind"]["components"]}
    assert parts["values"] == list(ref.values().shape) and parts["offsets"] == list(ref.offsets().shape)
    rc, _, err = run_ckptool("materialize", "--device", "cpu", src)
    assert rc == 3 and "unsupported" in err and "jagged nested tensor w" in err, err


DTENSOR_WRITER = textwrap.dedent("""
    import os, sys, socket, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate

    def run(rank, world, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=__import__("datetime").timedelta(seconds=60))
        names = ("dp",) if world == 1 else ("dp", "tp")
        mesh = init_device_mesh("cpu", (world,) if world == 1 else (world, 1), mesh_dim_names=names)
        full = torch.arange(24.0).reshape(6, 4)
        place = [Shard(0)] if world == 1 else [Shard(0), Replicate()]
        w = distribute_tensor(full, mesh, place)
        b = distribute_tensor(torch.ones(4), mesh, [Replicate()] * len(names))
        # An FSDP2 shard saved with plain torch.save: an nn.Parameter around a DTensor.
        p = torch.nn.Parameter(distribute_tensor(full * 2, mesh, place))
        torch.save({"w": w, "b": b, "p": p}, f"{out}.rank{rank}.pt")
        dist.destroy_process_group()

    if __name__ == "__main__":
        world, out = int(sys.argv[1]), sys.argv[2]
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        if world == 1:
            run(0, 1, port, out)
        else:
            torch.multiprocessing.spawn(run, args=(world, port, out), nprocs=world, join=True)
""")


@pytest.mark.parametrize("world", [1, 2])
def test_dtensor_is_its_local_tensor(tmp_path, world):
    script = tmp_path / "write_dtensor.py"
    script.write_text(DTENSOR_WRITER)
    stem = tmp_path / "dt"
    try:
        p = subprocess.run([sys.executable, str(script), str(world), str(stem)], capture_output=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("gloo process group did not come up within 180 s")
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    for rank in range(world):
        src = stem.parent / f"dt.rank{rank}.pt"
        ref = _load(src)
        j = inspect_json(src)
        rows = {t["path"][0]: t for t in j["tensors"]}
        assert list(rows) == ["w", "b", "p"]
        # torch.load(weights_only=True) read it above (torch.distributed.tensor imported).
        assert j["unsafe_globals"] == []
        for key, want_placements in (("w", ["Shard(dim=0)"] + (["Replicate()"] if world == 2 else [])),
                                     ("b", ["Replicate()"] * (1 if world == 1 else 2)),
                                     ("p", ["Shard(dim=0)"] + (["Replicate()"] if world == 2 else []))):
            t, r = rows[key], ref[key]
            local = r.to_local()
            assert t["shape"] == list(local.shape) and t["stride"] == list(local.stride())
            k = t["kind"]
            assert k["subclass"] == "torch.distributed.tensor.DTensor"
            assert k["global_shape"] == list(r.shape)
            assert k["mesh"] == {"shape": list(r.device_mesh.shape), "dim_names": list(r.device_mesh.mesh_dim_names)}
            assert k["placements"] == want_placements
        rc, out, err = run_ckptool("inspect", src)
        assert rc == 0, err
        assert "DTensor, local shard of [6, 4]" in out and "Shard(dim=0)" in out, out
        # materialize gives the local tensor; -o writes it as a plain tensor.
        dst = tmp_path / f"local{rank}.pt"
        rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", dst, src, timeout=60)
        assert rc == 0, err
        got = _load(dst)
        for key in ("w", "b", "p"):
            assert type(got[key]) is torch.Tensor
            assert got[key].requires_grad == ref[key].requires_grad, key
            assert _same_bits(got[key].detach(), ref[key].to_local().detach()), key
        rc, _, err = run_ckptool("verify", src)
        assert rc == 0, err


class _Wrapper(torch.Tensor):
    """A wrapper subclass as torch.save sees one: no storage of its own (data_ptr 0)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def _custom_rebuild(*args):  # named by the pickle; never called by ckptool
    return torch.zeros(1)


class _CustomReduce(torch.Tensor):
    def __reduce_ex__(self, proto):
        return (torch._tensor._rebuild_from_type_v2, (_custom_rebuild, type(self), (), {}))


@pytest.mark.parametrize("make, name", [
    (lambda: _Wrapper(torch.ones(2)), "_Wrapper"),
    (lambda: torch.ones(2).as_subclass(_CustomReduce), "_CustomReduce"),
])
def test_other_subclasses_are_unsupported_not_corrupt(tmp_path, make, name):
    src = tmp_path / "subclass.pt"
    torch.save({"w": make()}, src)
    for verb in ("inspect", "materialize"):
        args = (verb, src) if verb == "inspect" else (verb, "--device", "cpu", src)
        rc, _, err = run_ckptool(*args)
        assert rc == 3, (verb, err)
        assert "unsupported" in err and f"tensor subclass test_tensor_kinds.{name}" in err, (verb, err)


class _Reduces:
    """Pickles as the given call: the shape of a hostile or hand-made file, written by
    torch.save (tensors inside are real torch.save records)."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _long(*shape):
    return torch.zeros(*shape, dtype=torch.long)


@pytest.mark.parametrize("name, value, kind, message", [
    ("coo_size", _Reduces(torch._utils._rebuild_sparse_tensor,
                          (torch.sparse_coo, (_long(2, 3), torch.ones(3), torch.Size([4]), True))),
     "corrupt", "sparse COO size does not match"),
    ("coo_nnz", _Reduces(torch._utils._rebuild_sparse_tensor,
                         (torch.sparse_coo, (_long(1, 3), torch.ones(2), torch.Size([4]), True))),
     "corrupt", "one row per index column"),
    ("csr_float_indices", _Reduces(torch._utils._rebuild_sparse_tensor,
                                   (torch.sparse_csr, (torch.zeros(3), torch.zeros(2), torch.ones(2), torch.Size([2, 2])))),
     "corrupt", "int32 or both int64"),
    ("mkldnn_layout", _Reduces(torch._utils._rebuild_sparse_tensor, (torch._mkldnn, (torch.ones(1),))),
     "unsupported", "sparse layout torch._mkldnn"),
    ("nested_counts", _Reduces(torch._utils._rebuild_nested_tensor, (torch.ones(6), _long(2, 1), _long(2, 1), _long(3))),
     "corrupt", "disagree on the number of tensors"),
    ("bare_wrapper", _Reduces(torch._utils._rebuild_wrapper_subclass,
                              (torch.Tensor, torch.float32, (2,), (1,), 0, torch.strided, torch.device("cpu"), False)),
     "unsupported", "tensor subclass torch.Tensor saved without its data"),
])
def test_malformed_kinds_are_refused_in_one_line(tmp_path, name, value, kind, message):
    src = tmp_path / f"{name}.pt"
    torch.save({"w": value}, src)
    for args in (("inspect", src), ("materialize", "--device", "cpu", src), ("rekey", "--add-prefix", "x.", src, "-o", tmp_path / "o.pt")):
        rc, _, err = run_ckptool(*args)
        assert rc == 3, (args[0], err)
        assert err.count("\n") == 1 and f"ckptool: {kind}: " in err and message in err, (args[0], err)
