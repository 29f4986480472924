#!/usr/bin/env python3
"""Writes the DCP fixture tests/py/test_diff.py compares with dcp_to_torch_save's output,
with the real writer: ``dcp.save`` in 2 gloo processes on 127.0.0.1 (committed, so the test
needs no ranks of its own).

    .venv/bin/python tests/data/diff/make.py      # rewrites tests/data/diff/sharded/

``sharded/``: tensors whose chunks are not contiguous in the global tensor, so every row
(or every inner run) of a window comes from two pieces:
* ``col`` float32 (3, 6), DTensor Shard(1): chunks (0,0)+(3,3) and (0,3)+(3,3);
* ``uneven`` bfloat16 (4, 5), Shard(1): chunks of 3 and 2 columns;
* ``cube`` int32 (2, 3, 4), Shard(2): runs of 2 elements under two outer dimensions;
* ``row`` float16 (5, 2), Shard(0): each piece one contiguous range;
* ``plain`` int64 (3,), a plain tensor: one chunk.
dcp.save writes a random save id, so a rerun differs byte for byte, not in content.
"""

import os
import shutil
import socket
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rank_main(rank, world, port, out):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        sd = {
            "col": distribute_tensor(torch.arange(18, dtype=torch.float32).reshape(3, 6) * 0.5, mesh, [Shard(1)]),
            "uneven": distribute_tensor((torch.arange(20) - 7).reshape(4, 5).to(torch.bfloat16), mesh, [Shard(1)]),
            "cube": distribute_tensor(torch.arange(24, dtype=torch.int32).reshape(2, 3, 4) * 3, mesh, [Shard(2)]),
            "row": distribute_tensor(torch.arange(10, dtype=torch.float16).reshape(5, 2), mesh, [Shard(0)]),
            "plain": torch.tensor([4, 5, 6]),
        }
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp
    out = HERE / "sharded"
    shutil.rmtree(out, ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, str(out)), nprocs=2, join=True)
    for p in sorted(out.rglob("*")):
        print(p.relative_to(HERE), p.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
