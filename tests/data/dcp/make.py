#!/usr/bin/env python3
"""Writes the small DCP fixtures tests/unit/dcp_reader_test.cpp reads (into memory_opener
file sets), with the real writer: ``dcp.save`` in 2 gloo processes on 127.0.0.1.

    .venv/bin/python tests/data/dcp/make.py      # rewrites tests/data/dcp/

* ``small/``: ``.metadata`` and two ``.distcp`` files: ``w`` (float32 (5, 4), DTensor
  Shard(0): chunks (0,0)+(3,4) and (3,0)+(2,4)), ``b`` (int64 (3,), a plain tensor: one
  chunk), ``step`` (the int 7: a BYTE_IO item).
* ``overlap.metadata``, ``gap.metadata``: ``small/.metadata`` read back by
  ``FileSystemReader.read_metadata`` with ``w``'s second box moved to (2,0)+(3,4) (overlapping
  the first) or dropped (rows 3-4 held by no chunk), pickled again as FileSystemWriter
  pickles it (``pickle.dump`` of the real ``Metadata``).
dcp.save writes a random save id, so a rerun differs byte for byte, not in content.
"""

import copy
import os
import pickle
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
        sd = {"w": distribute_tensor(torch.arange(20, dtype=torch.float32).reshape(5, 4), mesh, [Shard(0)]),
              "b": torch.tensor([1, 2, 3]), "step": 7}
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def variants():
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    md = FileSystemReader(str(HERE / "small")).read_metadata()
    md.storage_meta = None  # what read_metadata adds (a load id) is not what was written
    w = md.state_dict_metadata["w"]
    assert [list(c.offsets) for c in w.chunks] == [[0, 0], [3, 0]], w.chunks
    over = copy.deepcopy(md)
    over.state_dict_metadata["w"].chunks[1] = ChunkStorageMetadata(offsets=torch.Size([2, 0]), sizes=torch.Size([3, 4]))
    (HERE / "overlap.metadata").write_bytes(pickle.dumps(over))
    gap = copy.deepcopy(md)
    del gap.state_dict_metadata["w"].chunks[1]
    (HERE / "gap.metadata").write_bytes(pickle.dumps(gap))
    # The success twin, pickled the same way.
    (HERE / "twin.metadata").write_bytes(pickle.dumps(md))


def main():
    import torch.multiprocessing as mp
    out = HERE / "small"
    shutil.rmtree(out, ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, str(out)), nprocs=2, join=True)
    variants()
    for p in sorted(HERE.rglob("*")):
        if p.is_file() and p.suffix != ".py":
            print(p.relative_to(HERE), p.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
