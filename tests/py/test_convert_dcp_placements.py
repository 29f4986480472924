"""``ckptool convert --to dcp --ranks K --plan PLAN`` (formats.md §9.9) judged by PyTorch:

* K = 2 and 3 gloo processes each build DTensors with the plan's placements on a 1-D mesh
  and ``dcp.load`` our directory into them: every local shard is bit for bit
  ``distribute_tensor(full, mesh, [placement]).to_local()`` (Shard(0), Shard(1), Shard(-1),
  Replicate, uneven splits that leave ranks empty, views, a cast, a DCP input);
* the same processes ``dcp.save`` those DTensors: our ``.metadata`` has the same chunks in
  the same order, each item in the same rank's file (dedup_save_plans' choice for
  replicated items and empty boxes), the same planner_data;
* ``dcp.load`` in one process into full tensors gives every tensor;
* Range, a dimension the tensor lacks, Shard of a 0-dim tensor, --plan with another target:
  usage errors (exit 2), nothing written;
* a column split of a tensor larger than the memory bound is read as strided runs (peak RSS).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import CKPTOOL, peak_rss_mib, run_ckptool, SANITIZED  # noqa: E402
from test_convert_dcp import assert_same, dcp_loaded, read_md  # noqa: E402

warnings.filterwarnings("ignore")

PLAN = {
    "col.*": "Shard(1)",
    "neg.*": "Shard(-1)",
    "rep.*": "Replicate()",
    "row.*": "Shard(dim=0)",
    "*.view": "Shard(1)",
}


def sample() -> dict:
    torch.manual_seed(29)
    base = torch.arange(35, dtype=torch.float32).reshape(5, 7)
    return {
        "col.f32": torch.randn(5, 7),                      # 7 columns: 4+3 on 2, 3+3+1 on 3
        "col.bf16": torch.randn(4, 6).to(torch.bfloat16),
        "col.i64": torch.arange(2**40, 2**40 + 24, dtype=torch.int64).reshape(3, 8),
        "col.3d": torch.randn(3, 5, 4, dtype=torch.float64),
        "col.thin": torch.arange(4, dtype=torch.int16).reshape(4, 1),  # 1 column: ranks past 0 empty
        "col.wide": torch.randn(64, 301),                  # rows far apart: one read per row
        "neg.f16": torch.randn(3, 2, 5).to(torch.float16),
        "rep.f32": torch.randn(3, 3),
        "rep.scalar": torch.tensor(2.5),
        "rep.bool": torch.tensor([True, False, True]),
        "row.u8": torch.arange(11, dtype=torch.uint8).reshape(11, 1),
        "t.view": base.t(),                                # a transposed view, cut in columns
        "s.view": base[1:, 2:],                            # a view with a row pitch of 7
        "plain": torch.randn(5, 2),                        # no rule: Shard(0)
        "scalar": torch.tensor(-3),                        # no rule, 0-dim: replicated
    }


def placement_of(key: str) -> str:
    import fnmatch
    for glob, p in PLAN.items():
        if fnmatch.fnmatchcase(key, glob):
            return p
    return "Shard(0)" if sample()[key].dim() else "Replicate()"


def convert(*args, ok=True):
    rc, out, err = run_ckptool("convert", *args, timeout=120)
    if ok:
        assert rc == 0, f"exit {rc}: {err}"
    return rc, out, err


# Each rank: dcp.load ours into DTensors of the plan's placements, compared with
# distribute_tensor's local shard; then dcp.save of distribute_tensor(full) for the layout.
RANKS = r'''
import json, os, sys, torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""

def check(mesh, job):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    exp = torch.load(job["expected"], weights_only=True)
    def place(text):
        if text.startswith("Replicate"):
            return Replicate()
        return Shard(int(text[text.index("(") + 1:-1].split("=")[-1]))
    bad = []
    want, blank = {}, {}
    for k, v in exp.items():
        p = place(job["placements"][k])
        # src_data_rank=None: each rank cuts its own shard, no collective (gloo lacks bf16/f16).
        want[k] = distribute_tensor(v, mesh, [p], src_data_rank=None)
        blank[k] = DTensor.from_local(torch.zeros_like(want[k].to_local()), mesh, [p], run_check=False,
                                      shape=v.shape, stride=want[k].stride())
    dcp.load(blank, checkpoint_id=job["ckpt"])
    for k in exp:
        g, w = blank[k].to_local(), want[k].to_local()
        if g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape) or bits(g) != bits(w):
            bad.append(k)
    dcp.save(want, checkpoint_id=job["saved"])
    return bad

def main(rank, world, port, jobs, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    out = []
    for job in json.load(open(jobs)):
        try:
            bad = check(mesh, job)
        except BaseException as e:
            bad = [f"{type(e).__name__}: {str(e)[:1500]}"]
        out.append("OK" if not bad else "MISMATCH " + ",".join(bad))
    open(f"{result}.{rank}", "w").write(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    world = int(sys.argv[3])
    s = __import__("socket").socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    # fork: the ranks inherit the imported torch instead of importing it again each.
    mp.start_processes(main, args=(world, port, sys.argv[1], sys.argv[2]), nprocs=world, join=True,
                       start_method="fork")
'''


def in_k_processes(tmp: Path, jobs: list[tuple[Path, Path, dict]], world: int) -> tuple[list[list[str]], list[Path]]:
    '''Each job (our directory, the expected torch.save file, key -> placement) checked by
    `world` ranks in one launch; per rank the jobs' results, and where each job's dcp.save went.'''
    script = tmp / "ranks.py"
    script.write_text(RANKS)
    saved = [tmp / f"torch-saved-{world}-{i}" for i in range(len(jobs))]
    spec = [{"ckpt": str(c), "expected": str(e), "placements": p, "saved": str(s)}
            for (c, e, p), s in zip(jobs, saved)]
    (tmp / "jobs.json").write_text(json.dumps(spec))
    result = tmp / f"result-{world}"
    try:
        _, log = dcp_fixtures.run_bounded([script, tmp / "jobs.json", result, world], timeout=240)
    except TimeoutError:
        pytest.fail(f"the {world}-process dcp.load did not finish within 240 s")
    out = []
    for r in range(world):
        p = Path(f"{result}.{r}")
        assert p.exists(), log[-3000:]
        out.append(json.loads(p.read_text()))
    return out, saved


def layout(d: Path) -> dict:
    """Per key: its chunks in order and the file of each; its planner_data."""
    md = read_md(d)
    files = {(i.fqn, tuple(i.offset)): s.relative_path for i, s in md.storage_data.items()}
    return {k: ([(tuple(c.offsets), tuple(c.sizes), files[(k, tuple(c.offsets))]) for c in v.chunks],
                md.planner_data[k]) for k, v in md.state_dict_metadata.items()}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dcp_plan")
    torch.save(sample(), d / "sample.pt")
    (d / "plan.json").write_text(json.dumps(PLAN))
    return d


@pytest.mark.parametrize("world", [2, 3])
def test_placements_load_as_distribute_tensor_and_match_dcp_save(work, tmp_path, world):
    out = tmp_path / f"ours{world}"
    _, stdout, _ = convert(work / "sample.pt", "-o", out, "--to", "dcp", "--ranks", world, "--plan",
                           work / "plan.json", "--json")
    assert json.loads(stdout)["plan"] == str(work / "plan.json")
    # One process, full tensors: every value.
    assert_same(dcp_loaded(out), sample())
    jobs = [(out, work / "sample.pt", {k: placement_of(k) for k in sample()})]
    if world == 3:
        # From a DCP input, cast: our 2-rank Shard(0) directory (pieces of rows) rewritten
        # in columns for 3 ranks, each column chunk met with every row piece it crosses.
        src = tmp_path / "rows2"
        convert(work / "sample.pt", "-o", src, "--to", "dcp", "--ranks", "2")
        cast = tmp_path / "cols3"
        convert(src, "-o", cast, "--to", "dcp", "--ranks", "3", "--plan", work / "plan.json", "--dtype", "bfloat16")
        want = {k: v.to(torch.bfloat16) if v.is_floating_point() else v.contiguous() for k, v in sample().items()}
        assert_same(dcp_loaded(cast), want)
        torch.save(want, tmp_path / "cast.pt")
        jobs.append((cast, tmp_path / "cast.pt", {k: placement_of(k) for k in want}))
    res, saved = in_k_processes(tmp_path, jobs, world)
    assert res == [["OK"] * len(jobs)] * world, res
    for (ours, _, _), theirs in zip(jobs, saved):
        assert layout(ours) == layout(theirs)
    # ckptool reads its own output back too (after torch, never instead).
    rc, _, err = run_ckptool("verify", out)
    assert rc == 0, err


def test_llama_tp_preset(tmp_path):
    sd = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(6, 4),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(4, 6),
        "model.layers.0.mlp.down_proj.weight": torch.randn(4, 5),
        "model.norm.weight": torch.randn(4),
    }
    torch.save(sd, tmp_path / "m.pt")
    out = tmp_path / "tp"
    convert(tmp_path / "m.pt", "-o", out, "--to", "dcp", "--ranks", "2", "--plan", "llama-tp")
    assert_same(dcp_loaded(out), sd)
    chunks = {k: [(tuple(c.offsets), tuple(c.sizes)) for c in v.chunks]
              for k, v in read_md(out).state_dict_metadata.items()}
    assert chunks["model.layers.0.self_attn.q_proj.weight"] == [((0, 0), (3, 4)), ((3, 0), (3, 4))]
    assert chunks["model.layers.0.mlp.down_proj.weight"] == [((0, 0), (4, 3)), ((0, 3), (4, 2))]
    assert chunks["model.norm.weight"] == [((0,), (4,))]


@pytest.mark.parametrize("plan, needle", [
    ({"*": "Range(0, 0, 1)"}, "not a DTensor placement"),
    ({"col.f32": "Shard(2)", "*": "Replicate()"}, "dimension 2"),
    ({"rep.scalar": "Shard(0)", "*": "Replicate()"}, "rep.scalar"),
])
def test_refusals(work, tmp_path, plan, needle):
    (tmp_path / "p.json").write_text(json.dumps(plan))
    out = tmp_path / "o"
    rc, _, err = convert(work / "sample.pt", "-o", out, "--to", "dcp", "--ranks", "2", "--plan", tmp_path / "p.json",
                         ok=False)
    assert rc == 2 and needle in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_plan_needs_dcp(work, tmp_path):
    rc, _, err = convert(work / "sample.pt", "-o", tmp_path / "hf", "--to", "hf", "--plan", "llama-tp", ok=False)
    assert rc == 2 and "--plan applies to --to dcp only" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time")
@pytest.mark.skipif(SANITIZED, reason="ASan's shadow memory is not the program's")
def test_column_chunks_are_read_alone(tmp_path):
    # A 128 MiB matrix in Shard(1) over 4 ranks: 32 MiB column chunks, each read as 4096
    # strided runs, so the row path's bound (largest chunk x 2 + 64 MiB) holds: 128 MiB,
    # the size of the tensor, which must never be held whole. From a torch.save file, and
    # from a 4-rank DCP of row pieces.
    n = 4096
    t = torch.arange(n * 2 * n, dtype=torch.int32).reshape(n, 2 * n)
    torch.save({"w": t}, tmp_path / "big.pt")
    (tmp_path / "p.json").write_text(json.dumps({"*": "Shard(1)"}))
    peak = peak_rss_mib(["convert", tmp_path / "big.pt", "-o", tmp_path / "c4", "--to", "dcp", "--ranks", "4",
                         "--plan", tmp_path / "p.json"])
    assert peak < 120, f"peak RSS {peak:.0f} MiB"
    convert(tmp_path / "big.pt", "-o", tmp_path / "r4", "--to", "dcp", "--ranks", "4")
    peak = peak_rss_mib(["convert", tmp_path / "r4", "-o", tmp_path / "c4b", "--to", "dcp", "--ranks", "4",
                         "--plan", tmp_path / "p.json"])
    assert peak < 120, f"peak RSS {peak:.0f} MiB"
    for d in ("c4", "c4b"):
        md = read_md(tmp_path / d)
        assert [tuple(c.offsets) for c in md.state_dict_metadata["w"].chunks] == [(0, 0), (0, 2048), (0, 4096),
                                                                                   (0, 6144)]
        assert torch.equal(dcp_loaded(tmp_path / d)["w"], t)
