"""materialize CKPT --model EP.pt2 with an archive of several programs (issue 16,
docs/formats.md §14.9): every archive is written by torch's own package_pt2 and every output
read back by its load_pt2; each program's module() must equal eager PyTorch holding the
checkpoint's weights.

  * without --program every program is filled from the one checkpoint, each aligned on its
    own (program "b" takes a subset of the keys "a" takes);
  * --program b fills b only: every record of a is the archive's byte for byte; a key only
    a needs may be missing then, while filling every program exits 1 naming it;
  * an unknown --program name exits 2, nothing written;
  * a weight file two programs name (hand-made: torch deduplicates within a program only)
    is written once; filling only one of the two programs is refused (exit 3).
"""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import run_ckptool
from test_pt2 import Mlp, rewrite

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Half(nn.Module):
    """The first layer of Mlp alone: its keys are a subset of Mlp's."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)

    def forward(self, x):
        return torch.relu(self.fc1(x)) * 2


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


def records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        return {i.filename[len(root) + 1:]: z.read(i.filename) for i in z.infolist()}


def config(path: Path, program: str) -> dict:
    return json.loads(records(path)[f"data/weights/{program}_weights_config.json"])["config"]


def files_of(path: Path, program: str) -> set[str]:
    return {"data/weights/" + e["path_name"] for e in config(path, program).values()}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pt2multi")
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    out = {"multi": d / "multi.pt2", "ckpt": d / "mlp.pt", "shared": d / "shared.pt2"}
    package(out["multi"], {"a": torch.export.export(Mlp(), (x,)), "b": torch.export.export(Half(), (x,))})
    torch.manual_seed(5)
    torch.save(Mlp().state_dict(), out["ckpt"])

    # b's fc1.weight entry names a's file for fc1.weight (same dtype and shape); b's own file dropped.
    a_file = config(out["multi"], "a")["fc1.weight"]["path_name"]
    b_file = config(out["multi"], "b")["fc1.weight"]["path_name"]

    def share(record, data):
        if record == "data/weights/" + b_file:
            return None
        if record == "data/weights/b_weights_config.json":
            cfg = json.loads(data)
            cfg["config"]["fc1.weight"]["path_name"] = a_file
            return json.dumps(cfg).encode()
        return data
    rewrite(out["multi"], out["shared"], share)
    return out


def eager(ckpt: Path) -> dict[str, nn.Module]:
    sd = torch.load(ckpt)
    a, b = Mlp(), Half()
    a.load_state_dict(sd)
    b.load_state_dict({k: v for k, v in sd.items() if k.startswith("fc1.")})
    return {"a": a.eval(), "b": b.eval()}


def fill(ckpt, model, out, *extra, rc=0):
    code, so, se = run_ckptool("materialize", ckpt, "--model", model, "-o", out, "--json", *extra)
    assert code == rc, f"exit {code}, expected {rc}\n{se[-3000:]}"
    return (json.loads(so) if rc == 0 else None), se


def assert_runs_like(programs: dict, name: str, ref: nn.Module):
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(programs[name].module()(x), ref(x), rtol=0, atol=0)


def test_every_program_filled(files, tmp_path):
    out = tmp_path / "out.pt2"
    r, _ = fill(files["ckpt"], files["multi"], out)
    assert r["programs"] == ["a", "b"], r
    assert set(r["filled"]) == {"a/fc1.weight", "a/fc1.bias", "a/fc2.weight", "a/fc2.bias",
                                "b/fc1.weight", "b/fc1.bias"}, r
    assert r["filled"]["b/fc1.weight"] == "fc1.weight"
    assert r["missing"] == [] and r["unexpected"] == [], r  # fc2.* is taken by a
    got, ref = load_all(out), eager(files["ckpt"])
    assert set(got) == {"a", "b"}
    for name in ("a", "b"):
        assert_runs_like(got, name, ref[name])
    # The archive's own weights differ: the programs really run the checkpoint's.
    orig = load_all(files["multi"])
    assert not torch.equal(orig["a"].state_dict["fc1.weight"], got["a"].state_dict["fc1.weight"])
    # Only tensor files changed; the programs and configs are the archive's.
    before, after = records(files["multi"]), records(out)
    assert list(before) == list(after)
    for rec, data in before.items():
        if not rec.startswith("data/weights/weight_"):
            assert after[rec] == data, rec


def test_one_program_selected(files, tmp_path):
    out = tmp_path / "out.pt2"
    r, _ = fill(files["ckpt"], files["multi"], out, "--program", "b")
    assert r["programs"] == ["b"] and set(r["filled"]) == {"b/fc1.weight", "b/fc1.bias"}, r
    assert sorted(r["unexpected"]) == ["fc2.bias", "fc2.weight"], r
    before, after = records(files["multi"]), records(out)
    assert list(before) == list(after)
    changed = {rec for rec in before if before[rec] != after[rec]}
    assert changed and changed <= files_of(files["multi"], "b"), changed
    got, orig = load_all(out), load_all(files["multi"])
    assert_runs_like(got, "b", eager(files["ckpt"])["b"])
    for k, v in orig["a"].state_dict.items():
        torch.testing.assert_close(got["a"].state_dict[k], v, rtol=0, atol=0)


def test_key_missing_for_one_program(files, tmp_path):
    """A checkpoint of b's keys only: filling every program exits 1 naming a's missing key;
    --program b fills."""
    sd = {k: v for k, v in torch.load(files["ckpt"]).items() if k.startswith("fc1.")}
    ckpt = tmp_path / "half.pt"
    torch.save(sd, ckpt)
    out = tmp_path / "o.pt2"
    _, err = fill(ckpt, files["multi"], out, rc=1)
    assert "'a'" in err and "fc2." in err, err
    assert not out.exists()
    fill(ckpt, files["multi"], out, "--program", "b")
    assert_runs_like(load_all(out), "b", eager(files["ckpt"])["b"])


def test_unknown_program(files, tmp_path):
    out = tmp_path / "o.pt2"
    _, err = fill(files["ckpt"], files["multi"], out, "--program", "c", rc=2)
    assert "'c'" in err and "'a'" in err and "'b'" in err, err
    assert not out.exists()


def test_file_shared_between_programs(files, tmp_path):
    """The shared file is written once, with the value both programs take; filling one of
    the two would change the other's weights: refused, nothing written."""
    got_shared = load_all(files["shared"])  # torch reads the hand-made archive
    assert torch.equal(got_shared["a"].state_dict["fc1.weight"], got_shared["b"].state_dict["fc1.weight"])
    out = tmp_path / "out.pt2"
    fill(files["ckpt"], files["shared"], out)
    names = list(records(out))
    assert len(names) == len(set(names))
    got, ref = load_all(out), eager(files["ckpt"])
    for name in ("a", "b"):
        assert_runs_like(got, name, ref[name])
    assert config(out, "b")["fc1.weight"]["path_name"] == config(out, "a")["fc1.weight"]["path_name"]
    out2 = tmp_path / "o2.pt2"
    _, err = fill(files["ckpt"], files["shared"], out2, "--program", "b", rc=3)
    assert "program 'a'" in err and "not filled" in err, err
    assert not out2.exists()


def test_run_needs_one_program(files):
    """nativert is given one program name: --run with several programs and no --program is a
    usage error listing them (test_pt2_run_program.py runs one)."""
    rc, _, err = run_ckptool("materialize", files["ckpt"], "--model", files["multi"], "--run", "forward",
                             "--input", "2x8")
    assert rc == 2 and "--program" in err and "2 programs" in err and "'a', 'b'" in err, err
