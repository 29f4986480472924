"""`ckptool inspect --json` against the reference clients, fixture by fixture.

For every fixture written by real torch / lightning / safetensors (tests/py/fixtures.py),
the JSON must agree with what torch.load(weights_only=True) (torch.load(weights_only=False)
only for the trusted whole-module pickle), torch.jit.load or safetensors.safe_open report:
the set of tensors (first path only), and per tensor dtype, shape, stride, storage_offset,
nbytes, parameter, requires_grad and device; which tensors share a storage; the storage
table (checked against the file's own bytes); aliases; totals; globals; the state dict
found and its wrapper segments; the non-tensor entries. See reference.py.
"""

from __future__ import annotations

import os
import zipfile

import pytest
import torch

import fixtures as F
import reference as R
from conftest import inspect_json, run_ckptool

COMPARED = [n for n, fn in F.BUILDERS.items() if n != "malicious"]


def _inspect_or_refused(fx):
    """inspect --json; a fixture marked may_refuse may instead be refused with exit 3."""
    rc, out, err = run_ckptool("inspect", "--json", fx.path)
    if rc == 3 and fx.may_refuse:
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1 and str(fx.path) in lines[0], f"refusal message: {err!r}"
        assert out == "", "stdout must be empty on error"
        pytest.skip(f"ckptool refuses {fx.name} (allowed): {lines[0]}")
    assert rc == 0, f"{fx.name}: inspect --json {fx.path}: exit {rc}, stderr: {err.strip()[:2000]}"
    import json

    return json.loads(out)


@pytest.mark.parametrize("name", COMPARED)
def test_matches_reference(name, fixture_set):
    fx = fixture_set[name]
    doc = _inspect_or_refused(fx)
    m = R.compare(fx, doc)
    assert not m, m.report(f"{name} ({fx.path.name})")


@pytest.mark.parametrize("name", ["plain", "safetensors", "scripted", "legacy"])
def test_file_field_is_path_as_given(name, fixture_set):
    fx = fixture_set[name]
    rel = os.path.relpath(fx.path, fx.path.parent.parent)
    rc, out, err = run_ckptool("inspect", "--json", rel, cwd=fx.path.parent.parent)
    assert rc == 0, err
    import json

    assert json.loads(out)["file"] == rel


@pytest.mark.parametrize("name", ["plain", "safetensors", "scripted", "legacy", "lightning"])
def test_files_and_storage_file(name, fixture_set):
    """files[] lists the one file (path as given, format, size from the file system, its
    tensors) and every storage says it lives in file 0, inside that file's bytes."""
    fx = fixture_set[name]
    doc = inspect_json(fx.path)
    size = os.path.getsize(fx.path)
    assert doc["files"] == [{"path": str(fx.path), "format": doc["format"], "size": size,
                             "tensors": len(doc["tensors"])}]
    assert (doc["layout"], doc["index"], doc["warnings"]) == ("file", None, [])
    assert doc["file_size"] == size
    assert doc["storages"], f"{name}: no storages"
    for s in doc["storages"]:
        assert s["file"] == 0
        if s["offset"] is not None:
            assert s["offset"] + s["nbytes"] <= doc["files"][s["file"]]["size"]


def test_zip64_many_records(zip64_fixture):
    fx = zip64_fixture
    with zipfile.ZipFile(fx.path) as z:
        assert len(z.infolist()) > 65535  # the fixture really needs ZIP64
    doc = inspect_json(fx.path, timeout=120)
    assert len(doc["tensors"]) == 70_000
    m = R.compare(fx, doc)
    assert not m, m.report("zip64")


# ---- pointed checks: the same facts as above, stated plainly so a failure reads clearly


def test_lightning_compiled_keys_and_optimizer_state(fixture_set):
    fx = fixture_set["lightning"]
    doc = inspect_json(fx.path)
    ck = torch.load(fx.path, weights_only=True)
    assert doc["state_dict"] == ["state_dict"]
    assert all(k.startswith("model._orig_mod.") for k in ck["state_dict"])
    assert doc["wrappers"] == {"_orig_mod.": len(ck["state_dict"])}
    paths = {tuple(t["path"]) for t in doc["tensors"]}
    for k in ck["state_dict"]:
        assert ("state_dict", k) in paths
    # Adam state: integer keys in the path
    for idx, st in ck["optimizer_states"][0]["state"].items():
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                assert ("optimizer_states", 0, "state", idx, name) in paths
    entry_paths = {tuple(e["path"]) for e in doc["entries"]}
    for k in ("epoch", "global_step", "pytorch-lightning_version"):
        assert (k,) in entry_paths, f"entry {k} not listed"
    for k in ck["hyper_parameters"]:
        assert ("hyper_parameters", k) in entry_paths, f"hyper-parameter {k} not listed"


def test_compiled_and_ddp_wrappers(fixture_set):
    sd = torch.load(fixture_set["compiled"].path, weights_only=True)
    doc = inspect_json(fixture_set["compiled"].path)
    assert doc["wrappers"] == {"_orig_mod.": len(sd)}
    sd = torch.load(fixture_set["ddp_compiled"].path, weights_only=True)
    doc = inspect_json(fixture_set["ddp_compiled"].path)
    assert doc["wrappers"] == {"_orig_mod.": len(sd), "module.": len(sd)}


def test_torchscript_exported_method(fixture_set):
    fx = fixture_set["scripted"]
    doc = inspect_json(fx.path)
    m = torch.jit.load(str(fx.path))
    methods = {d["name"]: d["schema"] for d in doc["module"]["methods"]}
    assert "evaluation_step" in methods
    assert methods["evaluation_step"] == str(m.evaluation_step.schema)
    assert methods["forward"] == str(m.forward.schema)


def test_tied_weights_share_storage(fixture_set):
    doc = inspect_json(fixture_set["tied"].path)
    by = {tuple(t["path"]): t for t in doc["tensors"]}
    assert by[("embed.weight",)]["storage"] == by[("lm_head.weight",)]["storage"]
    doc = inspect_json(fixture_set["tied_params"].path)
    assert {"path": ["lm_head.weight"], "same_as": ["embed.weight"]} in doc["aliases"]


def test_whole_module_reports_its_classes(fixture_set):
    fx = fixture_set["whole_module"]
    with pytest.raises(Exception):
        torch.load(fx.path, weights_only=True)  # torch refuses it ...
    doc = inspect_json(fx.path)
    unsafe = set(doc["unsafe_globals"])  # ... and ckptool says why
    assert f"{F.WholeNet.__module__}.WholeNet" in unsafe
    assert "torch.nn.modules.linear.Linear" in unsafe


def test_every_dtype_present(fixture_set):
    doc = inspect_json(fixture_set["dtypes"].path)
    got = {t["dtype"] for t in doc["tensors"]}
    want = {n for n in F.DTYPE_NAMES if hasattr(torch, n)}
    assert want <= got, f"dtypes missing: {sorted(want - got)}"


def test_long_and_non_ascii_keys(fixture_set):
    doc = inspect_json(fixture_set["keys"].path)
    keys = {t["path"][0] for t in doc["tensors"]}
    for k in F.NON_ASCII_KEYS + [F.LONG_KEY, F.LONG_UTF8_KEY]:
        assert k in keys, f"key {k[:40]!r} (len {len(k)}) missing or mangled"


SAMPLES = {
    "compiled_lightning.ckpt": ("torch-zip", "weights_only", ["state_dict"]),
    "plain.pt": ("torch-zip", "weights_only", []),
    "model.safetensors": ("safetensors", "safetensors", []),
    "scripted.pt": ("torchscript", "torchscript", F.ANY),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_match_reference(name):
    from conftest import SOURCE_DIR

    fmt, load, sd = SAMPLES[name]
    fx = F.Fixture("sample:" + name, SOURCE_DIR / "samples" / name, fmt, load, state_dict=sd)
    assert fx.path.is_file(), f"{fx.path} missing: run samples/make_samples.py"
    doc = inspect_json(fx.path)
    m = R.compare(fx, doc)
    assert not m, m.report(name)
