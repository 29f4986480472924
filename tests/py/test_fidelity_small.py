"""Issue 12 items 6 and 9: files real PyTorch writes that ckptool refused with the wrong words
or miscounted. Every fixture is written by the venv's torch and compared with torch.load.

6. legacy torch.save of uint16 / float8 / complex32 (untyped storages: torch.load cannot read
   them back) -> "unsupported" naming why, not "corrupt"; a torch.export .pt2 archive is named
   as such whatever its file name; verify refuses what it cannot read with exit 3, as every verb.
9. tensors with more than 64 dimensions are read (memory stays bounded by a budget); inspect's
   totals count only what --filter shows (JSON: "filtered_totals" beside "totals"); the state
   dict header and the totals count a tied key (two keys, one tensor object) the same way.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import hostile as H
from conftest import TIME_SCALE, inspect_json, run_ckptool

LIMIT = 10 * TIME_SCALE


def one_error(rc, out, err, kind: str, pattern: str, path: Path):
    assert rc == 3, f"exit {rc}; stdout {out[:300]!r}; stderr {err[:600]!r}"
    assert out == "", out[:300]
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ckptool: {kind}: {path}: "), lines[0]
    assert re.search(pattern, lines[0]), (pattern, lines[0])


def save(obj, path: Path, **kw) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, **kw)
    return path


# --------------------------------------------------------------------------- item 6

UNTYPED = {"uint16": torch.uint16, "float8_e4m3fn": torch.float8_e4m3fn, "complex32": torch.complex32}


@pytest.mark.parametrize("name", list(UNTYPED))
def test_legacy_untyped_storage_dtype_is_unsupported(name, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        w = torch.zeros(3, dtype=UNTYPED[name])
    path = save({"w": w, "b": torch.ones(2)}, tmp_path / f"{name}.pt", _use_new_zipfile_serialization=False)
    # What ckptool says must be what happens: PyTorch cannot read this file back.
    with pytest.raises(AttributeError, match="UntypedStorage"):
        torch.load(path, weights_only=False)
    pattern = (rf"legacy torch file with an untyped storage \(torch\.{name}\): legacy torch\.save writes it "
               r"but torch\.load cannot read it back")
    for verb in (["inspect"], ["inspect", "--json"], ["verify"], ["verify", "--json"]):
        rc, out, err = run_ckptool(*verb, path, timeout=LIMIT)
        one_error(rc, out, err, "unsupported", pattern, path)
    rc, out, err = run_ckptool("materialize", "--device", "cpu", path, "-o", tmp_path / "out.pt", timeout=60)
    one_error(rc, out, err, "unsupported", pattern, path)
    assert not (tmp_path / "out.pt").exists()


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def export_archive(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pt2")
    ep = torch.export.export(_Linear(), (torch.ones(1, 3),))
    path = d / "model.pt2"
    torch.export.save(ep, path)
    return path


@pytest.mark.parametrize("name", ["model.pt2", "weights.pt", "noext"])
def test_torch_export_archive_is_named_by_content(export_archive, name, tmp_path):
    path = tmp_path / name
    path.write_bytes(export_archive.read_bytes())
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        assert z.read(f"{root}/archive_format") == b"pt2"
    # Read as one whatever the name (formats.md §14.1), rekey included (§14.8).
    for verb in (["inspect", "--json"], ["verify", "--json"]):
        rc, out, err = run_ckptool(*verb, path, timeout=LIMIT)
        assert rc == 0 and json.loads(out)["format"] == "pt2", (verb, rc, out, err)
    rc, out, err = run_ckptool("rekey", "--dry-run", "--json", "--add-prefix", "x.", path, timeout=LIMIT)
    assert rc == 0, err
    assert json.loads(out)["mapping"] == [{"old": "fc.weight", "new": "x.fc.weight"}, {"old": "fc.bias", "new": "x.fc.bias"}]


def test_zip_without_data_pkl_or_pt2_marker_keeps_its_message(export_archive, tmp_path):
    """Only the archive_format record saying pt2 makes a torch.export archive."""
    path = tmp_path / "other.pt2"
    with zipfile.ZipFile(export_archive) as src, zipfile.ZipFile(path, "w") as dst:
        for n in src.namelist():
            dst.writestr(n, b"zip" if n.endswith("/archive_format") else src.read(n))
    rc, out, err = run_ckptool("inspect", path, timeout=LIMIT)
    one_error(rc, out, err, "unsupported", r"zip archive without data\.pkl", path)


@pytest.mark.parametrize("content", [b"hello world\n", bytes(range(200, 256)) * 4], ids=["text", "binary"])
def test_verify_refuses_an_unrecognized_format_with_exit_3(content, tmp_path):
    path = tmp_path / "not-a-checkpoint.pt"
    path.write_bytes(content)
    for verb in (["verify"], ["verify", "--json"], ["inspect"]):
        rc, out, err = run_ckptool(*verb, path, timeout=LIMIT)
        one_error(rc, out, err, "unsupported", r"byte 0: unrecognized format", path)


# --------------------------------------------------------------------------- item 9: dims


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("ndim", [65, 100])
def test_tensors_with_more_than_64_dims(ndim, legacy, tmp_path):
    shape = [2, 3] + [1] * (ndim - 3) + [2]
    t = torch.arange(12, dtype=torch.float32).reshape(shape)
    v = t.transpose(0, ndim - 1)  # a non-contiguous view, strides kept
    path = save({"t": t, "v": v}, tmp_path / "d.pt", _use_new_zipfile_serialization=not legacy)
    ref = torch.load(path, weights_only=True)
    doc = inspect_json(path, timeout=LIMIT)
    got = {t["path"][-1]: t for t in doc["tensors"]}
    for k in ("t", "v"):
        assert got[k]["shape"] == list(ref[k].shape)
        assert got[k]["stride"] == list(ref[k].stride())
    rc, out, err = run_ckptool("verify", path, timeout=LIMIT)
    assert rc == 0, err
    out_path = tmp_path / "out.pt"
    rc, out, err = run_ckptool("materialize", "--device", "cpu", path, "-o", out_path, timeout=60 * TIME_SCALE)
    assert rc == 0, err
    back = torch.load(out_path, weights_only=True)
    for k in ("t", "v"):
        assert back[k].shape == ref[k].shape and torch.equal(back[k], ref[k])


def test_dims_past_64_share_a_memory_budget(tmp_path):
    """One memoized 20,000-entry shape tuple used by 100 tensors would be 32 MB of shape and
    stride per copy read: past a 2^20-entry budget it is a limit, quickly, not an allocation."""
    base = save({"t": torch.zeros(1)}, tmp_path / "base.pt")
    st = H.FakeStorage("0", torch.FloatStorage, 1)
    dims = (1,) * 20_000
    pk = H.torch_pickle({f"t{i}": H.FakeTensor(st, 0, dims, dims) for i in range(100)})
    path = tmp_path / "wide.pt"
    path.write_bytes(H.replace_record(base.read_bytes(), "data.pkl", pk))
    assert path.stat().st_size < 200_000
    rc, out, err = run_ckptool("inspect", path, timeout=LIMIT)
    one_error(rc, out, err, "limit", r"more than 1048576 dimensions past the 64th", path)
    # Within the budget, the same tuple is read (the first 20 tensors).
    pk = H.torch_pickle({f"t{i}": H.FakeTensor(st, 0, dims, dims) for i in range(20)})
    path.write_bytes(H.replace_record(base.read_bytes(), "data.pkl", pk))
    doc = inspect_json(path, timeout=LIMIT)
    assert len(doc["tensors"]) == 20 and all(len(t["shape"]) == 20_000 for t in doc["tensors"])


# --------------------------------------------------------------------------- item 9: totals


@pytest.fixture(scope="module")
def filtered_file(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("filter")
    sd = {"enc.a": torch.zeros(2, 3), "enc.b": torch.zeros(4, dtype=torch.float16),
          "dec.c": torch.zeros(5, 5), "dec.d": torch.zeros(7, dtype=torch.int64)}
    return save(sd, d / "f.pt")


def _totals_line(text: str) -> str:
    return next(l for l in text.splitlines() if l.startswith("totals"))


def test_inspect_text_totals_count_only_filtered_tensors(filtered_file):
    ref = torch.load(filtered_file, weights_only=True)
    shown = {k: v for k, v in ref.items() if k.startswith("enc.")}
    numel = sum(v.numel() for v in shown.values())
    nbytes = sum(v.numel() * v.element_size() for v in shown.values())
    for extra in ([], ["--tree"]):
        rc, out, err = run_ckptool("inspect", "--filter", "enc.*", *extra, filtered_file, timeout=LIMIT)
        assert rc == 0, err
        line = _totals_line(out)
        assert line == f"totals of the tensors matching --filter: {len(shown)} tensors, {numel} elements, " \
                       f"{nbytes} B in 2 storages", line
        assert "(the file holds 4 tensors in 4 storages)" in out
        assert re.search(r"^\s+float16\s+1 tensors\s+8 B$", out, re.M) and not re.search(r"^\s+int64\s", out, re.M)
    rc, out, err = run_ckptool("inspect", filtered_file, timeout=LIMIT)
    all_numel = sum(v.numel() for v in ref.values())
    assert _totals_line(out).startswith(f"totals: 4 tensors, {all_numel} elements"), out


def test_inspect_json_filtered_totals_beside_totals(filtered_file):
    ref = torch.load(filtered_file, weights_only=True)
    whole = inspect_json(filtered_file, timeout=LIMIT)
    assert "filtered_totals" not in whole
    doc = inspect_json(filtered_file, "--filter", "dec.*", timeout=LIMIT)
    assert doc["totals"] == whole["totals"]  # unchanged meaning: the whole file
    shown = {k: v for k, v in ref.items() if k.startswith("dec.")}
    ft = doc["filtered_totals"]
    assert ft["tensors"] == len(doc["tensors"]) == len(shown)
    assert ft["numel"] == sum(v.numel() for v in shown.values())
    assert ft["nbytes"] == sum(v.numel() * v.element_size() for v in shown.values())
    assert ft["by_dtype"] == {"float32": {"tensors": 1, "numel": 25, "nbytes": 100},
                              "int64": {"tensors": 1, "numel": 7, "nbytes": 56}}


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "zip"])
def test_aliases_counted_the_same_in_header_and_totals(legacy, tmp_path):
    w = torch.arange(6.0)
    path = save({"w": w, "v": w[2:], "u": w, "x": torch.ones(2)}, tmp_path / "a.pt",
                _use_new_zipfile_serialization=not legacy)
    ref = torch.load(path, weights_only=True)
    assert ref["u"] is ref["w"]
    distinct = {id(t): t for t in ref.values()}
    numel = sum(t.numel() for t in distinct.values())
    rc, out, err = run_ckptool("inspect", path, timeout=LIMIT)
    assert rc == 0, err
    header = next(l for l in out.splitlines() if l.startswith("state dict:"))
    assert header == f"state dict: the root, {len(ref)} keys, {len(distinct)} tensors, {numel} elements", header
    assert _totals_line(out).startswith(f"totals: {len(distinct)} tensors, {numel} elements"), out
    assert f"{len(ref) - len(distinct)} more paths refer to tensors listed above" in out
    doc = inspect_json(path, timeout=LIMIT)
    assert doc["totals"]["tensors"] == len(doc["tensors"]) == len(distinct)
    assert doc["totals"]["numel"] == numel and len(doc["aliases"]) == len(ref) - len(distinct)


class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.b = torch.nn.Linear(2, 5)

    def forward(self, x):
        return self.b(self.a(x))


def test_inspect_torchscript_totals_match_the_filtered_listing(tmp_path):
    path = tmp_path / "two.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated in 2.11
        torch.jit.save(torch.jit.script(_Two()), path)
        params = dict(torch.jit.load(path).named_parameters())
    shown = {k: v for k, v in params.items() if k.startswith("b.")}
    rc, out, err = run_ckptool("inspect", "--filter", "b.*", path, timeout=60 * TIME_SCALE)
    assert rc == 0, err
    assert _totals_line(out).startswith(
        f"totals of the tensors matching --filter: {len(shown)} tensors, {sum(v.numel() for v in shown.values())} elements"), out


def test_dtype_views_of_one_storage_read_as_torch_reads_them(tmp_path):
    # fp8 packing code keeps raw bytes and typed views of them: torch.save pickles the uint8
    # tensor with a ByteStorage, the float8 and uint16 views with UntypedStorage references
    # to the same key, and torch.load gives each view its own dtype (formats.md §3.2).
    raw = torch.arange(24, dtype=torch.uint8)
    sd = {"raw": raw, "f8": raw.view(torch.float8_e4m3fn), "u16": raw[4:].view(torch.uint16)}
    src = tmp_path / "views.pt"
    torch.save(sd, src)
    want = torch.load(src, weights_only=True)
    doc = inspect_json(src)
    got = {t["path"][-1]: (t["dtype"], t["shape"], t["storage"]) for t in doc["tensors"]}
    assert got == {"raw": ("uint8", [24], "0"), "f8": ("float8_e4m3fn", [24], "0"), "u16": ("uint16", [10], "0")}
    # Every verb reads it: its values, bit for bit, through convert (safetensors, then torch).
    from safetensors.torch import load_file
    for to, name in [("safetensors", "views.safetensors"), ("torch", "views_out.pt")]:
        rc, _, err = run_ckptool("convert", src, "-o", tmp_path / name, "--to", to)
        assert rc == 0, err
        out = load_file(tmp_path / name) if to == "safetensors" else torch.load(tmp_path / name, weights_only=True)
        for k, v in want.items():
            assert out[k].dtype == v.dtype and torch.equal(out[k].view(torch.uint8), v.view(torch.uint8)), (to, k)
    rc, out, err = run_ckptool("diff", src, tmp_path / "views.safetensors")
    assert rc == 0, out + err
    # materialize -o writes them back as torch.save does: one storage, each view its dtype.
    rc, _, err = run_ckptool("materialize", src, "--device", "cpu", "-o", tmp_path / "views_mat.pt")
    assert rc == 0, err
    got = torch.load(tmp_path / "views_mat.pt", weights_only=True)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
        assert got[k].untyped_storage().data_ptr() == got["raw"].untyped_storage().data_ptr(), k
