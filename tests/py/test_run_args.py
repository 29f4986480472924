"""Issue 12 item 7: methods with non-tensor arguments, submodule methods, tied parameters.

  * `materialize --model M CKPT --run METHOD --input ... --arg VALUE / --arg NAME=VALUE`:
    int, float, bool, str, None (Optional) and List[int] arguments reach the method (its
    non-tensor results echo them; its tensor result's checksum equals what Python computes
    from torch.jit.load(M) with the checkpoint's weights and the same arguments);
  * `inspect --input/--arg/--method` runs the same on meta;
  * a wrong type, an unknown name, an argument given twice, a missing one, one too many:
    exit 2 with one line naming the argument;
  * `inspect` lists submodules' methods (`blocks.0.forward`, text and JSON) and they run;
  * `inspect`'s TorchScript listing marks tied parameters (text and JSON `tied_to`).
Real torch.jit.script modules and torch.save checkpoints throughout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from torch import Tensor

from conftest import run_ckptool


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor, gain: float) -> Tensor:
        return self.lin(x) * gain


class Audio(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor, sr: int) -> Tuple[Tensor, int]:
        for b in self.blocks:
            x = b(x, 0.5)
        return self.head(x) * float(sr), sr + 1

    @torch.jit.export
    def score(self, x: Tensor, k: int, dims: List[int], scale: float = 1.0, mode: str = "sum", flag: bool = False,
              bias: Optional[float] = None) -> Tuple[Tensor, int, float, str, bool, List[int], bool]:
        y = self.head(x).sum(dims) * scale
        if bias is not None:
            y = y + bias
        return y, k, scale, mode, flag, dims, bias is None


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.out = nn.Linear(4, 5, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.out(self.emb(ids))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("run_args")
    torch.manual_seed(0)
    m = Audio().eval()
    model = d / "audio_scripted.pt"
    torch.jit.script(m).save(str(model))
    # The checkpoint holds other weights than the model file: the run must use these.
    torch.manual_seed(1)
    weights = Audio().state_dict()
    ckpt = d / "audio.ckpt"
    torch.save(weights, ckpt)
    tied = d / "tied_scripted.pt"
    torch.jit.script(Tied()).save(str(tied))
    return {"model": model, "ckpt": ckpt, "weights": weights, "tied": tied}


def x_like_ckptool(shape):
    """--input SHAPE as src/torch/materialize.cpp draws it (one CPU generator seeded 0)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float32)


def reference(files):
    m = torch.jit.load(str(files["model"]))
    m.load_state_dict(files["weights"])
    return m.eval()


def materialize_run(files, *args, rc=0):
    code, out, err = run_ckptool("materialize", "--json", "--model", files["model"], files["ckpt"], *args, timeout=60)
    assert code == rc, f"exit {code}: {err}"
    return json.loads(out) if rc == 0 else err


def test_positional_int_after_input(files):
    r = materialize_run(files, "--run", "forward", "--input", "2x4", "--arg", "16000")
    t, n = r["run"]["outputs"]
    assert n["value"] == "16001"
    with torch.no_grad():
        y, _ = reference(files)(x_like_ckptool((2, 4)), 16000)
    assert t["shape"] == [2, 3]
    assert t["checksum"] == pytest.approx(y.double().sum().item(), rel=1e-6, abs=1e-4)


def test_named_int(files):
    r = materialize_run(files, "--run", "forward", "--input", "2x4", "--arg", "sr=8000")
    assert r["run"]["outputs"][1]["value"] == "8001"


def test_every_simple_type(files):
    r = materialize_run(files, "--run", "score", "--input", "3x4", "--arg", "7", "--arg", "mode=mean",
                        "--arg", "scale=0.25", "--arg", "flag=true", "--arg", "dims=[0, 1]", "--arg", "bias=None")
    outs = r["run"]["outputs"]
    # The tuple (y, k, scale, mode, flag, dims, bias is None), dims flattened to 5.0 and 5.1.
    by_path = {o["path"]: o for o in outs}
    assert by_path["1"]["value"] == "7"
    assert float(by_path["2"]["value"]) == 0.25
    assert "mean" in by_path["3"]["value"]
    assert by_path["4"]["value"] == "True"
    assert by_path["6"]["value"] == "True"
    with torch.no_grad():
        y = reference(files).score(x_like_ckptool((3, 4)), 7, [0, 1], 0.25, "mean", True, None)[0]
    assert by_path["0"]["checksum"] == pytest.approx(y.double().sum().item(), rel=1e-6, abs=1e-5)
    # An Optional given a value.
    r = materialize_run(files, "--run", "score", "--input", "3x4", "--arg", "k=1", "--arg", "dims=1", "--arg", "bias=2.5")
    with torch.no_grad():
        y = reference(files).score(x_like_ckptool((3, 4)), 1, [1], bias=2.5)[0]
    assert r["run"]["outputs"][0]["checksum"] == pytest.approx(y.double().sum().item(), rel=1e-6, abs=1e-5)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--input", "2x4", "--arg", "sr=abc"], ["argument 'sr' (int): 'abc'"]),
        (["--input", "2x4", "--arg", "rate=16000"], ["'rate'", "sr"]),
        (["--input", "2x4"], ["missing argument 'sr' (int)", "--arg"]),
        (["--input", "2x4", "--arg", "1", "--arg", "2"], ["too many", "'2'"]),
        (["--input", "2x4", "--arg", "1", "--arg", "sr=2"], ["'sr'", "twice"]),
        (["--arg", "1"], ["'x'", "Tensor", "--input"]),
        (["--input", "2x4", "--input", "3"], ["'sr'", "not a Tensor", "--arg"]),
    ],
)
def test_bad_arguments_are_usage_errors(files, args, words):
    err = materialize_run(files, "--run", "forward", *args, rc=2)
    line = err.strip()
    assert "\n" not in line, err
    assert line.startswith("ckptool: usage: "), err
    for w in words:
        assert w in line, f"{w!r} not in {line!r}"


def test_bad_list_and_bool(files):
    err = materialize_run(files, "--run", "score", "--input", "3x4", "--arg", "k=1", "--arg", "dims=1,x", rc=2)
    assert "'dims'" in err and "List[int]" in err
    err = materialize_run(files, "--run", "score", "--input", "3x4", "--arg", "k=1", "--arg", "dims=1", "--arg", "flag=maybe", rc=2)
    assert "'flag'" in err and "bool" in err


def test_inspect_runs_with_args_on_meta(files):
    code, out, err = run_ckptool("inspect", "--json", files["model"], "--method", "score", "--input", "3x4",
                                 "--arg", "5", "--arg", "dims=[0,1]")
    assert code == 0, err
    vals = json.loads(out)["outputs"]["values"]
    by_path = {v["path"]: v for v in vals}
    assert by_path["0"]["shape"] == [] and by_path["1"]["value"] == "5"
    code, out, err = run_ckptool("inspect", files["model"], "--input", "2x4", "--arg", "sr=x")
    assert code == 2 and "'sr'" in err and len(err.strip().splitlines()) == 1, err


def test_submodule_methods_listed_and_run(files):
    code, out, err = run_ckptool("inspect", "--json", files["model"])
    assert code == 0, err
    mod = json.loads(out)["module"]
    names = [m["name"] for m in mod["submodule_methods"]]
    for want in ("blocks.0.forward", "blocks.1.forward", "head.forward"):
        assert want in names, names
    assert {m["name"] for m in mod["methods"]} == {"forward", "score"}  # the root's, as before
    code, out, err = run_ckptool("inspect", files["model"])
    assert code == 0 and "blocks.0.forward" in out, out
    # Run one on meta, and for real with the checkpoint's weights.
    code, out, err = run_ckptool("inspect", "--json", files["model"], "--method", "blocks.1.forward",
                                 "--input", "2x4", "--arg", "gain=2.0")
    assert code == 0, err
    assert json.loads(out)["outputs"]["values"][0]["shape"] == [2, 4]
    r = materialize_run(files, "--run", "blocks.1.forward", "--input", "2x4", "--arg", "2.0")
    with torch.no_grad():
        y = getattr(reference(files).blocks, "1")(x_like_ckptool((2, 4)), 2.0)
    assert r["run"]["outputs"][0]["checksum"] == pytest.approx(y.double().sum().item(), rel=1e-6, abs=1e-5)
    err = materialize_run(files, "--run", "blocks.7.forward", "--input", "2x4", rc=2)
    assert "blocks.7" in err


def test_tied_parameters_marked(files):
    code, out, err = run_ckptool("inspect", "--json", files["tied"])
    assert code == 0, err
    params = json.loads(out)["module"]["parameters"]
    m = torch.jit.load(str(files["tied"]))
    names = [n for n, _ in m.named_parameters()]
    assert m.emb.weight is m.out.weight or m.emb.weight.data_ptr() == m.out.weight.data_ptr()
    tied = {p["name"]: p.get("tied_to") for p in params}
    # Each name torch lists; the later name of the shared tensor says which it is tied to.
    assert set(tied) >= set(names)
    marked = {k: v for k, v in tied.items() if v}
    assert marked in ({"out.weight": "emb.weight"}, {"emb.weight": "out.weight"}), tied
    code, out, err = run_ckptool("inspect", files["tied"])
    assert code == 0 and "tied to emb.weight" in out, out
