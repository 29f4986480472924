"""Whole loads of tensors whose bytes are not 64-byte aligned in their file
(src/torch/loader/cpu_loader.cpp). A safetensors tensor starts at 8 + header length +
its offset, any multiple of its element size, so in real files most are not; LibTorch's
64-byte alignment then keeps the destination from being congruent with the file. Such
tensors must still be filled page by page from a mapping of the file (UFFDIO_COPY), not
read by pread into zeroed pages (which costs the zeroing: 1.9 against 1.3 s of system time
for the 2 GiB bench model), and every byte must land where torch reads it: a page is
filled by exactly one of the reads the plan cut the tensor into, and the first and last
pages hold bytes of neighbours or past the end of the file.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import CKPTOOL, run_ckptool  # noqa: E402


def data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


@pytest.fixture(scope="module")
def unaligned(tmp_path_factory):
    """A file whose data section starts 24 bytes past a multiple of 64, with a tensor of
    40 MiB (cut into several reads of the plan), a run of small neighbours (one shared
    mapping), an odd-sized one that shifts everything after it by one byte, and a tensor of
    a few MiB that ends the file in the middle of a page."""
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(11)
    sd = {
        "a.big": torch.randn(10 * 1024 * 1024 + 3, generator=g),  # 40 MiB + 12 bytes
        "b.odd": torch.randint(0, 255, (3 * 1024 * 1024 + 1,), dtype=torch.uint8, generator=g),
        "c.small0": torch.randn(300, 100, generator=g).to(torch.bfloat16),
        "c.small1": torch.randint(-9, 9, (777,), dtype=torch.int32, generator=g),
        "c.small2": torch.randn(5000, generator=g).to(torch.float16),
        "d.last": torch.randn(700_001, generator=g),  # ~2.7 MiB, ends mid-page
    }
    d = tmp_path_factory.mktemp("unaligned")
    path = d / "m.safetensors"
    for pad in range(0, 64):
        save_file(sd, str(path), metadata={"pad": "x" * pad})
        if data_start(path) % 64 == 24:
            break
    assert data_start(path) % 64 == 24
    return path, sd


def test_unaligned_tensors_load_exactly(unaligned, tmp_path):
    import torch
    from safetensors.torch import load_file
    path, sd = unaligned
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", path, "--device", "cpu", "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want = load_file(str(path))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def traced_preads(tmp_path: Path, path: Path) -> tuple[list[int], bool]:
    """The sizes of the preads of a whole load of `path`, and whether it claimed pages for
    the filler."""
    trace = tmp_path / "trace"
    p = subprocess.run([shutil.which("strace"), "-f", "-e", "trace=pread64,ioctl", "-o", str(trace), str(CKPTOOL),
                        "materialize", str(path), "--device", "cpu"], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    lines = trace.read_text().splitlines()
    # The count asked for, from whole calls and from calls resumed after another thread's.
    sizes = [int(m.group(1)) for line in lines if "pread64" in line
             for m in [re.search(r"(\d+), \d+\) += ", line)] if m]
    return sizes, any("UFFDIO_REGISTER" in line and "= 0" in line for line in lines)


def test_unaligned_tensors_are_filled_page_by_page(unaligned, tmp_path):
    import torch
    path, _ = unaligned
    if not shutil.which("strace"):
        pytest.skip("no strace to count system calls")
    # Whether this kernel lets us fill pages at all, seen on a file torch.save aligned.
    aligned = tmp_path / "aligned.pt"
    torch.save({"w": torch.zeros(1 << 20)}, aligned)
    if not traced_preads(tmp_path, aligned)[1]:
        pytest.skip("userfaultfd is not available here: tensors are read with pread")
    # Read by pread, each tensor of a megabyte and more would take one large read (or a
    # few); filled by pages, only the first and last page of each block are read, a page
    # at most each.
    sizes, claimed = traced_preads(tmp_path, path)
    assert claimed
    assert not [n for n in sizes if n >= 64 * 1024], sizes
