#!/usr/bin/env python3
"""Regenerates the committed fuzz seeds under fuzz/seeds/<target>/ with the real reference
libraries (torch, safetensors from the project venv):

    .venv/bin/python fuzz/make_seeds.py            # rewrites fuzz/seeds/
    .venv/bin/python fuzz/make_seeds.py --dcp-only # rewrites fuzz/seeds/dcp_metadata/ only
    .venv/bin/python fuzz/make_seeds.py --sets-only # rewrites fuzz/seeds/dcp_sets/ only

Every file is small (tensors of a few elements) so the whole tree stays well under 2 MB.
torch.save records a random serialization id, so regenerated files differ byte-for-byte
from the committed ones; their structure is the same.

The shared corpora (../shared/corpora/: picklescan, ziplinter) and samples/ are NOT copied
here: fuzz/run.sh passes them to the fuzzers as extra read-only corpus directories.
"""
import collections
import datetime
import decimal
import io
import os
import pickle
import shutil
import struct
import sys
import zipfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")
SPLIT = b"\n--ckpt-fuzz-constants.pkl--\n"  # fuzz/targets.h kPickleSplit
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zipfile timestamps, so regenerated zips stay identical

torch.manual_seed(0)


def out(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def saved(obj, **kw):
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def records(data):
    """{record name without the archive folder: bytes} of a torch zip."""
    z = zipfile.ZipFile(io.BytesIO(data))
    return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(4, 3)
        self.hidden = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.hidden(self.embed(x)))))


# ---- torch.save files (zip format) -------------------------------------------------------

def torch_files():
    files = {}
    net = TinyNet()
    files["state_dict.pt"] = saved(net.state_dict())

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
              torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
              torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
              torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]
    sd = collections.OrderedDict()
    for dt in dtypes:
        name = str(dt).replace("torch.", "")
        sd[name] = torch.zeros(2, 2).to(dt) if dt != torch.bool else torch.tensor([True, False])
    sd["complex32"] = torch.zeros(2, dtype=torch.complex32)
    files["dtypes.pt"] = saved(sd)

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    files["views.pt"] = saved({
        "base": base,
        "slice": base[1:3, 2:5],            # storage offset, non-contiguous
        "transposed": base.t(),
        "column": base[:, 3],
        "expanded": torch.ones(1, 3).expand(4, 3),  # stride 0
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 5),
        "strided": base[::2, ::3],
    })

    lin = nn.Linear(3, 3)
    tied = collections.OrderedDict(encoder=lin.weight, decoder=lin.weight, bias=lin.bias,
                                   params=[nn.Parameter(torch.ones(2), requires_grad=False)])
    files["tied.pt"] = saved(tied)

    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.tensor([[0, 1]])).sum().backward()
    opt.step()
    files["lightning.ckpt"] = saved({
        "epoch": 1, "global_step": 2, "pytorch-lightning_version": "2.6.6",
        "state_dict": collections.OrderedDict(("model._orig_mod." + k, v) for k, v in net.state_dict().items()),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "dirpath": "/tmp/x"}},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [],
        "hyper_parameters": {"lr": 1e-3, "layers": [3, 3], "name": "tiny", "flag": True, "none": None},
    })
    files["ddp_module.pt"] = saved({"model": collections.OrderedDict(
        ("module." + k, v) for k, v in net.state_dict().items()), "iteration": 7})
    files["nested.pt"] = saved({1: [torch.ones(2), (torch.zeros(1), {"x": torch.arange(3)})],
                                "s": {1, 2, 3}, "b": b"\x00\x01", "f": 1.5, "big": 2 ** 70,
                                "neg": -5, "u": "\u00e9\u4e2d", "fs": frozenset([1])})
    files["meta.pt"] = saved({"w": torch.empty(3, 4, device="meta"), "b": torch.empty(2, device="meta")})
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0, -1.0]), 0.1, 10, torch.quint8)
    files["quantized.pt"] = saved({"q": q})

    class Sub(torch.Tensor):
        pass
    t = torch.ones(2)
    t.note = "attr"
    files["from_type.pt"] = saved({"attr": t})
    files["module_pickled.pt"] = saved(nn.Linear(2, 2))  # full nn.Module: unsafe globals
    files["sparse.pt"] = saved({"sp": torch.eye(2).to_sparse()})
    files["proto4.pt"] = saved(net.state_dict(), pickle_protocol=4)
    files["proto5.pt"] = saved({"w": torch.ones(2, 2)}, pickle_protocol=5)
    files["empty_dict.pt"] = saved({})
    files["list_root.pt"] = saved([torch.ones(1), torch.zeros(2)])
    return files


# ---- hand-made torch files: rebuild calls and shapes torch.save never writes itself -----

class Call:
    """Pickles as fn(*args), with optional listitems/dictitems (APPEND(S)/SETITEM(S) on it)."""

    def __init__(self, fn, args, listitems=None, dictitems=None):
        self.fn, self.args, self.listitems, self.dictitems = fn, args, listitems, dictitems

    def __reduce__(self):
        return (self.fn, self.args, None,
                iter(self.listitems) if self.listitems is not None else None,
                iter(self.dictitems) if self.dictitems is not None else None)


def zip_with(data, replace=None, compress=None, extra=None, drop=()):
    """Re-packs torch zip `data` with Python's zipfile: records replaced/added/dropped, or
    deflated. Not torch's layout (no 'FB' padding), which is part of the point."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for info in src.infolist():
            rec = info.filename.split("/", 1)[1]
            if rec in drop:
                continue
            body = (replace or {}).get(rec, src.read(info.filename))
            z.writestr(zipfile.ZipInfo(info.filename, FIXED_TIME), body,
                       compress_type=zipfile.ZIP_DEFLATED if compress and rec in compress else zipfile.ZIP_STORED)
        for rec, body in (extra or {}).items():
            z.writestr(zipfile.ZipInfo(src.namelist()[0].split("/", 1)[0] + "/" + rec, FIXED_TIME), body)
    return buf.getvalue()


def handmade_files():
    import warnings
    warnings.simplefilter("ignore")
    u = torch._utils
    files = {}
    t = torch.arange(6, dtype=torch.float32)
    st = t.storage()  # a TypedStorage: pickles with the FloatStorage class, as old torch did
    files["rebuild_tensor_v1.pt"] = saved({"old": Call(u._rebuild_tensor, (st, 0, (2, 3), (3, 1)))})
    files["device_tensor.pt"] = saved({"dev": Call(u._rebuild_device_tensor_from_cpu_tensor,
                                                   (torch.ones(2), torch.float32, "xla:0", False))})
    # CVE-2026-24747 shape: SETITEM / APPEND applied to a rebuilt tensor.
    files["cve_setitem_on_tensor.pt"] = saved({"w": Call(u._rebuild_tensor_v2,
                                                         (st, 0, (6,), (1,), False, collections.OrderedDict()),
                                                         dictitems=[("k", 1)])})
    files["cve_append_on_tensor.pt"] = saved({"w": Call(u._rebuild_tensor_v2,
                                                        (st, 0, (6,), (1,), False, collections.OrderedDict()),
                                                        listitems=[1])})
    # Views past their storage and overflowing extents (must be refused).
    files["view_past_storage.pt"] = saved({"w": Call(u._rebuild_tensor_v2,
                                                     (st, 4, (2, 2), (2, 1), False, collections.OrderedDict()))})
    files["view_overflow.pt"] = saved({"w": Call(u._rebuild_tensor_v2,
                                                 (st, 2 ** 62, (2 ** 40, 2 ** 40), (2 ** 40, 1), False,
                                                  collections.OrderedDict()))})
    files["negative_stride.pt"] = saved({"w": Call(u._rebuild_tensor_v2,
                                                   (st, 5, (6,), (-1,), False, collections.OrderedDict()))})
    files["from_type_param.pt"] = saved({"p": Call(torch._tensor._rebuild_from_type_v2,
                                                   (u._rebuild_tensor_v2, nn.Parameter,
                                                    (st, 0, (6,), (1,), False, collections.OrderedDict()), {}))})
    files["param_with_state.pt"] = saved({"p": Call(u._rebuild_parameter_with_state,
                                                    (torch.ones(2), True, collections.OrderedDict(), {"a": 1}))})
    # Storage reused with another dtype.
    files["storage_two_dtypes.pt"] = saved({"a": Call(u._rebuild_tensor_v2, (st, 0, (6,), (1,), False, {})),
                                            "b": Call(u._rebuild_tensor_v2,
                                                      (torch.arange(6, dtype=torch.float32).storage(), 0, (6,), (1,),
                                                       False, {}))})
    base = saved({"w": torch.ones(4), "v": torch.zeros(2)})
    files["deflated_tensor_record.pt"] = zip_with(base, compress={"data/0"})
    files["deflated_data_pkl.pt"] = zip_with(base, compress={"data.pkl"})
    files["no_data_pkl.zip"] = zip_with(base, drop={"data.pkl"})
    files["mobile_bytecode.zip"] = zip_with(base, drop={"data.pkl"}, extra={"bytecode.pkl": pickle.dumps((6,), 2)})
    files["model_json.zip"] = zip_with(base, extra={"model.json": b"{}"})
    files["byteorder_big.pt"] = zip_with(base, replace={"byteorder": b"big"})
    files["version_99.pt"] = zip_with(base, replace={"version": b"99\n"})
    return files


def legacy_variants(data):
    """Legacy files torch >= 2 no longer writes: a big-endian sys_info, a storage view."""
    out = {}
    i = data.find(b"little_endian")
    j = data.find(b"\x88", i)
    out["legacy_big_endian.pt"] = data[:j] + b"\x89" + data[j + 1:]
    # The first storage pid ('storage', cls, key, location, numel, None): make the None a
    # view (key, 0, numel) of its own root, as torch < 1.0 wrote for storage views.
    import pickletools
    ops = list(pickletools.genops(data[15:]))  # skip the magic pickle
    for k, (op, arg, pos) in enumerate(ops):
        if op.name == "BINUNICODE" and arg == "storage":
            key = ops[k + 4][1] if ops[k + 4][0].name == "BINUNICODE" else None
            for op2, arg2, pos2 in ops[k:k + 16]:
                if op2.name == "NONE" and key is not None:
                    at = 15 + pos2
                    k8 = key.encode()
                    view = b"X" + struct.pack("<I", len(k8)) + k8 + b"K\x00K\x02\x87"
                    out["legacy_storage_view.pt"] = data[:at] + view + data[at + 1:]
                    return out
    return out


# ---- other formats -----------------------------------------------------------------------

def legacy_files():
    net = TinyNet()
    base = torch.arange(6, dtype=torch.float32)
    return {
        "legacy_state_dict.pt": saved(net.state_dict(), _use_new_zipfile_serialization=False),
        "legacy_views.pt": saved({"base": base, "view": base[2:4], "t": base.reshape(2, 3).t()},
                                 _use_new_zipfile_serialization=False),
    }


class Scripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("running", torch.zeros(2))
        self.names: list = ["a", "b"]
        self.scale = 2.0

    def forward(self, x):
        return self.fc(x) * self.scale + torch.tensor([1.0, 2.0]) + self.running


def torchscript_files():
    files = {}
    for name, mod in [("scripted.pt", torch.jit.script(Scripted())),
                      ("traced.pt", torch.jit.trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), torch.ones(1, 2)))]:
        buf = io.BytesIO()
        torch.jit.save(mod, buf)
        files[name] = buf.getvalue()
    return files


def safetensors_files():
    from safetensors.torch import save
    files = {}
    files["mixed.safetensors"] = save({"a": torch.ones(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16),
                                       "c": torch.arange(3), "d": torch.tensor([True, False])},
                                      metadata={"format": "pt", "note": "fuzz seed"})
    files["empty_tensor.safetensors"] = save({"e": torch.empty(0, 4), "s": torch.tensor(1.0)})
    files["f8.safetensors"] = save({"x": torch.zeros(4, dtype=torch.float8_e4m3fn),
                                    "y": torch.zeros(2, dtype=torch.float8_e5m2),
                                    "u": torch.zeros(2, dtype=torch.uint16), "i": torch.zeros(2, dtype=torch.int8)})
    files["nothing.safetensors"] = save({})
    files["f64_c64.safetensors"] = save({"d": torch.zeros(1, dtype=torch.float64),
                                         "z": torch.zeros(1, dtype=torch.complex64)})
    # Hand-written header: whitespace padding the way the reference writer aligns.
    hdr = b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    hdr += b" " * (-(8 + len(hdr)) % 8)
    files["padded.safetensors"] = struct.pack("<Q", len(hdr)) + hdr + b"\x00" * 4

    # Hand-written headers for the refusals of security.md S1-S8 (each must be refused).
    def raw(header, data_len):
        h = header.encode()
        return struct.pack("<Q", len(h)) + h + b"\x00" * data_len
    t = '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'
    files["bad_overlap.safetensors"] = raw("{" + t % ("a", "F32", "[2]", 0, 8) + "," + t % ("b", "F32", "[2]", 4, 12) + "}", 12)
    files["bad_gap.safetensors"] = raw("{" + t % ("a", "F32", "[1]", 0, 4) + "," + t % ("b", "F32", "[1]", 8, 12) + "}", 12)
    files["bad_duplicate_key.safetensors"] = raw("{" + t % ("a", "F32", "[1]", 0, 4) + "," + t % ("a", "F32", "[1]", 4, 8) + "}", 8)
    files["bad_shape_overflow.safetensors"] = raw("{" + t % ("a", "F32", "[4294967296,4294967296]", 0, 4) + "}", 4)
    files["bad_unknown_dtype.safetensors"] = raw("{" + t % ("a", "F33", "[1]", 0, 4) + "}", 4)
    files["f4_even.safetensors"] = raw("{" + t % ("a", "F4", "[2,4]", 0, 4) + "}", 4)
    files["f4_odd.safetensors"] = raw("{" + t % ("a", "F4", "[3]", 0, 2) + "}", 2)
    files["f6.safetensors"] = raw("{" + t % ("a", "F6_E2M3", "[4]", 0, 3) + "}", 3)
    files["bad_bom.safetensors"] = struct.pack("<Q", 5) + b"\xef\xbb\xbf{}"
    files["bad_null_value.safetensors"] = raw('{"a":null}', 0)
    files["bad_bool_shape.safetensors"] = raw('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', 4)
    files["bad_metadata_value.safetensors"] = raw('{"__metadata__":{"k":1},' + t % ("a", "U8", "[1]", 0, 1) + "}", 1)
    files["bad_extra_key.safetensors"] = raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}}', 1)
    files["bad_rank65.safetensors"] = raw("{" + t % ("a", "U8", "[" + ",".join(["1"] * 65) + "]", 0, 1) + "}", 1)
    files["bad_trailing_data.safetensors"] = raw("{" + t % ("a", "U8", "[1]", 0, 1) + "}", 2)
    files["bad_header_too_large.safetensors"] = struct.pack("<Q", 100_000_001) + b"{}"
    files["whitespace_leading.safetensors"] = raw("  {}", 0)
    files["huge_dim.safetensors"] = raw("{" + t % ("a", "U8", "[9223372036854775808,0]", 0, 0) + "}", 0)
    return files


# ---- plain pickles -----------------------------------------------------------------------

def plain_pickles():
    shared = [1, 2]
    rec = []
    rec.append(rec)
    objects = {
        "scalars": [None, True, False, 0, 1, -1, 255, 256, 65535, 2 ** 31, -2 ** 31, 2 ** 63, 2 ** 100, -2 ** 100,
                    1.5, float("inf"), -0.0, "", "abc", "\u00e9\u4e2d\U0001F600", "\ud800", b"", b"\x00\xff",
                    bytearray(b"xy")],
        "containers": {"t": (1, 2, 3), "t0": (), "t1": (1,), "l": [[], {}], "s": {1, 2}, "f": frozenset([3]),
                       1: "int key", (1, 2): "tuple key", "shared": (shared, shared)},
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "recursive": rec,
        "objects": [datetime.date(2020, 1, 2), decimal.Decimal("1.5"), complex(1, 2), range(3), slice(1, 5, 2)],
    }
    files = {}
    for name, obj in objects.items():
        for proto in range(0, 6):
            files[f"{name}.p{proto}.pkl"] = pickle.dumps(obj, protocol=proto)
    # Protocol 5 out-of-band-free buffer and a bytearray.
    files["bytearray8.p5.pkl"] = pickle.dumps(bytearray(b"z" * 10), protocol=5)
    return files


def rekey_ops_files():
    """fuzz_rekey_ops: a --rename spec and keys, one per line, or a --map JSON document."""
    return {
        "group_rewrite": b"^(\\w+)\\.(\\d+)\\.=$1_$2.\nlayers.0.weight\nlayers.1.bias\nfc.weight",
        "escaped_equals": b"^a\\=b\\.=ab.\na=b.weight\nfc.bias",
        "exponential": b"(a|aa)*c=z\n" + b"a" * 60,
        "strip_collision": b"_orig_mod\\.=\nmodel._orig_mod.enc.w\nmodel._orig_mod.dec.b\nmodel.enc.w",
        "empty_key": b"^flag$=\nflag\nbf",
        "backreference": b"(a)\\1=x\naa",
        "hostile_keys": b".*=$$&[$&]\nx\x1b[2K\ny\r\nz\xe2\x80\xae\nw\xed\xa0\x80",
        "map_swap": b'{"ckptool_key_map": 1, "mapping": {"weight": "layer.weight", "layer.weight": "weight"}}',
        "map_duplicate": b'{"ckptool_key_map": 1, "mapping": {"a": "x", "a": "y"}}',
        "map_version": b'{"ckptool_key_map": 2, "mapping": {"a": "b"}}',
        "map_empty_collision": b'{"ckptool_key_map": 1, "mapping": {"a": "", "b": "c", "d": "c"}}',
    }


def dcp_metadata_files():
    """`.metadata` files of real DCP directories (dcp.save in 2 and 4 gloo processes,
    tests/py/dcp_fixtures.py), and hand-built Metadata for the forms no local writer makes:
    zstd descriptors, pre-2.7 _StorageInfo, Megatron's extra field, bad boxes, a payload."""
    import tempfile
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
    import dcp_fixtures
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, d in dcp_fixtures.build(tmp).items():
            for f in dcp_fixtures.metadata_files(d):
                rank = "" if f.name == ".metadata" else "_rank" + f.name[2:].split(".")[0]  # __{r}.metadata
                files[name + rank + ".metadata"] = f.read_bytes()

    def md(boxes, transforms=None, size=(5, 4)):
        t = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(size),
                                  [ChunkStorageMetadata(torch.Size(o), torch.Size(z)) for o, z in boxes])
        storage = {MetadataIndex("w", c.offsets, i): _StorageInfo("__0_0.distcp", 64 * i, 64, transforms)
                   for i, c in enumerate(t.chunks)}
        storage[MetadataIndex("lr")] = _StorageInfo("__1_0.distcp", 0, 32, transforms)
        return Metadata({"w": t, "lr": BytesStorageMetadata()}, {"w": ("w",), "lr": ("lr",)}, storage)

    rows = [((0, 0), (3, 4)), ((3, 0), (2, 4))]
    files["zstd.metadata"] = pickle.dumps(md(rows, ["stream.zstd/1"]), protocol=4)
    files["proto2.metadata"] = pickle.dumps(md(rows), protocol=2)
    files["overlap.metadata"] = pickle.dumps(md([((0, 0), (3, 4)), ((2, 0), (3, 4))]), protocol=4)
    files["gap.metadata"] = pickle.dumps(md([((0, 0), (3, 4))]), protocol=4)
    files["zero_size.metadata"] = pickle.dumps(md([((0, 0), (1, 3)), ((1, 0), (0, 3))], size=(1, 3)), protocol=4)
    m = md(rows)
    m.mcore_data = {"w": {"nd_reformulated_orig_global_shape": (5, 4)}}
    files["mcore_extra_field.metadata"] = pickle.dumps(m, protocol=4)
    good = pickle.dumps(md(rows), protocol=2)
    files["payload_popped.metadata"] = good[:2] + b"cos\nsystem\n(Vtrue\ntR0" + good[2:]
def hf_index_files():
    """Real *.index.json files from transformers' save_pretrained and huggingface_hub's
    save_torch_state_dict (tests/py/hf_fixtures.py), and a few edits of one of them."""
    import json
    import tempfile
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
    import hf_fixtures
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, s in hf_fixtures.write_all(tmp).items():
            files[name + "." + s.index.name] = s.index.read_bytes()
        base = json.loads((hf_fixtures.Path(tmp) / "llama_pretrained" / "model.safetensors.index.json").read_text())
    wm = base["weight_map"]
    first = next(iter(wm))
    files["edit_no_metadata.json"] = json.dumps({"weight_map": wm}).encode()
    files["edit_unknown_fields.json"] = json.dumps({"format": "pt", "metadata": {"total_size": 1.5, "x": [None]},
                                                    "weight_map": wm, "extra": {"weight_map": 1}}).encode()
    files["edit_subdir_shard.json"] = json.dumps({"weight_map": {**wm, first: "sub/" + wm[first]}}).encode()
    files["bad_escaping_shard.json"] = json.dumps({"weight_map": {**wm, first: "../" + wm[first]}}).encode()
    files["bad_duplicate_key.json"] = (b'{"weight_map": {"a": "s-1.safetensors", "a": "s-2.safetensors"}}')
    files["bad_value_type.json"] = json.dumps({"weight_map": {**wm, first: 3}}).encode()
    return files


FILE_SPLIT = b"\n--ckpt-fuzz-file--\n"  # fuzz/targets.h kFileSplit


def directory_seed(d):
    """A directory as one dcp_sets input: NAME\nBYTES per file, separated by FILE_SPLIT."""
    parts = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                parts.append(name.encode() + b"\n" + f.read())
    return FILE_SPLIT.join(parts)


def dcp_sets_files():
    """Small real directories: a DCP save, HuggingFaceStorageWriter pieces (distributed and
    not), a Hugging Face shard set, and pieces whose boxes tile a tensor (two files)."""
    import json
    import tempfile

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save as st_save
    seeds = {}
    small = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.float16),
             "n": torch.tensor([1, 2], dtype=torch.int64)}
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "dcp")
        dcp.save({"model": dict(small), "step": 3}, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
        seeds["dcp_no_dist.set"] = directory_seed(d)
        try:
            from torch.distributed.checkpoint import HuggingFaceStorageWriter
        except ImportError:
            HuggingFaceStorageWriter = None
        if HuggingFaceStorageWriter is not None:
            d = os.path.join(tmp, "hfdist")
            dcp.save(dict(small), storage_writer=HuggingFaceStorageWriter(d, save_distributed=True), no_dist=True)
            seeds["hf_storage_distributed.set"] = directory_seed(d)
            d = os.path.join(tmp, "hfnodist")
            dcp.save(dict(small), storage_writer=HuggingFaceStorageWriter(d), no_dist=True)
            seeds["hf_storage_index.set"] = directory_seed(d)
        # Two ranks' pieces of one tensor, as the writer lays them out (rows 0-1 and 2).
        d = os.path.join(tmp, "pieces")
        os.makedirs(d)
        full = torch.arange(9, dtype=torch.float32).reshape(3, 3)
        for rank, (rows, off) in enumerate([((0, 2), 0), ((2, 3), 2)]):
            info = {"w": {"saved_offsets": [off, 0]}}
            tensors = {"w": full[rows[0]:rows[1]].contiguous()}
            if rank == 1:
                info["s"] = {"saved_offsets": []}
                tensors["s"] = torch.tensor(2.5)
            data = st_save(tensors, metadata={"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0",
                                              "format": "pt"})
            with open(os.path.join(d, f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"), "wb") as f:
                f.write(data)
        seeds["hf_storage_two_ranks.set"] = directory_seed(d)
        d = os.path.join(tmp, "hfset")
        os.makedirs(d)
        idx = {"metadata": {"total_size": 0}, "weight_map": {}}
        for i, keys in enumerate([["w"], ["b", "n"]], start=1):
            name = f"model-{i:05d}-of-00002.safetensors"
            with open(os.path.join(d, name), "wb") as f:
                f.write(st_save({k: small[k] for k in keys}, metadata={"format": "pt"}))
            for k in keys:
                idx["weight_map"][k] = name
                idx["metadata"]["total_size"] += small[k].numel() * small[k].element_size()
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f)
        seeds["hf_shard_set.set"] = directory_seed(d)
    return seeds


def main():
    if os.path.isdir(SEEDS):
        shutil.rmtree(SEEDS)
    torch_zip = torch_files()
    legacy = legacy_files()
    ts = torchscript_files()
    st = safetensors_files()

    handmade = handmade_files()
    legacy.update(legacy_variants(legacy["legacy_views.pt"]))
    for name, data in {**torch_zip, **legacy, **ts, **st, **handmade}.items():
        out("torch_archive", name, data)
    for name, data in {**torch_zip, **ts, **handmade}.items():
        out("rewrite_roundtrip", name, data)
    for name in ["state_dict.pt", "views.pt", "lightning.ckpt", "nested.pt", "dtypes.pt"]:
        out("zip_index", name, torch_zip[name])
    out("zip_index", "scripted.pt", ts["scripted.pt"])  # deflated code/ records
    # Python's zipfile: deflate, data descriptors (streamed), a directory, ZIP64 extras.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl", FIXED_TIME), pickle.dumps({"a": 1}, protocol=2),
                   compress_type=zipfile.ZIP_DEFLATED)
        with z.open(zipfile.ZipInfo("archive/data/0", FIXED_TIME), "w", force_zip64=True) as f:
            f.write(b"\x00" * 64)
        z.writestr(zipfile.ZipInfo("archive/version", FIXED_TIME), "3\n", compress_type=zipfile.ZIP_DEFLATED)
    out("zip_index", "python_zipfile_deflate.zip", buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl", FIXED_TIME), pickle.dumps([], protocol=2))
    out("zip_index", "python_zipfile_stored.zip", buf.getvalue())

    for name, data in st.items():
        out("safetensors", name, data)

    for name, data in {**ts}.items():
        out("torchscript_meta", name, data)
        r = records(data)
        out("torchscript_meta", name.replace(".pt", ".split"), r["data.pkl"] + SPLIT + r.get("constants.pkl", b""))

    for name, data in {**torch_zip, **ts}.items():
        r = records(data)
        out("pickle", name.rsplit(".", 1)[0] + ".data.pkl", r["data.pkl"])
        if "constants.pkl" in r:
            out("pickle", name.rsplit(".", 1)[0] + ".constants.pkl", r["constants.pkl"])
    out("pickle", "legacy_views.stream.pkl", legacy["legacy_views.pt"])
    for name, data in plain_pickles().items():
        out("pickle", name, data)

    for name, data in rekey_ops_files().items():
        out("rekey_ops", name, data)

    for name, data in dcp_metadata_files().items():
        out("dcp_metadata", name, data)
    for name, data in hf_index_files().items():
        out("hf_index", name, data)
    for name, data in dcp_sets_files().items():
        out("dcp_sets", name, data)

    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(SEEDS) for f in fs)
    count = sum(len(fs) for _, _, fs in os.walk(SEEDS))
    print(f"make_seeds: {count} files, {total} bytes under {SEEDS}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--sets-only"]:  # just fuzz/seeds/dcp_sets/ (runs dcp.save)
        shutil.rmtree(os.path.join(SEEDS, "dcp_sets"), ignore_errors=True)
        for name, data in dcp_sets_files().items():
            out("dcp_sets", name, data)
    elif sys.argv[1:] == ["--dcp-only"]:  # just fuzz/seeds/dcp_metadata/ (runs dcp.save)
        shutil.rmtree(os.path.join(SEEDS, "dcp_metadata"), ignore_errors=True)
        for name, data in dcp_metadata_files().items():
            out("dcp_metadata", name, data)
    else:
        main()
