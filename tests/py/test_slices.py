"""Per-rank tensor-parallel slices (``materialize --rank R --world W --plan P -o OUT``),
judged by real torch: each rank's tensors equal ``distribute_tensor(full, mesh,
[placement]).to_local()`` computed in W gloo processes (slice_reference.py, once per world
size), bit for bit, from
* a single torch.save file (uneven splits with empty shards, a tied weight sliced under
  each key, a view at a storage offset, a 0-dim tensor, a 3-D Shard(2), Shard(-1));
* a Hugging Face shard set written by save_pretrained, with the llama-tp preset;
* DCP directories written by 2 and 4 ranks, sliced for 3;
and the bytes each rank read (its io.bytes_read) are within 5% + a page per piece of its
slices' size. Also: Range, RANK/WORLD_SIZE from the launcher, unmatched keys left out, a
non-row-major tensor refused when sliced (nothing written) and loaded whole when
replicated, and usage errors.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
import hf_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402

warnings.filterwarnings("ignore")
PAGE = 4096

SINGLE_PLAN = {"head.weight": "Shard(1)", "proj.weight": "Shard(-1)", "norm.*": "Replicate()",
               "steps": "Shard(2)", "scalar": "Replicate", "*": "Shard(0)"}
# The llama-tp preset, as DTensor placements (docs/formats.md §16.4).
LLAMA_PLAN = {f"*{p}.{k}": "Shard(0)" for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
              for k in ("weight", "bias")}
LLAMA_PLAN.update({"*o_proj.weight": "Shard(1)", "*down_proj.weight": "Shard(1)",
                   "*embed_tokens.weight": "Shard(0)", "*lm_head.weight": "Shard(0)", "*": "Replicate()"})
DCP_PLAN = {"model.layer.weight": "Shard(1)", "model.layer2.weight": "Shard(1)", "model.big": "Shard(0)",
            "model.tiny": "Shard(0)", "model.layer.bias": "Shard(0)", "w": "Shard(1)", "grid_big": "Shard(1)",
            "col": "Shard(0)", "hsdp": "Shard(0)", "*": "Replicate()"}


def single_state_dict() -> dict:
    g = torch.Generator().manual_seed(16)
    emb = torch.randn(10, 7, generator=g)
    base = torch.randn(12, 64, generator=g).to(torch.bfloat16)
    return {
        "embed.weight": emb,                                   # Shard(0) of 4: 3, 3, 3, 1 rows
        "head.weight": emb,                                    # tied to embed, sliced on dim 1
        "proj.weight": torch.randn(64, 256, generator=g),      # a column slice: a run per row
        "view.weight": base[2:9],                              # a view 2 rows into its storage
        "bias": torch.randn(5, generator=g, dtype=torch.float64),  # 2, 2, 1, 0: rank 3 empty
        "tiny": torch.randn(2, 3, generator=g),                # ranks 2 and 3 empty
        "scalar": torch.tensor(3.5),
        "steps": torch.arange(96, dtype=torch.int64).reshape(2, 3, 16),
        "norm.weight": torch.ones(7),
    }


def dcp_full(d: Path) -> dict:
    """Every tensor item as dcp.load gives it whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(str(d)).read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=str(d))
    return sd


def hf_full(d: Path) -> dict:
    from safetensors.torch import load_file
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """name -> (checkpoint, plan for ckptool, plan.json for the reference, world, reference dir)."""
    root = tmp_path_factory.mktemp("slices")
    out = {}
    single = root / "single.pt"
    torch.save(single_state_dict(), single)
    out["single"] = (single, root / "single_plan.json", SINGLE_PLAN, 4, single_state_dict())
    hf = hf_fixtures.write_set("llama_pretrained", root / "llama").directory
    out["hf"] = (hf, "llama-tp", LLAMA_PLAN, 3, hf_full(hf))
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    built = dcp_fixtures.build(Path(reuse) if reuse else root / "dcp", ["shard2", "grid4"])
    for name in ("shard2", "grid4"):
        out[name] = (built[name], root / f"{name}_plan.json", DCP_PLAN, 3, dcp_full(built[name]))
    jobs = {}
    for name, (ckpt, plan, rules, world, full) in out.items():
        (root / f"{name}_rules.json").write_text(json.dumps(rules))
        if isinstance(plan, Path):
            plan.write_text(json.dumps(rules))
        torch.save(full, root / f"{name}_full.pt")
        jobs.setdefault(world, []).append([str(root / f"{name}_full.pt"), str(root / f"{name}_rules.json"),
                                           str(root / f"{name}_ref")])
    for world, js in jobs.items():
        rc, log = dcp_fixtures.run_bounded([HERE / "slice_reference.py", world, json.dumps(js)], timeout=180)
        assert rc == 0, log[-3000:]
    return {n: (c, p, w, root / f"{n}_ref", full) for n, (c, p, _, w, full) in out.items()}


def materialize(ckpt, plan, rank, world, out: Path, *extra, env=None) -> dict:
    flags = [] if rank is None else ["--rank", str(rank), "--world", str(world)]
    rc, stdout, err = run_ckptool("materialize", ckpt, "--plan", plan, *flags, "-o", out, "--json", *extra,
                                  env=env, timeout=120)
    assert rc == 0, err
    return json.loads(stdout)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("name", ["single", "hf", "shard2", "grid4"])
def test_each_rank_gets_what_distribute_tensor_gives(cases, name, tmp_path):
    ckpt, plan, world, ref_dir, full = cases[name]
    for rank in range(world):
        out = tmp_path / f"r{rank}.pt"
        doc = materialize(ckpt, plan, rank, world, out)
        got = torch.load(out, weights_only=True)
        ref = torch.load(ref_dir / f"rank{rank}.pt", weights_only=True)
        assert sorted(got) == sorted(ref), name
        for k in ref:
            assert same(got[k], ref[k]), f"{name} rank {rank} {k}: {got[k].shape} vs {ref[k].shape}"
        slice_bytes = sum(t.numel() * t.element_size() for t in ref.values())
        assert doc["slices"]["slice_bytes"] == slice_bytes
        assert doc["slices"]["full_bytes"] == sum(full[k].numel() * full[k].element_size() for k in ref)
        # A piece per key when held whole; at most one per writing rank for DCP.
        pieces = len(ref) * (4 if name in ("shard2", "grid4") else 1)
        assert doc["io"]["bytes_read"] <= slice_bytes * 1.05 + PAGE * pieces, (name, rank)
        assert doc["io"]["bytes_read"] >= slice_bytes


def test_slices_are_smaller_than_the_whole(cases, tmp_path):
    # The llama shard set at rank 1 of 3: the projections are split, so well under the whole.
    ckpt, plan, world, _, full = cases["hf"]
    doc = materialize(ckpt, plan, 1, world, tmp_path / "r.pt")
    assert doc["io"]["bytes_read"] < doc["slices"]["full_bytes"] * 0.6
    assert doc["slices"]["sliced"] > 0 and doc["slices"]["replicated"] > 0


def test_rank_and_world_from_the_launcher(cases, tmp_path):
    ckpt, plan, world, ref_dir, _ = cases["single"]
    materialize(ckpt, plan, None, None, tmp_path / "r.pt", env={"RANK": "1", "WORLD_SIZE": str(world)})
    got = torch.load(tmp_path / "r.pt", weights_only=True)
    ref = torch.load(ref_dir / "rank1.pt", weights_only=True)
    assert all(same(got[k], ref[k]) for k in ref)
    # A world past torch's C int is a usage error, never an empty slice from an overflow.
    for world in ("2147483648", "9223372036854775807"):
        rc, _, err = run_ckptool("materialize", ckpt, "--plan", plan, "--rank", "0", "--world", world,
                                 "-o", tmp_path / "w.pt")
        assert rc == 2 and "expected an integer from 1 to 2147483647" in err and not (tmp_path / "w.pt").exists(), err
    # So are a world of 0 and a negative rank, each in one plain line.
    for flag, value, want in (("--world", "0", "from 1 to"), ("--rank", "-1", "from 0 to")):
        args = ["--rank", "0", "--world", "2"]
        args[args.index(flag) + 1] = value
        rc, _, err = run_ckptool("materialize", ckpt, "--plan", plan, *args, "-o", tmp_path / "w.pt")
        assert rc == 2 and f"{flag}: expected an integer {want}" in err and err.count("\n") == 1, err


def test_range_and_unmatched_keys(tmp_path):
    sd = single_state_dict()
    ckpt = tmp_path / "m.pt"
    torch.save(sd, ckpt)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"proj.weight": "Range(1, 10, 20)", "steps": "Range(dim=0, start=1, length=1)"}))
    doc = materialize(ckpt, plan, 0, 1, tmp_path / "o.pt")
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    assert sorted(got) == ["proj.weight", "steps"]
    assert same(got["proj.weight"], sd["proj.weight"].narrow(1, 10, 20).contiguous())
    assert same(got["steps"], sd["steps"].narrow(0, 1, 1).contiguous())
    assert doc["slices"]["left_out"] == len(sd) - 2
    assert doc["io"]["bytes_read"] == 64 * 20 * 4 + 3 * 16 * 8


def test_non_row_major_refused_when_sliced_and_whole_when_replicated(tmp_path):
    t = torch.randn(4, 6, generator=torch.Generator().manual_seed(3)).t()
    ckpt = tmp_path / "t.pt"
    torch.save({"t": t}, ckpt)
    before = ckpt.read_bytes()
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"t": "Shard(0)"}))
    out = tmp_path / "o.pt"
    rc, _, err = run_ckptool("materialize", ckpt, "--plan", plan, "--rank", "0", "--world", "2", "-o", out)
    assert rc == 3, err
    assert len(err.strip().splitlines()) == 1 and str(ckpt) in err and "row-major" in err
    assert not out.exists() and ckpt.read_bytes() == before
    plan.write_text(json.dumps({"t": "Replicate()"}))
    materialize(ckpt, plan, 1, 2, out)
    assert same(torch.load(out, weights_only=True)["t"].contiguous(), t.contiguous())


@pytest.mark.parametrize("plan,flags,fragment", [
    ({"proj.weight": "Shard(2)"}, ["--rank", "0", "--world", "2"], "dimension 2"),
    ({"proj.weight": "Shard(0)"}, ["--rank", "2", "--world", "2"], "--rank 2"),
    ({"proj.weight": "Partial()"}, ["--rank", "0", "--world", "2"], "not a placement"),
    ({"proj.weight": "Range(1, 250, 10)"}, ["--rank", "0", "--world", "1"], "outside"),
    (None, ["--rank", "0", "--world", "2"], "need --plan"),
    ({"*": "Shard(0)"}, [], "--rank"),
])
def test_usage_errors(tmp_path, plan, flags, fragment):
    ckpt = tmp_path / "m.pt"
    torch.save(single_state_dict(), ckpt)
    args = ["materialize", ckpt, *flags, "-o", tmp_path / "o.pt"]
    if plan is not None:
        (tmp_path / "p.json").write_text(json.dumps(plan))
        args += ["--plan", tmp_path / "p.json"]
    rc, _, err = run_ckptool(*args, env={"RANK": "", "WORLD_SIZE": ""})
    assert rc == 2, err
    assert fragment in err
    assert not (tmp_path / "o.pt").exists()


def test_ties_of_two_tensor_objects_stay_one_slice(tmp_path):
    """nn.Module ties give state_dict() one tensor object per module, both views of one
    storage (an embedding and its tied head): --plan used to slice them apart."""
    emb = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    sd = torch.nn.ModuleDict({"emb": emb, "head": head}).state_dict()
    assert sd["emb.weight"] is not sd["head.weight"]
    src = tmp_path / "tied.pt"
    torch.save(sd, src)
    for placement in ("Replicate()", "Shard(0)"):
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"*": placement}))
        out = tmp_path / "out.pt"
        rc, _, err = run_ckptool("materialize", src, "--plan", plan, "--rank", 1, "--world", 2, "-o", out)
        assert rc == 0, err
        got = torch.load(out, weights_only=True)
        assert got["emb.weight"].untyped_storage().data_ptr() == got["head.weight"].untyped_storage().data_ptr(), placement
        assert torch.equal(got["emb.weight"], got["head.weight"])


def test_an_empty_tensor_is_sliced_whatever_its_strides(tmp_path):
    """torch.empty(4, 0) has strides (1, 1) and is contiguous to torch: Shard(1) was refused
    as 'not row-major' though there is no byte to read."""
    src = tmp_path / "e.pt"
    t = torch.empty(4, 0)
    assert t.stride() == (1, 1) and t.is_contiguous()
    torch.save({"i": t, "w": torch.arange(8.0).reshape(4, 2)}, src)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"*": "Shard(1)"}))
    for rank in range(2):
        out = tmp_path / f"r{rank}.pt"
        rc, _, err = run_ckptool("materialize", src, "--plan", plan, "--rank", rank, "--world", 2, "-o", out)
        assert rc == 0, err
        got = torch.load(out, weights_only=True)
        assert got["i"].shape == torch.chunk(t, 2, 1)[rank].shape
        assert torch.equal(got["w"], torch.chunk(torch.arange(8.0).reshape(4, 2), 2, 1)[rank])
