"""materialize --model on TorchScript modules that differ from the common shape: a complex
nn.Parameter (its requires_grad was dropped, exit 0) and a method whose receiver the code
does not call `self` (--run refused it as an argument to give)."""

from __future__ import annotations

import torch
import torch.nn as nn

from conftest import run_ckptool


class Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Parameter(torch.randn(2, dtype=torch.complex64))
        self.w = nn.Parameter(torch.randn(2))

    def forward(self, x):
        return x * self.c.abs() + self.w


class Receiver(nn.Module):
    def __init__(s):  # noqa: N805 - the point of the test
        super().__init__()
        s.lin = nn.Linear(4, 4)

    def forward(s, x):  # noqa: N805
        return s.lin(x)


def test_a_complex_parameter_keeps_requires_grad(tmp_path):
    torch.manual_seed(0)
    m = Complex()
    torch.jit.script(m).save(str(tmp_path / "s.pt"))
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    out = tmp_path / "filled.pt"
    rc, _, err = run_ckptool("materialize", tmp_path / "sd.pt", "--device", "cpu", "--model", tmp_path / "s.pt", "-o", out)
    assert rc == 0, err
    filled = torch.jit.load(str(out))
    params = dict(filled.named_parameters())
    assert params["c"].requires_grad and params["w"].requires_grad
    assert torch.equal(params["c"].detach(), m.c.detach())


def test_a_receiver_not_named_self_runs(tmp_path):
    torch.manual_seed(0)
    m = Receiver()
    scripted = torch.jit.script(m)
    assert scripted.forward.schema.arguments[0].name == "s"
    scripted.save(str(tmp_path / "s.pt"))
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    rc, out, err = run_ckptool("materialize", tmp_path / "sd.pt", "--device", "cpu", "--model", tmp_path / "s.pt",
                               "--run", "forward", "--input", "2x4")
    assert rc == 0, (out, err)
