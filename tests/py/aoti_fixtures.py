"""AOTInductor packages for test_aoti.py, compiled by the real torch._inductor in a child
process (python aoti_fixtures.py OUT_DIR), once per test session: two compiles, about
20-60 s each on two cores.

OUT_DIR receives:
  default.pt2     aoti_compile_and_package, default configs: weights in the .so; fc2.bias
                  and shift (4 elements each) compiled in as literals
  keep.pt2        always_keep_tensor_constants=True: all five tensors are constants
  sd_orig.pt      the compiled model's own state dict
  sd_new.pt       new values for all five keys
  sd_new_big.pt   new values for the three keys the default package keeps
  expected.json   eager outputs for the inputs ckptool's --run makes (randn, seed 0)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

IN_FEATURES, HIDDEN, OUT = 8, 16, 4
BATCH = 3


def build_model():
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(IN_FEATURES, HIDDEN)
            self.fc2 = torch.nn.Linear(HIDDEN, OUT)
            self.register_buffer("shift", torch.ones(OUT))

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))) + self.shift

    return Net


def run_input():
    """The input ckptool's --run makes for `--input 3x8`: randn from a CPU generator
    seeded 0."""
    import torch

    return torch.randn(BATCH, IN_FEATURES, generator=torch.Generator().manual_seed(0))


def main(out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    m = build_model()().eval()
    x = torch.randn(BATCH, IN_FEATURES)
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(m, (x,), dynamic_shapes=({0: batch},))
    torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "default.pt2"))
    torch._inductor.aoti_compile_and_package(
        ep, package_path=str(out / "keep.pt2"), inductor_configs={"always_keep_tensor_constants": True})

    sd = {k: v.clone() for k, v in m.state_dict().items()}
    torch.save(sd, out / "sd_orig.pt")
    g = torch.Generator().manual_seed(1)
    new = {k: torch.randn(v.shape, generator=g) for k, v in sd.items()}
    torch.save(new, out / "sd_new.pt")
    big = {k: new[k] for k in ("fc1.weight", "fc1.bias", "fc2.weight")}
    torch.save(big, out / "sd_new_big.pt")

    xin = run_input()
    expected = {}
    with torch.no_grad():
        expected["orig"] = m(xin).tolist()
        m.load_state_dict(new)
        expected["new_all"] = m(xin).tolist()
        # The default package keeps fc2.bias and shift as the literals it was compiled with.
        mixed = dict(sd)
        mixed.update(big)
        m.load_state_dict(mixed)
        expected["new_big_only"] = m(xin).tolist()
    (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(sys.argv[1]) / "inductor-cache"))
    main(Path(sys.argv[1]))
