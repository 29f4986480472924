"""How a column slice is read (src/torch/load_slices.cpp): the rows of a ``Shard(1)`` slice
of a row-major matrix are far apart in the file, and are copied from a mapping of the file,
not read by one pread each (74k preads for rank 1 of 4 of the 2 GiB bench model made the
slice cost more per byte than a whole load). The values are torch's own ``chunk``; the
system calls are counted by strace (skipped where strace is missing).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import CKPTOOL, run_ckptool  # noqa: E402

ROWS, COLS = 2048, 1024


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    import torch
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("cols")
    g = torch.Generator().manual_seed(3)
    save_file({"w": torch.randn(ROWS, COLS, generator=g).to(torch.bfloat16)}, str(d / "m.safetensors"))
    (d / "plan.json").write_text(json.dumps({"*": "Shard(1)"}))
    return d


def test_a_column_slice_is_exact_and_not_read_row_by_row(matrix, tmp_path):
    import torch
    from safetensors.torch import load_file
    out = tmp_path / "r1.pt"
    args = ["materialize", "--plan", matrix / "plan.json", "--rank", "1", "--world", "4",
            matrix / "m.safetensors", "-o", out]
    rc, _, err = run_ckptool(*args)
    assert rc == 0, err
    want = load_file(str(matrix / "m.safetensors"))["w"].chunk(4, dim=1)[1]
    got = torch.load(out, weights_only=True)["w"]
    assert got.dtype == want.dtype and torch.equal(got, want)

    strace = shutil.which("strace")
    if not strace:
        pytest.skip("no strace to count system calls")
    trace = tmp_path / "trace"
    out.unlink()
    p = subprocess.run([strace, "-f", "-e", "trace=pread64", "-o", str(trace), str(CKPTOOL),
                        *map(str, args)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    preads = sum(1 for line in trace.read_text().splitlines() if "pread64(" in line)
    # The header and the pickle machinery take a few; one per row would be 2048 more.
    assert preads < ROWS // 8, preads


def test_a_dcp_row_slice_is_copied_page_by_page(tmp_path):
    """A Shard(0) slice that is one DCP chunk is filled by the page filler (UFFDIO_COPY from
    a mapping of the .distcp), not read by pread into zeroed pages, even where the chunk's
    data lies at an offset no 64-byte-aligned (LibTorch's alignment) slice can be
    congruent with: the items of a .distcp follow each other at any byte."""
    import torch
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(5)
    # Two tensors of 8 MiB: the second item starts where the first archive ends.
    sd = {f"w{i}": torch.randn(4096, 1024, generator=g).to(torch.bfloat16) for i in range(2)}
    d = tmp_path / "ckpt"
    dcp.save(sd, checkpoint_id=str(d))
    (tmp_path / "plan.json").write_text(json.dumps({"*": "Shard(0)"}))
    out = tmp_path / "r1.pt"
    args = ["materialize", "--plan", tmp_path / "plan.json", "--rank", "1", "--world", "4", d, "-o", out]
    rc, _, err = run_ckptool(*args)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    for k, v in sd.items():
        assert torch.equal(got[k], v.chunk(4, dim=0)[1]), k

    strace = shutil.which("strace")
    if not strace:
        pytest.skip("no strace to count system calls")
    trace = tmp_path / "trace"
    out.unlink()
    p = subprocess.run([strace, "-f", "-e", "trace=pread64,ioctl", "-o", str(trace), str(CKPTOOL), *map(str, args)],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    lines = trace.read_text().splitlines()
    if not any("UFFDIO_REGISTER" in line and "= 0" in line for line in lines):
        pytest.skip("userfaultfd is not available here: slices are read with pread")
    # Each slice is 2 MiB: read by pread, it would take one large read (or a few).
    # The count asked for, from whole calls and from calls resumed after another thread's.
    sizes = [int(m.group(1)) for line in lines if "pread64" in line
             for m in [re.search(r"(\d+), \d+\) += ", line)] if m]
    assert not [n for n in sizes if n >= 1 << 20], sizes


def test_a_rank_opens_only_the_dcp_chunks_its_slices_meet(tmp_path):
    """Opening a DCP chunk reads the ends of its embedded archive: every rank doing so for
    every chunk of every file does not scale (hundreds of ranks, a chunk per key per rank).
    A rank opens only the chunks its slices meet (ckpt::chunks_met_by); its slices are
    still torch's."""
    import torch
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(9)
    sd = {f"layers.{i}.w": torch.randn(64, 16, generator=g) for i in range(200)}
    sd["embed.weight"] = torch.randn(1024, 64, generator=g)
    d = tmp_path / "ckpt"
    dcp.save(sd, checkpoint_id=str(d))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"embed.weight": "Shard(0)", "layers.7.*": "Shard(1)"}))
    out = tmp_path / "r2.pt"
    args = ["materialize", "--plan", plan, "--rank", "2", "--world", "4", d, "-o", out]
    rc, _, err = run_ckptool(*args)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    assert sorted(got) == ["embed.weight", "layers.7.w"]
    assert torch.equal(got["embed.weight"], sd["embed.weight"].chunk(4, dim=0)[2])
    assert torch.equal(got["layers.7.w"], sd["layers.7.w"].chunk(4, dim=1)[2])

    strace = shutil.which("strace")
    if not strace:
        pytest.skip("no strace to count system calls")
    trace = tmp_path / "trace"
    out.unlink()
    p = subprocess.run([strace, "-f", "-y", "-e", "trace=pread64", "-o", str(trace), str(CKPTOOL), *map(str, args)],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    on_data = [line for line in trace.read_text().splitlines() if "pread64(" in line and ".distcp>" in line]
    # Two chunks opened (their archive's ends: a few reads each) and their slices read;
    # opening all 201 would take hundreds.
    assert len(on_data) <= 16, len(on_data)
