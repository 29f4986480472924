"""Issue 12 item 1: state dicts pickled by Python 2 (torch 0.4-1.4 under Python 2, many of
them still shipped) and by Python 3 below protocol 2. Python 2 reduces an OrderedDict to
OrderedDict([[key, value], ...]), writes keys as Python 2 str (BINSTRING / STRING), names
__builtin__ and copy_reg, and below protocol 2 builds objects with copy_reg._reconstructor;
torch.save at protocol 0/1 starts the legacy stream with a LONG text magic number.

The files are written by real torch.save with tests/py/py2_pickle.py as its pickle module
(Python 2's pickler, reproduced) or CPython's pickle at protocol 1, in both serialization
formats, and compared with torch.load: `inspect --json` field by field (reference.py) and
`materialize -o` key by key, bit for bit.
"""

from __future__ import annotations

import argparse
import warnings
from collections import OrderedDict
from pathlib import Path

import pickle
import pytest
import torch
import torch.nn as nn

import py2_pickle
import reference
from conftest import inspect_json, run_ckptool
from fixtures import FULL, Fixture

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


class AttrDict(dict):
    """A dict subclass as old training scripts kept their config and extra tensors in:
    below protocol 2 it pickles as copy_reg._reconstructor(AttrDict, dict, {...})."""


def _state_dict() -> OrderedDict:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 2))
    with torch.no_grad():
        m[1].running_mean.uniform_()
        m[1].num_batches_tracked += 5
    sd = m.state_dict()  # an OrderedDict with _metadata, as torch 0.4+ wrote it
    sd["half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    sd["row"] = sd["3.weight"][1]  # a view into another key's storage
    return sd


def _checkpoint() -> dict:
    """What the PyTorch ImageNet example saved (and most pre-2020 repositories copied)."""
    sd = _state_dict()
    params = [v for k, v in sd.items() if k.endswith("weight") and v.dtype == torch.float32]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return {"epoch": 7, "arch": "convnet", "state_dict": sd, "best_acc1": 0.5,
            "optimizer": opt.state_dict()}


WRITERS = {  # name: (pickle module, protocol)
    "py2-proto2": (py2_pickle, 2),  # torch.save's default protocol under Python 2
    "py2-proto1": (py2_pickle, 1),
    "py3-proto1": (pickle, 1),
}


def _save(obj, path: Path, writer: str, zip_format: bool) -> Path:
    module, protocol = WRITERS[writer]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, pickle_module=module, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=zip_format)
    return path


def _load(path: Path, weights_only: bool = False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, weights_only=weights_only, map_location="cpu")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _pickle_globals(data: bytes) -> set[str]:
    """The globals a pickle names, as CPython's find_class sees them (Python 2 names mapped
    below protocol 3); torch's own scanner reads protocol 2 and up only."""
    import _compat_pickle
    import pickletools

    proto, names = 0, set()
    for op, arg, _ in pickletools.genops(data):
        if op.name == "PROTO":
            proto = arg
        elif op.name in ("GLOBAL", "INST"):
            module, name = arg.split(" ", 1)
            if proto < 3:
                if (module, name) in _compat_pickle.NAME_MAPPING:
                    module, name = _compat_pickle.NAME_MAPPING[(module, name)]
                else:
                    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            names.add(f"{module}.{name}")
    return names


def _compare_with_torch(path: Path, fmt: str, state_dict_path: list) -> None:
    doc = inspect_json(path)
    fx = Fixture(path.name, path, fmt, FULL, state_dict=state_dict_path)
    saved = reference.pickle_globals
    reference.pickle_globals = _pickle_globals
    try:
        m = reference.compare(fx, doc)
    finally:
        reference.pickle_globals = saved
    assert not m, m.report(path.name)


def _materialized(src: Path, tmp_path: Path) -> dict:
    out = tmp_path / (src.stem + ".out.pt")
    rc, _, err = run_ckptool("materialize", "--device", "cpu", "-o", out, src, timeout=60)
    assert rc == 0, err
    return _load(out, weights_only=True)


def _assert_same_tensors(got: dict, want: dict) -> None:
    want = {k: v for k, v in want.items() if isinstance(v, torch.Tensor)}
    assert list(got)[: len(want)] == list(want)
    for k, v in want.items():
        assert _same_bits(got[k], v), k


FORMATS = [pytest.param(False, id="legacy"), pytest.param(True, id="zip")]


@pytest.mark.parametrize("zip_format", FORMATS)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_state_dict(writer, zip_format, tmp_path):
    src = _save(_state_dict(), tmp_path / f"{writer}.pth", writer, zip_format)
    ref = _load(src)
    assert list(ref)[:2] == ["0.weight", "0.bias"] and hasattr(ref, "_metadata")
    _compare_with_torch(src, "torch-zip" if zip_format else "torch-legacy", [])
    _assert_same_tensors(_materialized(src, tmp_path), ref)
    rc, out, err = run_ckptool("inspect", src)
    assert rc == 0, err
    assert "state dict: the root, 11 tensors, 114 elements" in out, out
    assert "__args__" not in out


@pytest.mark.parametrize("zip_format", FORMATS)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_training_checkpoint(writer, zip_format, tmp_path):
    src = _save(_checkpoint(), tmp_path / f"{writer}.pth.tar", writer, zip_format)
    ref = _load(src)
    _compare_with_torch(src, "torch-zip" if zip_format else "torch-legacy", ["state_dict"])
    got = _materialized(src, tmp_path)
    _assert_same_tensors(got, ref["state_dict"])
    # The optimizer's momentum buffers follow under their paths, as torch.load nests them.
    for i, st in ref["optimizer"]["state"].items():
        assert _same_bits(got[f"optimizer/state/{i}/momentum_buffer"], st["momentum_buffer"])


@pytest.mark.parametrize("writer", ["py2-proto1", "py3-proto1"])
def test_objects_built_by_copy_reg_reconstructor(writer, tmp_path):
    """Below protocol 2 every object without __reduce__ is
    copy_reg._reconstructor(cls, object, None) + BUILD, and a dict subclass
    _reconstructor(cls, dict, {...}): its tensors are under its keys, as in the protocol-2
    form (NEWOBJ + SETITEMS), never under __args__."""
    obj = {"args": argparse.Namespace(lr=0.1, arch="convnet", mean=torch.tensor([0.5, 0.4])),
           "misc": {"extra": AttrDict(w=torch.arange(4.0), nested=AttrDict(b=torch.ones(2, dtype=torch.int64)))},
           "state_dict": _state_dict()}
    src = _save(obj, tmp_path / f"{writer}.pt", writer, True)
    assert b"_reconstructor" in reference.zip_data_pkl(src)
    ref = _load(src)
    _compare_with_torch(src, "torch-zip", ["state_dict"])
    got = _materialized(src, tmp_path)
    _assert_same_tensors(got, ref["state_dict"])
    assert _same_bits(got["misc/extra/w"], ref["misc"]["extra"]["w"])
    assert _same_bits(got["misc/extra/nested/b"], ref["misc"]["extra"]["nested"]["b"])
    assert _same_bits(got["args/mean"], ref["args"].mean)
    doc = inspect_json(src)
    assert "copyreg._reconstructor" in doc["unsafe_globals"]


def test_protocol_0_is_refused_as_torch_load_refuses_it(tmp_path):
    """torch.save at protocol 0 writes each persistent id as str(tuple), which torch.load
    cannot read back: ckptool must not read it either."""
    for zip_format in (False, True):
        src = tmp_path / f"p0-{zip_format}.pt"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(_state_dict(), src, pickle_module=py2_pickle, pickle_protocol=0,
                       _use_new_zipfile_serialization=zip_format)
        with pytest.raises(Exception):
            _load(src)
        rc, out, err = run_ckptool("inspect", src)
        assert rc == 3 and out == "", (rc, err)
        assert "persistent id" in err, err


def test_pairs_that_are_not_pairs_are_refused(tmp_path):
    """OrderedDict([[k, v, extra]]) fails in Python; a reader must not guess."""
    sd = _state_dict()
    src = _save(sd, tmp_path / "bad.pt", "py2-proto2", True)
    data = reference.zip_data_pkl(src)
    # The first pair is the only 3-item list in the file: EMPTY_LIST BINPUT MARK key ... APPENDS.
    assert data.count(b"U\x080.weight") == 1
    bad = data.replace(b"U\x080.weight", b"U\x080.weightN", 1)
    import zipfile
    out = tmp_path / "bad2.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = zin.read(info)
            zout.writestr(info, bad if info.filename.endswith("/data.pkl") else body)
    with pytest.raises(Exception):
        _load(out)
    rc, _, err = run_ckptool("inspect", out)
    assert rc == 3, err
    assert "not a (key, value) pair" in err, err


@pytest.mark.parametrize("writer", list(WRITERS))
def test_rekey_of_a_python2_state_dict(writer, tmp_path):
    """rekey renames the keys (and _metadata) of a Python 2 state dict; the output, written
    at protocol 2, is what torch.load gives for the input under the new keys."""
    src = _save(_state_dict(), tmp_path / f"{writer}.pt", writer, True)
    out = tmp_path / "renamed.pt"
    rc, _, err = run_ckptool("rekey", "--add-prefix", "model.", "-o", out, src, timeout=60)
    assert rc == 0, err
    ref = _load(src)
    got = _load(out, weights_only=True)
    assert list(got) == ["model." + k for k in ref]
    for k, v in ref.items():
        assert _same_bits(got["model." + k], v), k
    assert list(got._metadata) == ["", "model"] + ["model." + k for k in ref._metadata if k]


@pytest.mark.parametrize("protocol", [4, 5])
def test_legacy_stream_at_protocols_4_and_5(tmp_path, protocol):
    """At protocols 4 and 5 the pickler frames the magic number (PROTO, FRAME, LONG1): such a
    legacy torch.save file was called a bare pickle, not a PyTorch checkpoint."""
    sd = {"a": torch.randn(3), "b": torch.arange(4).reshape(2, 2).t()}
    src = tmp_path / "legacy.pt"
    torch.save(sd, src, pickle_protocol=protocol, _use_new_zipfile_serialization=False)
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", src, "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    want = torch.load(src, weights_only=False)
    for k in sd:
        assert torch.equal(got[k], want[k]) and got[k].stride() == want[k].stride(), k
