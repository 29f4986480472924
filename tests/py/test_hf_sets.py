"""Hugging Face shard sets read as one checkpoint (issue 14): every verb over sets written
by the real writers (tests/py/hf_fixtures.py: transformers' save_pretrained,
huggingface_hub's save_torch_state_dict, safetensors and .bin), judged by the real readers
(safetensors.safe_open, torch.load(weights_only=True), transformers' from_pretrained).

* inspect --json: layout, index, files, and every tensor's name, dtype and shape as the
  real loaders see them; metadata only (io.bytes_read under 1% of a set of a few MB).
* The broken sets of test_hf_index.py (each with its success twin) through inspect:
  cross-check errors refuse the set (exit 3, naming the index), warnings are listed.
* verify: every shard's checks plus the cross-check.
* materialize: -o equals the saved model's state_dict() bit for bit; --dtype, --mmap,
  --device meta, --check-finite, --model key alignment; -o may not name a shard.
* rekey of a set: test_rekey_sets.py.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import run_ckptool
import hf_fixtures as F

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import test_hf_index as H  # noqa: E402  (the broken-set table and its mutations)
from safetensors import safe_open  # noqa: E402


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    return F.write_all(tmp_path_factory.mktemp("hfsets"))


def inspect(path, *extra):
    rc, out, err = run_ckptool("inspect", "--json", path, *extra)
    assert rc == 0, err
    return json.loads(out)


def shard_names(s):
    return sorted(set(json.loads(s.index.read_text())["weight_map"].values()))


def real_shard(path: Path):
    """{key: tensor} of one shard as the loaders read it, in the reader's key order."""
    if path.suffix == ".safetensors":
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    return torch.load(path, weights_only=True, mmap=True)


def real_set(s):
    """The set as transformers reads it: each shard in sorted order, merged."""
    out = {}
    for shard in shard_names(s):
        for k, v in real_shard(s.directory / shard).items():
            assert k not in out
            out[k] = v
    return out


def saved_state_dict(s):
    """The state dict the fixture's writer was given: the seeded model, rebuilt."""
    factory = F.SETS[s.name][0]
    model = factory()
    return model.state_dict() if s.writer == "save_pretrained" else F._plain_state_dict(model)


def dtype_name(t):
    return str(t.dtype).removeprefix("torch.")


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


# --- inspect --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(F.SETS))
def test_inspect_agrees_with_the_real_loaders(sets, name):
    s = sets[name]
    doc = inspect(s.directory)
    assert doc == inspect(s.index)  # the directory stands for its index
    assert doc["schema"] == 1
    assert doc["layout"] == "hf-shard-set"
    assert doc["file"] == doc["index"] == str(s.index)
    assert doc["format"] == ("safetensors" if s.serialization == "safetensors" else "torch-zip")
    assert doc["warnings"] == []
    assert doc["state_dict"] == []
    shards = shard_names(s)
    assert len(shards) >= 3
    real = {sh: real_shard(s.directory / sh) for sh in shards}
    assert [f["path"] for f in doc["files"]] == [str(s.directory / sh) for sh in shards]
    for f, sh in zip(doc["files"], shards):
        assert f["size"] == os.path.getsize(s.directory / sh)
        assert f["tensors"] == len(real[sh])
        assert f["format"] == doc["format"]
    assert doc["file_size"] == sum(f["size"] for f in doc["files"])

    # Every tensor, as the real readers give it, in shard order (sorted names).
    got = [(t["path"], t["dtype"], t["shape"]) for t in doc["tensors"]]
    want = {k: v for sh in shards for k, v in real[sh].items()}
    assert {p[0]: (d, sh) for p, d, sh in got} == {k: (dtype_name(v), list(v.shape)) for k, v in want.items()}
    assert all(len(p) == 1 for p, _, _ in got)
    file_of = [doc["storages"][[st["key"] for st in doc["storages"]].index(t["storage"])]["file"]
               if doc["format"] == "safetensors" else None for t in doc["tensors"]]
    if doc["format"] == "safetensors":
        assert file_of == sorted(file_of)
    for st in doc["storages"]:
        assert st["offset"] + st["nbytes"] <= doc["files"][st["file"]]["size"]
    assert doc["totals"]["tensors"] == len(want)
    assert doc["totals"]["nbytes"] == sum(v.nbytes for v in want.values())

    # And as transformers' from_pretrained loads it into the model class.
    if s.model_class:
        import transformers
        with contextlib.redirect_stderr(io.StringIO()):
            model = getattr(transformers, s.model_class).from_pretrained(s.directory)
        sd = model.state_dict()
        for p, d, sh in got:
            assert (dtype_name(sd[p[0]]), list(sd[p[0]].shape)) == (d, sh), p


def test_inspect_text_shows_the_set(sets):
    s = sets["gpt2_hub_bin"]
    rc, out, err = run_ckptool("inspect", s.directory)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{s.index}: torch-zip, ")
    shards = shard_names(s)
    assert lines[1] == f"layout: hf-shard-set, index {s.index}, {len(shards)} files"
    assert lines[2].split() == ["FILE", "FORMAT", "BYTES", "TENSORS"]
    for line, sh in zip(lines[3:], shards):
        assert line.split()[0] == str(s.directory / sh)
        assert int(line.split()[-1]) == len(real_shard(s.directory / sh))
    assert "state dict: the root," in out
    assert "unsafe globals: none" in out


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_inspect_reads_metadata_only(tmp_path, safe):
    """A set of 8 MB in 4+ shards is inspected reading less than 1% of its bytes."""
    from huggingface_hub import save_torch_state_dict
    torch.manual_seed(3)
    sd = {f"layers.{i}.weight": torch.randn(512, 512) for i in range(8)}
    save_torch_state_dict(sd, tmp_path, max_shard_size="2MB", safe_serialization=safe)
    doc = inspect(tmp_path)
    assert len(doc["files"]) >= 4
    assert doc["file_size"] > 8_000_000
    assert 0 < doc["io"]["bytes_read"] < doc["file_size"] / 100, doc["io"]


# --- broken sets ----------------------------------------------------------------------

@pytest.mark.parametrize("case", H.CASES, ids=[c[0] for c in H.CASES])
def test_broken_sets_through_inspect(sets, tmp_path, case):
    cid, name, mutate, expected = case
    d = tmp_path / "set"
    shutil.copytree(sets[name].directory, d)
    mutate(d)
    index = H._idx(d)
    rc, out, err = run_ckptool("inspect", "--json", d)
    if expected[0] == "refused":
        _, code, kind, pattern = expected
        assert rc == code and err.startswith(f"ckptool: {kind}: {index}: "), err
        assert re.search(pattern, err), err
        return
    findings = expected[1]
    if any(findings.values()):
        # An error of the cross-check: the set is refused in one line naming the index.
        assert rc == 3 and err.startswith(f"ckptool: corrupt: {index}: "), (rc, err)
        assert err.count("\n") == 1
        return
    assert rc == 0, err
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == len(findings), warnings
    if "no_total_size" in findings:
        assert any("transformers' from_pretrained refuses it" in w for w in warnings), warnings
    if "key_not_in_index" in findings:
        assert any("transformers and accelerate load it anyway" in w for w in warnings), warnings


def test_cross_check_errors_name_the_shards(sets, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets["gpt2_pretrained"].directory, d)
    shard = H._shard_of(d)
    H.key_missing(d)
    rc, out, err = run_ckptool("inspect", d)
    assert rc == 3
    assert err == (f"ckptool: corrupt: {H._idx(d)}: tensor '{H.K}' is in the index under shard '{shard}', "
                   "which does not hold it\n")


def test_a_corrupt_shard_is_named_with_its_byte(sets, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets["gpt2_pretrained"].directory, d)
    shard = d / shard_names(sets["gpt2_pretrained"])[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-3])  # truncated: the last tensor's bytes run past the end
    rc, out, err = run_ckptool("inspect", d)
    assert rc == 3 and err.startswith(f"ckptool: corrupt: {shard}: "), err


def _replace_shard(sets, tmp_path, name, content):
    """A copy of set `name` whose second shard holds `content` (bytes, or a function of the
    shard's path that writes it); the shard's path."""
    d = tmp_path / "set"
    shutil.copytree(sets[name].directory, d)
    shard = d / shard_names(sets[name])[1]
    if callable(content):
        content(shard)
    else:
        shard.write_bytes(content)
    return d, shard


def _torchscript(path):
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)


def _other_shard(sets, name):
    return lambda path: shutil.copyfile(sets[name].directory / shard_names(sets[name])[0], path)


def _legacy(path):
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)


# What stands where the index promises a shard. The loaders fail on all but the last (a
# legacy stream torch.load reads, which no shard writer writes): the set is corrupt, and
# verify says FAILED (exit 1) naming the shard; ckptool refuses only the last as unsupported.
BROKEN_SHARDS = {
    "junk": ("gpt2_pretrained", bytes(range(99, 256)) * 8, "corrupt", "it is no checkpoint: unrecognized format"),
    "lfs_pointer": ("gpt2_pretrained", b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 1234\n",
                    "corrupt", "a Git LFS pointer file"),
    "html_page": ("llama_hub_bin", b"\n<!DOCTYPE html><html><body>Access denied</body></html>\n", "corrupt",
                  "an HTML page, not a checkpoint"),
    "zip_named_safetensors": ("gpt2_pretrained", _other_shard, "corrupt",
                              "a torch-zip file under a name the loaders read as safetensors"),
    "safetensors_named_bin": ("llama_hub_bin", _other_shard, "corrupt",
                              "a safetensors file under a name the loaders read as a torch.save file"),
    "torchscript": ("llama_hub_bin", _torchscript, "corrupt", "a TorchScript archive as a shard"),
    "legacy_stream": ("llama_hub_bin", _legacy, "unsupported", "a legacy (pre-1.6) torch.save stream"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_SHARDS))
def test_what_stands_in_for_a_shard(sets, tmp_path, case):
    name, content, kind, says = BROKEN_SHARDS[case]
    if content is _other_shard:
        content = _other_shard(sets, "llama_hub_bin" if name == "gpt2_pretrained" else "gpt2_pretrained")
    d, shard = _replace_shard(sets, tmp_path, name, content)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    # The loaders' own reader of the shard, judging whether the set is broken.
    try:
        loaded = (torch.load(shard, weights_only=True) if shard.suffix == ".bin" else real_shard(shard))
    except Exception:
        loaded = None
    assert isinstance(loaded, dict) == (kind == "unsupported"), (case, type(loaded))
    rc, out, err = run_ckptool("inspect", d)
    assert rc == 3 and out == "" and err.startswith(f"ckptool: {kind}: {shard}: ") and says in err, err
    assert err.count("\n") == 1
    rc, out, err = run_ckptool("verify", "--json", d)
    if kind == "unsupported":
        assert rc == 3 and out == "" and err.startswith(f"ckptool: unsupported: {shard}: "), (out, err)
    else:
        assert rc == 1 and err == "", (out, err)
        doc = json.loads(out)
        assert not doc["ok"] and len(doc["problems"]) == 1, doc
        assert doc["problems"][0].startswith(f"corrupt: {shard}: ") and says in doc["problems"][0], doc
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # nothing touched


# --- verify ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2_pretrained", "llama_hub_bin"])
def test_verify_every_shard(sets, name):
    s = sets[name]
    rc, out, err = run_ckptool("verify", "--json", s.directory)
    assert rc == 0, (out, err)
    doc = json.loads(out)
    n = len(shard_names(s))
    assert doc["ok"] and doc["layout"] == "hf-shard-set" and doc["files"] == n
    assert doc["tensors"] == len(real_set(s))
    if s.serialization == "bin":
        assert doc["records_checked"] >= n * 3  # data.pkl, byteorder, version, data/ in each
    rc, out, err = run_ckptool("verify", s.directory)
    assert rc == 0 and out.startswith(f"{s.index}: OK ({doc['format']}, hf-shard-set of {n} files, "), out


def test_verify_finds_a_crc_mismatch_in_a_shard(sets, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets["gpt2_hub_bin"].directory, d)
    shard = d / shard_names(sets["gpt2_hub_bin"])[2]
    import zipfile
    with zipfile.ZipFile(shard) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    data = bytearray(shard.read_bytes())
    # The local header's own name and extra lengths (torch pads its extra field).
    name_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    at = info.header_offset + 30 + name_len + extra_len
    data[at + info.compress_size // 2] ^= 0x55
    shard.write_bytes(bytes(data))
    rc, out, err = run_ckptool("verify", d)
    assert rc == 1, (out, err)
    assert f"CRC-32 mismatch in {info.filename} of {shard}" in out, out


def test_verify_reports_cross_check_errors_and_warnings(sets, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets["gpt2_pretrained"].directory, d)
    H.orphan(d)
    rc, out, err = run_ckptool("verify", "--json", d)
    assert rc == 0, (out, err)
    assert any("no tensor points to it" in n for n in json.loads(out)["notes"])
    H.key_twice(d)
    rc, out, err = run_ckptool("verify", d)
    assert rc == 1 and "  problem: corrupt: " in out and "a loader may take either copy" in out, out


# --- materialize ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(F.SETS))
def test_materialize_equals_the_saved_state_dict(sets, tmp_path, name):
    s = sets[name]
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", s.directory, "--device", "cpu", "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    saved = saved_state_dict(s)
    real = real_set(s)
    # Keys in shard order (sorted names), as transformers reads them.
    assert set(got) == set(real)
    shard_of = {k: sh for sh in shard_names(s) for k in real_shard(s.directory / sh)}
    order = [shard_names(s).index(shard_of[k]) for k in got]
    assert order == sorted(order)
    for k, v in got.items():
        assert same_bits(v, saved[k]), k
        assert same_bits(v, real[k]), k
    # What the set lacks is only what save_pretrained drops: weights tied to another.
    assert set(saved) - set(got) == ({"lm_head.weight"} if name == "gpt2_pretrained" else set())


def test_materialize_dtype_mmap_meta_and_finite(sets, tmp_path):
    s = sets["llama_pretrained"]
    real = real_set(s)
    out = tmp_path / "bf16.pt"
    rc, _, err = run_ckptool("materialize", s.index, "--device", "cpu", "--dtype", "bfloat16", "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    for k, v in real.items():
        assert same_bits(got[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k
    mapped = tmp_path / "mmap.pt"
    rc, _, err = run_ckptool("materialize", s.directory, "--device", "cpu", "--mmap", "-o", mapped)
    assert rc == 0, err
    got = torch.load(mapped, weights_only=True)
    assert all(same_bits(got[k], v) for k, v in real.items()) and len(got) == len(real)
    rc, stdout, err = run_ckptool("materialize", s.directory, "--device", "meta", "--json")
    assert rc == 0, err
    assert json.loads(stdout)["tensors"] == len(real)
    rc, stdout, err = run_ckptool("materialize", s.directory, "--device", "cpu", "--check-finite")
    assert rc == 0 and "all floating tensors are finite" in stdout, (stdout, err)


def test_materialize_check_finite_finds_a_nan_in_a_shard(tmp_path):
    from huggingface_hub import save_torch_state_dict
    sd = {f"w{i}": torch.ones(64, 64) for i in range(4)}
    sd["w3"][5, 7] = float("nan")
    save_torch_state_dict(sd, tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) >= 3
    rc, out, err = run_ckptool("materialize", tmp_path, "--device", "cpu", "--check-finite")
    assert rc == 1 and "w3" in out, (out, err)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(48, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class _Compiled(torch.nn.Module):
    """The model as torch.compile names it: its weights under `_orig_mod.`."""

    def __init__(self):
        super().__init__()
        self._orig_mod = _Net()

    def forward(self, x):
        return self._orig_mod(x)


def test_materialize_into_a_model_aligns_the_keys(tmp_path):
    from huggingface_hub import save_torch_state_dict
    torch.manual_seed(5)
    net = _Net().eval()
    d = tmp_path / "set"
    d.mkdir()
    save_torch_state_dict(net.state_dict(), d, max_shard_size="10KB")
    assert len(list(d.glob("*.safetensors"))) >= 3
    scripted = tmp_path / "compiled.pt"
    torch.jit.script(_Compiled().eval()).save(str(scripted))
    out = tmp_path / "filled.pt"
    rc, stdout, err = run_ckptool("materialize", d, "--model", scripted, "--device", "cpu", "--json",
                                  "--run", "forward", "--input", "2x48", "-o", out)
    assert rc == 0, err
    report = json.loads(stdout)
    assert "_orig_mod." in report["key_edit"] and not report["missing"] and not report["unexpected"]
    filled = torch.jit.load(str(out))
    for k, v in net.state_dict().items():
        assert same_bits(filled.state_dict()["_orig_mod." + k], v), k
    x = torch.randn(2, 48)
    assert torch.equal(filled(x), net(x))


def test_materialize_output_may_not_be_a_shard(sets, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets["gpt2_hub_st"].directory, d)
    shard = d / shard_names(sets["gpt2_hub_st"])[1]
    before = shard.read_bytes()
    rc, out, err = run_ckptool("materialize", d, "--device", "cpu", "-o", shard)
    assert rc == 2 and err.startswith(f"ckptool: usage: {shard}: output '{shard}' is the input '{shard}'"), err
    assert shard.read_bytes() == before
