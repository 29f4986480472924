"""materialize CKPT --model EP.pt2 --run forward on an archive of several programs (issue 16,
docs/formats.md §14.9): nativert's runner is handed one program name, which --program gives.
Archives are written by torch's own package_pt2 with two programs of different architectures
(an MLP and a conv net with buffers and a dict output); eager PyTorch holding the
checkpoint's weights is the judge of what nativert returns.

  * --run --program NAME fills and runs that program, with or without -o; its outputs'
    shapes and sums are eager's on the inputs ckptool makes (floats from a CPU generator
    seeded 0, integers zero: src/torch/run_exported.cpp), and -o's archive, read back by
    load_pt2, gives eager's values exactly;
  * several programs and no --program, several --program, or a name the archive lacks:
    usage error (exit 2) listing the archive's programs, nothing written;
  * an archive of one program not named "model" runs without --program;
  * the library does the same for an embedding program: tests/tools_torch/run_pt2_program.cpp
    sets materialize_request::program (empty: the only program).
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import CKPTOOL, run_ckptool
from test_pt2 import Mlp

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class ConvNet(nn.Module):
    """Another architecture than Mlp: conv, a persistent and a non-persistent buffer, a dict out."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 3)
        self.head = nn.Linear(25, 4)
        self.register_buffer("scale", torch.rand(4) + 0.5)
        self.register_buffer("offset", torch.full((4,), 0.25), persistent=False)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.conv(x))
        return {"logits": self.head(h.flatten(1)) * self.scale + self.offset, "pooled": h.mean(-1)}


RUN_PT2_PROGRAM = Path(os.environ.get("CKPTOOL_BUILD_DIR", CKPTOOL.parent)) / "tests" / "run_pt2_program"

SHAPES = {"a": [2, 8], "b": [2, 3, 7]}
MODULES = {"a": Mlp, "b": ConvNet}


def package(path: Path, programs: dict) -> None:
    from torch.export.pt2_archive._package import package_pt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package_pt2(str(path), exported_programs=programs)


def load_all(path: Path) -> dict:
    from torch.export.pt2_archive._package import load_pt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_pt2(str(path)).exported_programs


def run_input(name: str) -> torch.Tensor:
    """The one float input --run --input SHAPE passes: randn from a CPU generator seeded 0."""
    return torch.randn(*SHAPES[name], generator=torch.Generator().manual_seed(0))


def leaves(out) -> dict[str, torch.Tensor]:
    """Eager outputs keyed as ckptool's --run report names them."""
    if isinstance(out, dict):
        return dict(out)
    return {"": out}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pt2run")
    torch.manual_seed(0)
    out = {"multi": d / "multi.pt2", "single": d / "encoder.pt2", "ckpt": d / "both.pt"}
    eps = {n: torch.export.export(MODULES[n]().eval(), (torch.randn(*SHAPES[n]),)) for n in ("a", "b")}
    package(out["multi"], eps)
    package(out["single"], {"encoder": eps["b"]})
    # New values for every weight of both programs, keys disjoint (fc1/fc2 vs conv/head/scale).
    torch.manual_seed(5)
    sd = {**Mlp().state_dict(), **ConvNet().state_dict()}
    torch.save(sd, out["ckpt"])
    return out


def eager(files, name: str) -> nn.Module:
    m = MODULES[name]()
    sd = torch.load(files["ckpt"])
    m.load_state_dict({k: v for k, v in sd.items() if k in m.state_dict()})
    return m.eval()


def materialize_run(files, model, *extra, rc=0, env=None):
    args = ["materialize", files["ckpt"], "--model", model, "--run", "forward", *extra]
    code, so, se = run_ckptool(*args, env=env)
    assert code == rc, f"exit {code}, expected {rc}\n{se[-3000:]}"
    return so, se


def assert_outputs_are_eager(run: dict, ref: nn.Module, name: str):
    with torch.no_grad():
        want = leaves(ref(run_input(name)))
    got = {o["path"]: o for o in run["outputs"]}
    assert set(got) == set(want), (got, list(want))
    for path, t in want.items():
        assert got[path]["shape"] == list(t.shape), (path, got[path])
        assert got[path]["checksum"] == pytest.approx(t.double().sum().item(), rel=1e-6, abs=1e-6), path


@pytest.mark.parametrize("name,with_output", [("b", False), ("b", True), ("a", False)])
def test_run_named_program(files, tmp_path, name, with_output):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "o.pt2"
    shape = "x".join(map(str, SHAPES[name]))
    extra = ["-o", out] if with_output else []
    so, _ = materialize_run(files, files["multi"], "--program", name, "--input", shape, "--json", *extra,
                            env={"TMPDIR": str(tmp)})
    r = json.loads(so)
    assert r["programs"] == [name], r
    assert r["run"]["program"] == name and r["run"]["runtime"] == "nativert", r["run"]
    ref = eager(files, name)
    assert_outputs_are_eager(r["run"], ref, name)
    # The archive's own weights give other sums: the run really used the checkpoint's.
    orig = leaves(load_all(files["multi"])[name].module()(run_input(name)))
    sums = {o["path"]: o["checksum"] for o in r["run"]["outputs"]}
    assert any(sums[p] != pytest.approx(t.double().sum().item(), rel=1e-3) for p, t in orig.items())
    assert list(tmp.iterdir()) == []  # the temporary copy is gone
    if with_output:
        got = load_all(out)
        x = run_input(name)
        with torch.no_grad():
            torch.testing.assert_close(leaves(got[name].module()(x)), leaves(ref(x)), rtol=0, atol=0)
    else:
        assert not out.exists()


def test_run_report_names_program(files):
    so, _ = materialize_run(files, files["multi"], "--program", "b", "--input", "2x3x7")
    assert "forward of program b on cpu (nativert) returned:" in so, so
    assert "logits: float32 [2, 4]" in so and "pooled: float32 [2, 5]" in so, so


@pytest.mark.parametrize("case", ["no_program", "two_programs", "unknown"])
def test_run_program_usage_errors(files, tmp_path, case):
    out = tmp_path / "o.pt2"
    flags = {"no_program": [], "two_programs": ["--program", "a", "--program", "b"],
             "unknown": ["--program", "model"]}[case]
    _, err = materialize_run(files, files["multi"], *flags, "--input", "2x8", "-o", out, rc=2)
    assert "'a'" in err and "'b'" in err, err  # the archive's programs, listed
    assert {"no_program": "needs --program", "two_programs": "one program",
            "unknown": "--program 'model'"}[case] in err, err
    assert not out.exists()


@pytest.mark.parametrize("flags", [[], ["--program", "encoder"]])
def test_single_program_not_named_model(files, flags):
    assert list(load_all(files["single"])) == ["encoder"]
    so, _ = materialize_run(files, files["single"], *flags, "--input", "2x3x7", "--json")
    r = json.loads(so)
    assert r["programs"] == ["encoder"] and r["run"]["program"] == "encoder", r
    assert_outputs_are_eager(r["run"], eager(files, "b"), "b")


def run_library(archive, program: str, shape: str, rc: int = 0) -> tuple[str, str]:
    if not RUN_PT2_PROGRAM.exists():
        pytest.fail(f"{RUN_PT2_PROGRAM} not built (ninja run_pt2_program; set CKPTOOL_BUILD_DIR)")
    p = subprocess.run([str(RUN_PT2_PROGRAM), str(archive), program, shape], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == rc, f"exit {p.returncode}, expected {rc}\n{p.stdout}\n{p.stderr[-2000:]}"
    return p.stdout, p.stderr


@pytest.mark.parametrize("archive,program,name", [("multi", "b", "b"), ("multi", "a", "a"), ("single", "", "b")])
def test_library_runs_program(files, archive, program, name):
    """materialize_request::program through the library: the archive's own weights, so the
    judge is load_pt2's program on the same input."""
    shape = "x".join(map(str, SHAPES[name]))
    so, _ = run_library(files[archive], program, shape)
    lines = so.splitlines()
    assert lines[0] == "program " + (program or "encoder"), so
    programs = load_all(files[archive])
    with torch.no_grad():
        want = leaves(programs[program or "encoder"].module()(run_input(name)))
    got = {}
    for line in lines[1:]:
        _, path, *rest = line.split()
        got["" if path == "-" else path] = ([int(d) for d in rest[:-2]], float(rest[-1]))
    assert set(got) == set(want), (got, list(want))
    for path, t in want.items():
        assert got[path][0] == list(t.shape), path
        assert got[path][1] == pytest.approx(t.double().sum().item(), rel=1e-6, abs=1e-6), path


@pytest.mark.parametrize("program,needle", [("", "needs --program"), ("model", "--program 'model'")])
def test_library_program_errors(files, program, needle):
    _, err = run_library(files["multi"], program, "2x8", rc=2)
    assert err.startswith("usage: ") and needle in err and "'a', 'b'" in err, err
