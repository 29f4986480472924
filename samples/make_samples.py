#!/usr/bin/env python3
"""Write the small sample checkpoints under samples/ with real torch, Lightning and
safetensors (see samples/README.md). Run from anywhere:

    .venv/bin/python samples/make_samples.py [OUTDIR]

OUTDIR defaults to the directory of this script.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyNet(nn.Module):
    """A tiny classifier: token embedding, one hidden layer, layer norm, head."""

    def __init__(self, vocab: int = 32, dim: int = 16, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        x = self.embed(ids).mean(dim=1)
        return self.head(self.norm(F.gelu(self.hidden(x))))


class ScriptedNet(TinyNet):
    """TinyNet uncompiled, with an exported evaluation step: the scripted twin of the model
    inside compiled_lightning.ckpt, so `materialize --model` can fill one from the other."""

    @torch.jit.export
    def evaluation_step(self, ids, target):
        return F.cross_entropy(self.forward(ids), target)


def make_lightning(path: Path) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class TinyClassifier(L.LightningModule):
        def __init__(self, vocab: int = 32, dim: int = 16, classes: int = 4, lr: float = 3e-3):
            super().__init__()
            self.save_hyperparameters()
            # torch.compile wraps the submodule: its keys become model._orig_mod.*
            self.model = torch.compile(TinyNet(vocab, dim, classes), backend="eager")

        def training_step(self, batch, batch_idx):
            ids, y = batch
            return F.cross_entropy(self.model(ids), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    for lg in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(lg).setLevel(logging.ERROR)
    torch.manual_seed(0)
    data = TensorDataset(torch.randint(0, 32, (32, 6)), torch.randint(0, 4, (32,)))
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(TinyClassifier(), DataLoader(data, batch_size=8))
    trainer.save_checkpoint(str(path))


def make_plain(path: Path) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                          nn.Linear(12, 2))
    torch.save(model.state_dict(), path)


def make_safetensors(path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(2)
    m = TinyNet()
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    tensors["hidden.weight"] = tensors["hidden.weight"].to(torch.bfloat16)
    tensors["head.weight"] = tensors["head.weight"].to(torch.float16)
    tensors["vocab_ids"] = torch.arange(32, dtype=torch.int64)
    save_file(tensors, str(path), metadata={"format": "pt", "source": "samples/make_samples.py"})


def make_scripted(path: Path) -> None:
    torch.manual_seed(3)
    m = torch.jit.script(ScriptedNet())
    m.save(str(path))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_lightning(out / "compiled_lightning.ckpt")
        make_plain(out / "plain.pt")
        make_safetensors(out / "model.safetensors")
        make_scripted(out / "scripted.pt")
    total = 0
    for name in ("compiled_lightning.ckpt", "plain.pt", "model.safetensors", "scripted.pt"):
        n = (out / name).stat().st_size
        total += n
        print(f"{name:26s} {n:7d} bytes")
    print(f"{'total':26s} {total:7d} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
