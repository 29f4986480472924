"""Parallel ``convert`` at its edges (docs/distributed.md, "Steps and failure semantics"): the
commit decision when a rank's wait ends by timeout, and the staging directory a SIGKILLed
rank 0 leaves behind.

* A rank slower than ``--dist-timeout`` just before the commit (the CKPTOOL_TEST_DELAY_RANK
  hook of cli/cmd_convert.cpp: ``R:SECONDS`` makes rank R sleep after its last check, just
  before it reports ready to commit; on rank 0 that is after ``.metadata`` or the index is
  written): whichever rank it is, nothing is committed, no staging directory remains, and
  every rank exits 4 naming the rank that gave up.
* Rank 0 SIGKILLed mid-write (the CKPTOOL_TEST_KILL_RANK hook): its staging directory has an
  owner file nobody holds any more. Under torchrun (the agent ends the other ranks at once)
  the directory stays until the next run for that OUTDIR removes it, and nothing else:
  not a look-alike without an owner file, not one whose owner is alive, not another
  OUTDIR's. Launched by hand (rank 0 hosts the store), the surviving ranks remove it.
* Rank 0 SIGKILLed the moment every rank knows its staging directory (CKPTOOL_TEST_KILL_AT=
  rank-0-staging-known): the survivors remove it.
* Rank 0 SIGKILLed in its commit of a new OUTDIR (the CKPTOOL_TEST_KILL_AT hook of
  src/io/sys_io.cpp), just before or just after the one rename: launched by hand, rank 0
  takes the store and its decision with it; the survivors read the outcome off the file
  system (commit_witness): after the rename they exit 0 and the set is whole, before it
  they exit 4 saying nothing was committed, and no staging directory remains either way.

Multi-process runs are bounded (dcp_fixtures.run_bounded, or a timeout per rank), gloo-free:
the ranks meet in a c10d TCPStore on 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import shutil
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import TIME_SCALE, run_ckptool  # noqa: E402
from test_distributed import (SHARD, grid4, leftovers, ranks, same_but_save_id, torchrun,  # noqa: E402,F401 (grid4:
                              tree)                                                    # a fixture)


def convert_args(grid4: Path, out: Path, to: str) -> list:
    if to == "hf":
        return ["convert", grid4, "-o", out, "--to", "hf", "--max-shard-size", SHARD, "--drop-other"]
    return ["convert", grid4, "-o", out, "--to", "dcp", "--ranks", "4"]


@pytest.mark.parametrize("to", ["hf", "dcp"])
def test_rank_0_slower_than_the_timeout_before_its_commit_commits_nothing(grid4, tmp_path, to):
    # Rank 1 gives up waiting and vetoes; rank 0, done, finds the veto and does not commit.
    out = tmp_path / "o"
    timeout = 3
    seen = ranks(2, *convert_args(grid4, out, to), "--dist-timeout", timeout,
                 env={"CKPTOOL_TEST_DELAY_RANK": f"0:{2 * timeout}"}, timeout=60)
    for r, (rc, stdout, err, _) in enumerate(seen):
        assert rc == 4 and stdout == "", (r, seen)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptool: io: "), (r, err)
    assert "rank 1 gave up waiting for rank 0 to commit" in seen[0][2], seen[0][2]
    assert "nothing committed" in seen[0][2]
    assert "rank 1 gave up on 'convert/commit/ready'" in seen[1][2], seen[1][2]
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_rank_1_slower_than_the_timeout_learns_that_nothing_was_committed(grid4, tmp_path):
    # Rank 0 gives up on rank 1; rank 1, arriving late, finds every rank's report of the ready
    # step in the store but rank 0's outcome beside it: a failure, not a success.
    out = tmp_path / "o"
    timeout = 3
    seen = ranks(2, *convert_args(grid4, out, "dcp"), "--dist-timeout", timeout,
                 env={"CKPTOOL_TEST_DELAY_RANK": f"1:{timeout + 1.5}"}, timeout=60)
    for r, (rc, stdout, err, _) in enumerate(seen):
        assert rc == 4 and stdout == "", (r, seen)
        assert "missing ranks: 1" in err, (r, err)
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_a_slow_rank_within_the_timeout_still_commits(grid4, tmp_path):
    out = tmp_path / "o"
    seen = ranks(2, *convert_args(grid4, out, "dcp"), "--dist-timeout", 30,
                 env={"CKPTOOL_TEST_DELAY_RANK": "0:1"}, timeout=60)
    assert [s[0] for s in seen] == [0, 0], seen
    assert (out / ".metadata").is_file()
    assert leftovers(tmp_path) == []


def staging_like(parent: Path, base: str, suffix: str, owner: bool) -> Path:
    d = parent / f".{base}.ckptool-{suffix}"
    d.mkdir()
    (d / "part.safetensors").write_bytes(b"x" * 10)
    if owner:
        (d / ".ckptool-owner").write_text("ckptool pid 1 on elsewhere\n")
    return d


def test_rank_0_killed_under_torchrun_leaves_a_staging_directory_the_next_run_removes(grid4, tmp_path):
    out = tmp_path / "hf"
    rc, log = torchrun(2, *convert_args(grid4, out, "hf"), "--dist-timeout", 20,
                       env={"CKPTOOL_TEST_KILL_RANK": "0"})
    assert rc != 0 and "exitcode: -9" in log, log
    assert not out.exists(), log
    left = leftovers(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0] / ".ckptool-owner").is_file(), left

    # Look-alikes that are not abandoned staging directories of this OUTDIR.
    no_owner = staging_like(tmp_path, "hf", "0123456789abcdef", owner=False)
    other_outdir = staging_like(tmp_path, "hf2", "0123456789abcdef", owner=True)
    live = staging_like(tmp_path, "hf", "fedcba9876543210", owner=True)
    held = open(live / ".ckptool-owner", "rb")  # this process owns it, alive
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        rc, stdout, err = run_ckptool(*convert_args(grid4, out, "hf"), timeout=120)
    finally:
        held.close()
    assert rc == 0, err
    assert f"removed {tmp_path / left[0]}: the staging directory of an earlier run" in err, err
    assert (out / "model.safetensors.index.json").is_file()
    assert leftovers(tmp_path) == sorted(p.name for p in (no_owner, other_outdir, live))
    for d in (no_owner, other_outdir, live):
        assert (d / "part.safetensors").read_bytes() == b"x" * 10


@pytest.mark.parametrize("killed", [
    # Mid-write (its first bytes).
    {"CKPTOOL_TEST_KILL_RANK": "0"},
    # The first moment it may write: every survivor holds the path by then, and no later
    # exchange stands between that and the cleanup (a broadcast there once left a survivor
    # that had not received it unable to remove the directory).
    {"CKPTOOL_TEST_KILL_AT": "rank-0-staging-known"},
], ids=["mid-write", "staging-known"])
def test_rank_0_killed_the_survivors_remove_its_staging_directory(grid4, tmp_path, killed):
    # Rank 0 hosts the store: the others lose their connection as it dies, find its
    # staging directory's owner file unlocked, and remove it.
    out = tmp_path / "hf"
    seen = ranks(3, *convert_args(grid4, out, "hf"), "--dist-timeout", 10, env=killed, timeout=60)
    assert seen[0][0] == -signal.SIGKILL, seen
    for rc, stdout, _, took in seen[1:]:
        assert rc == 4 and stdout == "", seen
        assert took < 30 * TIME_SCALE, took
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_an_existing_outdir_holding_an_abandoned_staging_directory_is_not_refused(grid4, tmp_path):
    # Inside an existing OUTDIR an abandoned staging directory would be "a file that is not
    # of the previous set" (refused without --force); it is removed first instead.
    out = tmp_path / "hf"
    rc, _, err = run_ckptool(*convert_args(grid4, out, "hf"), timeout=120)
    assert rc == 0, err
    stale = staging_like(out, "hf", "00000000000000aa", owner=True)
    rc, _, err = run_ckptool(*convert_args(grid4, out, "hf"), timeout=120)
    assert rc == 0, err
    assert not stale.exists()
    assert leftovers(out) == []


def killed_in_commit(grid4: Path, out: Path, to: str, point: str) -> list:
    """3 ranks launched by hand, rank 0 SIGKILLed at `point` of its commit; what the
    survivors (ranks 1 and 2) saw, each within the time bound."""
    seen = ranks(3, *convert_args(grid4, out, to), "--dist-timeout", 10,
                 env={"CKPTOOL_TEST_KILL_AT": point}, timeout=60)
    assert seen[0][0] == -signal.SIGKILL, seen
    assert all(took < 30 * TIME_SCALE for *_, took in seen[1:]), seen
    return seen[1:]


@pytest.mark.parametrize("to", ["hf", "dcp"])
def test_rank_0_killed_after_its_commit_rename_the_survivors_find_the_set_in_place(grid4, tmp_path, to):
    out = tmp_path / "o"
    for rc, _, err, _ in killed_in_commit(grid4, out, to, "after-commit-rename"):
        assert rc == 0, err
    assert leftovers(tmp_path) == []
    # The same set a run that nobody killed writes to the same path (a DCP `.metadata`
    # records it), but for a DCP save's random save_id.
    got = tree(out)
    shutil.rmtree(out)
    rc, _, err = run_ckptool(*convert_args(grid4, out, to), timeout=120)
    assert rc == 0, err
    if to == "dcp":
        same_but_save_id(tree(out), got)
    else:
        assert got == tree(out)


@pytest.mark.parametrize("to", ["hf", "dcp"])
def test_rank_0_killed_before_its_commit_rename_the_survivors_say_nothing_was_committed(grid4, tmp_path, to):
    out = tmp_path / "o"
    for r, (rc, stdout, err, _) in enumerate(killed_in_commit(grid4, out, to, "before-commit-rename"), start=1):
        assert rc == 4 and stdout == "", (r, rc, stdout, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptool: io: "), (r, err)
        assert f"rank {r} gave up on 'convert/commit'" in lines[0], lines[0]
        assert "rank 0 is gone and nothing was committed" in lines[0], lines[0]
    assert not out.exists()
    assert leftovers(tmp_path) == []
