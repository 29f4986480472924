"""A Lightning FSDP checkpoint directory written by Lightning itself (lightning_fsdp_fixture.py:
Fabric with ModelParallelStrategy, FSDP2 on 2 CPU processes; FSDPStrategy cannot run on CPU,
that file says why), judged by what Lightning loads from it:

* ``inspect --json`` marks it Lightning's and shows meta.pt's state (``step``, ``hparams``)
  as ``fabric.load`` returns it, and lists every tensor ``read_metadata()`` lists;
* ``materialize -o`` gives the model's tensors bit for bit as ``fabric.load`` put them
  into a fresh model; ``verify`` passes.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dcp_fixtures  # noqa: E402
from conftest import run_ckptool  # noqa: E402


@pytest.fixture(scope="session")
def lightning_dir(tmp_path_factory) -> Path:
    pytest.importorskip("lightning")
    reuse = os.environ.get("CKPTOOL_DCP_FIXTURES")
    out = Path(reuse) if reuse else tmp_path_factory.mktemp("dcp")
    return dcp_fixtures.build_lightning(out)


def expected(d: Path) -> dict:
    return torch.load(str(d) + ".expected.pt", weights_only=True)


def test_inspect_shows_meta_pt_as_lightning_loads_it(lightning_dir):
    rc, out, err = run_ckptool("inspect", "--json", lightning_dir, timeout=120)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["layout"] == "dcp" and doc["lightning"] is True
    meta = {e["path"][1]: e for e in doc["entries"] if e["path"][0] == "meta.pt"}
    want = expected(lightning_dir)
    assert set(meta) == {"step", "hparams"}
    assert meta["step"]["type"] == "int" and int(meta["step"]["value"]) == want["step"] == 7
    assert meta["hparams"]["type"] == "dict" and ast.literal_eval(meta["hparams"]["value"]) == want["hparams"]
    md = FileSystemReader(str(lightning_dir)).read_metadata()
    items = [k for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)]
    assert [k["key"] for k in doc["keys"]] == items


def test_materialize_equals_what_fabric_load_gives(lightning_dir, tmp_path):
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", lightning_dir, "--device", "cpu", "-o", out, timeout=120)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want = expected(lightning_dir)["model"]
    assert want and all("model." + k in got for k in want)
    for k, v in want.items():
        g = got["model." + k]
        assert g.dtype == v.dtype and g.shape == v.shape, k
        assert torch.equal(g.view(torch.uint8), v.view(torch.uint8)), k
    rc, out, err = run_ckptool("verify", lightning_dir, timeout=120)
    assert rc == 0, out + err


def test_rekey_output_replaced_with_its_meta_pt(lightning_dir, tmp_path):
    # meta.pt is part of a Lightning DCP set: a second run into the same OUTDIR replaces the
    # set ckptool wrote, meta.pt included, without --force.
    out = tmp_path / "out"
    for prefix in ("x.", "y."):
        rc, _, err = run_ckptool("rekey", "--add-prefix", prefix, lightning_dir, "-o", out)
        assert rc == 0, err
    assert (out / "meta.pt").read_bytes() == (lightning_dir / "meta.pt").read_bytes()
    keys = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    assert keys and all(k.startswith("y.") for k in keys)
