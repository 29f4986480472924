#!/usr/bin/env python3
"""Write the fixtures of tests/unit/assembled_load_torch_test.cpp with real torch and
safetensors. Run from anywhere:

    .venv/bin/python tests/data/assembled/make_assembled.py

pieces.safetensors holds, for each tensor the test assembles, its pieces ("p.<name>.<i>":
boxes cut out of it, as the ranks of a DCP save write them) and the tensor itself as torch
computed it ("full.<name>"); the test builds assembled keys from the pieces by hand and
compares what ckptool assembles with the full tensors. model.pt is a TorchScript module
whose parameters and buffers have the assembled keys' global shapes, for --model.
"""

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file


def boxes(full, cuts):
    """The pieces of `full` cut at `cuts` (one list of [start, stop) per dimension)."""
    out = []

    def rec(dim, index):
        if dim == full.dim():
            out.append(full[tuple(slice(a, b) for a, b in index)].clone().contiguous())
            return
        for a, b in cuts[dim]:
            rec(dim + 1, index + [(a, b)])

    rec(0, [])
    return out


def main():
    here = Path(__file__).resolve().parent
    t = {}

    def add(name, full, pieces):
        t["full." + name] = full.contiguous()
        for i, p in enumerate(pieces):
            t[f"p.{name}.{i}"] = p

    dim0 = torch.arange(30, dtype=torch.float32).reshape(6, 5) + 0.25
    add("dim0", dim0, boxes(dim0, [[(0, 2), (2, 6)], [(0, 5)]]))
    dim1 = torch.arange(24, dtype=torch.float32).reshape(4, 6) * -1.5
    add("dim1", dim1, boxes(dim1, [[(0, 4)], [(0, 2), (2, 6)]]))
    grid = torch.arange(35, dtype=torch.float64).reshape(5, 7) / 7
    add("grid", grid, boxes(grid, [[(0, 2), (2, 5)], [(0, 3), (3, 7)]]))
    cube = torch.arange(60, dtype=torch.int32).reshape(3, 4, 5) - 7
    add("cube", cube, boxes(cube, [[(0, 3)], [(0, 2), (2, 4)], [(0, 3), (3, 5)]]))
    bf = (torch.arange(24, dtype=torch.float32).reshape(3, 8) / 3).to(torch.bfloat16)
    add("bf", bf, boxes(bf, [[(0, 3)], [(0, 5), (5, 8)]]))
    # Zero-size pieces (a rank whose shard is empty) beside the one that holds it all.
    halves = torch.arange(12, dtype=torch.float16).reshape(4, 3)
    add("halves", halves, [halves.clone(), halves[4:4].clone(), halves[:, 3:3].clone()])
    add("scalar", torch.tensor(3.5), [torch.tensor(3.5)])
    # A replicated tensor: every rank wrote it whole, the metadata lists it once.
    whole = torch.arange(8, dtype=torch.int64) * 1000
    add("whole", whole, [whole.clone()])
    nan = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    nan[1, 3] = float("nan")
    add("nan", nan, boxes(nan, [[(0, 2)], [(0, 2), (2, 4)]]))
    save_file(t, str(here / "pieces.safetensors"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.dim0 = nn.Parameter(torch.zeros(6, 5))
            self.dim1 = nn.Parameter(torch.zeros(4, 6))
            self.register_buffer("cube", torch.zeros(3, 4, 5, dtype=torch.int32))

        def forward(self, x):
            return x @ self.dim0 @ self.dim1.t()

    torch.jit.script(Model()).save(str(here / "model.pt"))


if __name__ == "__main__":
    main()
