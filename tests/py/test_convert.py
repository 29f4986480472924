"""``ckptool convert`` judged by the real readers, never by ours:

* torch.save -> safetensors / torch / hf, safetensors -> torch / safetensors, a Hugging
  Face set -> hf, DCP directories (written by real ``dcp.save`` in 2 and 4 processes) ->
  torch / safetensors / hf: every value bit-identical to the source (read back with
  ``torch.load(weights_only=True)``, ``safetensors.torch.load_file`` / ``safe_open``,
  ``dcp.load``), over every dtype safetensors holds (bool, integers, float8, bfloat16,
  complex64), 0-dim and empty tensors, views, non-contiguous tensors and ties;
* ``--to hf``: shards, their order and the index equal what huggingface_hub's
  ``save_torch_state_dict`` writes for the same state dict and ``--max-shard-size``;
  ``transformers`` ``from_pretrained`` loads a converted GPT-2 set;
* ties: one tensor for safetensors with the alias in ``__metadata__`` (as save_model does),
  one storage for torch;
* key edits, ``--select``, ``--state-dict``, ``--drop-other``;
* refusals (exit code, one line, nothing written): unsafe globals, entries the target
  cannot hold, a truncated input, a collision, OUT = IN, a sparse tensor, unknown targets;
* bounded memory: peak RSS under the largest tensor x 2 + 64 MiB on an input larger.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import CKPTOOL, peak_rss_mib, run_ckptool, SANITIZED  # noqa: E402
from fixtures import Evil  # noqa: E402

warnings.filterwarnings("ignore")

# safetensors holds these (complex32 and complex128 it does not).
ST_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
             "float16", "bfloat16", "float32", "float64", "complex64",
             "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]


def _values(dt: torch.dtype, shape) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    if dt == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(shape)
    if dt.is_complex:
        return torch.randn(*shape, dtype=dt)
    if dt.is_floating_point:
        return (torch.randn(*shape, dtype=torch.float64) * 3).to(dt)
    if dt in (torch.uint16, torch.uint32, torch.uint64, torch.uint8):
        return (torch.arange(n, dtype=torch.int64) * 7 + 200).reshape(shape).to(dt)
    return (torch.arange(n, dtype=torch.int64) * 1000 - 3 * n).reshape(shape).to(dt)


def zoo() -> dict:
    """Every kind of tensor convert must carry exactly."""
    torch.manual_seed(15)
    sd = {}
    for name in ST_DTYPES:
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        sd[f"dtypes.{name}"] = _values(dt, (2, 3))
        sd[f"dtypes.{name}.strided"] = _values(dt, (3, 4))[1:, ::2]  # offset 4, stride (4, 2)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd.update({
        "views.base": base,
        "views.transposed": base.t(),
        "views.slice": base[1:, 2:],
        "views.expanded": torch.arange(3, dtype=torch.float32).unsqueeze(0).expand(5, 3),
        "views.scalar": base[2, 5],  # 0-dim view at offset 17
        "views.channels_last": torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "scalar.f32": torch.tensor(3.5),
        "scalar.i64": torch.tensor(-7),
        "scalar.bool": torch.tensor(True),
        "scalar.bf16": torch.tensor(1.25, dtype=torch.bfloat16),
        "empty.f32": torch.empty(0),
        "empty.i32_3x0": torch.empty(3, 0, dtype=torch.int32),
        "big.int64": torch.arange(2**33, 2**33 + 50, dtype=torch.int64),
    })
    w = torch.randn(5, 4)
    sd["tie.embed"] = w
    sd["tie.lm_head"] = w  # the same tensor object: a tie
    return sd


def bits(t: torch.Tensor) -> bytes:
    """A tensor's values as raw bytes, contiguous: equal bytes = bit-identical values."""
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same(got: dict, want: dict):
    assert list(got) == list(want) or sorted(got) == sorted(want), (sorted(got), sorted(want))
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


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("convert")
    sd = zoo()
    torch.save(sd, d / "zoo.pt")
    return d


def without_tie(sd: dict) -> dict:
    return {k: v for k, v in sd.items() if k != "tie.lm_head"}


# ---------------------------------------------------------------- single files


def test_torch_to_safetensors_exact(work):
    out = work / "zoo.safetensors"
    _, stdout, err = convert(work / "zoo.pt", out, "--to", "safetensors")
    want = zoo()
    got = load_file(out)
    assert_same(got, without_tie(want))
    # The tie is written once, the alias recorded as safetensors' save_model records it.
    with safe_open(out, "pt") as f:
        md = f.metadata()
    assert md == {"format": "pt", "tie.lm_head": "tie.embed"}
    assert "tie.lm_head is tied to tie.embed" in err


def test_torch_to_torch_exact_and_tied(work):
    out = work / "zoo_out.pt"
    convert(work / "zoo.pt", out, "--to", "torch")
    got = torch.load(out, weights_only=True)
    want = zoo()
    assert list(got) == list(want)  # state-dict order kept
    assert_same(got, want)
    assert got["tie.lm_head"] is got["tie.embed"]  # one object, as torch.save wrote it
    assert all(v.is_contiguous() for v in got.values())


def test_safetensors_round_trips_with_metadata(work):
    src = work / "meta.safetensors"
    sd = without_tie(zoo())
    sd = {k: v.clone(memory_format=torch.contiguous_format) for k, v in sd.items()}
    save_file(sd, src, metadata={"format": "pt", "note": "kept"})
    out = work / "meta_out.safetensors"
    convert(src, out, "--to", "safetensors")
    assert_same(load_file(out), sd)
    with safe_open(out, "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "kept"}
    # A torch file has no place for "note": refused, then left out when asked.
    pt = work / "meta_out.pt"
    rc, _, err = convert(src, pt, "--to", "torch", ok=False)
    assert rc == 3 and "note" in err and not pt.exists()
    _, _, err = convert(src, pt, "--to", "torch", "--drop-other")
    assert "__metadata__ note" in err
    assert_same(torch.load(pt, weights_only=True), sd)


def test_key_edits_and_select(work):
    src = work / "compiled.pt"
    sd = {"_orig_mod.enc.weight": torch.randn(3, 2), "_orig_mod.enc.bias": torch.randn(3),
          "_orig_mod.dec.weight": torch.randn(2, 3)}
    torch.save(sd, src)
    out = work / "compiled.safetensors"
    convert(src, out, "--to", "safetensors", "--strip-compiled", "--select", "*enc*")
    got = load_file(out)
    assert_same(got, {"enc.weight": sd["_orig_mod.enc.weight"], "enc.bias": sd["_orig_mod.enc.bias"]})
    rc, _, err = convert(src, work / "none.safetensors", "--to", "safetensors", "--select", "nothing*", ok=False)
    assert rc == 2 and "matches no key" in err
    # Two keys renamed to one: refused before anything is written.
    rc, _, err = convert(src, work / "clash.pt", "--to", "torch", "--rename", r"(weight|bias)=x", ok=False)
    assert rc == 1 and not (work / "clash.pt").exists(), err
    assert "nothing written: '_orig_mod.enc.x' <- _orig_mod.enc.weight, _orig_mod.enc.bias" in err, err


def test_lightning_style_needs_state_dict_or_drop(work):
    src = work / "lit.ckpt"
    sd = {"layer.weight": torch.randn(4, 3), "layer.bias": torch.randn(4)}
    torch.save({"epoch": 3, "global_step": 12, "pytorch-lightning_version": "2.5.0", "state_dict": sd,
                "optimizer_states": [{"state": {0: {"exp_avg": torch.randn(4, 3)}}}]}, src)
    out = work / "lit.safetensors"
    rc, _, err = convert(src, out, "--to", "safetensors", ok=False)
    assert rc == 3 and "epoch" in err and "--drop-other" in err and not out.exists(), err
    convert(src, out, "--to", "safetensors", "--state-dict", "state_dict")
    assert_same(load_file(out), sd)
    out2 = work / "lit_dropped.safetensors"
    _, _, err = convert(src, out2, "--to", "safetensors", "--drop-other")
    assert "left out epoch" in err
    assert_same(load_file(out2), sd)


def test_state_dict_path_names_what_is_left_out_and_refuses_ambiguity(work):
    w = torch.randn(3)
    # Non-tensor values inside a state dict below the root (a module's _extra_state, a
    # counter) are entries too: never dropped without being named.
    src = work / "nested_entry.pt"
    torch.save({"state_dict": {"w": w, "n": 5}, "epoch": 1}, src)
    out = work / "nested_entry.safetensors"
    rc, _, err = convert(src, out, "--to", "safetensors", ok=False)
    assert rc == 3 and "'state_dict/n (int)'" in err and not out.exists(), err
    _, _, err = convert(src, out, "--to", "safetensors", "--drop-other")
    assert "left out state_dict/n (int)" in err and "left out epoch (int)" in err
    assert_same(load_file(out), {"w": w})
    # --state-dict deeper than an entry: what lies beside the way down is named, not the
    # entry that holds the converted dict.
    src = work / "deep.pt"
    torch.save({"m": {"sd": {"w": w, "n": 2}, "extra": 5}, "other": 1}, src)
    _, _, err = convert(src, work / "deep.safetensors", "--to", "safetensors", "--state-dict", "m/sd")
    left = sorted(line.split("left out ")[1] for line in err.splitlines() if "left out " in line)
    assert left == ["m/extra (int)", "m/sd/n (int)", "other (int)"], err
    assert_same(load_file(work / "deep.safetensors"), {"w": w})
    # A key holding '/': the path is matched against the file's keys, and two matches refused.
    src = work / "slash.pt"
    torch.save({"a/b": {"w": torch.ones(2)}, "c": 1}, src)
    convert(src, work / "slash.safetensors", "--to", "safetensors", "--state-dict", "a/b")
    assert_same(load_file(work / "slash.safetensors"), {"w": torch.ones(2)})
    src = work / "slash2.pt"
    torch.save({"a/b": {"w": torch.ones(2)}, "a": {"b": {"w": torch.zeros(2)}}}, src)
    rc, _, err = convert(src, work / "slash2.safetensors", "--to", "safetensors", "--state-dict", "a/b", ok=False)
    assert rc == 2 and "ambiguous" in err and not (work / "slash2.safetensors").exists(), err

@pytest.mark.parametrize("target", ["bfloat16", "float16", "float8_e4m3fn"])
def test_dtype_cast_equals_torch_to(work, target):
    # Values that round, overflow and underflow: each must come out as Tensor.to gives it.
    src = work / f"cast_{target}.pt"
    torch.manual_seed(3)
    sd = {"f32": torch.randn(64, 33) * torch.logspace(-9, 9, 33),
          "f64.strided": torch.randn(40, 30, dtype=torch.float64)[::3, 1::2] * 1e4,
          "bf16": torch.randn(17, dtype=torch.bfloat16),
          "f8": (torch.randn(9) * 50).to(torch.float8_e5m2),
          "scalar": torch.tensor(65519.99),
          "int": torch.arange(5), "flag": torch.tensor([True, False])}
    torch.save(sd, src)
    dt = getattr(torch, target)
    want = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
    convert(src, work / f"cast_{target}.pt.out", "--to", "torch", "--dtype", target)
    assert_same(torch.load(work / f"cast_{target}.pt.out", weights_only=True), want)
    convert(src, work / f"cast_{target}.safetensors", "--to", "safetensors", "--dtype", target)
    assert_same(load_file(work / f"cast_{target}.safetensors"), want)
    rc, _, err = convert(src, work / "cast_bad.pt", "--to", "torch", "--dtype", "int8", ok=False)
    assert rc == 2 and not (work / "cast_bad.pt").exists(), err


# ---------------------------------------------------------------- refusals


def test_refusals_write_nothing(work):
    # A global torch.load(weights_only=True) refuses: exit 3 unless --drop-other.
    evil = work / "evil.pt"
    marker = work / "PWNED"
    torch.save({"w": torch.ones(2), "e": Evil(marker)}, evil)
    out = work / "evil.safetensors"
    rc, _, err = convert(evil, out, "--to", "safetensors", ok=False)
    assert rc == 3 and "system" in err and not out.exists(), err
    _, _, err = convert(evil, out, "--to", "safetensors", "--drop-other")
    assert "unsafe global" in err
    assert_same(load_file(out), {"w": torch.ones(2)})
    assert not marker.exists()  # never run

    # A truncated input: exit 3, no output.
    good = work / "zoo.safetensors"
    if not good.exists():
        convert(work / "zoo.pt", good, "--to", "safetensors")
    cut = work / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    rc, _, err = convert(cut, work / "cut.pt", "--to", "torch", ok=False)
    assert rc == 3 and not (work / "cut.pt").exists(), err
    assert len(err.strip().splitlines()) == 1

    # OUT = IN: usage, the input untouched.
    before = (work / "zoo.pt").read_bytes()
    rc, _, err = convert(work / "zoo.pt", work / "zoo.pt", "--to", "torch", ok=False)
    assert rc == 2 and (work / "zoo.pt").read_bytes() == before, err

    # A sparse tensor has no exact plain form.
    torch.save({"s": torch.eye(3).to_sparse()}, work / "sparse.pt")
    rc, _, err = convert(work / "sparse.pt", work / "sparse.safetensors", "--to", "safetensors", ok=False)
    assert rc == 3 and "sparse" in err and not (work / "sparse.safetensors").exists(), err

    # complex128 has no safetensors dtype.
    torch.save({"c": torch.randn(2, dtype=torch.complex128)}, work / "c128.pt")
    rc, _, err = convert(work / "c128.pt", work / "c128.safetensors", "--to", "safetensors", ok=False)
    assert rc == 3 and "complex128" in err, err

    rc, _, err = convert(work / "zoo.pt", work / "x.bin", "--to", "onnx", ok=False)
    assert rc == 2, err
    rc, _, err = convert(work / "zoo.pt", work / "x.bin", "--to", "torch", "--max-shard-size", "1MB", ok=False)
    assert rc == 2, err


# ---------------------------------------------------------------- hf sets


def hub_reference(sd: dict, directory: Path, max_shard_size) -> None:
    from huggingface_hub import save_torch_state_dict
    directory.mkdir()
    save_torch_state_dict(sd, directory, max_shard_size=max_shard_size)


def test_hf_equals_huggingface_hub(work):
    sd = {k: v.clone(memory_format=torch.contiguous_format) for k, v in without_tie(zoo()).items()}
    torch.save(sd, work / "flat.pt")
    for size in ["300", "1KB", "5GB"]:
        out = work / f"hf_{size}"
        ref = work / f"hub_{size}"
        convert(work / "flat.pt", out, "--to", "hf", "--max-shard-size", size)
        hub_reference(sd, ref, int(size) if size.isdigit() else size)
        names = sorted(p.name for p in ref.iterdir())
        assert sorted(p.name for p in out.iterdir()) == names, size
        for name in names:
            if name.endswith(".json"):
                # The index byte for byte: same shards, order, total_size, formatting.
                assert (out / name).read_text() == (ref / name).read_text(), size
            else:
                with safe_open(out / name, "pt") as a, safe_open(ref / name, "pt") as b:
                    assert sorted(a.keys()) == sorted(b.keys()), (size, name)
                    assert a.metadata() == b.metadata() == {"format": "pt"}
                assert_same(load_file(out / name), load_file(ref / name))


def test_hf_ties_keep_the_name_huggingface_hub_keeps(work):
    # The tie's first key (in dict order) is not the one that sorts first: the Hub keeps
    # lm_head.weight, at its own place, and records the embedding as its alias. Two ties,
    # so the aliases' order in the index is checked too.
    emb, head2 = torch.arange(12.0).reshape(3, 4), torch.arange(8.0).reshape(2, 4)
    sd = {"model.embed_tokens.weight": emb, "z.proj": head2, "model.norm.weight": torch.ones(4),
          "lm_head.weight": emb, "b.proj": head2, "a.unused": torch.zeros(3)}
    torch.save(sd, work / "ties.pt")
    for size in ["5GB", "100"]:
        out, ref = work / f"ties_hf_{size}", work / f"ties_hub_{size}"
        _, _, err = convert(work / "ties.pt", out, "--to", "hf", "--max-shard-size", size)
        assert "model.embed_tokens.weight is tied to lm_head.weight" in err, err
        hub_reference(dict(sd), ref, int(size) if size.isdigit() else size)
        names = sorted(p.name for p in ref.iterdir())
        assert sorted(p.name for p in out.iterdir()) == names, size
        for name in names:
            if name.endswith(".json"):
                assert (out / name).read_text() == (ref / name).read_text(), size
                continue
            with safe_open(out / name, "pt") as a, safe_open(ref / name, "pt") as b:
                assert list(a.keys()) == list(b.keys()), (size, name)
                assert a.metadata() == b.metadata(), (size, name)
            assert_same(load_file(out / name), load_file(ref / name))


def test_hf_set_to_hf_loads_in_transformers(work):
    from hf_fixtures import gpt2_model
    from transformers import GPT2LMHeadModel
    model = gpt2_model()
    src = work / "gpt2"
    model.save_pretrained(src, max_shard_size="100KB")
    out = work / "gpt2_resharded"
    convert(src, out, "--to", "hf", "--max-shard-size", "40KB")
    assert (out / "model.safetensors.index.json").exists()
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    loaded = GPT2LMHeadModel.from_pretrained(out).eval()
    want = model.state_dict()
    got = loaded.state_dict()
    for k, v in want.items():
        assert bits(got[k]) == bits(v), k
    # One shard: no index, "model.safetensors".
    one = work / "gpt2_one"
    convert(src, one, "--to", "hf")
    assert sorted(p.name for p in one.iterdir()) == ["model.safetensors"]
    # The set as one file of either kind: every key of every shard.
    stored = {}
    for f in sorted(src.glob("*.safetensors")):
        stored.update(load_file(f))
    convert(src, work / "gpt2.pt", "--to", "torch")
    assert_same(torch.load(work / "gpt2.pt", weights_only=True), stored)
    convert(src, work / "gpt2.safetensors", "--to", "safetensors")
    assert_same(load_file(work / "gpt2.safetensors"), stored)


def test_hf_output_dir_policy(work):
    out = work / "hf_policy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, _, err = convert(work / "zoo.pt", out, "--to", "hf", ok=False)
    assert rc == 2 and sorted(p.name for p in out.iterdir()) == ["notes.txt"], err
    convert(work / "zoo.pt", out, "--to", "hf", "--force")
    assert (out / "notes.txt").read_text() == "mine"
    # A set's OUTDIR inside the input set's directory: refused.
    st = work / "set_in"
    convert(work / "zoo.pt", st, "--to", "hf", "--max-shard-size", "1KB")
    rc, _, err = convert(st, st / "inner", "--to", "hf", ok=False)
    assert rc == 2 and not (st / "inner").exists(), err


# ---------------------------------------------------------------- DCP


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory) -> dict:
    import dcp_fixtures
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["shard2"])


def dcp_loaded(d: Path) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(str(d)).read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=str(d))
    return sd


# shard2 (2 ranks): Shard(0) and Shard(1) pieces (the second lands row by row), replicated
# and zero-size chunks, bfloat16, float16, int64, bool and a 0-dim tensor. One scenario:
# each one costs seconds of process start-up.
@pytest.mark.parametrize("name", ["shard2"])
def test_dcp_to_every_target(dcp_dirs, tmp_path, name):
    if name not in dcp_dirs:
        pytest.skip(f"{name}: not written by this torch")
    d = dcp_dirs[name]
    want = dcp_loaded(d)
    # Non-tensor items (step, name, param_groups) cannot be held: refused, then dropped.
    rc, _, err = convert(d, tmp_path / "x.pt", "--to", "torch", ok=False)
    assert rc == 3 and "--drop-other" in err and not (tmp_path / "x.pt").exists(), err
    convert(d, tmp_path / "out.pt", "--to", "torch", "--drop-other")
    assert_same(torch.load(tmp_path / "out.pt", weights_only=True), want)
    convert(d, tmp_path / "out.safetensors", "--to", "safetensors", "--drop-other")
    assert_same(load_file(tmp_path / "out.safetensors"), want)
    convert(d, tmp_path / "hf", "--to", "hf", "--drop-other", "--max-shard-size", "100")
    got = {}
    for f in sorted((tmp_path / "hf").glob("*.safetensors")):
        got.update(load_file(f))
    assert_same(got, want)


# ---------------------------------------------------------------- memory


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time")
@pytest.mark.skipif(SANITIZED, reason="ASan's shadow memory is not the program's")
def test_memory_bounded_by_largest_tensor(tmp_path):
    # 8 tensors of 16 MiB (half of them transposed views, which are gathered in memory):
    # 128 MiB of data, more than the bound of 16 x 2 + 64 = 96 MiB.
    n = 2048
    sd = {}
    for i in range(8):
        t = torch.full((n, n), float(i))
        sd[f"w{i}"] = t.t() if i % 2 else t
    src = tmp_path / "big.pt"
    torch.save(sd, src)
    del sd
    for to, out in [("safetensors", tmp_path / "big.safetensors"), ("torch", tmp_path / "big_out.pt")]:
        peak = peak_rss_mib(["convert", src, "-o", out, "--to", to])
        assert peak <= 96, f"--to {to}: peak RSS {peak:.0f} MiB"
    got = load_file(tmp_path / "big.safetensors")
    assert all(float(got[f"w{i}"][5, 7]) == float(i) for i in range(8))


def test_module_versions_left_out_of_a_torch_output_are_named(work):
    # model.state_dict() carries _metadata (module versions); a torch output is a plain dict.
    src = work / "versions.pt"
    torch.save(torch.nn.BatchNorm1d(3).state_dict(), src)
    _, stdout, err = convert(src, work / "versions_out.pt", "--to", "torch", "--json")
    assert "left out _metadata (module versions; rekey keeps them)" in err, err
    assert any("_metadata" in d for d in json.loads(stdout)["dropped"])
    got = torch.load(work / "versions_out.pt", weights_only=True)
    assert_same(got, torch.load(src, weights_only=True))
    # safetensors never holds it: nothing to say.
    _, _, err = convert(src, work / "versions.safetensors", "--to", "safetensors")
    assert "_metadata" not in err, err


def test_one_shard_hf_output_is_a_previous_set(work):
    # A set of one shard is model.safetensors alone: a second run replaces it, and a DCP
    # is never written beside it.
    src = work / "one_shard.pt"
    torch.save({"w": torch.ones(4)}, src)
    out = work / "one_shard_hf"
    for _ in range(2):
        convert(src, out, "--to", "hf")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    rc, _, err = convert(src, out, "--to", "dcp", "--force", ok=False)
    assert rc == 2 and "set of one shard 'model.safetensors'" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_hf_output_never_replaces_its_own_input(tmp_path):
    """out/model.safetensors converted into out/ as a shard set: the input is the previous
    set's only file, which the commit would replace with its own output."""
    out = tmp_path / "out"
    out.mkdir()
    src = out / "model.safetensors"
    save_file({"w": torch.randn(4, 4)}, src)
    before = src.read_bytes()
    rc, _, err = run_ckptool("convert", src, "-o", out, "--to", "hf", "--dtype", "float16")
    assert rc == 2, err
    assert "is the input" in err
    assert src.read_bytes() == before


def test_shards_metadata_that_differ_are_named(tmp_path):
    """Only the first shard's __metadata__ was read: a pair only another shard held was lost."""
    import huggingface_hub
    src = tmp_path / "set"
    src.mkdir()
    sd = {"a": torch.zeros(1000), "b": torch.ones(1000)}
    huggingface_hub.save_torch_state_dict(sd, src, max_shard_size="5KB", metadata={"format": "pt"})
    shards = sorted(src.glob("*.safetensors"))
    assert len(shards) == 2
    second = load_file(shards[1])
    save_file(second, shards[1], metadata={"format": "pt", "important": "yes"})
    out = tmp_path / "o.safetensors"
    rc, _, err = run_ckptool("convert", src, "-o", out, "--to", "safetensors")
    assert rc == 3, err
    assert "important" in err and not out.exists()
    rc, _, err = run_ckptool("convert", src, "-o", out, "--to", "safetensors", "--drop-other")
    assert rc == 0, err
    assert "important" in err
    with safe_open(out, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_the_index_cross_check_warnings_are_said(tmp_path):
    """A shard holding a key its index omits is converted (transformers loads it too), but
    not without the warning inspect gives."""
    src = tmp_path / "s"
    src.mkdir()
    save_file({"a": torch.ones(2), "extra": torch.ones(3)}, src / "model-00001-of-00002.safetensors",
              metadata={"format": "pt"})
    save_file({"b": torch.zeros(2)}, src / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 16}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                        "b": "model-00002-of-00002.safetensors"}}))
    rc, out, err = run_ckptool("inspect", src)
    assert rc == 0 and "extra" in out
    rc, _, err = run_ckptool("convert", src, "-o", tmp_path / "o.pt", "--to", "torch")
    assert rc == 0, err
    assert "extra" in err and "warning" in err
