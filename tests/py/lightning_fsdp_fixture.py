"""A Lightning FSDP checkpoint directory written by Lightning itself, on CPU.

    .venv/bin/python tests/py/lightning_fsdp_fixture.py OUTDIR

Lightning 2.6's ``FSDPStrategy`` cannot run on CPU: the connector refuses it ("You
selected the FSDP strategy but FSDP is only available on GPU", fabric/connector.py), and
past that check torch's FSDP1 itself does ("FSDP needs a non-CPU accelerator device, but
no accelerator device is detected", torch/distributed/fsdp/_init_utils.py). Its
``ModelParallelStrategy`` (FSDP2 ``fully_shard``) runs on CPU with gloo and saves through
the same path: the model and optimizer with ``torch.distributed.checkpoint`` and the rest
into ``meta.pt`` (fabric/strategies/model_parallel.py ``_save_checkpoint``,
``_METADATA_FILENAME``). This script is the Fabric program: 2 CPU processes, one Adam
step, ``fabric.save``; then ``fabric.load`` into a fresh model, and rank 0 writes what
Lightning loaded, in full, to OUTDIR.expected.pt (the test's reference). Fabric launches
the second process itself by re-running this script; the caller bounds and kills the
whole session (dcp_fixtures.build_lightning).
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn


def model_of(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def main(out: str) -> None:
    import lightning as L
    from lightning.fabric.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    def parallelize(model, mesh):
        fully_shard(model, mesh=mesh["data_parallel"])
        return model

    strategy = ModelParallelStrategy(parallelize, data_parallel_size=2, tensor_parallel_size=1)
    fabric = L.Fabric(strategy=strategy, accelerator="cpu", devices=2)
    fabric.launch()
    model = fabric.setup(model_of(0))
    opt = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=1e-3))
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    fabric.save(out, {"model": model, "optimizer": opt, "step": 7, "hparams": {"lr": 1e-3, "name": "tiny"}})

    fresh = fabric.setup(model_of(1))
    rest = fabric.load(out, {"model": fresh})
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in fresh.state_dict().items()}
    if fabric.global_rank == 0:
        torch.save({"model": full, "step": rest.get("step"), "hparams": rest.get("hparams")}, out + ".expected.pt")
    fabric.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
