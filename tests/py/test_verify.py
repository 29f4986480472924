"""`ckptool verify`: CRC of every record, views, safetensors ranges, unsafe globals.
The damaged files are made by flipping bytes of files real torch wrote, at offsets that
Python's zipfile reports, so the expectations do not come from ckptool's own reader."""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import run_ckptool

PYTORCH_FORMATS = ("plain", "tied", "views", "dtypes", "lightning", "legacy", "safetensors", "scripted", "meta")


def verify(path, *extra):
    rc, out, err = run_ckptool("verify", "--json", path, *extra)
    return rc, (json.loads(out) if out.strip() else None), err


@pytest.mark.parametrize("name", PYTORCH_FORMATS)
def test_files_written_by_pytorch_verify(fixture_set, name):
    if name not in fixture_set:
        pytest.skip(f"fixture {name} not built")
    rc, doc, err = verify(fixture_set[name].path)
    assert rc == 0, (name, doc, err)
    assert doc["ok"] and doc["problems"] == []


def _data_offset(path: Path, member_suffix: str) -> tuple[str, int]:
    """The file offset of the first data byte of a member, from Python's zipfile."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len = int.from_bytes(f.read(2), "little")
        extra_len = int.from_bytes(f.read(2), "little")
    return info.filename, info.header_offset + 30 + name_len + extra_len


def test_flipped_tensor_byte_is_a_crc_mismatch(fixture_set, tmp_path):
    src = fixture_set["plain"].path
    bad = tmp_path / "flipped.pt"
    shutil.copy(src, bad)
    name, offset = _data_offset(bad, "data/0")
    raw = bytearray(bad.read_bytes())
    raw[offset] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with zipfile.ZipFile(bad) as z:  # the reference agrees the member is damaged
        assert z.testzip() == name
    rc, doc, err = verify(bad)
    assert rc == 1, (doc, err)
    assert any("CRC-32 mismatch" in p and name in p for p in doc["problems"]), doc
    # inspect does not read tensor data, so it only notices when asked to.
    assert run_ckptool("inspect", bad)[0] == 0
    rc, _, err = run_ckptool("inspect", "--verify-crc", bad)
    assert rc == 3 and len(err.strip().splitlines()) == 1, err


def test_files_saved_without_crc_verify_with_a_note(tmp_path):
    path = tmp_path / "nocrc.pt"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({"w": torch.arange(10.0)}, path)
    finally:
        torch.serialization.set_crc32_options(True)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(10.0))
    rc, doc, err = verify(path)
    assert rc == 0, (doc, err)
    assert doc["records_without_crc"] >= 1 and any("no CRC" in n for n in doc["notes"])


def test_unsafe_globals_fail_verification(fixture_set):
    fx = fixture_set["malicious"]
    expected = set(torch.serialization.get_unsafe_globals_in_checkpoint(fx.path))
    rc, doc, err = verify(fx.path)
    assert rc == 1
    assert set(doc["unsafe_globals"]) == expected and expected
    assert any(g in p for g in expected for p in doc["problems"])


def test_corrupt_structure_is_a_failed_check_not_a_crash(tmp_path, fixture_set):
    bad = tmp_path / "truncated.pt"
    raw = fixture_set["plain"].path.read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    rc, doc, err = verify(bad)
    assert rc == 1 and not doc["ok"] and doc["format"] is None
    assert str(bad) in doc["problems"][0]


def test_missing_file_is_an_io_error(tmp_path):
    rc, out, err = run_ckptool("verify", tmp_path / "absent.pt")
    assert rc == 4 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt", ["torch_save", "torchscript"])
def test_an_archive_without_a_version_record_fails_as_torch_refuses_it(tmp_path, fmt):
    good = tmp_path / "good.pt"
    if fmt == "torch_save":
        torch.save({"w": torch.tensor([1.0, 2.0, 3.0])}, good)
    else:
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), good)
    bad = tmp_path / "noversion.pt"
    with zipfile.ZipFile(good) as zi, zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            if info.filename.split("/", 1)[1] not in ("version", ".data/version"):
                zo.writestr(info.filename, zi.read(info))
    with pytest.raises(RuntimeError, match="version"):  # the reference refuses it
        (torch.load(bad, weights_only=True) if fmt == "torch_save" else torch.jit.load(bad))
    rc, doc, err = verify(bad)
    assert rc == 1 and not doc["ok"], (doc, err)
    assert any("no version record" in p for p in doc["problems"]), doc
    rc, out, err = run_ckptool("inspect", bad)
    assert rc == 3 and out == "" and "no version record" in err and err.count("\n") == 1, err
    rc, out, err = run_ckptool("diff", good, bad)
    assert rc == 3 and out == "", (out, err)
