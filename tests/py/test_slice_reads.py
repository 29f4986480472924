"""How a column slice is read (src/torch/load_slices.cpp): the rows of a ``Shard(1)`` slice
of a row-major matrix are far apart in the file, and are copied from a mapping of the file,
not read by one pread each (74k preads for rank 1 of 4 of the 2 GiB bench model made the
slice cost more per byte than a whole load). The values are torch's own ``chunk``; the
system calls are counted by strace (skipped where strace is missing).
"""

from __future__ import annotations

import json
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
