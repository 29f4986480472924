"""`ckptool diff A B` on purpose-built pairs written by the real writers (torch.save,
safetensors' save_file, huggingface_hub's save_torch_state_dict, dcp.save), judged by the
real readers: torch.allclose / torch.isclose decide what "within tolerance" means, and
torch's own conversions decide what each stored element is worth.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", HERE.parent.parent / "build"))
DECODE = BUILD_DIR / "tests" / "decode_elements"


def diff(a, b, *flags):
    rc, out, err = run_ckptool("diff", *flags, a, b)
    return rc, out, err


def diff_json(a, b, *flags) -> tuple[int, dict]:
    rc, out, err = run_ckptool("diff", "--json", *flags, a, b)
    assert rc in (0, 1), f"diff {a} {b}: exit {rc}: {err}"
    doc = json.loads(out)
    assert doc["equivalent"] == (rc == 0)
    return rc, doc


def state_dict() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "enc.weight": torch.randn(6, 5, generator=g),
        "enc.bias": torch.randn(5, generator=g).half(),
        "dec.weight": torch.randn(3, 4, generator=g).bfloat16(),
        "dec.scale": torch.randn(7, generator=g).to(torch.float8_e4m3fn),
        "steps": torch.arange(5, dtype=torch.int64) * (2**40),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
    }


def tensor_entry(doc, key) -> dict:
    hits = [t for t in doc["tensors"] if t["key_a"] == key]
    assert len(hits) == 1, (key, doc["tensors"])
    return hits[0]


# --- the same state dict in every format -------------------------------------------------


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> dict:
    import torch.distributed.checkpoint as dcp
    from huggingface_hub import save_torch_state_dict
    d = tmp_path_factory.mktemp("formats")
    sd = state_dict()
    out = {"pt": d / "model.pt", "st": d / "model.safetensors", "hf": d / "hf", "dcp": d / "dcp"}
    torch.save(sd, out["pt"])
    # huggingface_hub writes format: pt into each shard's __metadata__, which diff compares.
    save_file(sd, str(out["st"]), metadata={"format": "pt"})
    out["hf"].mkdir()
    save_torch_state_dict(sd, str(out["hf"]), max_shard_size=200)  # several shards and an index
    assert len(list(out["hf"].glob("*.safetensors"))) > 1
    dcp.save(sd, checkpoint_id=str(out["dcp"]))
    return out


@pytest.mark.parametrize("a,b", [("pt", "st"), ("st", "hf"), ("hf", "dcp"), ("dcp", "pt"), ("pt", "hf")])
def test_one_state_dict_in_any_two_formats_is_equivalent(formats, a, b):
    rc, doc = diff_json(formats[a], formats[b])
    assert rc == 0, doc
    assert doc["paired"] == len(state_dict())
    assert doc["values"]["identical"] == len(state_dict())
    assert doc["only_in_a"] == [] and doc["only_in_b"] == [] and doc["tensors"] == []
    assert doc["bytes_compared"] == 2 * sum(t.numel() * t.element_size() for t in state_dict().values())


def test_summary_line_first(formats):
    rc, out, _ = diff(formats["pt"], formats["dcp"])
    assert rc == 0
    first = out.splitlines()[0]
    assert first.startswith(f"{formats['pt']} vs {formats['dcp']}: equivalent (8 tensors, 8 identical)"), first


# --- each kind of difference ----------------------------------------------------------


def st_data_offset(path: Path, key: str) -> int:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return 8 + n + header[key]["data_offsets"][0]


def test_one_bit_flipped(tmp_path):
    sd = state_dict()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file(sd, str(a))
    raw = bytearray(a.read_bytes())
    # Element 7 of enc.weight, its lowest mantissa bit.
    raw[st_data_offset(a, "enc.weight") + 7 * 4] ^= 0x01
    b.write_bytes(bytes(raw))
    rc, doc = diff_json(a, b)
    assert rc == 1
    t = tensor_entry(doc, "enc.weight")
    from safetensors.torch import load_file
    ta, tb = load_file(str(a))["enc.weight"], load_file(str(b))["enc.weight"]
    assert not torch.equal(ta, tb)
    assert t["values"] == "different" and t["outside_tolerance"] == 1 and t["bits_differ"] == 1
    assert t["first_outside"] == 7
    assert t["max_abs_error"] == (ta.double() - tb.double()).abs().max().item()
    assert doc["values"]["identical"] == len(sd) - 1
    # A tolerance as loose as torch.allclose needs makes it close, exit 0.
    assert torch.allclose(ta, tb, rtol=1e-6, atol=0)
    rc, doc = diff_json(a, b, "--rtol", "1e-6")
    assert rc == 0 and tensor_entry(doc, "enc.weight")["values"] == "close"
    # --metadata-only reads no tensor byte, so it cannot see it.
    rc, doc = diff_json(a, b, "--metadata-only")
    assert rc == 0 and doc["bytes_compared"] == 0
    rc, out, _ = diff(a, b)
    assert rc == 1
    assert out.splitlines()[0].endswith("DIFFERENT (1 tensor's values differ)")
    assert "values: enc.weight: 1 of 30 elements outside tolerance (first at index 7)" in out


def test_renamed_key(tmp_path):
    sd = state_dict()
    renamed = dict(sd)
    renamed["encoder.weight"] = renamed.pop("enc.weight")
    torch.save(sd, tmp_path / "a.pt")
    torch.save(renamed, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1
    assert doc["only_in_a"] == ["enc.weight"] and doc["only_in_b"] == ["encoder.weight"]
    assert doc["renamed"] is None
    assert doc["paired"] == len(sd) - 1


@pytest.mark.parametrize("wrapper", ["_orig_mod.", "module."])
def test_wrapper_added(tmp_path, wrapper):
    sd = state_dict()
    wrapped = {wrapper + k: v for k, v in sd.items()}
    torch.save(sd, tmp_path / "a.pt")
    save_file(wrapped, str(tmp_path / "b.safetensors"))
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.safetensors")
    assert rc == 1  # the keys differ: a strict load_state_dict would refuse
    assert doc["only_in_a"] == [] and doc["only_in_b"] == []
    assert doc["renamed"]["edit"] == f"add '{wrapper}'"
    assert sorted(p["b"] for p in doc["renamed"]["pairs"]) == sorted(wrapped)
    assert doc["values"]["identical"] == len(sd)  # the values were compared through the pairing
    rc, out, _ = diff(tmp_path / "b.safetensors", tmp_path / "a.pt")
    assert rc == 1
    assert f"renamed: B's keys are A's with remove '{wrapper}' ({len(sd)} keys)" in out


def test_dtype_change(tmp_path):
    sd = state_dict()
    cast = dict(sd)
    cast["enc.weight"] = sd["enc.weight"].bfloat16()
    torch.save(sd, tmp_path / "a.pt")
    torch.save(cast, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1
    t = tensor_entry(doc, "enc.weight")
    assert (t["dtype_a"], t["dtype_b"]) == ("float32", "bfloat16")
    # The values are still compared, across the dtypes, as torch's double conversion says.
    want = (sd["enc.weight"].double() - cast["enc.weight"].double()).abs().max().item()
    assert t["max_abs_error"] == want and want > 0


def test_shape_change(tmp_path):
    sd = state_dict()
    other = dict(sd)
    other["enc.weight"] = sd["enc.weight"].reshape(5, 6)
    save_file(sd, str(tmp_path / "a.safetensors"))
    save_file(other, str(tmp_path / "b.safetensors"))
    rc, doc = diff_json(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert rc == 1
    t = tensor_entry(doc, "enc.weight")
    assert t["shape_a"] == [6, 5] and t["shape_b"] == [5, 6] and t["values"] == "not-compared"
    rc, out, _ = diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert "shape: enc.weight: [6, 5] vs [5, 6]" in out


def test_non_tensor_entry_changed(tmp_path):
    sd = state_dict()
    torch.save({"state_dict": sd, "epoch": 3, "name": "run"}, tmp_path / "a.pt")
    torch.save({"state_dict": sd, "epoch": 4, "name": "run"}, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1
    assert doc["entries"] == [{"path": "epoch", "a": {"type": "int", "value": "3"},
                               "b": {"type": "int", "value": "4"}}]
    assert doc["values"]["identical"] == len(sd)
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt", "--ignore-entries")
    assert rc == 0


# Values torch.load gives as different objects at paths that spell alike: each pair must
# differ. (Against a DCP directory a dict key is its str(): dcp.save keeps no key's type.)
PLACES_THAT_SPELL_ALIKE = {
    "int_vs_str_key": ({"opt": {"state": {0: {"step": 3}}}}, {"opt": {"state": {"0": {"step": 3}}}}),
    "list_vs_dict": ({"x": [{"a": 1}]}, {"x": {0: {"a": 1}}}),
    "tensor_list_vs_str_dict": ({"x": [torch.ones(1)]}, {"x": {"0": torch.ones(1)}}),
    "tuple_key_vs_str": ({"x": {(1, 2): 1}}, {"x": {"(1, 2)": 1}}),
    "slash_in_key_vs_nesting": ({"x": {"a/b": 1}}, {"x": {"a": {"b": 1}}}),
    "slash_in_top_key_vs_nesting": ({"a/b": 1, "w": torch.ones(1)}, {"a": {"b": 1}, "w": torch.ones(1)}),
    "int_and_str_key_side_by_side": ({"x": {1: "a", "1": "b"}}, {"x": {1: "a", "1": "c"}}),
}


@pytest.mark.parametrize("case", sorted(PLACES_THAT_SPELL_ALIKE))
def test_entries_at_places_that_spell_alike_differ(tmp_path, case):
    a, b = PLACES_THAT_SPELL_ALIKE[case]
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1 and doc["entries"], doc
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "a.pt")
    assert rc == 0, doc


def test_a_key_of_another_kind_is_named_in_the_report(tmp_path):
    torch.save({"opt": {"state": {0: {"step": 3}}}}, tmp_path / "a.pt")
    torch.save({"opt": {"state": {"0": {"step": 3}}}}, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1 and doc["entries"] == [{
        "path": "opt/state/0/step",
        "a": {"type": "int (path element 3 is a key that is no str)", "value": "3"},
        "b": {"type": "int (path element 3 is a str key)", "value": "3"}}], doc


def test_a_key_with_a_slash_and_a_nested_dict_in_dcp(tmp_path):
    # dcp.save keeps "a/b" a key of its own and {"a": {"b": 1}} as "a.b": dcp.load of one
    # into the other's layout fails ("Missing key in checkpoint state_dict: a.b").
    import torch.distributed.checkpoint as dcp
    dcp.save({"t": torch.ones(1), "a/b": 1}, checkpoint_id=str(tmp_path / "slash"), no_dist=True)
    dcp.save({"t": torch.ones(1), "a": {"b": 1}}, checkpoint_id=str(tmp_path / "nested"), no_dist=True)
    torch.save({"t": torch.ones(1), "a/b": 1}, tmp_path / "slash.pt")
    rc, doc = diff_json(tmp_path / "slash", tmp_path / "nested")
    assert rc == 1 and sorted(e["path"] for e in doc["entries"]) == ["'a/b'", "a/b"], doc
    rc, doc = diff_json(tmp_path / "slash", tmp_path / "slash.pt")
    assert rc == 0, doc


def test_long_entries_differing_past_the_summary(tmp_path):
    # inspect's rendering stops at 120 characters; a difference after that is still found.
    sd = {"w": torch.ones(2)}
    long_a = {"note": "x" * 300 + "a"}
    long_b = {"note": "x" * 300 + "b"}
    torch.save({"state_dict": sd, "hparams": long_a}, tmp_path / "a.pt")
    torch.save({"state_dict": sd, "hparams": long_b}, tmp_path / "b.pt")
    torch.save({"state_dict": sd, "hparams": dict(long_a)}, tmp_path / "c.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1 and [e["path"] for e in doc["entries"]] == ["hparams/note"]
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "c.pt")
    assert rc == 0 and doc["entries_compared_by_summary"] == 0


def test_some_keys_paired_through_a_wrapper(tmp_path):
    sd = state_dict()
    other = {"_orig_mod." + k: v for k, v in sd.items() if k != "steps"}
    other["counter"] = sd["steps"]
    torch.save(sd, tmp_path / "a.pt")
    torch.save(other, tmp_path / "b.pt")
    rc, doc = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1
    assert doc["only_in_a"] == ["steps"] and doc["only_in_b"] == ["counter"]
    assert doc["renamed"]["edit"] == "add '_orig_mod.'" and len(doc["renamed"]["pairs"]) == len(sd) - 1


# --- NaN, -0.0 and tolerances, as torch.allclose decides --------------------------------


def pair_files(tmp_path, a: torch.Tensor, b: torch.Tensor):
    pa, pb = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"t": a.contiguous()}, str(pa))
    save_file({"t": b.contiguous()}, str(pb))
    return pa, pb


def nan_with_payload(payload: int) -> torch.Tensor:
    return torch.tensor([0x7FC00000 | payload], dtype=torch.int32).view(torch.float32)


def test_negative_zero_is_equal_not_identical(tmp_path):
    a, b = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])
    assert torch.equal(a, b)
    rc, doc = diff_json(*pair_files(tmp_path, a, b))
    assert rc == 0
    t = tensor_entry(doc, "t")
    assert t["values"] == "equal" and t["bits_differ"] == 1 and t["not_equal"] == 0


def test_nan(tmp_path):
    nan1, nan2 = nan_with_payload(1), nan_with_payload(2)
    one = torch.tensor([1.0])
    # The same NaN bits on both sides: identical, whatever --equal-nan says.
    rc, doc = diff_json(*pair_files(tmp_path, torch.cat([nan1, one]), torch.cat([nan1, one])))
    assert rc == 0 and doc["tensors"] == []
    # Different NaNs: equal only with --equal-nan, as torch.allclose(equal_nan=...) says.
    a, b = torch.cat([nan1, one]), torch.cat([nan2, one])
    files = pair_files(tmp_path, a, b)
    for flags, want in (((), False), (("--equal-nan",), True)):
        assert torch.allclose(a, b, rtol=0, atol=0, equal_nan=bool(flags)) == want
        rc, doc = diff_json(*files, *flags)
        assert rc == (0 if want else 1)
        if not want:
            assert tensor_entry(doc, "t")["nan_mismatches"] == 1
    # NaN against a number is never close.
    a, b = torch.cat([nan1, one]), torch.tensor([0.0, 1.0])
    assert not torch.allclose(a, b, rtol=1, atol=1e30, equal_nan=True)
    rc, doc = diff_json(*pair_files(tmp_path, a, b), "--equal-nan", "--atol", "1e30", "--rtol", "1")
    assert rc == 1 and tensor_entry(doc, "t")["nan_mismatches"] == 1


def test_infinities(tmp_path):
    a = torch.tensor([math.inf, -math.inf, math.inf, 1.0])
    b = torch.tensor([math.inf, -math.inf, -math.inf, math.inf])
    rc, doc = diff_json(*pair_files(tmp_path, a, b), "--atol", "1e30")
    assert not torch.allclose(a, b, atol=1e30)
    t = tensor_entry(doc, "t")
    assert rc == 1 and t["outside_tolerance"] == int((~torch.isclose(a, b, rtol=0, atol=1e30)).sum())
    assert t["max_abs_error"] == "inf"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.complex64])
def test_tolerance_boundaries_match_torch_isclose(tmp_path, dtype):
    g = torch.Generator().manual_seed(1)
    n = 4000
    b = (torch.randn(n, generator=g, dtype=torch.float64) * 100)
    # Differences at and around atol + rtol * |b| for the tolerances below, so that many
    # elements sit on the boundary, both sides of it, in the dtype's own arithmetic.
    atol, rtol = 0.5, 0.01
    bound = atol + rtol * b.abs()
    a = b + bound * torch.tensor([-1.0, 1.0])[torch.randint(0, 2, (n,), generator=g)] * \
        (1 + torch.randint(-2, 3, (n,), generator=g).double() * 1e-7)
    if dtype.is_complex:
        # The same magnitudes, turned: |b| and |a - b| are unchanged.
        a, b = torch.complex(a * 0.6, a * 0.8), torch.complex(b * 0.6, b * 0.8)
    a, b = a.to(dtype), b.to(dtype)
    want_outside = int((~torch.isclose(a, b, rtol=rtol, atol=atol)).sum())
    assert 0 < want_outside < n
    rc, doc = diff_json(*pair_files(tmp_path, a, b), "--atol", str(atol), "--rtol", str(rtol))
    assert rc == 1
    assert tensor_entry(doc, "t")["outside_tolerance"] == want_outside
    # And a tolerance that admits everything: exit 0 exactly when torch.allclose says so.
    assert torch.allclose(a, b, rtol=rtol, atol=atol * 3)
    rc, _ = diff_json(*pair_files(tmp_path, a, b), "--atol", str(atol * 3), "--rtol", str(rtol))
    assert rc == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint64,
                                   torch.bool])
def test_integer_tolerances_are_torch_isclose(tmp_path, dtype):
    # torch.isclose casts both sides to float32 before anything else (torch/_refs isclose):
    # large values round, and a uint8 a < b does not wrap. Many pairs sit on the bound.
    g = torch.Generator().manual_seed(7)
    n = 3000
    if dtype == torch.bool:
        a, b = torch.randint(0, 2, (n,), generator=g).bool(), torch.randint(0, 2, (n,), generator=g).bool()
        cases = [(0.5, 0.0), (0.0, 0.5), (1.0, 0.0), (0.0, 1.0)]
    else:
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -2**45), min(info.max, 2**45)
        b = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)
        step = torch.randint(-3, 4, (n,), generator=g, dtype=torch.int64)
        a = (b + (b.abs() // 17) * step.sign() + step).clamp(lo, hi)
        a, b = a.to(dtype), b.to(dtype)
        cases = [(0.0, 1 / 17), (2.0, 1 / 17), (0.0, 0.0590475599651634), (16777216.0, 0.0), (3.0, 0.0)]
    for atol, rtol in cases:
        want = int((~torch.isclose(a, b, rtol=rtol, atol=atol)).sum())
        rc, doc = diff_json(*pair_files(tmp_path, a, b), "--atol", repr(atol), "--rtol", repr(rtol))
        got = tensor_entry(doc, "t")["outside_tolerance"] if doc["tensors"] else 0
        assert got == want and (rc == 0) == (want == 0), (atol, rtol, got, want)


@pytest.mark.parametrize("dtype,big", [(torch.int64, 2**62), (torch.int64, -2**63 + 1), (torch.uint64, 2**63)],
                         ids=["int64", "int64-min", "uint64"])
def test_64_bit_integers_past_2_53_are_compared_exactly(tmp_path, dtype, big):
    # As doubles, 2^62 and 2^62 + 1 are one value: torch.equal still tells them apart.
    a, b = torch.tensor([big, 5], dtype=dtype), torch.tensor([big + 1, 5], dtype=dtype)
    assert not torch.equal(a, b)
    rc, doc = diff_json(*pair_files(tmp_path, a, b))
    t = tensor_entry(doc, "t")
    assert rc == 1 and t["not_equal"] == 1 and t["outside_tolerance"] == 1 and t["max_abs_error"] == 1.0
    # Under a tolerance, torch.isclose casts integers to float32 first, where 2^62 and
    # 2^62 + 1 are one value: close under any tolerance, as torch says.
    for atol in ("0.5", "1"):
        close = bool(torch.isclose(a, b, rtol=0, atol=float(atol)).all())
        rc, doc = diff_json(*pair_files(tmp_path, a, b), "--atol", atol)
        assert (rc == 0) == close and tensor_entry(doc, "t")["max_abs_error"] == 1.0, doc
    # Across integer dtypes too (int32 against int64): the values decide, exactly.
    if dtype == torch.int64 and big > 0:
        rc, doc = diff_json(*pair_files(tmp_path, torch.tensor([7, 5], dtype=torch.int32), a))
        assert rc == 1 and tensor_entry(doc, "t")["not_equal"] == 1


# --- every element as torch reads it ---------------------------------------------------


def decoded(path, key, window=1000) -> list:
    p = subprocess.run([str(DECODE), str(path), key, str(window)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def as_pairs(t: torch.Tensor) -> list:
    t = t.reshape(-1)
    if t.is_complex():
        t = t.to(torch.complex128)
        return [[repr_float(z.real), repr_float(z.imag)] for z in t.tolist()]
    return [[repr_float(v), "0"] for v in t.double().tolist()]


def repr_float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "%.17g" % v


SMALL_FLOATS = [torch.float16, torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn,
                torch.float8_e5m2fnuz, torch.float8_e4m3fnuz, torch.float8_e8m0fnu]


@pytest.mark.parametrize("dtype", SMALL_FLOATS, ids=str)
def test_every_bit_pattern_decodes_as_torch_converts_it(tmp_path, dtype):
    bits = 16 if dtype.itemsize == 2 else 8
    raw = torch.arange(2**bits, dtype=torch.int32)
    t = (raw.to(torch.int16) if bits == 16 else raw.to(torch.uint8)).view(dtype)
    save_file({"t": t}, str(tmp_path / "t.safetensors"))
    got = decoded(tmp_path / "t.safetensors", "t", window=777)
    assert got == as_pairs(t.to(torch.float64) if dtype != torch.float8_e8m0fnu else t.float())


def test_integers_bool_complex_decode_as_torch_converts_them(tmp_path):
    g = torch.Generator().manual_seed(2)
    sd = {
        "i8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "i16": torch.tensor([-32768, 32767], dtype=torch.int16),
        "u16": torch.tensor([0, 65535], dtype=torch.uint16),
        "i32": torch.tensor([-2**31, 2**31 - 1], dtype=torch.int32),
        "u32": torch.tensor([0, 2**32 - 1], dtype=torch.uint32),
        "i64": torch.tensor([-2**63, 2**53, 2**63 - 1], dtype=torch.int64),
        "b": torch.tensor([True, False]),
        "f64": torch.randn(5, generator=g, dtype=torch.float64),
        "c32": torch.randn(4, generator=g, dtype=torch.complex64).to(torch.complex32),
        "c64": torch.randn(4, generator=g, dtype=torch.complex64),
        "c128": torch.randn(4, generator=g, dtype=torch.complex128),
    }
    torch.save(sd, tmp_path / "t.pt")
    for k, t in sd.items():
        want = as_pairs(t.to(torch.complex128) if t.is_complex() else t)
        if t.dtype in (torch.uint16, torch.uint32):
            want = [[repr_float(float(v)), "0"] for v in t.tolist()]
        assert decoded(tmp_path / "t.pt", k) == want, k


def test_strided_views_read_in_row_major_order(tmp_path):
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    views = {"t": base.t(), "sliced": base[1:5, 2:9:3], "plain": base}
    torch.save(views, tmp_path / "v.pt")
    loaded = torch.load(tmp_path / "v.pt", weights_only=True)
    assert not loaded["t"].is_contiguous()
    for k in views:
        assert decoded(tmp_path / "v.pt", k, window=7) == as_pairs(loaded[k]), k
    save_file({k: v.contiguous() for k, v in views.items()}, str(tmp_path / "v.safetensors"))
    rc, doc = diff_json(tmp_path / "v.pt", tmp_path / "v.safetensors")
    assert rc == 0, doc
    changed = {k: v.contiguous().clone() for k, v in views.items()}
    changed["t"][3, 4] += 1  # row-major index 3 * 6 + 4 of the transposed view
    save_file(changed, str(tmp_path / "w.safetensors"))
    rc, doc = diff_json(tmp_path / "v.pt", tmp_path / "w.safetensors")
    assert rc == 1 and tensor_entry(doc, "t")["first_outside"] == 3 * 6 + 4


# --- DCP written by two ranks: tensors assembled from pieces ---------------------------

SHARDED = HERE.parent / "data" / "diff" / "sharded"  # tests/data/diff/make.py


@pytest.fixture(scope="module")
def sharded_full(tmp_path_factory) -> Path:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path_factory.mktemp("sharded") / "full.pt"
    dcp_to_torch_save(str(SHARDED), str(out))
    return out


def test_assembled_dcp_equals_dcp_to_torch_save(sharded_full):
    rc, doc = diff_json(SHARDED, sharded_full)
    assert rc == 0, doc
    assert doc["values"]["identical"] == 5


@pytest.mark.parametrize("key", ["col", "uneven", "cube", "row", "plain"])
@pytest.mark.parametrize("window", [1, 4, 7, 1000])
def test_assembled_elements_in_row_major_order(sharded_full, key, window):
    # Shard(1) and Shard(2): every row is runs of two pieces; windows cut runs anywhere.
    full = torch.load(sharded_full, weights_only=True)
    assert decoded(SHARDED, key, window=window) == as_pairs(full[key])


def test_assembled_difference_found_where_torch_puts_it(sharded_full, tmp_path):
    full = torch.load(sharded_full, weights_only=True)
    full["cube"][1, 2, 3] += 1
    save_file(full, str(tmp_path / "changed.safetensors"))
    rc, doc = diff_json(SHARDED, tmp_path / "changed.safetensors")
    t = tensor_entry(doc, "cube")
    assert rc == 1 and t["outside_tolerance"] == 1 and t["first_outside"] == 1 * 12 + 2 * 4 + 3
    assert t["max_abs_error"] == 1


class Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("buf", torch.arange(4.0))

    def forward(self, x):
        return self.lin(x) + self.buf.sum()


def test_torchscript_weights_against_their_state_dict(tmp_path):
    m = torch.jit.script(Scripted())
    torch.jit.save(m, tmp_path / "m.pt")
    sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(tmp_path / "sd.safetensors"))
    rc, doc = diff_json(tmp_path / "m.pt", tmp_path / "sd.safetensors")
    assert rc == 0 and doc["paired"] == 3, doc
    sd["lin.bias"] = sd["lin.bias"] + 1
    save_file(sd, str(tmp_path / "changed.safetensors"))
    rc, doc = diff_json(tmp_path / "m.pt", tmp_path / "changed.safetensors")
    assert rc == 1 and tensor_entry(doc, "lin.bias")["outside_tolerance"] == 2


# --- refusals ---------------------------------------------------------------------------


def test_unreadable_input_is_exit_3_naming_the_file(formats, tmp_path):
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(formats["st"].read_bytes()[:-10])
    rc, out, err = diff(formats["st"], bad)
    assert rc == 3 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(bad) in err


def test_usage(formats):
    rc, _, err = run_ckptool("diff", formats["st"])
    assert rc == 2 and err.startswith("ckptool: usage: ") and "(see 'ckptool diff --help')" in err
    # torch refuses a negative or NaN tolerance; an infinite one would admit every value.
    # Decimal numbers only: no hex floats, no spaces around.
    for flag, value in [("--atol", "-1"), ("--atol", "nan"), ("--rtol", "nan"), ("--atol", "inf"),
                        ("--rtol", "1e400"), ("--atol", "0x1"), ("--rtol", " 1"), ("--atol", "1e-3 "),
                        ("--atol", "infinity")]:
        rc, _, err = run_ckptool("diff", flag, value, formats["st"], formats["pt"])
        assert rc == 2 and f"{flag}: expected a finite number >= 0, got '{value}'" in err, (flag, value, err)


def test_hostile_key_is_escaped(tmp_path):
    torch.save({"a\nb\x1b[2J": torch.ones(2), "w": torch.ones(1)}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(1)}, tmp_path / "b.pt")
    rc, out, _ = diff(tmp_path / "a.pt", tmp_path / "b.pt")
    assert rc == 1
    assert '  only in A: "a\\nb\\x1b[2J"' in out
    assert "\x1b" not in out


def test_a_float16_error_that_overflows_float16_is_never_close(tmp_path):
    """torch.allclose takes |a - b| in float16: 60000 - -60000 is inf there, so not close
    under any tolerance; in float32 it is 120000, within rtol 3 of 60000."""
    a = torch.tensor([60000.0, 1.0], dtype=torch.float16)
    b = torch.tensor([-60000.0, 1.0], dtype=torch.float16)
    torch.save({"t": a}, tmp_path / "a.pt")
    torch.save({"t": b}, tmp_path / "b.pt")
    assert not torch.allclose(a, b, rtol=3.0)
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "b.pt", "--rtol", "3")
    assert rc == 1, (out, err)
    near = torch.tensor([30000.0, 1.0], dtype=torch.float16)  # |a - near| = 30000: finite
    torch.save({"t": near}, tmp_path / "near.pt")
    assert torch.allclose(a, near, rtol=3.0)
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "near.pt", "--rtol", "3")
    assert rc == 0, (out, err)


@pytest.mark.parametrize("tol", ["4e-320", "1e-400"])
def test_a_tolerance_below_the_normal_doubles_is_a_number(tmp_path, tol):
    """Python reads 4e-320 as a subnormal and 1e-400 as 0.0; both are tolerances torch takes."""
    torch.save({"t": torch.ones(2)}, tmp_path / "a.pt")
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "a.pt", "--atol", tol, "--rtol", tol)
    assert rc == 0, (out, err)
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "a.pt", "--atol", "1e400")
    assert rc == 2, (out, err)
