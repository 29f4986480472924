"""Smoke test of the benchmark harness (issue 6): `bench/run.sh --quick` with tiny fixtures
(CKPTOOL_BENCH_TINY=1: ~8 MB files, 2 repeats, fewest peers) completes and prints its report.
No timing is judged here: the targets in the report may read MET, MISSED or n/m."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import CKPTOOL, SANITIZED, SOURCE_DIR


@pytest.mark.skipif(SANITIZED, reason="timings of a sanitized build mean nothing; the harness runs in the normal build")
def test_bench_quick_tiny(tmp_path):
    if not CKPTOOL.exists():
        pytest.fail(f"ckptool binary not found at {CKPTOOL} (set CKPTOOL)")
    report = tmp_path / "report.md"
    raw = tmp_path / "raw.json"
    env = dict(os.environ)
    env.update({"CKPTOOL": str(CKPTOOL), "CKPTOOL_PYTHON": sys.executable, "CKPTOOL_BENCH_TINY": "1",
                "TMPDIR": str(tmp_path)})
    p = subprocess.run(["bash", str(SOURCE_DIR / "bench" / "run.sh"), "--quick", "--out", str(report),
                        "--raw", str(raw)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"run.sh exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    text = report.read_text()
    assert text.startswith("# ckptool benchmark results")
    assert "| scen | fixture | cache | tool | t median |" in text
    for scen in ("| S1 |", "| S3 |", "| S4 |", "| S5 |"):
        assert scen in text, f"no {scen} row in the report:\n{text}"
    assert "Targets (issues 6 and 14):" in text
    assert "samples failed" not in p.stdout, p.stdout[-3000:]
    assert raw.exists()
    # the scratch directory is removed at the end
    assert not [d for d in tmp_path.iterdir() if d.name.startswith("ckptool-bench.")]
