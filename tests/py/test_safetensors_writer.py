"""The streaming safetensors writer (src/formats/safetensors_writer.cpp) against the
reference library, and the Hub's shard plan (src/formats/hf_shard_plan.cpp) against
huggingface_hub (formats.md §6.1, §10.5; issue 15).

Our file must be byte-identical to `safetensors.torch.save_file`'s for the same tensors and
load in safe_open and torch with identical tensors; refusals leave nothing behind. The
shard plan must equal `split_torch_state_dict_into_shards` key for key and file for file.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

from conftest import SOURCE_DIR  # noqa: E402

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", SOURCE_DIR / "build"))
WRITE = BUILD_DIR / "tests" / "safetensors_write"
SHARDS = BUILD_DIR / "tests" / "hf_shard_plan"

# Every dtype safetensors 0.8.0 holds, as torch names them.
WRITABLE = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
            torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
            torch.complex64, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e5m2fnuz,
            torch.float8_e4m3fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]


def _run(tool: Path, *args) -> tuple[int, dict]:
    p = subprocess.run([str(tool), *map(str, args)], capture_output=True, timeout=120)
    return p.returncode, json.loads(p.stdout.decode())


def _random(dtype, shape, gen) -> "torch.Tensor":
    n = 1
    for d in shape:
        n *= d
    itemsize = torch.empty((), dtype=dtype).element_size() if dtype != torch.float4_e2m1fn_x2 else 1
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def _raw(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _describe(sd: dict, metadata, tmp: Path, order=None) -> Path:
    """The tool's JSON description of `sd`, bytes in a blob in `order` (default: reversed,
    so the writer's own sort is what puts them in place)."""
    names = list(order) if order is not None else list(reversed(list(sd)))
    blob = bytearray()
    tensors = []
    for name in names:
        t = sd[name]
        raw = _raw(t)
        tensors.append({"name": name, "dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape),
                        "offset": len(blob), "nbytes": len(raw)})
        blob += raw
    (tmp / "blob.bin").write_bytes(bytes(blob))
    desc = tmp / "desc.json"
    desc.write_text(json.dumps({"data": str(tmp / "blob.bin"), "metadata": metadata, "tensors": tensors}))
    return desc


def _same_tensors(path: Path, sd: dict):
    loaded = safetensors_torch.load_file(str(path))
    assert list(sorted(loaded)) == sorted(sd)
    for k, t in sd.items():
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape, k
        assert _raw(loaded[k]) == _raw(t), k
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(sd)
        for k in sd:
            assert _raw(f.get_tensor(k)) == _raw(sd[k]), k


def _fixtures():
    gen = torch.Generator().manual_seed(15)
    out = {}
    out["every_dtype"] = ({f"t_{str(dt).split('.')[-1]}": _random(dt, (2, 3), gen) for dt in WRITABLE}, {"format": "pt"})
    out["zero_dim"] = ({f"s_{str(dt).split('.')[-1]}": _random(dt, (), gen) for dt in WRITABLE
                        if dt != torch.float4_e2m1fn_x2}, None)
    out["empty"] = ({"e0": torch.zeros(0), "e1": torch.zeros(3, 0, 2, dtype=torch.float16), "e2": torch.zeros(0, dtype=torch.int64),
                     "x": torch.ones(1, dtype=torch.int8), "b": torch.zeros(0, dtype=torch.bool)}, {})
    out["long_names"] = ({"a" * 5000: torch.ones(3), "b" * 70 + ".weight": torch.ones(1, dtype=torch.int16)}, {"format": "pt"})
    out["unicode_names"] = ({"é": torch.ones(1), "😀.w": torch.ones(2), "Z": torch.ones(1), "a": torch.ones(1),
                             "q\"uo\\te": torch.ones(1), "ctl\n\t\x01\x1f\x7f/": torch.ones(1), "€": torch.ones(1)},
                            {"note": "é\n\x02\"\\/"})
    out["one_metadata_pair"] = ({"w": torch.ones(4, 4)}, {"format": "pt"})
    out["no_tensors"] = ({}, {"format": "pt"})
    out["no_tensors_no_metadata"] = ({}, None)
    rng = random.Random(15)
    many = {}
    for i in range(3000):
        dt = rng.choice(WRITABLE)
        shape = tuple(rng.randint(0, 3) for _ in range(rng.randint(0, 3)))
        if dt == torch.float4_e2m1fn_x2 and not shape:
            shape = (2,)
        many[f"layer.{rng.randint(0, 99)}.p{i}"] = _random(dt, shape, gen)
    out["many"] = (many, {"format": "pt"})
    return out


FIXTURES = _fixtures()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_byte_identical_to_save_file(name, tmp_path):
    sd, metadata = FIXTURES[name]
    ref = tmp_path / "ref.safetensors"
    safetensors_torch.save_file(sd, str(ref), metadata=metadata)
    ours = tmp_path / "ours.safetensors"
    rc, out = _run(WRITE, "json", _describe(sd, metadata, tmp_path), ours)
    assert rc == 0, out
    assert ours.read_bytes() == ref.read_bytes()
    assert out["file_size"] == ref.stat().st_size
    _same_tensors(ours, sd)
    # The same through ckptool's reader: the writer is handed the tensors in reverse order.
    copied = tmp_path / "copied.safetensors"
    rc, out = _run(WRITE, "copy", ref, copied)
    if metadata == {}:
        # The reader does not tell an empty `__metadata__` from none; the copy drops it.
        assert rc == 0 and copied.read_bytes() != ref.read_bytes()
    else:
        assert rc == 0, out
        assert copied.read_bytes() == ref.read_bytes()


def test_metadata_pairs_keep_their_order(tmp_path):
    # The reference writes several pairs in its HashMap's order, which changes from run to
    # run; ours keeps the given order. The headers agree as JSON, the data byte for byte.
    sd = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    metadata = {"format": "pt", "z": "1", "a": "2", "é": "3"}
    ref = tmp_path / "ref.safetensors"
    safetensors_torch.save_file(sd, str(ref), metadata=metadata)
    ours = tmp_path / "ours.safetensors"
    rc, out = _run(WRITE, "json", _describe(sd, metadata, tmp_path), ours)
    assert rc == 0, out
    a, b = ref.read_bytes(), ours.read_bytes()
    n = struct.unpack("<Q", a[:8])[0]
    assert struct.unpack("<Q", b[:8])[0] == n
    assert json.loads(a[8:8 + n]) == json.loads(b[8:8 + n])
    assert list(json.loads(b[8:8 + n])["__metadata__"]) == list(metadata)
    assert a[8 + n:] == b[8 + n:]
    _same_tensors(ours, sd)
    with safe_open(str(ours), framework="pt") as f:
        assert f.metadata() == metadata


def _refused(tmp_path, tensors, metadata=None, kind="unsupported"):
    (tmp_path / "blob.bin").write_bytes(bytes(64))
    desc = tmp_path / "desc.json"
    desc.write_text(json.dumps({"data": str(tmp_path / "blob.bin"), "metadata": metadata, "tensors": tensors}))
    out_path = tmp_path / "out.safetensors"
    out_path.write_bytes(b"old")
    before = sorted(os.listdir(tmp_path))
    rc, out = _run(WRITE, "json", desc, out_path)
    assert (rc, out["ok"], out["kind"]) == (3, False, kind), out
    assert out_path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left
    return out["message"]


def _t(name, dtype="float32", shape=(1,), nbytes=4, **kw):
    return {"name": name, "dtype": dtype, "shape": list(shape), "offset": 0, "nbytes": nbytes, **kw}


@pytest.mark.parametrize("dtype,nbytes", [("complex128", 16), ("complex32", 4), ("qint8", 1), ("quint4x2", 1), ("bits8", 1)])
def test_refuses_dtypes_safetensors_cannot_hold(tmp_path, dtype, nbytes):
    assert "no dtype" in _refused(tmp_path, [_t("x", dtype, (1,), nbytes)])
    # The reference cannot either.
    if dtype in ("complex128", "complex32"):
        with pytest.raises(Exception):
            safetensors_torch.save_file({"x": torch.zeros(1, dtype=getattr(torch, dtype))}, str(tmp_path / "r"))


def test_refuses_bad_names_and_sizes(tmp_path):
    assert "twice" in _refused(tmp_path, [_t("a"), _t("b"), _t("a")])
    assert "empty name" in _refused(tmp_path, [_t("")])
    assert "__metadata__" in _refused(tmp_path, [_t("__metadata__")])
    assert "not UTF-8" in _refused(tmp_path, [{**_t(""), "name_hex": "61ff"}])
    assert "not UTF-8" in _refused(tmp_path, [{**_t(""), "name_hex": "eda080"}])  # a surrogate
    assert "holds 8" in _refused(tmp_path, [_t("a", "float32", (2,), 4)])
    assert "0-dim" in _refused(tmp_path, [_t("a", "float4_e2m1fn_x2", (), 1)])
    assert "negative" in _refused(tmp_path, [_t("a", "float32", (-1,), 0)])
    assert "overflows" in _refused(tmp_path, [_t("a", "float64", (2**62, 4), 0)])
    _refused(tmp_path, [_t("a" * 70000)], kind="limit")
    _refused(tmp_path, [_t("a", "float32", (1,) * 65)], kind="limit")


def test_a_lying_source_leaves_nothing(tmp_path):
    # The source hands the writer fewer (or more) bytes than a tensor's nbytes: the file
    # is not committed, the old one stays.
    assert "3 of its 4 bytes" in _refused(tmp_path, [_t("a"), _t("b", supply=3)], kind="corrupt")
    assert "more than its 4 bytes" in _refused(tmp_path, [_t("a", supply=8)], kind="corrupt")


# ---- the Hub's shard plan ----

def _hub_split(sd, max_shard_size, pattern=None):
    from huggingface_hub import split_torch_state_dict_into_shards
    kw = {"max_shard_size": max_shard_size}
    if pattern:
        kw["filename_pattern"] = pattern
    return split_torch_state_dict_into_shards(sd, **kw)


def _our_split(sd, max_shard_size, tmp_path, pattern=None):
    from huggingface_hub.serialization._torch import get_torch_storage_id, get_torch_storage_size
    ids: dict = {}
    tensors = []
    for k, t in sd.items():
        sid = get_torch_storage_id(t)
        tensors.append([k, None if sid is None else ids.setdefault(sid, len(ids)), get_torch_storage_size(t)])
    desc = {"max_shard_size": max_shard_size, "tensors": tensors}
    if pattern:
        desc["pattern"] = pattern
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(desc))
    return _run(SHARDS, path)


def _compare(sd, max_shard_size, tmp_path, pattern=None):
    hub = _hub_split(sd, max_shard_size, pattern)
    rc, ours = _our_split(sd, max_shard_size, tmp_path, pattern)
    assert rc == 0, ours
    assert ours["is_sharded"] == hub.is_sharded
    assert ours["metadata"] == hub.metadata
    assert ours["filename_to_tensors"] == [[f, list(ks)] for f, ks in hub.filename_to_tensors.items()]
    assert ours["tensor_to_filename"] == [[k, f] for k, f in hub.tensor_to_filename.items()]
    return hub


def _bytes(n):
    return torch.zeros(n, dtype=torch.uint8)


def _state_dicts():
    rng = random.Random(1515)
    cases = {}
    for seed in range(6):  # sizes around the limit of 1000 bytes, ties included
        r = random.Random(seed)
        cases[f"around_limit_{seed}"] = {f"k{i}": _bytes(r.choice([0, 1, 499, 500, 501, 999, 1000, 1001, 250]))
                                         for i in range(40)}
    cases["exact_ties"] = {f"k{i}": _bytes(n) for i, n in enumerate([500, 500, 1000, 250, 750, 1000, 1, 999])}
    cases["huge_first"] = {"big": _bytes(5000), "a": _bytes(600), "b": _bytes(600)}
    cases["huge_middle"] = {"a": _bytes(600), "big": _bytes(5000), "b": _bytes(300), "c": _bytes(600)}
    cases["huge_last"] = {"a": _bytes(600), "b": _bytes(600), "big": _bytes(1001)}
    cases["many_small"] = {f"layer.{i}.w": _bytes(4) for i in range(2000)}
    base = _bytes(800)
    tied = torch.ones(100, dtype=torch.float32)  # 400 bytes
    cases["shared"] = {"emb": tied, "a": _bytes(700), "view0": base[:10], "b": _bytes(300), "view1": base[10:],
                       "lm_head": tied, "c": _bytes(900), "view2": base.view(2, 400)}
    cases["empties_share_pointer_zero"] = {"e0": torch.zeros(0), "a": _bytes(900), "e1": torch.zeros(0, 3),
                                           "b": _bytes(900), "e2": torch.zeros(0, dtype=torch.int64)}
    cases["meta"] = {"m0": torch.empty(100, device="meta"), "a": _bytes(700), "m1": torch.empty(100, device="meta")}
    cases["empty_dict"] = {}
    cases["random"] = {f"p{i}": _bytes(rng.randint(0, 1500)) for i in range(300)}
    return cases


SHARD_CASES = _state_dicts()


@pytest.mark.parametrize("name", sorted(SHARD_CASES))
@pytest.mark.parametrize("limit", ["1KB", 1000, "0.5KB", "1.1KB", "0KB", "5GB", 1])
def test_shard_plan_matches_huggingface_hub(name, limit, tmp_path):
    _compare(SHARD_CASES[name], limit, tmp_path)


def test_shard_plan_names(tmp_path):
    hub = _compare(SHARD_CASES["many_small"], "1KB", tmp_path)
    assert list(hub.filename_to_tensors)[0] == "model-00001-of-00008.safetensors"
    _compare(SHARD_CASES["huge_middle"], "1KB", tmp_path, pattern="pytorch_model{suffix}.bin")
    hub = _compare(SHARD_CASES["huge_middle"], "1TB", tmp_path, pattern="pytorch_model{suffix}.bin")
    assert list(hub.filename_to_tensors) == ["pytorch_model.bin"]
    # Past five digits, as Python's {:05d} widens. The Hub's own split is quadratic in the
    # shard count (minutes here), so its naming rule is applied directly.
    n = 100_001
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"max_shard_size": 1, "tensors": [[f"k{i}", None, 1] for i in range(n)]}))
    rc, out = _run(SHARDS, path)
    assert rc == 0
    want = ["model{suffix}.safetensors".format(suffix=f"-{i + 1:05d}-of-{n:05d}") for i in range(n)]
    assert [f for f, _ in out["filename_to_tensors"]] == want


SIZES = ["5GB", "5gb", "5Gb", " 1.5 MB ", "1.1GB", "0.1KB", "2e3MB", "1_000KB", "3.0000001TB", ".5KB", "5.KB",
         "5 gB", "+5KB", "0KB", "1E1kb", "\t7MB\n", "9999999999TB", "123456789.123456789KB", "0.3KB", "4.35GB",
         # refused by the Hub too
         "5B", "GB", "5XB", "abcKB", "5 G B", "1__0KB", "_1KB", "1_KB", "", "K", "5GB5", "infKB", "nanKB"]
STRICTER = ["-1KB", "-0.5GB"]  # the Hub returns a negative size; we refuse


def test_max_shard_size_strings(tmp_path):
    from huggingface_hub.serialization._base import parse_size_to_int
    path = tmp_path / "sizes.json"
    path.write_text(json.dumps({"sizes": SIZES + STRICTER}))
    rc, out = _run(SHARDS, path)
    assert rc == 0, out
    for text, ours in zip(SIZES + STRICTER, out["sizes"]):
        try:
            want = parse_size_to_int(text)
        except (ValueError, OverflowError):
            want = {"kind": "usage"}
        if text in STRICTER:
            assert want < 0 and ours == {"kind": "usage"}, text
        elif isinstance(want, int) and want >= 2**64:
            assert ours == 2**64 - 1, text  # Python's int has no end; ours saturates
        else:
            assert ours == want, (text, ours, want)


def test_shard_plan_refusals(tmp_path):
    path = tmp_path / "plan.json"
    for desc in [{"max_shard_size": "1KB", "tensors": [["a", None, 1], ["a", None, 1]]},
                 {"max_shard_size": "1KB", "pattern": "model.safetensors", "tensors": []},
                 {"max_shard_size": "1KB", "pattern": "m{suffix}{x}.bin", "tensors": []},
                 {"max_shard_size": "5B", "tensors": []}]:
        path.write_text(json.dumps(desc))
        rc, out = _run(SHARDS, path)
        assert (rc, out["kind"]) == (2, "usage"), (desc, out)
