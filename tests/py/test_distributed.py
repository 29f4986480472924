"""Parallel ``convert --to hf`` and ``verify`` under a launcher (docs/distributed.md), on a real
4-rank DCP directory written by ``dcp.save`` (dcp_fixtures' ``grid4``):

* ``torchrun --nproc-per-node 2`` and ``3``: the shard set is byte for byte the one a single
  process writes, and safetensors and transformers' own shard-set loader read the values
  torch saved;
* verify with 2 and 3 ranks finds a byte flipped in any one of the 4 ``.distcp`` files,
  whichever rank's share holds it, and rank 0 prints exactly the single-process report;
* ``convert --to dcp --ranks 4 --plan``: the directory is byte for byte the single
  process's (``.metadata`` but for its random save_id), torch's dcp.load reads it; a rank
  killed mid-write leaves nothing;
* a rank SIGKILLed while writing its shard (the CKPTOOL_TEST_KILL_RANK hook): no output
  directory, no staging directory, no partial file; every other rank exits 4 within the
  timeout, naming the lost rank; under torchrun too.

Ranks are launched two ways: by torchrun (its agent hosts the rendezvous store), and by hand
with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (rank 0 hosts it), 127.0.0.1 only, every
process in a session of its own and killed on a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import CKPTOOL, SOURCE_DIR, TIME_SCALE, run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")

TORCHRUN = Path(sys.executable).parent / "torchrun"
SHARD = "50"  # bytes: grid4 in 4 shards ([w], [hsdp, tiny], [col], [grid_big]) and an index


@pytest.fixture(scope="module")
def grid4(tmp_path_factory) -> Path:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["grid4"])["grid4"]


def expected_grid4() -> dict:
    """What dcp_fixtures' grid4 saved (its tensors, recomputed by torch)."""
    import torch
    return {
        "w": torch.arange(12.0).reshape(3, 4),
        "hsdp": torch.arange(5.0),
        "tiny": torch.arange(1.0),
        "col": torch.arange(14, dtype=torch.int32).reshape(2, 7),
        "grid_big": torch.randn(301, 1003, generator=torch.Generator().manual_seed(6)),
    }


def torchrun(n: int, *args, timeout: float = 90, env: dict | None = None) -> tuple[int, str]:
    """ckptool ARGS under torchrun with n local workers; (exit code, merged output)."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        return dcp_fixtures.run_bounded(
            [TORCHRUN, "--standalone", f"--nproc-per-node={n}", "--no-python", CKPTOOL, *args], timeout * TIME_SCALE)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ranks(n: int, *args, timeout: float = 60, env: dict | None = None) -> list[tuple[int, str, str, float]]:
    """ckptool ARGS as n processes given the launcher's variables by hand (rank 0 hosts the
    store); per rank (exit code, stdout, stderr, seconds until it exited)."""
    port = dcp_fixtures.free_port()
    procs = []
    start = time.monotonic()
    try:
        for r in range(n):
            e = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), ASAN_OPTIONS="detect_leaks=0", **(env or {}))
            e.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            procs.append(subprocess.Popen([str(CKPTOOL), *map(str, args)], env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True))
        out = []
        for p in procs:
            left = max(0.1, timeout * TIME_SCALE - (time.monotonic() - start))
            o, err = p.communicate(timeout=left)
            out.append((p.returncode, o.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                        time.monotonic() - start))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".ckptool-" in p.name)


def tree(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def single(grid4, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single") / "hf"
    rc, stdout, err = run_ckptool("convert", grid4, "-o", out, "--to", "hf", "--max-shard-size", SHARD,
                                  "--drop-other", timeout=120)
    assert rc == 0, err
    assert len(list(out.glob("*.safetensors"))) >= 3, sorted(out.iterdir())
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_parallel_convert_is_byte_identical_and_loads(grid4, single, tmp_path, n):
    import torch
    from safetensors.torch import load_file
    from transformers.modeling_utils import get_checkpoint_shard_files, load_state_dict
    out = tmp_path / "hf"
    rc, log = torchrun(n, "convert", grid4, "-o", out, "--to", "hf", "--max-shard-size", SHARD, "--drop-other")
    assert rc == 0, log
    # One report, from rank 0.
    assert log.count("converted 5 tensors to hf") == 1, log
    assert tree(out) == tree(single)
    assert leftovers(tmp_path) == []

    want = expected_grid4()
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(f))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    # transformers' own shard-set reader: the index, then each shard it names.
    files, _ = get_checkpoint_shard_files(str(out), str(out / "model.safetensors.index.json"))
    by_transformers = {}
    for f in files:
        by_transformers.update(load_state_dict(f))
    for k, v in want.items():
        assert torch.equal(by_transformers[k], v), k


def flip_in_piece(src: Path, dst: Path, piece_index: int) -> Path:
    """A copy of src with one byte of grid_big's piece `piece_index` flipped; the file it is in."""
    shutil.copytree(src, dst)
    rc, out, err = run_ckptool("inspect", "--json", "--chunks", dst, timeout=60)
    assert rc == 0, err
    doc = json.loads(out)
    piece = next(k for k in doc["keys"] if k["key"] == "grid_big")["pieces"][piece_index]
    path = Path(doc["files"][piece["file"]]["path"])
    data = bytearray(path.read_bytes())
    data[piece["offset"] + 1000] ^= 0x10
    path.write_bytes(data)
    return path


def test_parallel_verify_finds_a_flipped_byte_whichever_rank_reads_it(grid4, tmp_path):
    # Intact: every rank exits 0, rank 0 prints the single-process report, the others nothing.
    rc, want, _ = run_ckptool("verify", grid4, timeout=60)
    assert rc == 0
    for n in (2, 3):
        seen = ranks(n, "verify", grid4)
        assert [r[0] for r in seen] == [0] * n, seen
        assert seen[0][1] == want
        assert all(r[1] == "" for r in seen[1:]), seen

    flipped_files = set()
    for i in range(4):  # grid_big's 4 pieces, one in each rank's .distcp file
        d = tmp_path / f"flip{i}"
        path = flip_in_piece(grid4, d, i)
        flipped_files.add(path.name)
        rc, want, _ = run_ckptool("verify", d, timeout=60)
        assert rc == 1 and "CRC-32 mismatch" in want and path.name in want, want
        # 3 ranks: each piece read by a different rank than with 2 (pieces 0-1 -> rank 0 and
        # 2-3 -> rank 1), and by ranks 0, 1 and 2 across the pieces.
        for n in ((2, 3) if i in (0, 3) else (3,)):
            seen = ranks(n, "verify", d)
            assert [r[0] for r in seen] == [1] * n, (i, n, seen)
            assert seen[0][1] == want, (i, n)
            assert all(r[1] == "" for r in seen[1:])
    assert len(flipped_files) == 4


def test_rank_killed_mid_convert_leaves_nothing(grid4, tmp_path):
    out = tmp_path / "hf"
    timeout = 5
    seen = ranks(3, "convert", grid4, "-o", out, "--to", "hf", "--max-shard-size", SHARD, "--drop-other",
                 "--dist-timeout", timeout, env={"CKPTOOL_TEST_KILL_RANK": "1"}, timeout=60)
    assert seen[1][0] == -signal.SIGKILL, seen
    for r in (0, 2):
        rc, stdout, err, took = seen[r]
        assert rc == 4, (r, seen)
        assert stdout == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptool: io: "), err
        assert "missing ranks: 1" in lines[0], err
        # The wait for the lost rank, and rank 0's bounded wait for the others to leave.
        assert took < (3 * timeout + 10) * TIME_SCALE, took
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_rank_killed_under_torchrun_leaves_nothing(grid4, tmp_path):
    out = tmp_path / "hf"
    rc, log = torchrun(3, "convert", grid4, "-o", out, "--to", "hf", "--max-shard-size", SHARD, "--drop-other",
                       "--dist-timeout", 20, env={"CKPTOOL_TEST_KILL_RANK": "1"})
    assert rc != 0, log
    assert "exitcode: -9" in log, log  # torchrun saw rank 1 SIGKILLed, and ended the others
    assert not out.exists(), log
    assert leftovers(tmp_path) == [], log


def test_one_file_targets_are_refused_in_parallel(grid4, tmp_path):
    seen = ranks(2, "convert", grid4, "-o", tmp_path / "x.safetensors", "--to", "safetensors", "--drop-other")
    for rc, stdout, err, _ in seen:
        assert rc == 2, seen
        assert "only --to hf and --to dcp are divided among ranks" in err
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_on_rank_0_reaches_every_rank(grid4, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    seen = ranks(2, "convert", grid4, "-o", out, "--to", "hf", "--drop-other")
    for rc, stdout, err, _ in seen:
        assert rc == 2, seen
        assert err.startswith("ckptool: usage: rank 0: "), err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert leftovers(tmp_path) == [] and leftovers(out) == []


def test_without_launcher_variables_no_libtorch_is_loaded(grid4, tmp_path):
    # A command that is not distributed never opens the plugin: a plugin path that does not
    # exist would otherwise be an error.
    rc, _, err = run_ckptool("verify", grid4, env={"CKPTOOL_TORCH_PLUGIN": str(tmp_path / "none.so")})
    assert rc == 0, err
    rc, _, err = run_ckptool("verify", grid4, env={"CKPTOOL_TORCH_PLUGIN": str(tmp_path / "none.so"),
                                                     "RANK": "0", "WORLD_SIZE": "1"})
    assert rc == 0, err


# ---------------------------------------------------------------- --to dcp

DCP_PLAN = {"col": "Shard(1)", "grid_big": "Shard(-1)", "hsdp": "Replicate()"}


def same_but_save_id(a: dict, b: dict):
    """Two DCP trees: equal files, `.metadata` equal once b's save_id is a's."""
    import pickle
    assert sorted(a) == sorted(b)
    for name in a:
        if name != ".metadata":
            assert a[name] == b[name], name
    ida = pickle.loads(a[".metadata"]).storage_meta.save_id
    idb = pickle.loads(b[".metadata"]).storage_meta.save_id
    assert b[".metadata"].replace(idb.encode(), ida.encode()) == a[".metadata"]


@pytest.mark.parametrize("n", [2, 3])
def test_parallel_dcp_is_byte_identical_and_loads(grid4, tmp_path, n):
    import torch
    import torch.distributed.checkpoint as dcp
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(DCP_PLAN))
    out = tmp_path / "d"  # the same path both times: .metadata records it
    args = ("convert", grid4, "-o", out, "--to", "dcp", "--ranks", "4", "--plan", plan)
    rc, _, err = run_ckptool(*args, timeout=120)
    assert rc == 0, err
    want_tree = tree(out)
    shutil.rmtree(out)
    rc, log = torchrun(n, *args)
    assert rc == 0, log
    assert log.count("converted 5 tensors to dcp") == 1, log
    same_but_save_id(want_tree, tree(out))
    assert leftovers(tmp_path) == []
    # PyTorch reads it: every tensor, and the BYTE_IO item grid4 saved.
    want = expected_grid4()
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    sd["rank_count"] = None
    dcp.load(sd, checkpoint_id=str(out), no_dist=True)
    assert sd.pop("rank_count") == 4
    for k, v in want.items():
        assert torch.equal(sd[k], v), k


def test_rank_killed_mid_dcp_convert_leaves_nothing(grid4, tmp_path):
    out = tmp_path / "d"
    timeout = 5
    seen = ranks(3, "convert", grid4, "-o", out, "--to", "dcp", "--ranks", "4", "--dist-timeout", timeout,
                 env={"CKPTOOL_TEST_KILL_RANK": "1"}, timeout=60)
    assert seen[1][0] == -signal.SIGKILL, seen
    for r in (0, 2):
        rc, stdout, err, took = seen[r]
        assert rc == 4 and stdout == "", (r, seen)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "missing ranks: 1" in lines[0], err
        assert took < (3 * timeout + 10) * TIME_SCALE, took
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_a_dcp_refusal_reaches_every_rank(grid4, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"w": "Shard(3)", "*": "Replicate()"}))
    seen = ranks(2, "convert", grid4, "-o", tmp_path / "d", "--to", "dcp", "--ranks", "2", "--plan", plan)
    for rc, stdout, err, _ in seen:
        assert rc == 2 and "Shard(3)" in err, seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
