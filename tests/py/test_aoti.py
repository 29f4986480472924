"""AOTInductor packages (docs/formats.md §15): inspect and verify from metadata alone, and
materialize --model PKG.pt2 --run, which swaps a checkpoint's tensors into the package's
constants and runs it. Packages are compiled by the real torch._inductor, twice per
session (aoti_fixtures.py); the references are LibTorch's own AOTI runner (through
torch._C._aoti) and eager PyTorch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import run_ckptool, TIME_SCALE

HERE = Path(__file__).resolve().parent
torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def aoti(tmp_path_factory) -> Path:
    # CKPTOOL_AOTI_FIXTURES: a directory to build the packages in once and reuse (for
    # running this file against several binaries).
    keep = os.environ.get("CKPTOOL_AOTI_FIXTURES")
    if keep and (Path(keep) / "expected.json").exists():
        return Path(keep)
    d = Path(keep) if keep else tmp_path_factory.mktemp("aoti")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(d / "inductor-cache"))
    p = subprocess.run([sys.executable, str(HERE / "aoti_fixtures.py"), str(d)], capture_output=True, env=env,
                       timeout=600 * TIME_SCALE)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    shutil.rmtree(d / "inductor-cache", ignore_errors=True)
    return d


def ck(tmp_path, *args, timeout=120, env=None):
    """ckptool with a private TMPDIR, which must be empty again afterwards: no extraction
    directory is left on any path."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    rc, out, err = run_ckptool(*args, timeout=timeout * TIME_SCALE, env={"TMPDIR": str(tmp), **(env or {})})
    assert list(tmp.iterdir()) == [], f"left behind: {list(tmp.iterdir())}"
    return rc, out, err


def inspect_model(tmp_path, pkg) -> dict:
    rc, out, err = ck(tmp_path, "inspect", pkg, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["format"] == "aoti-package"
    assert len(doc["models"]) == 1
    return doc


def loader_view(pkg: Path):
    """What LibTorch's AOTI loader and runner report of the package."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(pkg), "model", False, 1, -1)
    fqns = sorted(loader.get_constant_fqns())
    spec = loader.get_call_spec()
    meta = loader.get_metadata()
    return fqns, spec, meta


def runner_view(pkg: Path, tmp_path: Path):
    """The model library's own table: internal name -> (FQN, c10::ScalarType code)."""
    d = tmp_path / "extracted"
    with zipfile.ZipFile(pkg) as z:
        so = next(n for n in z.namelist() if n.endswith(".so"))
        z.extract(so, d)
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(d / so), 1)
    fqns = runner.get_constant_names_to_original_fqns()
    dtypes = runner.get_constant_names_to_dtypes()
    return {n: (fqns[n], dtypes[n]) for n in fqns}


@pytest.mark.parametrize("name,fqns", [("default", ["fc1.bias", "fc1.weight", "fc2.weight"]),
                                       ("keep", ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "shift"])])
def test_inspect_agrees_with_loader_and_state_dict(aoti, tmp_path, name, fqns):
    pkg = aoti / f"{name}.pt2"
    doc = inspect_model(tmp_path, pkg)
    m = doc["models"][0]
    # Metadata only: the library is never read.
    lib = [f for f in m["files"] if f["role"] == "model library"]
    assert len(lib) == 1 and doc["bytes_read"] < lib[0]["size"]
    loader_fqns, spec, meta = loader_view(pkg)
    assert sorted(c["fqn"] for c in m["constants"]) == loader_fqns == fqns
    assert json.loads(spec[0]) == m["in_spec"] and json.loads(spec[1]) == m["out_spec"]
    assert m["metadata"] == meta and m["device"] == meta["AOTI_DEVICE_KEY"] == "cpu"
    assert m["weights"] == "in_so"
    sd = torch.load(aoti / "sd_orig.pt")
    for c in m["constants"]:
        t = sd[c["fqn"]]
        assert c["dtype"] == str(t.dtype).removeprefix("torch.")
        assert c["shape"] == list(t.shape) and c["stride"] == list(t.stride())
        assert c["data_size"] == (t.numel() * t.element_size() + 63) // 64 * 64
        assert c["kind"] == ("buffer" if c["fqn"] == "shift" else "parameter")
    # The library's own table: the same internal names, FQNs and dtypes (6 is
    # c10::ScalarType::Float).
    assert runner_view(pkg, tmp_path) == {c["name"]: (c["fqn"], 6) for c in m["constants"]}
    assert all(c["dtype"] == "float32" for c in m["constants"])
    # The input check: float32 [batch, 8]; the batch bounds as Inductor generated them.
    (inp,) = m["inputs"]
    assert inp["dtype"] == "float32" and inp["device"] == "cpu"
    assert inp["dims"][1] == {"dim": 1, "size": 8}
    assert inp["dims"][0]["max"] == 1024 and inp["dims"][0]["symbol"].startswith("s")
    assert m["not_swappable"]["keeps_small_constants"] == (name == "keep")


def test_inspect_text_and_verify(aoti, tmp_path):
    rc, out, err = ck(tmp_path, "inspect", aoti / "default.pt2")
    assert rc == 0, err
    assert "AOTInductor package" in out and "fc1.weight" in out and "always_keep_tensor_constants=True" in out
    rc, out, err = ck(tmp_path, "verify", aoti / "default.pt2", "--json")
    assert rc == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] and doc["format"] == "aoti-package" and doc["tensors"] == 3 and doc["records_checked"] >= 10


def test_verify_under_a_launcher_is_refused_on_every_rank(aoti, tmp_path):
    """An AOTInductor package is one small file of metadata: `verify` under torchrun has
    nothing to divide, and says so on every rank with the usage code, never half-run."""
    from test_distributed import ranks
    got = ranks(2, "verify", aoti / "default.pt2", env={"TMPDIR": str(tmp_path)})
    for rank, (rc, out, err, _) in enumerate(got):
        assert rc == 2, f"rank {rank}: exit {rc}: {err}"
        assert "runs in one process, not under a launcher" in err, f"rank {rank}: {err}"
        assert err.count("\n") == 1, f"rank {rank}: not one line: {err!r}"
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def run_swap(tmp_path, ckpt, pkg, *extra, env=None):
    return ck(tmp_path, "materialize", ckpt, "--model", pkg, "--run", "forward", "--input", "3x8", "--json", *extra,
              env=env)


def checksum(rows) -> float:
    return float(sum(sum(r) for r in rows))


@pytest.mark.parametrize("pkg,ckpt,want", [("keep", "sd_new.pt", "new_all"),
                                           ("default", "sd_new_big.pt", "new_big_only"),
                                           ("keep", "sd_orig.pt", "orig")])
def test_swap_gives_eager_output(aoti, tmp_path, pkg, ckpt, want):
    expected = json.loads((aoti / "expected.json").read_text())
    rc, out, err = run_swap(tmp_path, aoti / ckpt, aoti / f"{pkg}.pt2")
    assert rc == 0, err
    doc = json.loads(out)
    (o,) = doc["run"]["outputs"]
    assert o["shape"] == [3, 4] and o["dtype"] == "float32"
    assert o["checksum"] == pytest.approx(checksum(expected[want]), rel=1e-5, abs=1e-5)
    # The other expectations differ, so the checksum tells the cases apart.
    for other, rows in expected.items():
        if other != want:
            assert abs(checksum(rows) - o["checksum"]) > 1e-3


def test_swap_solves_compiled_prefix(aoti, tmp_path):
    sd = torch.load(aoti / "sd_new.pt")
    p = tmp_path / "compiled.pt"
    torch.save({"_orig_mod." + k: v for k, v in sd.items()}, p)
    rc, out, err = run_swap(tmp_path, p, aoti / "keep.pt2")
    assert rc == 0, err
    doc = json.loads(out)
    assert "_orig_mod." in doc["key_edit"]
    expected = json.loads((aoti / "expected.json").read_text())
    assert doc["run"]["outputs"][0]["checksum"] == pytest.approx(checksum(expected["new_all"]), rel=1e-5, abs=1e-5)


def refused(tmp_path, ckpt, pkg, *words):
    # The LibTorch plugin named here does not exist: had ckptool tried to load it, the
    # answer would be exit 4 naming it. A refusal comes first, from ckptool's own reading.
    rc, out, err = run_swap(tmp_path, ckpt, pkg, env={"CKPTOOL_TORCH_PLUGIN": str(tmp_path / "no-plugin.so")})
    assert rc == 3, (rc, out, err)
    line = err.strip()
    assert "\n" not in line, line
    for w in words:
        assert w in line, line
    # Nothing extracted either (ck checks the TMPDIR is empty).
    assert "LibTorch" not in line and "no-plugin" not in line
    return line


def edited(tmp_path, aoti, name, **change):
    sd = torch.load(aoti / "sd_new_big.pt")
    sd.update(change)
    p = tmp_path / f"{name}.pt"
    torch.save(sd, p)
    return p


def test_refuses_wrong_dtype(aoti, tmp_path):
    p = edited(tmp_path, aoti, "f64", **{"fc1.weight": torch.ones(16, 8, dtype=torch.float64)})
    refused(tmp_path, p, aoti / "default.pt2", "fc1.weight", "float64", "dtype")


def test_refuses_wrong_shape(aoti, tmp_path):
    p = edited(tmp_path, aoti, "shape", **{"fc1.weight": torch.ones(8, 16)})
    refused(tmp_path, p, aoti / "default.pt2", "fc1.weight", "shape")


def test_refuses_unknown_name(aoti, tmp_path):
    p = edited(tmp_path, aoti, "unknown", **{"fc3.weight": torch.ones(4, 16)})
    refused(tmp_path, p, aoti / "default.pt2", "fc3.weight", "no constant")


def test_refuses_compiled_in_constant(aoti, tmp_path):
    line = refused(tmp_path, aoti / "sd_new.pt", aoti / "default.pt2", "fc2.bias", "shift", "literal",
                   "always_keep_tensor_constants=True")
    # The same checkpoint swaps into the package that kept them (test_swap_gives_eager_output).
    assert "2 keys" in line


def test_missing_constant_is_strict(aoti, tmp_path):
    sd = torch.load(aoti / "sd_new.pt")
    del sd["shift"]
    p = tmp_path / "noshift.pt"
    torch.save(sd, p)
    rc, out, err = run_swap(tmp_path, p, aoti / "keep.pt2")
    assert rc == 1 and "shift" in err and "--no-strict" in err
    rc, out, err = run_swap(tmp_path, p, aoti / "keep.pt2", "--no-strict")
    assert rc == 0, err
    assert json.loads(out)["filled_from_model"] == ["shift"]


def test_refuses_bad_input_before_loading(aoti, tmp_path):
    rc, out, err = ck(tmp_path, "materialize", aoti / "sd_new.pt", "--model", aoti / "keep.pt2", "--run", "forward",
                      "--input", "3x9")
    assert rc == 2 and "dimension 1" in err


def test_library_must_match_its_wrapper(aoti, tmp_path):
    """A package whose .so is another model's (keep's 5 constants under default's table
    of 3) is refused once the library reports its own table, before any swap."""
    src = zipfile.ZipFile(aoti / "default.pt2")
    keep = zipfile.ZipFile(aoti / "keep.pt2")
    keep_so = next(n for n in keep.namelist() if n.endswith(".so"))
    p = tmp_path / "mixed.pt2"
    with zipfile.ZipFile(p, "w") as z:
        for i in src.infolist():
            data = keep.read(keep_so) if i.filename.endswith(".so") else src.read(i)
            z.writestr(i.filename, data)
    rc, out, err = run_swap(tmp_path, aoti / "sd_new_big.pt", p)
    assert rc == 3 and "differ" in err, err


# Hostile wrapper.cpp text: each a one-line exit 3 naming the file and a byte offset,
# and a success twin (the same rewrite, unchanged text) that reads.
def rewrite(aoti, tmp_path, name, edit) -> Path:
    src = zipfile.ZipFile(aoti / "default.pt2")
    p = tmp_path / f"{name}.pt2"
    with zipfile.ZipFile(p, "w") as z:
        for i in src.infolist():
            data = src.read(i)
            if i.filename.endswith(".wrapper.cpp"):
                data = edit(data.decode()).encode()
            z.writestr(i.filename, data)
    return p


HOSTILE = {
    "index_out_of_range": (lambda t: t.replace("constants_info_[2].name", "constants_info_[99].name"), "out of range"),
    "huge_index": (lambda t: t.replace("constants_info_[2].name", "constants_info_[99999999999999999999999].name"),
                   "integer"),
    "many_dims": (lambda t: t.replace("constants_info_[0].shape = {16, 8};",
                                      "constants_info_[0].shape = {" + ", ".join(["1"] * 100) + "};"), "dimensions"),
    "unterminated": (lambda t: t.replace('constants_info_[0].name = "fc1_weight";',
                                         'constants_info_[0].name = "fc1_weight;'), "string literal"),
    "no_base": (lambda t: t.replace("AOTInductorModelBase(", "SomethingElse("), "AOTInductorModelBase"),
    "missing_field": (lambda t: t.replace("constants_info_[1].shape = {16};", ""), "no .shape"),
    "twice": (lambda t: t.replace("constants_info_[1].shape = {16};",
                                  "constants_info_[1].shape = {16};\n    constants_info_[1].shape = {16};"), "twice"),
    "bad_dtype": (lambda t: t.replace("constants_info_[0].dtype = cached_torch_dtype_float32;",
                                      "constants_info_[0].dtype = 42;"), "dtype"),
    "negative_size": (lambda t: t.replace("constants_info_[0].data_size = 512;",
                                          "constants_info_[0].data_size = -512;"), "negative"),
    "shape_stride_count": (lambda t: t.replace("constants_info_[0].stride = {8, 1};",
                                               "constants_info_[0].stride = {1};"), "strides"),
}


def test_rewritten_twin_reads(aoti, tmp_path):
    p = rewrite(aoti, tmp_path, "twin", lambda t: t)
    rc, out, err = ck(tmp_path, "inspect", p, "--json")
    assert rc == 0, err
    assert len(json.loads(out)["models"][0]["constants"]) == 3


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_wrapper(aoti, tmp_path, case):
    edit, word = HOSTILE[case]
    p = rewrite(aoti, tmp_path, case, edit)
    before = p.read_bytes()
    for verb in ("inspect", "verify"):
        rc, out, err = ck(tmp_path, verb, p)
        assert rc == 3, (verb, rc, out, err)
        line = err.strip()
        assert "\n" not in line and str(p.name) in line and "byte" in line and word in line, line
    assert p.read_bytes() == before


def test_verify_finds_blob_size_mismatch(aoti, tmp_path):
    """A package whose blob does not hold what its table reserves fails verify."""
    src = zipfile.ZipFile(aoti / "default.pt2")
    p = tmp_path / "blob.pt2"
    with zipfile.ZipFile(p, "w") as z:
        for i in src.infolist():
            data = src.read(i)
            if i.filename.endswith(".wrapper.cpp"):
                data = data.replace(b"std::move(cubin_dir),\n                           true)",
                                    b"std::move(cubin_dir),\n                           false)")
            z.writestr(i.filename, data)
        wrapper = next(n for n in src.namelist() if n.endswith(".wrapper.cpp"))
        z.writestr(wrapper.replace(".wrapper.cpp", ".wrapper_weights.blob"), b"\0" * 100)
    rc, out, err = ck(tmp_path, "verify", p, "--json")
    assert rc == 1, out + err
    doc = json.loads(out)
    assert any("832" in x and "100" in x for x in doc["problems"]), doc


def test_verify_finds_library_weights_mismatch(aoti, tmp_path):
    """The weights the library holds (its _binary_constants_bin symbols) against a table
    that reserves 64 bytes more for fc1.weight: verify fails; the twin passes."""
    p = rewrite(aoti, tmp_path, "libsize", lambda t: t.replace("constants_info_[0].data_size = 512;",
                                                                "constants_info_[0].data_size = 576;"))
    rc, out, err = ck(tmp_path, "verify", p, "--json")
    assert rc == 1, out + err
    assert any("832" in x and "896" in x for x in json.loads(out)["problems"]), out
    twin = rewrite(aoti, tmp_path, "libsize_twin", lambda t: t)
    rc, out, err = ck(tmp_path, "verify", twin, "--json")
    assert rc == 0 and json.loads(out)["notes"] == [n for n in json.loads(out)["notes"] if "not located" not in n], out
