"""materialize CKPT --model EP.pt2 -o OUT.pt2 (issue 16, docs/formats.md §14.9): a
torch.export archive filled with a checkpoint's weights, checked against real PyTorch. Every
archive is written by torch.export.save and every output read by torch.export.load; the
program's output on the filled archive must equal eager PyTorch's on a module holding the
checkpoint's weights.

  * a real export (dynamic batch, tied weights, a non-persistent buffer, a lifted constant,
    a float16 parameter) filled from torch.save of a differently initialized instance, and
    from a torch.compile'd instance's state dict (`_orig_mod.` keys): the output runs with
    the checkpoint's weights, ties stay one file, every other record is byte for byte the
    archive's, every record 64-byte aligned;
  * an archive exported on the meta device (empty weight files, all in one bogus group)
    filled: one file per tensor, a tie kept as one file, devices cpu;
  * archives of several programs: tests/py/test_pt2_fill_multi.py;
  * refusals with nothing written: a shape or dtype that differs (exit 3, naming the key),
    a missing key (exit 1, as for TorchScript; --no-strict keeps the archive's value),
    a meta archive's constant the checkpoint lacks (exit 3);
  * a hostile --model archive (test_pt2's corruptions): exit 3 naming its record, nothing
    written; its unchanged zipfile-written twin (another root, unaligned) is filled;
  * --run through LibTorch's nativert runtime: output checksums equal eager PyTorch's on
    the same inputs, with and without -o (a temporary copy, removed); CPU only (exit 3).
"""

from __future__ import annotations

import json
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import run_ckptool
from test_pt2 import CORRUPT, Mlp, Tied, Views, rewrite

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class MetaTied(nn.Module):
    """Tied weights and a transposed parameter, for the meta export."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.fc = Mlp().fc1
        self.wt = nn.Parameter(torch.randn(4, 3).t())

    def forward(self, idx):
        e = self.emb(idx).sum(1)
        return self.head(e), self.fc(e.repeat(1, 2)) @ torch.ones(16, 1, device=e.device), e @ self.wt.t()


def tied_inputs(batch):
    g = torch.Generator().manual_seed(batch)
    return torch.randint(0, 10, (batch, 5), generator=g), torch.randn(batch, 4, generator=g)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pt2fill")
    out: dict[str, Path] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        batch = torch.export.Dim("batch", min=2, max=64)
        ep = torch.export.export(Tied().eval(), tied_inputs(2), dynamic_shapes=({0: batch}, {0: batch}))
        out["ep"] = d / "ep.pt2"
        torch.export.save(ep, out["ep"])

        torch.manual_seed(1)
        other = Tied().eval()
        out["ckpt"] = d / "ckpt.pt"
        torch.save(other.state_dict(), out["ckpt"])
        out["compiled"] = d / "compiled.pt"
        torch.save(torch.compile(other).state_dict(), out["compiled"])
        torch.save(other, d / "module.pt")  # the reference module, reloaded per test
        out["module"] = d / "module.pt"

        with torch.device("meta"):
            skeleton = MetaTied()
        out["meta"] = d / "meta.pt2"
        torch.export.save(torch.export.export(skeleton, (torch.zeros(3, 5, dtype=torch.long, device="meta"),),
                                              dynamic_shapes=({0: torch.export.Dim("b", min=2, max=32)},)),
                          out["meta"])
        torch.manual_seed(2)
        out["meta_ckpt"] = d / "meta_ckpt.pt"
        torch.save(MetaTied().state_dict(), out["meta_ckpt"])

        out["views"] = d / "views.pt2"
        torch.export.save(torch.export.export(Views(), (torch.randn(2, 4),)), out["views"])
        v = Views()
        with torch.no_grad():
            big = torch.arange(100.0, 124.0).reshape(6, 4)
            v.a, v.b = big[1:3].clone(), big[3:5].clone() * 2
            v.wt.mul_(-1)
        out["views_ckpt"] = d / "views_ckpt.pt"
        torch.save(v.state_dict(), out["views_ckpt"])

        with torch.device("meta"):
            const_skeleton = Tied()
        out["meta_const"] = d / "meta_const.pt2"
        torch.export.save(torch.export.export(const_skeleton, tuple(t.to("meta") for t in tied_inputs(2))),
                          out["meta_const"])
    return out


def load_ep(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.load(str(path))


def fill(ckpt, model, out, *extra, rc=0):
    code, so, se = run_ckptool("materialize", ckpt, "--model", model, "-o", out, "--json", *extra)
    assert code == rc, f"exit {code}, expected {rc}\n{se[-3000:]}"
    return (json.loads(so) if rc == 0 else None), se


def weights_config(path):
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        return json.loads(z.read(f"{root}/data/weights/model_weights_config.json"))["config"]


def records(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        return {i.filename[len(root) + 1:]: z.read(i.filename) for i in z.infolist()}


def assert_aligned(path):
    with open(path, "rb") as f:
        raw = f.read()
    with zipfile.ZipFile(path) as z:
        for i in z.infolist():
            assert i.compress_type == zipfile.ZIP_STORED, i.filename
            n, m = struct.unpack("<HH", raw[i.header_offset + 26:i.header_offset + 30])
            start = i.header_offset + 30 + n + m
            assert start % 64 == 0, (i.filename, start)


@pytest.mark.parametrize("which", ["ckpt", "compiled"])
def test_fill_runs_with_checkpoint_weights(files, tmp_path, which):
    out = tmp_path / "out.pt2"
    r, _ = fill(files[which], files["ep"], out)
    if which == "compiled":
        assert r["filled"]["fc.weight"] == "_orig_mod.fc.weight", r
    assert r["missing"] == [] and r["unexpected"] == [], r
    assert sorted(r["from_model_file"]) == ["consttensor", "nonpersist"], r
    ref = torch.load(files["module"], weights_only=False)
    got = load_ep(out).module()
    for batch in (2, 3, 7):  # the batch dimension stays dynamic
        idx, x = tied_inputs(batch)
        want_y, want_z = ref(idx, x)
        y, z = got(idx, x)
        torch.testing.assert_close(y, want_y, rtol=0, atol=0)
        torch.testing.assert_close(z["logits"], want_z["logits"], rtol=0, atol=0)
    # The original archive's weights differ, so the program really runs the new ones.
    orig_y, _ = load_ep(files["ep"]).module()(*tied_inputs(3))
    assert not torch.equal(orig_y, ref(*tied_inputs(3))[0])
    # Ties stay one file; everything but the tensor files is the archive's byte for byte.
    cfg = weights_config(out)
    assert cfg["emb.weight"]["path_name"] == cfg["head.weight"]["path_name"]
    assert cfg == weights_config(files["ep"])
    before, after = records(files["ep"]), records(out)
    assert list(before) == list(after)
    for name, data in before.items():
        if not name.startswith("data/weights/weight_"):
            assert after[name] == data, name
    assert_aligned(out)


def test_views_of_one_file(files, tmp_path):
    """Two buffers slicing one file (with rows no entry covers) and a transposed parameter:
    each filled through its own view, the rest of the file kept, the slices still one storage."""
    out = tmp_path / "views_out.pt2"
    fill(files["views_ckpt"], files["views"], out)
    ckpt = torch.load(files["views_ckpt"])
    orig, got = load_ep(files["views"]).state_dict, load_ep(out).state_dict
    for k in ("a", "b", "wt"):
        torch.testing.assert_close(got[k], ckpt[k], rtol=0, atol=0)
    assert got["wt"].stride() == orig["wt"].stride()
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    whole = torch.frombuffer(bytearray(got["a"].untyped_storage()), dtype=torch.float32).reshape(6, 4)
    was = torch.frombuffer(bytearray(orig["a"].untyped_storage()), dtype=torch.float32).reshape(6, 4)
    torch.testing.assert_close(whole[0], was[0], rtol=0, atol=0)  # rows no entry views
    torch.testing.assert_close(whole[5], was[5], rtol=0, atol=0)
    x = torch.randn(2, 4)  # exported with a static batch of 2
    want = x @ ckpt["wt"] + ckpt["a"].sum() + ckpt["b"].sum()
    torch.testing.assert_close(load_ep(out).module()(x), want)


def test_untied_checkpoint_refused(files, tmp_path):
    """The archive ties emb.weight and head.weight (one file); a checkpoint giving them
    different values cannot be written as one file: refused, nothing written."""
    sd = torch.load(files["ckpt"])
    sd["head.weight"] = sd["head.weight"].clone() + 1
    ckpt = tmp_path / "untied.pt"
    torch.save(sd, ckpt)
    out = tmp_path / "o.pt2"
    _, err = fill(ckpt, files["ep"], out, rc=3)
    assert "head.weight" in err or "emb.weight" in err, err
    assert "tie" in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["untied.pt"]


def test_meta_export_filled(files, tmp_path):
    out = tmp_path / "meta_out.pt2"
    r, _ = fill(files["meta_ckpt"], files["meta"], out)
    assert r["meta_export"] is True and r["missing"] == [], r
    ref = MetaTied()
    ref.load_state_dict(torch.load(files["meta_ckpt"]))
    got = load_ep(out)
    for k, v in got.state_dict.items():
        assert v.device.type == "cpu", k
        torch.testing.assert_close(v, ref.state_dict()[k], rtol=0, atol=0)
    for batch in (2, 5):
        idx = torch.randint(0, 10, (batch, 5))
        for a, b in zip(got.module()(idx), ref(idx)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    cfg = weights_config(out)
    files_named = {e["path_name"] for e in cfg.values()}
    # One file per tensor (the meta group undone), the tie one file.
    assert cfg["emb.weight"]["path_name"] == cfg["head.weight"]["path_name"]
    assert len(files_named) == len(cfg) - 1
    assert all(e["tensor_meta"]["device"]["type"] == "cpu" for e in cfg.values())
    assert cfg["wt"]["tensor_meta"]["strides"] == weights_config(files["meta"])["wt"]["tensor_meta"]["strides"]
    assert b'"meta"' not in records(out)["models/model.json"]
    assert_aligned(out)


def test_meta_constant_without_data_refused(files, tmp_path):
    out = tmp_path / "o.pt2"
    _, err = fill(files["ckpt"], files["meta_const"], out, rc=3)
    assert "no data in the archive" in err and "nonpersist" in err, err
    assert not out.exists()


@pytest.mark.parametrize("case", ["past_record", "missing_file", "size_mismatch", "unknown_spec"])
def test_corrupt_archive_refused(files, tmp_path, case):
    """A hostile --model archive: exit 3 naming the archive's record, nothing written; its
    unchanged twin (rewritten by Python's zipfile: another root, no alignment) is filled."""
    twin, bad = tmp_path / "twin.pt2", tmp_path / "bad.pt2"
    rewrite(files["ep"], twin, lambda r, d: d)
    fill(files["ckpt"], twin, tmp_path / "twin_out.pt2")
    got = load_ep(tmp_path / "twin_out.pt2").state_dict
    torch.testing.assert_close(got["fc.weight"], torch.load(files["ckpt"])["fc.weight"], rtol=0, atol=0)
    edit, record, needle = CORRUPT[case]
    rewrite(files["ep"], bad, edit)
    out = tmp_path / "o.pt2"
    _, err = fill(files["ckpt"], bad, out, rc=3)
    assert "bad.pt2" in err and record in err and needle in err, err
    assert not out.exists()


def rewritten_ckpt(files, tmp_path, edit) -> Path:
    sd = torch.load(files["ckpt"])
    edit(sd)
    p = tmp_path / "edited.pt"
    torch.save(sd, p)
    return p


@pytest.mark.parametrize("case,rc,needle", [
    ("shape", 3, "fc.weight"),
    ("dtype", 3, "fc.weight"),
    ("missing", 1, "fc.bias"),
])
def test_refused_nothing_written(files, tmp_path, case, rc, needle):
    edits = {
        "shape": lambda sd: sd.__setitem__("fc.weight", torch.zeros(3, 5)),
        "dtype": lambda sd: sd.__setitem__("fc.weight", sd["fc.weight"].double()),
        "missing": lambda sd: sd.pop("fc.bias"),
    }
    ckpt = rewritten_ckpt(files, tmp_path, edits[case])
    out = tmp_path / "o.pt2"
    _, err = fill(ckpt, files["ep"], out, rc=rc)
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [ckpt]  # no temporary left either


def test_no_strict_keeps_archive_values(files, tmp_path):
    ckpt = rewritten_ckpt(files, tmp_path, lambda sd: sd.pop("fc.bias"))
    out = tmp_path / "o.pt2"
    r, _ = fill(ckpt, files["ep"], out, "--no-strict")
    assert r["missing"] == ["fc.bias"], r
    got = load_ep(out).state_dict
    torch.testing.assert_close(got["fc.bias"], load_ep(files["ep"]).state_dict["fc.bias"], rtol=0, atol=0)
    torch.testing.assert_close(got["fc.weight"], torch.load(ckpt)["fc.weight"], rtol=0, atol=0)


def run_inputs(batch):
    """What --run --input Bx5:int64 --input Bx4 passes: integers zero, floats from a CPU
    generator seeded 0 (as TorchScript's --run)."""
    g = torch.Generator().manual_seed(0)
    return torch.zeros(batch, 5, dtype=torch.long), torch.randn(batch, 4, generator=g)


@pytest.mark.parametrize("with_output", [False, True])
def test_run_through_nativert(files, tmp_path, with_output):
    """--run executes the filled archive in LibTorch's own ExportedProgram runtime (nativert);
    without -o it runs a temporary copy, removed afterwards."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    extra = ["-o", tmp_path / "o.pt2"] if with_output else []
    rc, so, se = run_ckptool("materialize", files["compiled"], "--model", files["ep"], "--run", "forward",
                             "--input", "3x5:int64", "--input", "3x4", "--json", *extra, env={"TMPDIR": str(tmp)})
    assert rc == 0, se[-3000:]
    r = json.loads(so)
    assert r["run"]["runtime"] == "nativert"
    ref = torch.load(files["module"], weights_only=False)
    y, z = ref(*run_inputs(3))
    outs = {o["path"]: o for o in r["run"]["outputs"]}
    assert set(outs) == {"0", "1.logits"}, outs
    assert outs["0"]["shape"] == [3, 3] and outs["1.logits"]["shape"] == [3, 5, 10]
    assert outs["0"]["checksum"] == pytest.approx(y.double().sum().item(), rel=1e-6, abs=1e-6)
    assert outs["1.logits"]["checksum"] == pytest.approx(z["logits"].double().sum().item(), rel=1e-6, abs=1e-6)
    assert list(tmp.iterdir()) == []
    assert (tmp_path / "o.pt2").exists() == with_output


def test_run_meta_export_through_nativert(files):
    """nativert places weights by the program's devices: the filled meta export runs because
    its program's meta devices were rewritten to cpu."""
    rc, so, se = run_ckptool("materialize", files["meta_ckpt"], "--model", files["meta"], "--run", "forward",
                             "--input", "3x5:int64", "--json")
    assert rc == 0, se[-3000:]
    ref = MetaTied()
    ref.load_state_dict(torch.load(files["meta_ckpt"]))
    want = [o.double().sum().item() for o in ref(torch.zeros(3, 5, dtype=torch.long))]
    got = [o["checksum"] for o in json.loads(so)["run"]["outputs"]]
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("flags", [["--dtype", "bfloat16"], ["--check-finite"],
                                   ["--run", "forward", "--input", "2x5:int64", "--input", "2x4", "--arg", "1"]])
def test_flags_that_do_not_apply(files, tmp_path, flags):
    out = tmp_path / "o.pt2"
    rc, _, err = run_ckptool("materialize", files["ckpt"], "--model", files["ep"], "-o", out, *flags)
    assert rc == 2 and "torch.export" in err, err
    assert not out.exists()


def test_run_needs_cpu(files, tmp_path):
    rc, _, err = run_ckptool("materialize", files["ckpt"], "--model", files["ep"], "--run", "forward",
                             "--input", "2x5:int64", "--input", "2x4", "--device", "cuda")
    assert rc == 3 and "CPU only" in err, err
