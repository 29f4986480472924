"""Hugging Face shard-set indexes (issue 14, first part): ckpt::hf::parse_index and the
cross-check, through tests/tools/hf_index_dump, against sets written by the real writers
(tests/py/hf_fixtures.py) and read by the real readers (json, safetensors.safe_open,
torch.load, transformers, huggingface_hub, accelerate).

* The index as Python's json reads it: weight_map in file order, shards as the loaders
  list them (sorted(set(values))), metadata.
* The index against the shards' real contents: every key where the index says, nothing
  else, total_size = what huggingface_hub counts.
* A table of broken sets, each beside a success twin that differs only in the point
  the refusal is about; and the loaders' own behaviour on each break, which is why a
  break is an error or only a warning (docs/formats.md §10.3).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from conftest import SOURCE_DIR
import hf_fixtures as F

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", SOURCE_DIR / "build"))
DUMP = BUILD_DIR / "tests" / "hf_index_dump"
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def dump(index, check=True):
    args = [str(DUMP), str(index)] + (["--check"] if check else [])
    p = subprocess.run(args, capture_output=True, timeout=60)
    out = json.loads(p.stdout)
    assert (p.returncode == 0) == out["ok"], p.stdout
    return p.returncode, out


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    return F.write_all(tmp_path_factory.mktemp("hf"))


def real_contents(directory: Path, shard: str):
    """Keys and total_size bytes of one shard, by the real readers."""
    path = directory / shard
    if shard.endswith(".safetensors"):
        with safe_open(path, "pt") as f:
            keys = list(f.keys())
            nbytes = sum(f.get_tensor(k).nbytes for k in keys)
        return keys, nbytes
    sd = torch.load(path, weights_only=True, mmap=True)
    storages = {}
    for t in sd.values():
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return list(sd), sum(storages.values())


# --- the index as Python reads it, the shards as the real readers read them -------------

@pytest.mark.parametrize("name", list(F.SETS))
def test_index_as_python_reads_it(sets, name):
    s = sets[name]
    want = json.loads(s.index.read_text())
    rc, got = dump(s.index, check=False)
    assert rc == 0
    assert got["weight_map"] == [list(kv) for kv in want["weight_map"].items()]  # file order kept
    assert got["shards"] == sorted(set(want["weight_map"].values()))
    assert len(got["shards"]) >= 3
    assert got["total_size"] == want["metadata"]["total_size"]
    assert got["total_parameters"] == want["metadata"].get("total_parameters")
    assert got["has_metadata"] and got["notes"] == []


@pytest.mark.parametrize("name", list(F.SETS))
def test_index_agrees_with_shards(sets, name):
    s = sets[name]
    want = json.loads(s.index.read_text())
    held, total = {}, 0
    for shard in sorted(set(want["weight_map"].values())):
        keys, nbytes = real_contents(s.directory, shard)
        total += nbytes
        for k in keys:
            held.setdefault(k, []).append(shard)
    # The real set is consistent by the real readers...
    assert {k: [v] for k, v in want["weight_map"].items()} == held
    assert total == want["metadata"]["total_size"]
    # ...and our cross-check, reading the shards with ckptool's readers, finds nothing.
    rc, got = dump(s.index)
    assert rc == 0 and got["findings"] == [], got["findings"]


def test_transformers5_writes_safetensors_only(tmp_path):
    """Why the .bin sets come from huggingface_hub: transformers 5.x ignores
    safe_serialization=False (docs/formats.md §10.1)."""
    m = F.gpt2_model()
    with contextlib.redirect_stderr(io.StringIO()):
        m.save_pretrained(tmp_path, max_shard_size=F.SHARD_SIZE, safe_serialization=False)
    assert not list(tmp_path.glob("*.bin"))
    assert (tmp_path / "model.safetensors.index.json").exists()


def test_pretrained_sets_load(sets):
    import transformers
    for s in sets.values():
        if not s.model_class:
            continue
        cls = getattr(transformers, s.model_class)
        with contextlib.redirect_stderr(io.StringIO()):
            _, info = cls.from_pretrained(s.directory, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (s.name, info)


# --- broken sets, each with a success twin --------------------------------------------

K = "transformer.h.0.attn.c_attn.weight"  # random-initialised: a copy or a fresh init shows


def _idx(d):
    return next(d.glob("*.index.json"))


def _read(d):
    return json.loads(_idx(d).read_text())


def _write(d, j):
    _idx(d).write_text(json.dumps(j, indent=2))


def _shard_of(d, key=K):
    return _read(d)["weight_map"][key]


def _other_shard(d, key=K, after=True):
    own = _shard_of(d, key)
    others = sorted(set(_read(d)["weight_map"].values()) - {own})
    return others[-1] if after else others[0]


def _load(path):
    return load_file(path) if str(path).endswith(".safetensors") else torch.load(path, weights_only=True)


def _save(sd, path):
    if str(path).endswith(".safetensors"):
        save_file(sd, path, metadata={"format": "pt"})
    else:
        torch.save(sd, path)


def _edit_shard(d, shard, fn):
    sd = _load(d / shard)
    fn(sd)
    _save(sd, d / shard)


def _total(d, delta):
    j = _read(d)
    j["metadata"]["total_size"] += delta
    _write(d, j)


def _nbytes(d, key=K):
    return _load(d / _shard_of(d, key))[key].nbytes


def missing_shard(d):
    os.remove(d / _shard_of(d))


def missing_shard_twin(d):  # a file the index never names may go
    shutil.copy(d / _shard_of(d), d / "model-00099-of-00099.safetensors")
    os.remove(d / "model-00099-of-00099.safetensors")


def key_missing(d):
    _edit_shard(d, _shard_of(d), lambda sd: sd.pop(K))


def key_missing_twin(d):  # removed from its shard and from the index
    n = _nbytes(d)
    shard = _shard_of(d)
    j = _read(d)
    del j["weight_map"][K]
    j["metadata"]["total_size"] -= n
    _write(d, j)
    _edit_shard(d, shard, lambda sd: sd.pop(K))


def key_twice(d):
    v = _load(d / _shard_of(d))[K]
    _edit_shard(d, _other_shard(d), lambda sd: sd.__setitem__(K, torch.full_like(v, 7.0)))


def key_twice_twin(d):  # moved to the other shard, index updated
    v = _load(d / _shard_of(d))[K]
    _edit_shard(d, _shard_of(d), lambda sd: sd.pop(K))
    other = _other_shard(d)
    _edit_shard(d, other, lambda sd: sd.__setitem__(K, v))
    j = _read(d)
    j["weight_map"][K] = other
    _write(d, j)


def key_unindexed(d):
    j = _read(d)
    del j["weight_map"][K]
    _write(d, j)


def orphan(d):
    shutil.copy(d / _shard_of(d), d / "model-00008-of-00007.safetensors")


def orphan_twin(d):  # the same copy under a name no loader would take for a shard
    shutil.copy(d / _shard_of(d), d / "model-00008-of-00007.safetensors.bak")


def total_size_wrong(d):
    _total(d, 1)


def no_metadata(d):
    j = _read(d)
    del j["metadata"]
    _write(d, j)


def _rename_shard(d, new_name):
    old = _shard_of(d)
    target = d / new_name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(d / old, target)
    j = _read(d)
    j["weight_map"] = {k: (new_name if v == old else v) for k, v in j["weight_map"].items()}
    _write(d, j)
    os.remove(d / old)


def escaping(d):
    _rename_shard(d, "../outside/" + _shard_of(d))


def escaping_twin(d):
    _rename_shard(d, "sub/" + _shard_of(d))


def absolute(d):
    _rename_shard(d, str((d / "abs" / _shard_of(d)).resolve()))


def malformed(d):
    t = _idx(d).read_text()
    _idx(d).write_text(t[: len(t) // 2])


def malformed_twin(d):  # the same document on one line, keys unsorted
    j = _read(d)
    _idx(d).write_text(json.dumps({"weight_map": dict(reversed(list(j["weight_map"].items()))),
                                   "metadata": j["metadata"]}))


def dup_json_key(d):
    t = _idx(d).read_text()
    _idx(d).write_text(t.replace('"weight_map": {', '"weight_map": {\n    "%s": "%s",' % (K, _other_shard(d)), 1))


def dup_json_key_twin(d):  # the same key in two different objects
    j = _read(d)
    j["metadata"][K] = _other_shard(d)
    _write(d, j)


def value_not_string(d):
    j = _read(d)
    j["weight_map"][K] = 3
    _write(d, j)


def no_weight_map(d):
    j = _read(d)
    j["weightmap"] = j.pop("weight_map")
    _write(d, j)


def unknown_fields(d):
    j = _read(d)
    j["format"] = {"weight_map": 1}
    j["metadata"]["extra"] = [1, None]
    _write(d, j)


def noop(d):
    pass


# (id, set, mutate, expected): expected is ("refused", exit code, kind, message regex) or
# ("findings", {kind: error?}) for an index that reads, {} meaning a clean set.
CASES = [
    ("missing-shard", "gpt2_pretrained", missing_shard, ("findings", {"missing_shard": True})),
    ("missing-shard-twin", "gpt2_pretrained", missing_shard_twin, ("findings", {})),
    ("key-missing-from-shard", "gpt2_pretrained", key_missing,
     ("findings", {"key_missing_from_shard": True, "total_size_mismatch": False})),
    ("key-missing-from-shard-twin", "gpt2_pretrained", key_missing_twin, ("findings", {})),
    ("key-missing-from-bin-shard", "gpt2_hub_bin", key_missing,
     ("findings", {"key_missing_from_shard": True, "total_size_mismatch": False})),
    ("key-missing-from-bin-shard-twin", "gpt2_hub_bin", key_missing_twin, ("findings", {})),
    ("key-in-two-shards", "gpt2_pretrained", key_twice,
     ("findings", {"key_in_two_shards": True, "total_size_mismatch": False})),
    ("key-in-two-shards-twin", "gpt2_pretrained", key_twice_twin, ("findings", {})),
    ("key-in-two-bin-shards", "gpt2_hub_bin", key_twice,
     ("findings", {"key_in_two_shards": True, "total_size_mismatch": False})),
    ("key-not-in-index", "gpt2_pretrained", key_unindexed, ("findings", {"key_not_in_index": False})),
    ("key-not-in-index-twin", "gpt2_pretrained", noop, ("findings", {})),
    ("orphan-shard", "gpt2_pretrained", orphan, ("findings", {"orphan_shard": False})),
    ("orphan-shard-twin", "gpt2_pretrained", orphan_twin, ("findings", {})),
    ("total-size-wrong", "llama_pretrained", total_size_wrong, ("findings", {"total_size_mismatch": False})),
    ("no-metadata", "llama_pretrained", no_metadata, ("findings", {"no_total_size": False})),
    ("escaping-shard-name", "gpt2_pretrained", escaping, ("refused", 3, "unsafe", r"goes up a directory")),
    ("absolute-shard-name", "gpt2_pretrained", absolute, ("refused", 3, "unsafe", r"is absolute")),
    ("escaping-shard-name-twin", "gpt2_pretrained", escaping_twin, ("findings", {})),
    ("malformed-json", "llama_hub_bin", malformed, ("refused", 3, "corrupt", r"not valid JSON")),
    ("malformed-json-twin", "llama_hub_bin", malformed_twin, ("findings", {})),
    ("duplicate-json-key", "gpt2_pretrained", dup_json_key, ("refused", 3, "corrupt", r"appears twice")),
    ("duplicate-json-key-twin", "gpt2_pretrained", dup_json_key_twin, ("findings", {})),
    ("value-not-a-string", "gpt2_pretrained", value_not_string, ("refused", 3, "corrupt", r"not a shard file name")),
    ("no-weight-map", "gpt2_pretrained", no_weight_map, ("refused", 3, "corrupt", r"no \"weight_map\"")),
    ("unknown-fields-twin", "gpt2_pretrained", unknown_fields, ("findings", {})),
]


def _copy(sets, name, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sets[name].directory, d)
    return d


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_broken_sets(sets, tmp_path, case):
    cid, name, mutate, expected = case
    d = _copy(sets, name, tmp_path)
    mutate(d)
    rc, got = dump(_idx(d))
    if expected[0] == "refused":
        _, code, kind, pattern = expected
        assert (rc, got["kind"]) == (code, kind), got
        assert str(_idx(d)) in got["error"]
        import re
        assert re.search(pattern, got["error"]), got["error"]
        return
    assert rc == 0, got
    kinds = {}
    for f in got["findings"]:
        assert kinds.setdefault(f["kind"], f["error"]) == f["error"]
    assert kinds == expected[1], got["findings"]
    for f in got["findings"]:
        if f["key"]:
            assert f["key"] == K


def test_malformed_json_offset(sets, tmp_path):
    d = _copy(sets, "gpt2_pretrained", tmp_path)
    t = _idx(d).read_text()
    at = t.index('"weight_map"')
    _idx(d).write_text(t[:at] + "," + t[at:])
    rc, got = dump(_idx(d))
    assert rc == 3 and got["offset"] == at, got


# --- what the real loaders do with each break (docs/formats.md §10.3) -------------------

def _loaders(d, saved):
    """{loader: outcome} where outcome is "saved" (K as written), "dup" (the planted
    copy), "init" (left as initialised) or "raise <Error>"."""
    from transformers import GPT2LMHeadModel
    from huggingface_hub import load_torch_model
    from accelerate.utils import load_checkpoint_in_model

    def which(v):
        if torch.equal(v, saved):
            return "saved"
        if (v == 7).all():
            return "dup"
        return "init"

    def fresh():  # a model whose K matches no file
        m = F.gpt2_model()
        with torch.no_grad():
            m.state_dict()[K].fill_(-3.0)
        return m

    out = {}
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in (
            ("transformers", lambda: GPT2LMHeadModel.from_pretrained(d).state_dict()[K]),
            ("hub", lambda: (lambda m: (load_torch_model(m, d, strict=False), m.state_dict()[K])[1])(fresh())),
            ("accelerate", lambda: (lambda m: (load_checkpoint_in_model(m, str(_idx(d))), m.state_dict()[K])[1])(fresh())),
        ):
            try:
                v = fn()
                out[name] = which(v)
            except Exception as e:  # noqa: BLE001 - recording what the loader does
                out[name] = "raise " + type(e).__name__
    return out


LOADER_CASES = [
    # errors: some loader gives wrong data without a word, or fails
    ("missing-shard", missing_shard, {"transformers": "raise FileNotFoundError", "hub": "raise FileNotFoundError",
                                      "accelerate": "raise FileNotFoundError"}),
    ("key-missing-from-shard", key_missing, {"transformers": "init", "hub": "init", "accelerate": "init"}),
    # huggingface_hub opens list(set(weight_map.values())): its pick varies with the hash seed
    ("key-in-two-shards-later", key_twice, {"transformers": "dup", "hub": "saved|dup", "accelerate": "dup"}),
    ("key-in-two-shards-earlier", lambda d: _edit_shard(d, _other_shard(d, after=False), lambda sd: sd.__setitem__(
        K, torch.full_like(_load(d / _shard_of(d))[K], 7.0))), {"transformers": "saved", "hub": "saved|dup", "accelerate": "saved"}),
    ("escaping-shard-name", escaping, {"transformers": "saved", "hub": "raise ValueError", "accelerate": "saved"}),
    # warnings: every loader still loads the right data
    ("key-not-in-index", key_unindexed, {"transformers": "saved", "hub": "saved", "accelerate": "saved"}),
    ("orphan-shard", orphan, {"transformers": "saved", "hub": "saved", "accelerate": "saved"}),
    ("total-size-wrong", total_size_wrong, {"transformers": "saved", "hub": "saved", "accelerate": "saved"}),
    ("no-metadata", no_metadata, {"transformers": "raise KeyError", "hub": "saved", "accelerate": "saved"}),
]


@pytest.mark.parametrize("case", LOADER_CASES, ids=[c[0] for c in LOADER_CASES])
def test_what_loaders_do(sets, tmp_path, case):
    """Pins the behaviour docs/formats.md §10.3 reports, so a loader upgrade that changes
    it fails here instead of silently making an error rule too strict or too lax."""
    _, mutate, expected = case
    d = _copy(sets, "gpt2_pretrained", tmp_path)
    saved = _load(d / _shard_of(d))[K]
    mutate(d)
    got = _loaders(d, saved)
    assert got.keys() == expected.keys()
    for loader, outcome in got.items():
        assert outcome in expected[loader].split("|"), (loader, got)
