"""One CRC-32 rule for every verb (issue 13 item 1): `verify`, `inspect --verify-crc` and
`materialize --verify-crc` share zip::archive::record_crc, so they cannot disagree.

PyTorch's rule, which ours mirrors: torch.save with torch.serialization.set_crc32_options(False)
leaves every record's CRC field 0, and torch.load never checks CRCs, so such a file loads.
Before the fix, `verify` accepted it while `inspect --verify-crc` called it corrupt (exit 3).
The reference here is torch.load on files real torch wrote; nothing is judged by our writer.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest
import torch

import reference as R
from conftest import TIME_SCALE, corpora_dir, run_ckptool


def _save_without_crc(path: Path, obj) -> None:
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(obj, path)
    finally:
        torch.serialization.set_crc32_options(True)


def _state() -> dict:
    g = torch.Generator().manual_seed(13)
    w = torch.randn(6, 5, generator=g)
    return {
        "w": w,
        "w_t": w.t(),  # a view sharing w's storage
        "b": torch.arange(7, dtype=torch.int64),
        "h": torch.randn(3, generator=g).to(torch.bfloat16),
        "empty": torch.ones(0),  # its record is empty: CRC 0 is its real CRC
        "step": 12,
    }


def test_saved_without_crc_passes_every_verb_as_torch_load_does(tmp_path):
    path = tmp_path / "nocrc.pt"
    _save_without_crc(path, _state())
    with zipfile.ZipFile(path) as z:  # what PyTorch's writer did: every CRC field is 0
        assert all(i.CRC == 0 for i in z.infolist())
    ref = torch.load(path, weights_only=True)  # ... and its reader accepts it

    rc, out, err = run_ckptool("inspect", "--json", "--verify-crc", path)
    assert rc == 0, err
    # (reference.compare reads data.pkl with Python's zipfile, which checks CRCs and so
    # refuses this file; the comparison with torch.load is spelled out here instead.)
    doc = json.loads(out)
    by_key = {t["path"][-1]: t for t in doc["tensors"]}
    storages = {s["key"]: s for s in doc["storages"]}
    raw = path.read_bytes()
    tensors = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}
    assert sorted(by_key) == sorted(tensors)
    for k, v in tensors.items():
        t = by_key[k]
        assert (t["dtype"], t["shape"], t["stride"], t["storage_offset"]) == \
            (R.dtype_name(v.dtype), list(v.shape), list(v.stride()), v.storage_offset()), k
        s = storages[t["storage"]]
        assert raw[s["offset"]:s["offset"] + s["nbytes"]] == bytes(v.untyped_storage()), k
    assert by_key["w"]["storage"] == by_key["w_t"]["storage"]  # shared, as in torch
    assert [e["path"] for e in doc["entries"]] == [["step"]]

    rc, out, err = run_ckptool("verify", "--json", path)
    doc = json.loads(out)
    assert rc == 0 and doc["ok"], (doc, err)
    non_empty = sum(1 for i in zipfile.ZipFile(path).infolist() if i.file_size)
    assert doc["records_without_crc"] == non_empty

    out_pt = tmp_path / "materialized.pt"
    rc, _, err = run_ckptool("materialize", path, "--device", "cpu", "--verify-crc", "-o", out_pt,
                             timeout=120 * TIME_SCALE)
    assert rc == 0, err
    got = torch.load(out_pt, weights_only=True)
    for k, v in ref.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def _crc_field_offsets(path: Path, member_suffix: str) -> list[int]:
    """Offsets of a member's CRC field in its local header and central directory entry, and
    in its data descriptor, found with Python's zipfile (not with our reader)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
        cd_offset = z.start_dir
    raw = path.read_bytes()
    offsets = [info.header_offset + 14]
    name_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    data_end = info.header_offset + 30 + name_len + extra_len + info.compress_size
    if info.flag_bits & 0x8:
        assert raw[data_end:data_end + 4] == b"PK\x07\x08"
        offsets.append(data_end + 4)
    pos = cd_offset
    while raw[pos:pos + 4] == b"PK\x01\x02":
        n, x, c = (int.from_bytes(raw[pos + o:pos + o + 2], "little") for o in (28, 30, 32))
        if raw[pos + 46:pos + 46 + n].decode() == info.filename:
            offsets.append(pos + 16)
        pos += 46 + n + x + c
    assert len(offsets) >= 2
    return offsets


def _with_crc(src: Path, dst: Path, member_suffix: str, crc: int) -> None:
    shutil.copy(src, dst)
    raw = bytearray(dst.read_bytes())
    for off in _crc_field_offsets(dst, member_suffix):
        raw[off:off + 4] = crc.to_bytes(4, "little")
    dst.write_bytes(bytes(raw))


def _verdicts(path: Path) -> tuple[int, int, int]:
    """(inspect --verify-crc, verify, materialize --verify-crc) exit codes."""
    a = run_ckptool("inspect", "--verify-crc", path)[0]
    b = run_ckptool("verify", path)[0]
    c = run_ckptool("materialize", path, "--device", "meta", "--verify-crc", timeout=120 * TIME_SCALE)[0]
    return a, b, c


def test_one_zeroed_crc_is_not_recorded_and_a_wrong_one_is_refused_by_all_verbs(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(12.0).reshape(3, 4)}, good)
    assert _verdicts(good) == (0, 0, 0)

    zeroed = tmp_path / "zeroed.pt"
    _with_crc(good, zeroed, "data/0", 0)
    torch.load(zeroed, weights_only=True)  # torch does not check CRCs
    assert _verdicts(zeroed) == (0, 0, 0)

    wrong = tmp_path / "wrong.pt"
    _with_crc(good, wrong, "data/0", 0x12345678)
    with zipfile.ZipFile(wrong) as z:  # the reference says the member is damaged
        assert z.testzip() is not None
    assert _verdicts(wrong) == (3, 1, 3)


CORPORA = corpora_dir()
CORPUS_FILES = sorted(str(p.relative_to(CORPORA)) for p in CORPORA.rglob("*") if p.is_file()) \
    if CORPORA.is_dir() else []


def test_corpora_present():
    assert CORPORA.is_dir() and len(CORPUS_FILES) > 100, \
        f"corpora not found at {CORPORA} (set CKPTOOL_CORPORA)"


@pytest.mark.parametrize("rel", CORPUS_FILES)
def test_three_verbs_agree_on_corpus_file(rel):
    """Each verb reads the file (0) or refuses it; they never split on the CRC. `verify`
    reports damage it can read past as a failed check (1) and an unreadable format as 3;
    inspect and materialize refuse both with 3."""
    p = CORPORA / rel
    t0 = time.perf_counter()
    inspect_rc, verify_rc, materialize_rc = _verdicts(p)
    assert time.perf_counter() - t0 < 30 * TIME_SCALE
    assert inspect_rc in (0, 3) and materialize_rc in (0, 3) and verify_rc in (0, 1, 3), \
        (inspect_rc, verify_rc, materialize_rc)
    assert inspect_rc == materialize_rc, (inspect_rc, verify_rc, materialize_rc)
    assert (inspect_rc == 0) == (verify_rc == 0), (inspect_rc, verify_rc, materialize_rc)
