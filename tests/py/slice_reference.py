"""Each rank's slices as real torch makes them: ``distribute_tensor(full, mesh,
[placement]).to_local()`` in W gloo processes on 127.0.0.1 (never ckptool's arithmetic).

    python slice_reference.py WORLD JOBS_JSON

JOBS_JSON is a list of [full.pt, plan.json, outdir]: full.pt a torch.save dict of whole
tensors, plan.json a {glob: placement} object (first match wins, as ckptool's --plan; keys
no glob matches and Range placements are left out). Rank r writes outdir/rank{r}.pt.
Run it through dcp_fixtures.run_bounded, which kills every rank on a timeout.
"""
from __future__ import annotations

import fnmatch
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def placement_of(text: str):
    from torch.distributed.tensor import Replicate, Shard
    t = text.replace(" ", "")
    if t in ("Replicate", "Replicate()"):
        return Replicate()
    if t.startswith("Shard(") and t.endswith(")"):
        return Shard(int(t[6:-1].removeprefix("dim=")))
    return None  # Range: not a DTensor placement


def rank_main(rank: int, world: int, jobs: list, port: int):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for full_pt, plan_json, out in jobs:
            full = torch.load(full_pt, weights_only=True)
            rules = list(json.loads(Path(plan_json).read_text()).items())
            local = {}
            for key, t in full.items():
                rule = next((p for g, p in rules if fnmatch.fnmatchcase(key, g)), None)
                p = placement_of(rule) if rule else None
                if p is None:
                    continue
                local[key] = distribute_tensor(t, mesh, [p]).to_local().clone()
            Path(out).mkdir(parents=True, exist_ok=True)
            torch.save(local, Path(out) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    import dcp_fixtures
    world = int(sys.argv[1])
    jobs = json.loads(sys.argv[2])
    mp.spawn(rank_main, args=(world, jobs, dcp_fixtures.free_port()), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
