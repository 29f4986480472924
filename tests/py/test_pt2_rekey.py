"""rekey of torch.export archives (issue 16, docs/formats.md §14.8), checked against real
PyTorch: every input is written by torch.export.save / package_pt2 in this process, every
output is read by torch.export.load, run, and compared with the eager model loaded with the
renamed state dict.

  * --strip-compiled on an export of a torch.compile'd model (every name starts with
    `_orig_mod.`) and of a model with a compiled submodule; --add-prefix on a plain model:
    torch.export.load(out).module() runs and equals eager; its state_dict keys (and its
    constants) are the expected renamed names; the program's signature and module call
    graph name them; the weight and constant files are byte-identical;
  * several models in one archive renamed in each;
  * --dry-run writes nothing; a collision (exit 1), a module whose names would go separate
    ways, a record that might name keys and a corrupt input (exit 3) are refused with
    nothing written;
  * --save-map replayed with --map gives the same archive (one model only);
  * the output passes ckptool verify.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import inspect_json, run_ckptool
from test_pt2 import WithCompiled

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Inner(nn.Module):
    """A parameterless submodule (act), a persistent and a non-persistent buffer and a
    lifted tensor constant: names in both configs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.out = nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.register_buffer("shift", torch.arange(3.0), persistent=False)
        self.c = torch.tensor([1.0, -1.0, 0.5])

    def forward(self, x):
        return self.out(self.act(self.fc(x))) * self.scale + self.shift + self.c



class Wrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)


X = torch.randn(2, 4)


def export(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(m, (X,))


def load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.load(str(path))


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pt2rekey")
    torch.manual_seed(0)
    out = {}
    out["orig_mod"] = d / "orig_mod.pt2"
    torch.export.save(export(torch.compile(Inner().eval())), out["orig_mod"])
    out["sub_compiled"] = d / "sub_compiled.pt2"
    torch.export.save(export(WithCompiled()), out["sub_compiled"])
    out["plain"] = d / "plain.pt2"
    torch.export.save(export(Inner().eval()), out["plain"], extra_files={"note.txt": "hello"})
    from torch.export.pt2_archive._package import package_pt2
    out["multi"] = d / "multi.pt2"
    package_pt2(str(out["multi"]), exported_programs={"encoder": export(torch.compile(nn.Sequential(nn.Linear(4, 4)))),
                                                     "decoder": export(torch.compile(Inner().eval()))})
    return out


def records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        return {i.filename[len(root) + 1:]: z.read(i.filename) for i in z.infolist()}


def rekey(src: Path, dst: Path, *ops) -> tuple[int, str, str]:
    return run_ckptool("rekey", src, "-o", dst, *ops)


def program(path: Path, model: str = "model") -> dict:
    return json.loads(records(path)[f"models/{model}.json"])


def check_runs_like_eager(src: Path, out: Path, rename, eager_cls=None):
    """torch.export.load(out) has the renamed names; its module runs and equals the
    original module, and equals an eager model loaded with the renamed state dict."""
    before, after = load(src), load(out)
    assert list(after.state_dict) == [rename(k) for k in before.state_dict]
    assert sorted(after.constants) == sorted(rename(k) for k in before.constants)
    for k, v in before.state_dict.items():
        assert torch.equal(after.state_dict[rename(k)], v), k
    got = after.module()(X)
    assert torch.equal(got, before.module()(X))
    if eager_cls is not None:
        eager = eager_cls()
        missing, unexpected = eager.load_state_dict(after.state_dict, strict=False)
        assert not unexpected and set(missing) <= set(dict(eager.named_buffers())), (missing, unexpected)
        for k, v in after.constants.items():
            owner, _, leaf = k.rpartition(".")
            setattr(eager.get_submodule(owner), leaf, v)
        assert torch.allclose(eager.eval()(X), got)
    return before, after


def payload_files_identical(src: Path, out: Path):
    a, b = records(src), records(out)
    assert list(a) == list(b)  # the same records in the same order
    for name in a:
        if name.startswith(("data/weights/weight_", "data/constants/tensor_", "data/sample_inputs/", "extra/")):
            assert a[name] == b[name], name


def strip(k: str) -> str:
    return k.replace("_orig_mod.", "")


def test_strip_compiled_whole_model(archives, tmp_path):
    out = tmp_path / "stripped.pt2"
    rc, stdout, err = rekey(archives["orig_mod"], out, "--strip-compiled")
    assert rc == 0, err
    assert "5 of 5 keys renamed" in stdout and "2 constants" in stdout, stdout
    check_runs_like_eager(archives["orig_mod"], out, strip, Inner)
    payload_files_identical(archives["orig_mod"], out)
    # The program says what an export of the uncompiled model says.
    plain = program(archives["plain"])["graph_module"]
    got = program(out)["graph_module"]
    assert got["signature"]["input_specs"] == [
        {k: {f: (strip(x) if f.endswith("_name") else x) for f, x in v.items()}} for s in
        program(archives["orig_mod"])["graph_module"]["signature"]["input_specs"] for k, v in s.items()]
    assert [e["fqn"] for e in got["module_call_graph"]] == [e["fqn"] for e in plain["module_call_graph"]]
    assert "_orig_mod" not in json.dumps(got["module_call_graph"])
    stacks = [n["metadata"].get("nn_module_stack", "") for n in got["graph"]["nodes"]]
    assert not any(",_orig_mod" in s for s in stacks), stacks
    assert any(",fc,torch.nn.modules.linear.Linear" in s for s in stacks), stacks
    # Unflattening follows the renamed module paths.
    unflat = torch.export.unflatten(load(out))
    assert {n for n, _ in unflat.named_parameters()} == set(load(out).state_dict) - {"scale"}
    rc, o, e = run_ckptool("verify", out)
    assert rc == 0, o + e


def test_strip_compiled_submodule(archives, tmp_path):
    out = tmp_path / "sub.pt2"
    rc, stdout, err = rekey(archives["sub_compiled"], out, "--strip-compiled")
    assert rc == 0, err
    before, after = check_runs_like_eager(archives["sub_compiled"], out, strip)
    assert list(after.state_dict) == ["sub.weight", "sub.bias", "out.weight", "out.bias"]
    payload_files_identical(archives["sub_compiled"], out)
    assert [e["fqn"] for e in program(out)["graph_module"]["module_call_graph"]] == ["", "sub", "out"]


def test_add_prefix(archives, tmp_path):
    out = tmp_path / "prefixed.pt2"
    rc, stdout, err = rekey(archives["plain"], out, "--add-prefix", "model.")
    assert rc == 0, err
    check_runs_like_eager(archives["plain"], out, lambda k: "model." + k, lambda: Wrapper(Inner()))
    payload_files_identical(archives["plain"], out)
    # As an export of Wrapper(Inner()) lists it: the new wrapper, then the moved modules.
    wrapped = program(archives["plain"])  # reference below
    calls = [e["fqn"] for e in program(out)["graph_module"]["module_call_graph"]]
    assert calls == ["", "model"] + ["model." + e["fqn"] for e in wrapped["graph_module"]["module_call_graph"][1:]]
    rc, o, e = run_ckptool("verify", out)
    assert rc == 0, o + e


def test_multi_model(archives, tmp_path):
    out = tmp_path / "multi.pt2"
    rc, stdout, err = rekey(archives["multi"], out, "--strip-compiled", "--json")
    assert rc == 0, err
    doc = json.loads(stdout)
    doc["mapping"] = {p["old"]: p["new"] for p in doc["mapping"]}
    assert doc["mapping"]["encoder/_orig_mod.0.weight"] == "encoder/0.weight"
    assert doc["mapping"]["decoder/_orig_mod.fc.weight"] == "decoder/fc.weight"
    from torch.export.pt2_archive._package import load_pt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before, after = load_pt2(str(archives["multi"])), load_pt2(str(out))
    for name in ("encoder", "decoder"):
        b, a = before.exported_programs[name], after.exported_programs[name]
        assert list(a.state_dict) == [strip(k) for k in b.state_dict]
        assert torch.equal(a.module()(X), b.module()(X))
    payload_files_identical(archives["multi"], out)
    rc, o, e = run_ckptool("verify", out)
    assert rc == 0, o + e


def test_dry_run_writes_nothing(archives, tmp_path):
    out = tmp_path / "never.pt2"
    rc, stdout, err = run_ckptool("rekey", archives["orig_mod"], "--strip-compiled", "--dry-run", "--json")
    assert rc == 0, err
    doc = json.loads(stdout)
    assert doc["dry_run"] and doc["changed"] == 5 and doc["constants_renamed"] == 2
    assert {p["old"]: p["new"] for p in doc["mapping"]} == {k: strip(k) for k in load(archives["orig_mod"]).state_dict}
    rc, stdout, err = run_ckptool("rekey", archives["orig_mod"], "--strip-compiled", "--dry-run", "-o", out)
    assert rc == 0, err
    assert not out.exists()


def test_collision_refused(archives, tmp_path):
    out = tmp_path / "collide.pt2"
    # out.bias and the constant c would both be called "c".
    rc, stdout, err = rekey(archives["plain"], out, "--rename", r"^(out\.bias|c)$=c")
    assert rc == 1, (rc, err)
    assert "claimed by several" in err and "'c'" in err, err
    assert not out.exists()


def test_half_moved_module_refused(archives, tmp_path):
    # fc.weight moves to a module "lin" while fc.bias stays: the program's module "fc"
    # cannot be renamed exactly.
    out = tmp_path / "half.pt2"
    rc, stdout, err = rekey(archives["plain"], out, "--rename", r"^fc\.weight$=lin.weight")
    assert rc == 3, (rc, err)
    assert "fc" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def rewrite(src: Path, dst: Path, edit=lambda record, data: data) -> None:
    """Copies the archive record by record with Python's zipfile (no 64-byte alignment),
    letting `edit` change a record's bytes."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = edit(info.filename[len(root) + 1:], zin.read(info.filename))
            zout.writestr(info.filename.replace(root + "/", dst.stem + "/", 1), data)


def test_corrupt_input_refused(archives, tmp_path):
    # The unchanged twin (written by zipfile, unaligned) is renamed and loads ...
    twin = tmp_path / "twin.pt2"
    rewrite(archives["orig_mod"], twin)
    rc, stdout, err = rekey(twin, tmp_path / "twin_out.pt2", "--strip-compiled")
    assert rc == 0, err
    check_runs_like_eager(twin, tmp_path / "twin_out.pt2", strip)
    # ... the corrupt one is refused, and nothing is written.
    bad = tmp_path / "bad.pt2"
    rewrite(archives["orig_mod"], bad, lambda r, d: d.replace(b'"weight_0"', b'"weight_77"', 1)
            if r == "data/weights/model_weights_config.json" else d)
    before = sorted(tmp_path.iterdir())
    rc, stdout, err = rekey(bad, tmp_path / "out.pt2", "--strip-compiled")
    assert rc == 3, (rc, err)
    assert str(bad) in err and "weight_77" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(tmp_path.iterdir()) == before


def test_unknown_record_refused(archives, tmp_path):
    # A record the configs do not name may name keys: refused, never half renamed.
    odd = tmp_path / "odd.pt2"
    with zipfile.ZipFile(archives["orig_mod"]) as zin, zipfile.ZipFile(odd, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            zout.writestr(info.filename.replace(root + "/", "odd/", 1), zin.read(info.filename))
        zout.writestr("odd/data/weights/model_param_config.json", b'{"_orig_mod.fc.weight": 1}')
    out = tmp_path / "out.pt2"
    rc, stdout, err = rekey(odd, out, "--strip-compiled")
    assert rc == 3, (rc, err)
    assert "model_param_config.json" in err, err
    assert not out.exists()


def test_save_map_replayed(archives, tmp_path):
    # --save-map's keys are the state dict's; replayed with --map, the constants follow
    # their module, and the result is the same archive.
    first, again = tmp_path / "first.pt2", tmp_path / "again.pt2"
    rc, _, err = rekey(archives["orig_mod"], first, "--strip-compiled", "--save-map", tmp_path / "m.json")
    assert rc == 0, err
    rc, _, err = rekey(archives["orig_mod"], again, "--map", tmp_path / "m.json")
    assert rc == 0, err
    assert records(first) == records(again)
    check_runs_like_eager(archives["orig_mod"], again, strip, Inner)
    # With several models a map's keys would not be the programs' names: refused.
    rc, _, err = rekey(archives["multi"], tmp_path / "multi.pt2", "--map", tmp_path / "m.json")
    assert rc == 3 and "one model" in err, err
    assert not (tmp_path / "multi.pt2").exists()
