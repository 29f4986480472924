"""``rekey --match TARGET`` where the input or the target is a DCP directory, judged by
PyTorch's own reader and loader:

* input DCP: compiled2 (dcp_fixtures.py: a torch.compile'd FSDP2 model, every key with
  ``_orig_mod.``) matched to a safetensors file of the uncompiled names: the edit found is
  the compiled-wrapper strip, and the new ``.metadata`` is byte for byte the one
  ``--strip-compiled`` writes, whose directory ``dcp.load`` reads into the uncompiled model
  in 2 processes (test_dcp_rekey.py test_strip_compiled_loads_into_uncompiled_model);
  ``read_metadata()`` of the output lists exactly the target's keys;
* target DCP: a DDP-style file (``module.`` keys) of the tensors ``dcp.load`` gives from
  shard2, and of nocoll2 (rank-local metadata, formats.md §9.8), matched to that directory:
  the output's keys are the directory's tensor keys, its values unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402


@pytest.fixture(scope="session")
def dcp_dirs(tmp_path_factory) -> dict:
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build(out, ["compiled2", "shard2", "nocoll2"])


def need(dcp_dirs, name) -> Path:
    if name not in dcp_dirs:
        pytest.skip(dcp_fixtures.skip_reason(name) or f"{name} not built")
    return dcp_dirs[name]


def tensor_items(md) -> dict:
    return {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def test_input_dcp_matched_to_a_file(dcp_dirs, tmp_path):
    src = need(dcp_dirs, "compiled2")
    exp = torch.load(str(src) + ".expected.pt", weights_only=True)
    target = {"model." + k.removeprefix("_orig_mod."): v.contiguous() for k, v in exp["model"].items()}
    for k, st in exp["optim"].items():
        for s, t in st.items():
            target[f"optim.state.{k.removeprefix('_orig_mod.')}.{s}"] = t.contiguous()
    target_file = tmp_path / "uncompiled.safetensors"
    save_file(target, str(target_file))
    assert set(tensor_items(FileSystemReader(str(src)).read_metadata())) != set(target)

    out = tmp_path / "matched"
    rc, stdout, err = run_ckptool("rekey", src, "--match", target_file, "--json", "-o", out, timeout=120)
    assert rc == 0, err
    assert "remove '_orig_mod.'" in json.loads(stdout)["operations"][0], stdout
    assert set(tensor_items(FileSystemReader(str(out)).read_metadata())) == set(target)
    stripped = tmp_path / "stripped"
    rc, _, err = run_ckptool("rekey", src, "--strip-compiled", "-o", stripped, timeout=120)
    assert rc == 0, err
    assert (out / ".metadata").read_bytes() == (stripped / ".metadata").read_bytes()
    for f in src.glob("*.distcp"):
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name


def dcp_loaded(d: Path, md) -> dict:
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in tensor_items(md).items()}
    dcp.load(sd, checkpoint_id=str(d))
    return sd


def test_file_matched_to_a_dcp_target(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "shard2")
    want = dcp_loaded(d, FileSystemReader(str(d)).read_metadata())
    src = tmp_path / "ddp.safetensors"
    save_file({"module." + k: v.contiguous() for k, v in want.items()}, str(src))
    out = tmp_path / "out.safetensors"
    rc, _, err = run_ckptool("rekey", src, "--match", d, "-o", out, timeout=120)
    assert rc == 0, err
    got = load_file(str(out))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_file_matched_to_a_rank_local_dcp_target(dcp_dirs, tmp_path):
    d = need(dcp_dirs, "nocoll2")
    want = torch.load(str(d) + ".expected.pt", weights_only=True)["tensors"]
    src = tmp_path / "compiled.safetensors"
    save_file({"_orig_mod." + k: v.contiguous() for k, v in want.items()}, str(src))
    out = tmp_path / "out.safetensors"
    rc, _, err = run_ckptool("rekey", src, "--match", d, "-o", out, timeout=120)
    assert rc == 0, err
    keys = set()
    for r in (0, 1):
        keys |= set(tensor_items(FileSystemReader(str(d)).read_metadata(rank=r)))
    assert set(load_file(str(out))) == keys
