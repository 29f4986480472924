"""What the reference clients (torch, safetensors) say a file holds, and the comparison of
that with `ckptool inspect --json`.

Nothing here trusts ckptool: every expected value comes from torch.load / torch.jit.load /
safetensors.safe_open, from Python's zipfile, or from an independent parse of the file.
The compare_* functions return a list of human-readable mismatches ("which field, expected
vs got"); the tests assert that list is empty so one run shows every disagreement.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

WRAPPER_SEGMENTS = ["_orig_mod.", "module.", "_fsdp_wrapped_module.",
                    "_checkpoint_wrapped_module.", "_forward_module."]

LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.dtype,
              torch.device, torch.layout, torch.memory_format, torch.qscheme, type)

MAX_LISTED = 12  # mismatches listed per category before summarising


# --------------------------------------------------------------------------- loading


def load_reference(fx) -> Any:
    """The Python object the reference client gives for a fixture (never the malicious one)."""
    if fx.load == "never":
        raise AssertionError(f"{fx.name} must never be unpickled by Python")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fx.load == "weights_only":
            return torch.load(fx.path, weights_only=True)
        if fx.load == "full":
            return torch.load(fx.path, weights_only=False)
        if fx.load == "torchscript":
            return torch.jit.load(str(fx.path), map_location="cpu")
    raise AssertionError(f"no python loader for {fx.load}")


# --------------------------------------------------------------------------- walking


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def walk(root: Any):
    """Every tensor reachable from `root`, first path only (dict keys in insertion order,
    list/tuple indices, object attributes from __dict__), plus the aliases: later paths that
    reach an already-seen tensor object. Returns (tensors: {path: tensor}, aliases:
    {path: first_path}). Paths are tuples of str/int."""
    tensors: dict[tuple, torch.Tensor] = {}
    aliases: dict[tuple, tuple] = {}
    seen: dict[int, tuple] = {}
    seen_containers: set[int] = set()

    def rec(o, path):
        if isinstance(o, torch.Tensor):
            if id(o) in seen:
                aliases[path] = seen[id(o)]
            else:
                seen[id(o)] = path
                tensors[path] = o
            return
        if isinstance(o, LEAF_TYPES) or isinstance(o, (set, frozenset)):
            return
        if id(o) in seen_containers:
            return
        seen_containers.add(id(o))
        if isinstance(o, dict):
            for k, v in o.items():
                rec(v, path + (k,))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                rec(v, path + (i,))
        elif hasattr(o, "__dict__"):
            for k, v in vars(o).items():
                rec(v, path + (k,))

    rec(root, ())
    return tensors, aliases


def resolve(root: Any, path) -> Any:
    """Follow a JSON path (keys, indices, attribute names) through the loaded object."""
    cur = root
    for step in path:
        if isinstance(cur, dict):
            cur = cur[step]
        elif isinstance(cur, (list, tuple)):
            if not isinstance(step, int):
                raise KeyError(f"non-integer index {step!r} into a {type(cur).__name__}")
            cur = cur[step]
        elif isinstance(step, str):
            d = getattr(cur, "__dict__", None)
            if d is not None and step in d:
                cur = d[step]
            else:
                cur = getattr(cur, step)
        else:
            raise KeyError(f"cannot step {step!r} into a {type(cur).__name__}")
    return cur


def jpath(p) -> tuple:
    return tuple(p)


def show(path) -> str:
    s = json.dumps(list(path), ensure_ascii=True)
    return s if len(s) < 120 else s[:100] + f"...(len {len(s)})]"


def storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def view_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tensor_record(t: torch.Tensor) -> dict:
    return {
        "dtype": dtype_name(t.dtype),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "nbytes": view_nbytes(t),
        "parameter": isinstance(t, nn.Parameter),
        "requires_grad": bool(t.requires_grad),
        "device": str(t.device),
    }


def totals_of(tensors) -> dict:
    out = {"tensors": 0, "numel": 0, "nbytes": 0, "by_dtype": {}}
    for t in tensors:
        dn = dtype_name(t.dtype)
        b = out["by_dtype"].setdefault(dn, {"tensors": 0, "numel": 0, "nbytes": 0})
        for dct in (out, b):
            dct["tensors"] += 1
            dct["numel"] += t.numel()
            dct["nbytes"] += view_nbytes(t)
    return out


def wrapper_counts(keys) -> dict:
    """segment -> number of keys that hold it as a dotted component (non-zero only)."""
    out = {}
    for seg in WRAPPER_SEGMENTS:
        name = seg[:-1]
        n = sum(1 for k in keys if isinstance(k, str) and name in k.split(".")[:-1])
        if n:
            out[seg] = n
    return out


# --------------------------------------------------------------------------- file layouts


def zip_storage_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """storage key -> (first data byte, record size) from the zip's own headers (zipfile)."""
    out = {}
    with open(path, "rb") as fh, zipfile.ZipFile(fh) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) >= 3 and parts[-2] == "data" and info.filename.count("/") == 2:
                fh.seek(info.header_offset)
                hdr = fh.read(30)
                sig, *_rest = struct.unpack("<IHHHHHIIIHH", hdr)
                assert sig == 0x04034B50
                nlen, xlen = struct.unpack("<HH", hdr[26:30])
                out[parts[-1]] = (info.header_offset + 30 + nlen + xlen, info.file_size)
    return out


def zip_data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        assert len(names) == 1, names
        return z.read(names[0])


class _Stub:
    """Permissive stand-in for any global while scanning a pickle: never runs real code."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Stub()

    def __setstate__(self, state):
        pass

    def __setitem__(self, k, v):
        pass

    def append(self, v):
        pass

    def extend(self, v):
        pass


_LEGACY_ELSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "LongStorage": 8, "IntStorage": 4,
    "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "BFloat16Storage": 2, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8,
    "QInt8Storage": 1, "QUInt8Storage": 1, "QInt32Storage": 4, "QUInt4x2Storage": 1,
    "QUInt2x4Storage": 1,
}


def legacy_layout(path: Path):
    """Parse a pre-1.6 torch.save stream without executing anything.
    Returns (main pickle bytes, {storage key: (first data byte, nbytes)})."""
    pids: dict[str, int] = {}

    class U(pickle.Unpickler):
        def find_class(self, module, name):
            return type(name, (_Stub,), {})

        def persistent_load(self, pid):
            if isinstance(pid, tuple) and pid and pid[0] == "storage":
                _, stype, key, _loc, numel = pid[:5]
                pids[str(key)] = numel * _LEGACY_ELSIZE.get(stype.__name__, 1)
            return _Stub()

    with open(path, "rb") as f:
        for _ in range(3):  # magic number, protocol version, sys info
            U(f).load()
        start = f.tell()
        U(f).load()
        end = f.tell()
        keys = U(f).load()
        offsets = {}
        for key in keys:
            (numel,) = struct.unpack("<q", f.read(8))
            offsets[str(key)] = (f.tell(), pids[str(key)])
            f.seek(pids[str(key)], os.SEEK_CUR)
        f.seek(start)
        main = f.read(end - start)
    return main, offsets


def pickle_globals(data: bytes) -> set[str]:
    from torch import _weights_only_unpickler as wou

    return set(wou.get_globals_in_pkl(io.BytesIO(data)))


def allowed_globals() -> set[str]:
    from torch import _weights_only_unpickler as wou

    return set(wou._get_allowed_globals()) | set(wou._get_user_allowed_globals())


def safetensors_header(path: Path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return n, header


def read_at(path: Path, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


# --------------------------------------------------------------------------- comparison


class Mismatches(list):
    def add(self, where: str, field: str, expected, got):
        self.append(f"{where}: {field}: expected {expected!r}, got {got!r}")

    def report(self, title: str) -> str:
        return f"{title}: {len(self)} mismatch(es)\n  " + "\n  ".join(self[:200])


def _listed(items) -> str:
    items = list(items)
    s = ", ".join(show(p) for p in items[:MAX_LISTED])
    return s + (f", ... ({len(items)} in all)" if len(items) > MAX_LISTED else "")


def compare_common(fx, doc, m: Mismatches):
    if doc.get("schema") != 1:
        m.add("document", "schema", 1, doc.get("schema"))
    if doc.get("format") != fx.format:
        m.add("document", "format", fx.format, doc.get("format"))
    size = os.path.getsize(fx.path)
    if doc.get("file_size") != size:
        m.add("document", "file_size", size, doc.get("file_size"))
    io_ = doc.get("io")
    if not isinstance(io_, dict) or not isinstance(io_.get("bytes_read"), int):
        m.add("document", "io.bytes_read", "an integer", io_)
    for k in ("tensors", "storages", "aliases", "unsafe_globals", "globals", "entries"):
        if not isinstance(doc.get(k), list):
            m.add("document", k, "an array", type(doc.get(k)).__name__)
    for k in ("wrappers", "totals"):
        if not isinstance(doc.get(k), dict):
            m.add("document", k, "an object", type(doc.get(k)).__name__)


def compare_tensor_sets(py_tensors: dict, doc, m: Mismatches, check_fields=True) -> dict:
    """Path set equality and per-tensor fields. Returns {path: json entry}."""
    jt = {}
    for e in doc.get("tensors") or []:
        p = jpath(e.get("path", []))
        if p in jt:
            m.add(show(p), "path", "unique in tensors[]", "listed twice")
        jt[p] = e
    missing = [p for p in py_tensors if p not in jt]
    extra = [p for p in jt if p not in py_tensors]
    if missing:
        m.append(f"tensors missing from JSON ({len(missing)}): {_listed(missing)}")
    if extra:
        m.append(f"tensors in JSON that torch does not have at that path ({len(extra)}): "
                 f"{_listed(extra)}")
    if check_fields:
        for p, t in py_tensors.items():
            e = jt.get(p)
            if e is None:
                continue
            exp = tensor_record(t)
            for k, v in exp.items():
                if e.get(k) != v:
                    m.add(show(p), k, v, e.get(k))
    return jt


def compare_storages(fx, py_tensors: dict, jt: dict, doc, m: Mismatches, layout=None):
    """Sharing: tensors on one storage in torch <=> one "storage" key in JSON; the storages[]
    table (dtype, nbytes, device, tensors, offset checked against the file's bytes)."""
    common = [p for p in py_tensors if p in jt]
    py_groups: dict[int, set] = {}
    js_groups: dict[Any, set] = {}
    for p in common:
        py_groups.setdefault(storage_id(py_tensors[p]), set()).add(p)
        key = jt[p].get("storage")
        js_groups.setdefault(("null", p) if key is None else key, set()).add(p)
    py_part = {frozenset(g) for g in py_groups.values()}
    js_part = {frozenset(g) for g in js_groups.values()}
    for g in py_part - js_part:
        keys = sorted({str(jt[p].get("storage")) for p in g})
        m.append(f"storage sharing: torch has {_listed(sorted(g, key=str))} on one storage; "
                 f"JSON storage keys {keys}")
    for g in js_part - py_part:
        if len(g) > 1:
            m.append(f"storage sharing: JSON puts {_listed(sorted(g, key=str))} on one storage "
                     f"({jt[next(iter(g))].get('storage')!r}); torch does not")

    table = {}
    for s in doc.get("storages") or []:
        if s.get("key") in table:
            m.add(f"storage {s.get('key')!r}", "key", "unique in storages[]", "listed twice")
        table[s.get("key")] = s
    used = {}
    for p in jt:
        k = jt[p].get("storage")
        if k is not None:
            used.setdefault(k, []).append(p)
    for k in used:
        if k not in table:
            m.add(f"storage {k!r}", "storages[]", "an entry for every key tensors use", "missing")
    qparams = _compare_quantizers(py_tensors, jt, common, m)
    for k in table:
        if k not in used and k not in qparams:
            m.add(f"storage {k!r}", "storages[]", "only keys some tensor uses", "unused key")
    for k, v in qparams.items():
        s = table.get(k)
        where = f"storage {k!r} (quantizer values)"
        if s is None:
            m.add(where, "storages[]", "an entry for every key quantizers use", "missing")
            continue
        for f, want in {"dtype": dtype_name(v.dtype), "nbytes": v.numel() * v.element_size(), "tensors": 1}.items():
            if s.get(f) != want:
                m.add(where, f, want, s.get(f))
        if isinstance(s.get("offset"), int):
            with open(fx.path, "rb") as fh:
                fh.seek(s["offset"])
                if fh.read(s["nbytes"]) != v.contiguous().numpy().tobytes():
                    m.add(where, "bytes at offset", "torch's per-channel values", "different bytes")
    with open(fx.path, "rb") as fh:
        _compare_storage_table(fx, py_tensors, used, table, layout, m, fh)


def _compare_quantizers(py_tensors, jt, common, m) -> dict:
    """Each quantized tensor's "quantization" against torch's quantizer; returns the storage
    keys that hold per-channel scales and zero points, with the tensors torch rebuilt."""
    qparams = {}
    for p in common:
        t, q = py_tensors[p], jt[p].get("quantization")
        if not t.is_quantized:
            if q is not None:
                m.add(show(p), "quantization", None, q)
            continue
        if not isinstance(q, dict):
            m.add(show(p), "quantization", "the quantizer", q)
            continue
        if t.qscheme() == torch.per_tensor_affine:
            exp = {"scheme": "per_tensor_affine", "scale": t.q_scale(), "zero_point": t.q_zero_point()}
            if q != exp:
                m.add(show(p), "quantization", exp, q)
            continue
        # torch.save names both per-channel variants per_channel_affine.
        if q.get("scheme") != "per_channel_affine" or q.get("axis") != t.q_per_channel_axis():
            m.add(show(p), "quantization", f"per_channel_affine on axis {t.q_per_channel_axis()}", q)
        for field, v in (("scales", t.q_per_channel_scales()), ("zero_points", t.q_per_channel_zero_points())):
            ref = q.get(field)
            if not isinstance(ref, dict) or ref.get("dtype") != dtype_name(v.dtype):
                m.add(show(p), f"quantization.{field}", f"a {dtype_name(v.dtype)} storage", ref)
                continue
            qparams[ref.get("storage")] = v
    return qparams


def _compare_storage_table(fx, py_tensors, used, table, layout, m, fh):
    for k, paths in used.items():
        s = table.get(k)
        if s is None:
            continue
        ps = [p for p in paths if p in py_tensors]
        if not ps:
            continue
        t = py_tensors[ps[0]]
        where = f"storage {k!r} (of {show(ps[0])})"
        st = t.untyped_storage()
        exp = {"dtype": dtype_name(t.dtype), "nbytes": st.nbytes(), "device": str(t.device),
               "tensors": len(paths)}
        for f, v in exp.items():
            if s.get(f) != v:
                m.add(where, f, v, s.get(f))
        if t.device.type == "meta":
            if s.get("offset") is not None:
                m.add(where, "offset", None, s.get("offset"))
            continue
        off = s.get("offset")
        if layout is not None and k not in layout:
            m.add(where, "key", "the name of a storage record in the file", "no such record")
        if layout is not None and k in layout:
            exp_off, exp_n = layout[k]
            if off != exp_off:
                m.add(where, "offset", exp_off, off)
            if exp_n != st.nbytes():
                m.add(where, "record size in file", st.nbytes(), exp_n)
        if isinstance(off, int) and st.nbytes() > 0:
            if fh.seek(off) != off or fh.read(st.nbytes()) != bytes(st):
                m.add(where, "bytes at offset", "the storage's data", "different bytes")


def compare_aliases(py_aliases: dict, doc, m: Mismatches):
    js = {}
    for a in doc.get("aliases") or []:
        js[jpath(a.get("path", []))] = jpath(a.get("same_as", []))
    for p, first in py_aliases.items():
        if p not in js:
            m.add(show(p), "aliases", f"same_as {show(first)}", "not listed")
        elif js[p] != first:
            m.add(show(p), "aliases.same_as", show(first), show(js[p]))
    for p in js:
        if p not in py_aliases:
            m.add(show(p), "aliases", "not an alias in torch", f"same_as {show(js[p])}")


def compare_totals(tensors, doc, m: Mismatches):
    exp = totals_of(tensors)
    got = doc.get("totals") or {}
    for k in ("tensors", "numel", "nbytes"):
        if got.get(k) != exp[k]:
            m.add("totals", k, exp[k], got.get(k))
    if got.get("by_dtype") != exp["by_dtype"]:
        m.add("totals", "by_dtype", exp["by_dtype"], got.get("by_dtype"))


def compare_globals(expected_all: set, doc, m: Mismatches):
    exp_unsafe = expected_all - allowed_globals()
    got_unsafe = set(doc.get("unsafe_globals") or [])
    if got_unsafe != exp_unsafe:
        m.add("unsafe_globals", "set", sorted(exp_unsafe), sorted(got_unsafe))
    got_all = set(doc.get("globals") or [])
    if got_all != expected_all:
        m.add("globals", "set", sorted(expected_all), sorted(got_all))


def compare_state_dict(fx, root, doc, m: Mismatches):
    from fixtures import ANY

    got = doc.get("state_dict", "<absent>")
    if fx.state_dict is not ANY and got != fx.state_dict:
        m.add("state_dict", "path", fx.state_dict, got)
    # wrappers are counted over the keys of the state dict ckptool chose
    exp = {}
    if isinstance(got, list):
        try:
            sd = resolve(root, got)
        except Exception as e:  # noqa: BLE001
            m.add("state_dict", "path resolves in torch's object", True, f"{type(e).__name__}: {e}")
            sd = None
        if isinstance(sd, dict):
            exp = wrapper_counts(sd.keys())
    if (doc.get("wrappers") or {}) != exp:
        m.add("wrappers", "counts", exp, doc.get("wrappers"))


def compare_entries(root, doc, m: Mismatches, extra_holders=()):
    """Non-tensor scalars at the top level (and in the given sub-dicts) must be listed, and
    every listed entry must resolve to a non-tensor with the same value."""
    scalars = (str, int, float, bool, type(None))
    listed = {}
    for e in doc.get("entries") or []:
        listed[jpath(e.get("path", []))] = e
    expected = []
    if isinstance(root, dict):
        for k, v in root.items():
            if isinstance(v, scalars):
                expected.append(((k,), v))
        for h in extra_holders:
            sub = root.get(h)
            if isinstance(sub, dict):
                for k, v in sub.items():
                    if isinstance(v, scalars):
                        expected.append(((h, k), v))
    for p, v in expected:
        if p not in listed:
            m.add(show(p), "entries", f"listed ({v!r})", "missing")
    for p, e in listed.items():
        try:
            v = resolve(root, p)
        except Exception as ex:  # noqa: BLE001
            m.add(show(p), "entries.path", "resolves in torch's object", f"{type(ex).__name__}")
            continue
        if isinstance(v, torch.Tensor):
            m.add(show(p), "entries", "a non-tensor", "a tensor")
            continue
        exp_v = entry_value(v)
        if exp_v is not None and e.get("value") != exp_v:
            m.add(show(p), "entries.value", exp_v, e.get("value"))
        if isinstance(v, float):
            try:
                ok = float(e.get("value")) == v
            except (TypeError, ValueError):
                ok = False
            if not ok:
                m.add(show(p), "entries.value", repr(v), e.get("value"))
        exp_t = entry_type(v)
        if exp_t is not None and e.get("type") != exp_t:
            m.add(show(p), "entries.type", exp_t, e.get("type"))


def entry_type(v):
    for t, n in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (bytes, "bytes"),
                 (dict, "dict"), (list, "list"), (tuple, "tuple")):
        if isinstance(v, t):
            return n
    if v is None:
        return "None"
    return None


def entry_value(v):
    """Expected "value" string: Python's repr for scalars (floats compared numerically)."""
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    return None


def compare_torch_file(fx, doc) -> Mismatches:
    """torch-zip and torch-legacy fixtures."""
    m = Mismatches()
    compare_common(fx, doc, m)
    root = load_reference(fx)
    py_t, py_a = walk(root)
    jt = compare_tensor_sets(py_t, doc, m)
    if fx.format == "torch-legacy":
        main, layout = legacy_layout(fx.path)
        exp_globals = pickle_globals(main)
    else:
        layout = zip_storage_offsets(fx.path)
        exp_globals = pickle_globals(zip_data_pkl(fx.path))
        if fx.load == "weights_only":
            tu = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(fx.path)))
            assert tu == exp_globals - allowed_globals()
    compare_storages(fx, py_t, jt, doc, m, layout)
    compare_aliases(py_a, doc, m)
    compare_totals(py_t.values(), doc, m)
    compare_globals(exp_globals, doc, m)
    compare_state_dict(fx, root, doc, m)
    holders = ("hyper_parameters",) if fx.name == "lightning" else ()
    compare_entries(root, doc, m, holders)
    if doc.get("module") is not None:
        m.add("document", "module", None, "present (only TorchScript has one)")
    return m


def compare_safetensors(fx, doc) -> Mismatches:
    from safetensors import safe_open

    m = Mismatches()
    compare_common(fx, doc, m)
    n, header = safetensors_header(fx.path)
    tensors = {}
    with safe_open(str(fx.path), framework="pt") as f:
        for k in f.keys():
            tensors[(k,)] = f.get_tensor(k)
    jt = compare_tensor_sets(tensors, doc, m)
    # storages: one per tensor, named after it, at 8 + header + data_offsets[0]
    table = {s.get("key"): s for s in doc.get("storages") or []}
    for (k,), t in tensors.items():
        e = jt.get((k,))
        if e is not None and e.get("storage") != k:
            m.add(show((k,)), "storage", k, e.get("storage"))
        s = table.get(k)
        if s is None:
            m.add(f"storage {k!r}", "storages[]", "present", "missing")
            continue
        b, end = header[k]["data_offsets"]
        exp = {"dtype": dtype_name(t.dtype), "nbytes": end - b, "offset": 8 + n + b,
               "device": "cpu", "tensors": 1}
        for f_, v in exp.items():
            if s.get(f_) != v:
                m.add(f"storage {k!r}", f_, v, s.get(f_))
        if end > b and read_at(fx.path, 8 + n + b, end - b) != bytes(t.contiguous().untyped_storage()):
            m.add(f"storage {k!r}", "bytes at offset", "the tensor's data", "different bytes")
    if len(table) != len(tensors):
        m.add("storages", "count", len(tensors), len(table))
    compare_totals(tensors.values(), doc, m)
    if doc.get("state_dict") != []:
        m.add("state_dict", "path", [], doc.get("state_dict"))
    if doc.get("unsafe_globals"):
        m.add("unsafe_globals", "list", [], doc.get("unsafe_globals"))
    if doc.get("aliases"):
        m.add("aliases", "list", [], doc.get("aliases"))
    exp_w = wrapper_counts(k for (k,) in tensors)
    if (doc.get("wrappers") or {}) != exp_w:
        m.add("wrappers", "counts", exp_w, doc.get("wrappers"))
    return m


def torchscript_reference(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sm = torch.jit.load(str(path), map_location="cpu")
    return {
        "object": sm,
        "type": sm._c._type().qualified_name(),
        "parameters": [{"name": n, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
                       for n, t in sm.named_parameters()],
        "buffers": [{"name": n, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
                    for n, t in sm.named_buffers()],
        "methods": {name: str(getattr(sm, name).schema) for name in sm._c._method_names()},
        "submodules": [{"name": n, "type": c._c._type().qualified_name()}
                       for n, c in sm.named_children()],
    }


def compare_torchscript(fx, doc) -> Mismatches:
    m = Mismatches()
    compare_common(fx, doc, m)
    ref = torchscript_reference(fx.path)
    mod = doc.get("module")
    if not isinstance(mod, dict):
        m.add("module", "object", "present for TorchScript", mod)
        return m
    if mod.get("type") != ref["type"]:
        m.add("module", "type", ref["type"], mod.get("type"))
    for kind in ("parameters", "buffers"):
        exp = {d["name"]: d for d in ref[kind]}
        got = {d.get("name"): d for d in mod.get(kind) or []}
        if set(exp) != set(got):
            m.add(f"module.{kind}", "names", sorted(exp), sorted(map(str, got)))
        for name in set(exp) & set(got):
            for f_ in ("dtype", "shape"):
                if exp[name][f_] != got[name].get(f_):
                    m.add(f"module.{kind}[{name}]", f_, exp[name][f_], got[name].get(f_))
    got_methods = {d.get("name"): d.get("schema") for d in mod.get("methods") or []}
    if set(got_methods) != set(ref["methods"]):
        m.add("module.methods", "names", sorted(ref["methods"]), sorted(map(str, got_methods)))
    for name, schema in ref["methods"].items():
        if name in got_methods and got_methods[name] != schema:
            m.add(f"module.methods[{name}]", "schema", schema, got_methods[name])
    exp_sub = {d["name"]: d["type"] for d in ref["submodules"]}
    got_sub = {d.get("name"): d.get("type") for d in mod.get("submodules") or []}
    if exp_sub != got_sub:
        m.add("module.submodules", "name -> type", exp_sub, got_sub)
    # tensors[]: the parameters and buffers, reached through attributes of the module
    sm = ref["object"]
    py_t = {tuple(n.split(".")): t for n, t in list(sm.named_parameters()) + list(sm.named_buffers())}
    jt = {jpath(e.get("path", [])): e for e in doc.get("tensors") or []}
    missing = [p for p in py_t if p not in jt]
    extra = [p for p in jt if p not in py_t]
    if missing:
        m.append(f"tensors missing from JSON ({len(missing)}): {_listed(missing)}")
    for p in extra:  # any other tensor attribute must at least resolve by getattr
        try:
            t = resolve(sm, p)
            if not isinstance(t, torch.Tensor):
                m.add(show(p), "tensors[].path", "a tensor attribute", type(t).__name__)
        except Exception as ex:  # noqa: BLE001
            m.add(show(p), "tensors[].path", "resolves on torch.jit.load's module", type(ex).__name__)
    for p, t in py_t.items():
        e = jt.get(p)
        if e is None:
            continue
        exp = tensor_record(t)
        # torch.jit.load marks parameters itself; ckptool reports the file's tensors
        exp.pop("parameter")
        exp.pop("requires_grad")
        for k, v in exp.items():
            if e.get(k) != v:
                m.add(show(p), k, v, e.get(k))
    compare_totals([resolve(sm, p) for p in jt if _is_tensor_at(sm, p)], doc, m)
    # storages: keys name the archive's data/<key> records; bytes there are the tensors' data
    compare_storages(fx, py_t, jt, doc, m, zip_storage_offsets(fx.path))
    return m


def _is_tensor_at(root, p) -> bool:
    try:
        return isinstance(resolve(root, p), torch.Tensor)
    except Exception:  # noqa: BLE001
        return False


def compare(fx, doc) -> Mismatches:
    if fx.format == "safetensors":
        return compare_safetensors(fx, doc)
    if fx.format == "torchscript":
        return compare_torchscript(fx, doc)
    return compare_torch_file(fx, doc)
