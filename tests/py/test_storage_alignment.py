"""`.storage_alignment` is read once, as torch.load reads it (Python's int()), and rekey pads
its output to that value: it copies the record, and torch.load's calculate_storage_offsets
mode computes every data offset from it without reading local headers."""

from __future__ import annotations

import zipfile

import torch
from torch.utils.serialization import config

import hostile as H
from conftest import run_ckptool


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {f"layer{i}.weight": torch.randn(3 + i, 5, generator=g) for i in range(6)}


def _data_offsets(path) -> dict[str, int]:
    out = {}
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        for i in z.infolist():
            n = int.from_bytes(raw[i.header_offset + 26:i.header_offset + 28], "little")
            x = int.from_bytes(raw[i.header_offset + 28:i.header_offset + 30], "little")
            out[i.filename] = i.header_offset + 30 + n + x
    return out


def test_rekey_pads_to_the_alignment_torch_load_reads(tmp_path):
    saved = tmp_path / "a128.pt"
    old = config.save.storage_alignment
    config.save.storage_alignment = 128
    try:
        torch.save(_state(), saved)
    finally:
        config.save.storage_alignment = old
    # The same value as torch.load's int() reads it, written the way a hand-edited or
    # other-tool file might: not bare digits.
    src = tmp_path / "spaced.pt"
    src.write_bytes(H.replace_record(saved.read_bytes(), ".storage_alignment", b" 128\n"))
    expected = torch.load(src, weights_only=True)

    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("rekey", src, "-o", out, "--add-prefix", "m.")
    assert rc == 0, err
    data = {k: v for k, v in _data_offsets(out).items() if "/data/" in k}
    assert data and all(off % 128 == 0 for off in data.values()), data

    config.load.calculate_storage_offsets = True
    try:
        got = torch.load(out, weights_only=True)
    finally:
        config.load.calculate_storage_offsets = False
    assert sorted(got) == sorted("m." + k for k in expected)
    for k, v in expected.items():
        assert torch.equal(got["m." + k], v), k


def test_an_alignment_no_zip_writer_can_reproduce_is_refused_by_rekey(tmp_path):
    src = tmp_path / "huge.pt"
    torch.save(_state(), src)
    src.write_bytes(H.replace_record(src.read_bytes(), ".storage_alignment", b"1_000_000"))
    torch.load(src, weights_only=True)  # torch reads it: the value only matters for offsets
    assert run_ckptool("inspect", src)[0] == 0
    rc, out, err = run_ckptool("rekey", src, "-o", tmp_path / "out.pt", "--add-prefix", "m.")
    assert rc == 3 and "storage_alignment" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.pt").exists()
