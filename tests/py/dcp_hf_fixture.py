"""Writes DCP directories with torch.distributed.checkpoint's HuggingFaceStorageWriter (the
real writer; docs/formats.md §9.10), in WORLD local gloo processes:

    python dcp_hf_fixture.py OUTDIR WORLD

* OUTDIR/dist: ``save_distributed=True``: every rank writes its own
  ``shard-{rank+1}-model-{i}-of-{N}.safetensors`` pieces (with WORLD 2 over two files per
  rank, by ``fqn_to_index_mapping``), no index;
* OUTDIR/nodist: ``save_distributed=False``: ``model-*.safetensors`` and an index (meant for
  one process: with WORLD 2 the ranks write one file name over each other);
* OUTDIR/source.pt: the state dict in full (rank 0), what both must read back as.

Run bounded by dcp_fixtures.run_bounded; nothing here looks at ckptool.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path


def state(world: int):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    g = torch.Generator().manual_seed(3)
    full = {
        "embed.weight": torch.randn(7, 5, generator=g),                           # Shard(0), uneven
        "proj.weight": torch.randn(3, 6, generator=g).to(torch.bfloat16),         # Shard(1)
        "norm.weight": torch.randn(4, generator=g).to(torch.float16),             # Replicate
        "tiny": torch.tensor([[1.5, 2.5, 3.5]]),                                  # one row: a zero-size box
        "big": torch.randn(301, 1000, generator=g),                               # over a megabyte, Shard(0)
        "scale": torch.tensor(3.5, dtype=torch.float64),                          # 0-dim
    }
    mesh = init_device_mesh("cpu", (world,))
    place = {"embed.weight": [Shard(0)], "proj.weight": [Shard(1)], "norm.weight": [Replicate()],
             "tiny": [Shard(0)], "big": [Shard(0)], "scale": [Replicate()]}
    sd = {k: distribute_tensor(v.clone(), mesh, place[k]) for k, v in full.items()}
    return full, sd


def rank_main(rank: int, world: int, out: str, port: int):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        full, sd = state(world)
        mapping = {k: (1 if i % 2 == 0 else 2) for i, k in enumerate(full)} if world > 1 else None
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(f"{out}/dist", fqn_to_index_mapping=mapping,
                                                            save_distributed=True))
        dist.barrier()
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(f"{out}/nodist"))
        dist.barrier()
        if rank == 0:
            torch.save(full, f"{out}/source.pt")
    finally:
        dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dcp_fixtures import free_port
    out, world = sys.argv[1], int(sys.argv[2])
    Path(out).mkdir(parents=True, exist_ok=True)
    mp.spawn(rank_main, args=(world, out, free_port()), nprocs=world, join=True)


if __name__ == "__main__":
    main()
