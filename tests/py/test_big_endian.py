"""Files saved on a big-endian host (record `byteorder` = "big", every storage's elements
byte-swapped; a complex number's two parts each on its own, torch/storage.py `byteswap`).
No little-endian torch writes one, so the files are made from real torch.save files by
swapping their data records as a big-endian host would have written them; torch.load,
which swaps them back, is the judge of what they hold."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from conftest import run_ckptool

VALUES = {
    "f32": torch.tensor([1.0, -2.5, 3.25]),
    "i64": torch.tensor([1, -2, 2**40 + 3]),
    "c64": torch.tensor([1 + 2j, -3.5 + 0.25j], dtype=torch.complex64),
    "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    "u8": torch.tensor([1, 2, 250], dtype=torch.uint8),
}


def swap_width(t: torch.Tensor) -> int:
    return t.element_size() // 2 if t.is_complex() else t.element_size()


def as_big_endian(src: Path, dst: Path, values: dict) -> None:
    """src (a torch.save of `values`, one storage each) as a big-endian host writes it."""
    # torch.save numbers storages in the order the pickler meets them: the dict's order.
    widths = [swap_width(t) for t in values.values()]
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            data = zi.read(info)
            name = info.filename.split("/", 1)[1]
            if name == "byteorder":
                data = b"big"
            elif name.startswith("data/"):
                w = widths[int(name[5:])]
                data = b"".join(data[i:i + w][::-1] for i in range(0, len(data), w))
            zo.writestr(info, data)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    torch.save(VALUES, d / "little.pt")
    as_big_endian(d / "little.pt", d / "big.pt", VALUES)
    # The same bytes under "big": torch.load reads other values.
    as_big_endian(d / "little.pt", d / "swapped_twice.pt", VALUES)
    as_big_endian(d / "swapped_twice.pt", d / "misread.pt", VALUES)
    return d


def test_the_reference_reads_them(files):
    big = torch.load(files / "big.pt", weights_only=True)
    assert all(torch.equal(big[k], v) for k, v in VALUES.items())
    misread = torch.load(files / "misread.pt", weights_only=True)
    assert not torch.equal(misread["f32"], VALUES["f32"]) and not torch.equal(misread["c64"], VALUES["c64"])


def test_diff_compares_the_values_torch_load_gives(files):
    rc, out, err = run_ckptool("diff", files / "little.pt", files / "big.pt")
    assert rc == 0, (out, err)
    rc, out, err = run_ckptool("diff", "--json", files / "little.pt", files / "misread.pt")
    assert rc == 1, (out, err)
    import json
    differ = {t["key_a"] for t in json.loads(out)["tensors"] if t["values"] == "different"}
    assert differ == {"f32", "i64", "c64", "bf16"}, out  # bytes of one are never swapped


def test_materialize_writes_the_values_torch_load_gives(files, tmp_path):
    rc, out, err = run_ckptool("materialize", files / "big.pt", "--device", "cpu", "-o", tmp_path / "out.pt")
    assert rc == 0, err
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    ref = torch.load(files / "big.pt", weights_only=True)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k
