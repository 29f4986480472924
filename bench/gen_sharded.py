"""Benchmark fixtures for sharded checkpoints (issue 14, scenario S6), written by the real
writers: huggingface_hub.save_torch_state_dict for Hugging Face shard sets, and
torch.distributed.checkpoint.save in 4 gloo processes for DCP directories.

  hf_many/   N tensors (the S3 layout at the main size) as a safetensors shard set of ~8 shards
  dcp_many/  those N keys, each a DTensor sharded on dim 0 over 4 ranks (N x 4 chunks; small keys
             give zero-size chunks, as real uneven splits do)
  hf_big/    the llm_bf16 layout at the main size, shards of about a quarter of it
  dcp_big/   the same layout at the main size, every tensor sharded on dim 0 over 4 ranks
  dcp_hf_big/  (S7 only) dcp_big's layout saved by 4 ranks through HuggingFaceStorageWriter
             (save_distributed=True: one safetensors file per rank), the only DCP form that
             PyTorch's consolidate_safetensors_files reads; ckptool does not read it

Each rank of a DCP save draws only its own chunk (its own generator), so the writers hold
one copy of the data between them, not four. Values are random and finite, as in
gen_fixtures.py. Called by gen_fixtures.py (`--what ...,s6`).
"""

from __future__ import annotations

import os
import socket
from collections import OrderedDict
from pathlib import Path

import torch

RANKS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_rows(rows: int, rank: int) -> tuple:
    """(first row, row count) of rank's chunk: torch.chunk's split, which Shard(0) uses."""
    per = -(-rows // RANKS)
    first = min(rows, per * rank)
    return first, max(0, min(per, rows - first))


def _dcp_rank(rank: int, port: int, out: str, shapes: list, seed: int, hf_writer: bool) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from gen_fixtures import random_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(RANKS))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS, timeout=__import__("datetime").timedelta(seconds=600))
    try:
        mesh = init_device_mesh("cpu", (RANKS,))
        gen = torch.Generator().manual_seed(seed * 100 + rank)
        sd = OrderedDict()
        for key, shape in shapes:
            _, n = _local_rows(shape[0], rank)
            local = random_tensor((n, *shape[1:]), torch.bfloat16, gen)
            stride = []
            acc = 1
            for d in reversed(shape):
                stride.insert(0, acc)
                acc *= d
            sd[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                         stride=tuple(stride))
        if hf_writer:
            from torch.distributed.checkpoint import HuggingFaceStorageWriter
            dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
        else:
            dcp.save(sd, checkpoint_id=out)
    finally:
        dist.destroy_process_group()


def write_dcp(out: Path, shapes: list, seed: int, hf_writer: bool = False) -> None:
    """dcp.save of `shapes` ([(key, shape)]) in RANKS gloo processes on 127.0.0.1 (hf_writer:
    through HuggingFaceStorageWriter)."""
    import torch.multiprocessing as mp
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_dcp_rank, args=(_free_port(), str(out), shapes, seed, hf_writer), nprocs=RANKS, join=True,
                       start_method="spawn")


def write_hf(out: Path, sd, shard_bytes: int) -> None:
    from huggingface_hub import save_torch_state_dict
    out.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(sd, str(out), max_shard_size=shard_bytes)


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file())


def fsync_dir(p: Path) -> None:
    for f in p.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def shapes_of(sd) -> list:
    return [(k, tuple(v.shape)) for k, v in sd.items()]


def payload_of(shapes: list, esize: int = 2) -> int:
    total = 0
    for _, s in shapes:
        n = 1
        for d in s:
            n *= d
        total += n * esize
    return total


def write_all(d: Path, size: int, count: int, gen: torch.Generator, record, hf_dcp: bool = False) -> None:
    """The four S6 fixtures (and dcp_hf_big with hf_dcp); record(name, fmt, path, payload,
    tensors) adds each to the manifest."""
    from gen_fixtures import for_safetensors, llm_state_dict, many_state_dict, payload_bytes

    # At the main size, not the S3 size: issue 14 speaks of multi-GB sets, and the share of
    # bytes inspect reads is measured against the whole set (20,000 keys x 4 ranks in 2 GiB).
    many = many_state_dict(size, count, gen)
    p = d / "hf_many"
    write_hf(p, many, max(1, size // 8))
    fsync_dir(p)
    record("hf_many", "hf-set", p, payload_bytes(many), len(many))
    shapes = shapes_of(many)
    del many
    p = d / "dcp_many"
    write_dcp(p, shapes, 61)
    fsync_dir(p)
    record("dcp_many", "dcp", p, payload_of(shapes), len(shapes))

    big = for_safetensors(llm_state_dict(size, torch.bfloat16, gen))
    big = OrderedDict((k, v) for k, v in big.items() if k != "model.rotary_emb.cos_even")
    p = d / "hf_big"
    write_hf(p, big, max(1, size // 4))
    fsync_dir(p)
    record("hf_big", "hf-set", p, payload_bytes(big), len(big))
    shapes = shapes_of(big)
    del big
    p = d / "dcp_big"
    write_dcp(p, shapes, 62)
    fsync_dir(p)
    record("dcp_big", "dcp", p, payload_of(shapes), len(shapes))
    if hf_dcp:
        p = d / "dcp_hf_big"
        write_dcp(p, shapes, 62, hf_writer=True)
        fsync_dir(p)
        record("dcp_hf_big", "dcp-hf", p, payload_of(shapes), len(shapes))
