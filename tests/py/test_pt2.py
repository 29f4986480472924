"""torch.export archives (`.pt2`, issue 16, docs/formats.md §14) checked against real PyTorch:
every archive is written by torch.export.save (or package_pt2) in this process and read back
by torch.export.load, never by ckptool's own writer.

  * inspect --json: state-dict keys in torch.export.load's order, dtypes, shapes, strides,
    storage offsets, parameters; constants (lifted tensors, non-persistent buffers) under
    "<constants>/NAME"; storages shared exactly where torch.export.load's tensors share
    them (tied weights, slices of one buffer), never for a meta export's empty files; the
    signature (user inputs with dtypes and symbolic dims, parameters/buffers/constants),
    range_constraints, the calling convention; --graph's node shapes against the loaded
    graph's node metadata;
  * several models in one archive (package_pt2) keyed "<model>/<fqn>"; a model exported on
    meta; a torch.compile'd submodule's `_orig_mod.` keys;
  * materialize -o (and --mmap, --dtype, --device meta): each tensor bit for bit equal to
    torch.export.load's, ties kept;
  * verify: OK on every archive;
  * corrupt archives (rewritten with zipfile, each beside an unchanged rewrite that loads):
    exit 3 with one line naming the file and the record.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import inspect_json, run_ckptool

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Tied(nn.Module):
    """Tied weights, a non-persistent buffer, a lifted tensor constant, a float16
    parameter, and a dict inside the output tuple."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 3)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.register_buffer("nonpersist", torch.arange(3.0), persistent=False)
        self.consttensor = torch.tensor([1.0, 2.0, 3.0])
        self.hw = nn.Parameter(torch.randn(4, 4, dtype=torch.float16))

    def forward(self, idx, x):
        e = self.emb(idx)
        y = self.fc(x) * self.scale + self.nonpersist + self.consttensor
        z = self.head(e) + self.hw.float().sum()
        return y, {"logits": z}


class Views(nn.Module):
    """Two buffers slicing one tensor, a transposed parameter."""

    def __init__(self):
        super().__init__()
        big = torch.arange(24.0).reshape(6, 4)
        self.register_buffer("a", big[1:3])
        self.register_buffer("b", big[3:5])
        self.wt = nn.Parameter(torch.arange(12.0).reshape(3, 4).t())

    def forward(self, x):
        return x @ self.wt + self.a.sum() + self.b.sum()


class Sym(nn.Module):
    def forward(self, x, y):
        return torch.cat([x, x], 0), y[1:], x.shape[0] * 3


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class WithCompiled(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = torch.compile(nn.Linear(4, 4))
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.sub(x))


@pytest.fixture(scope="session")
def archives(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pt2")
    out: dict[str, Path] = {}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = torch.export.Dim("batch", min=2, max=64)
        ep = torch.export.export(Tied().eval(), (torch.randint(0, 10, (2, 5)), torch.randn(2, 4)),
                                 dynamic_shapes=({0: batch}, {0: batch}))
        out["tied"] = d / "tied.pt2"
        torch.export.save(ep, out["tied"], extra_files={"note.txt": "hello"})

        out["views"] = d / "views.pt2"
        torch.export.save(torch.export.export(Views(), (torch.randn(2, 4),)), out["views"])

        b, t = torch.export.Dim("B", min=2, max=100), torch.export.Dim("T", min=3)
        out["sym"] = d / "sym.pt2"
        torch.export.save(torch.export.export(Sym(), (torch.randn(4, 2), torch.randn(5)),
                                              dynamic_shapes=({0: b}, {0: t})), out["sym"])

        from torch.export.pt2_archive._package import package_pt2
        shared = nn.Linear(4, 4)
        enc = nn.Sequential(shared)
        dec = nn.Sequential(shared, nn.Linear(4, 2))
        x = torch.randn(2, 4)
        out["multi"] = d / "multi.pt2"
        package_pt2(str(out["multi"]), exported_programs={"encoder": torch.export.export(enc, (x,)),
                                                          "decoder": torch.export.export(dec, (x,))})

        with torch.device("meta"):
            meta_model = Mlp()
        out["meta"] = d / "meta.pt2"
        torch.export.save(torch.export.export(meta_model, (torch.randn(3, 8, device="meta"),)), out["meta"])

        from torch.testing._internal.two_tensor import TwoTensor

        class Subclass(nn.Module):
            def __init__(self):
                super().__init__()
                self.p = nn.Parameter(TwoTensor(torch.ones(2), torch.zeros(2)))
                self.q = nn.Parameter(torch.ones(2))

            def forward(self, x):
                return x + self.p + self.q

        out["subclass"] = d / "subclass.pt2"
        torch.export.save(torch.export.export(Subclass(), (torch.randn(2),)), out["subclass"])

        out["compiled"] = d / "compiled.pt2"
        torch.export.save(torch.export.export(WithCompiled(), (torch.randn(2, 4),)), out["compiled"])
    return out


def load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.load(str(path))


def expected_tensors(ep, prefix="") -> dict[str, torch.Tensor]:
    """What ckptool names each tensor of the archive: the state-dict keys, then the tensor
    constants as "<constants>/NAME" (both after "MODEL/" when the archive has several)."""
    named = {prefix + k: v for k, v in ep.state_dict.items()}
    for k, v in ep.constants.items():
        if isinstance(v, torch.Tensor):
            named[prefix + "<constants>/" + k] = v
    return named


def by_path(doc) -> dict[str, dict]:
    return {"/".join(str(p) for p in t["path"]): t for t in doc["tensors"]}


# ---------------------------------------------------------------------------------------
# inspect


@pytest.mark.parametrize("name", ["tied", "views", "sym", "compiled"])
def test_inspect_agrees_with_export_load(archives, name):
    path = archives[name]
    ep = load(path)
    doc = inspect_json(path)
    assert doc["format"] == "pt2"
    assert doc["state_dict"] == []
    tensors = by_path(doc)
    # The state dict, in torch.export.load's order; then the constants.
    assert [t["path"][0] for t in doc["tensors"] if t["path"][0] != "<constants>"] == list(ep.state_dict)
    expect = expected_tensors(ep)
    assert set(tensors) == set(expect)
    for key, ref in expect.items():
        t = tensors[key]
        assert t["dtype"] == str(ref.dtype).removeprefix("torch."), key
        assert t["shape"] == list(ref.shape), key
        assert t["stride"] == list(ref.stride()), key
        assert t["storage_offset"] == ref.storage_offset(), key
        assert t["parameter"] == isinstance(ref, nn.Parameter), key
    # Shared storages exactly where torch.export.load's tensors share one.
    keys = list(expect)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            same = expect[a].untyped_storage().data_ptr() == expect[b].untyped_storage().data_ptr()
            assert (tensors[a]["storage"] == tensors[b]["storage"]) == same, (a, b)


def test_inspect_ties_and_views(archives):
    doc = inspect_json(archives["tied"])
    t = by_path(doc)
    assert t["emb.weight"]["storage"] == t["head.weight"]["storage"] == "weights/weight_1"
    assert t["<constants>/nonpersist"]["storage"].startswith("constants/")
    v = by_path(inspect_json(archives["views"]))
    assert v["a"]["storage"] == v["b"]["storage"]
    assert (v["a"]["storage_offset"], v["b"]["storage_offset"]) == (4, 12)
    assert v["wt"]["stride"] == [1, 4]


def test_signature_symbols_and_ranges(archives):
    ep = load(archives["tied"])
    m = inspect_json(archives["tied"])["pt2"]["models"][0]
    assert m["name"] == "model" and m["key_prefix"] == ""
    assert m["schema_version"]["major"] == 8
    users = [i for i in m["inputs"] if i["role"] == "user_input"]
    placeholders = {n.name: n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"}
    assert [u["name"] for u in users] == ["idx", "x"]
    for u in users:
        val = placeholders[u["name"]]
        assert u["shape"] == [int(s) if isinstance(s, int) else str(s) for s in val.shape]
        assert u["dtype"] == str(val.dtype).removeprefix("torch.")
    roles = {(i["role"], i.get("target"), i.get("persistent")) for i in m["inputs"] if i["role"] != "user_input"}
    expect = set()
    for s in ep.graph_signature.input_specs:
        kind = s.kind.name
        if kind == "PARAMETER":
            expect.add(("parameter", s.target, None))
        elif kind == "BUFFER":
            expect.add(("buffer", s.target, s.persistent))
        elif kind == "CONSTANT_TENSOR":
            expect.add(("tensor_constant", s.target, None))
    assert roles == expect
    ranges = {r["symbol"]: r for r in m["ranges"]}
    assert set(ranges) == {str(s) for s in ep.range_constraints}
    for sym, vr in ep.range_constraints.items():
        r = ranges[str(sym)]
        assert r["min"] == int(vr.lower)
        assert r["max"] == (None if not vr.upper.is_finite else int(vr.upper))
        assert r["text"] == f"{sym} \u2208 [{int(vr.lower)}, {int(vr.upper)}]"
    assert m["call"]["forward_arg_names"] == ["idx", "x"]
    assert m["call"]["signature"] == "((idx, x), {}) -> (add_1, {'logits': add_2})"


def test_symbolic_expressions_and_unbounded_range(archives):
    ep = load(archives["sym"])
    m = inspect_json(archives["sym"], "--graph")["pt2"]["models"][0]
    ranges = {r["symbol"]: r for r in m["ranges"]}
    unbounded = [r for r in ranges.values() if r["max"] is None]
    assert len(unbounded) == 1 and unbounded[0]["text"].endswith("\u221e]")
    # Every node's outputs: the loaded graph's metadata, as sympy prints it.
    nodes = {n["name"]: n for n in m["graph"]}
    checked = 0
    for n in ep.graph.nodes:
        if n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor):
            continue
        got = nodes[n.name]["outputs"][0]
        assert [str(s) for s in got["shape"]] == [str(s) for s in n.meta["val"].shape], n.name
        assert got["dtype"] == str(n.meta["val"].dtype).removeprefix("torch."), n.name
        checked += 1
    assert checked >= 2
    shapes = {n["name"]: n["outputs"][0].get("shape") for n in m["graph"]}
    assert any(s and s[0] == "2*" + users_symbol(m, "x") for s in shapes.values())
    assert any(s and s[0] == users_symbol(m, "y") + " - 1" for s in shapes.values())


def users_symbol(m, name):
    return next(i for i in m["inputs"] if i.get("name") == name)["shape"][0]


def test_text_report(archives):
    rc, out, err = run_ckptool("inspect", archives["tied"])
    assert rc == 0, err
    assert "pt2" in out.splitlines()[0]
    assert re.search(r"s\d+ \u2208 \[2, 64\]", out)
    assert "call: forward((idx, x), {}) -> (add_1, {'logits': add_2})" in out
    assert "shares storage weights/weight_1 (2 tensors)" in out
    assert "extra file: note.txt" in out
    rc, out, err = run_ckptool("inspect", "--graph", archives["tied"])
    assert rc == 0, err
    assert "torch.ops.aten.embedding.default" in out and "in emb (torch.nn.modules.sparse.Embedding)" in out
    rc, _, err = run_ckptool("inspect", "--graph", archives["tied"].with_suffix(".missing"))
    assert rc != 0


def test_multi_model_keys(archives):
    doc = inspect_json(archives["multi"])
    from torch.export.pt2_archive._package import load_pt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        contents = load_pt2(str(archives["multi"]))
    expect = {}
    for name, ep in contents.exported_programs.items():
        expect.update(expected_tensors(ep, name + "/"))
    tensors = by_path(doc)
    assert set(tensors) == set(expect)
    for k, ref in expect.items():
        assert tensors[k]["shape"] == list(ref.shape)
    assert {m["name"]: m["key_prefix"] for m in doc["pt2"]["models"]} == {"encoder": "encoder/", "decoder": "decoder/"}
    # Weights are deduplicated within a model only: the shared Linear is stored twice.
    assert tensors["encoder/0.weight"]["storage"] != tensors["decoder/0.weight"]["storage"]


def test_meta_export_has_no_data_and_no_sharing(archives):
    doc = inspect_json(archives["meta"])
    assert doc["storages"] == []
    for t in doc["tensors"]:
        assert t["storage"] is None and t["device"] == "meta"
    ep = load(archives["meta"])
    assert [t["path"][0] for t in doc["tensors"]] == list(ep.state_dict)
    rc, out, err = run_ckptool("materialize", archives["meta"], "--device", "meta")
    assert rc == 0, err


def test_compiled_submodule_names(archives):
    ep = load(archives["compiled"])
    doc = inspect_json(archives["compiled"])
    assert any("_orig_mod." in k for k in ep.state_dict)
    assert doc["wrappers"].get("_orig_mod.") == sum("_orig_mod." in k for k in ep.state_dict)


def test_pickled_subclass_listed_not_read(archives, tmp_path):
    """A tensor subclass is saved as a whole torch.save archive (use_pickle): listed with its
    file, never read; materialize refuses rather than return the state dict without it."""
    m = inspect_json(archives["subclass"])["pt2"]["models"][0]
    assert [(o["fqn"], o["config"], o["what"]) for o in m["opaque"]] == [("p", "weights", "pickled tensor (use_pickle)")]
    assert [t["path"] for t in inspect_json(archives["subclass"])["tensors"]] == [["q"]]
    rc, out, err = run_ckptool("materialize", archives["subclass"], "--device", "cpu", "-o", tmp_path / "o.pt")
    assert rc == 3 and "'p' is a pickled tensor" in err, err
    assert not (tmp_path / "o.pt").exists()
    rc, out, err = run_ckptool("verify", archives["subclass"])
    assert rc == 0 and "1 pickled entry" in out, out + err


# ---------------------------------------------------------------------------------------
# materialize and verify


@pytest.mark.parametrize("name", ["tied", "views", "sym", "multi", "compiled"])
@pytest.mark.parametrize("mode", [[], ["--mmap"]])
def test_materialize_bit_for_bit(archives, tmp_path, name, mode):
    path = archives[name]
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", path, "--device", "cpu", *mode, "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    if name == "multi":
        from torch.export.pt2_archive._package import load_pt2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expect = {}
            for m, ep in load_pt2(str(path)).exported_programs.items():
                expect.update(expected_tensors(ep, m + "/"))
    else:
        expect = expected_tensors(load(path))
    assert list(got) == list(expect)
    for k, ref in expect.items():
        g = got[k]
        assert g.dtype == ref.dtype and g.shape == ref.shape and g.stride() == ref.stride(), k
        assert torch.equal(g.view(torch.uint8) if g.dim() and g.is_contiguous() else g, ref.view(torch.uint8)
                           if g.dim() and g.is_contiguous() else ref), k
        assert isinstance(g, nn.Parameter) == isinstance(ref, nn.Parameter), k
    if name == "tied":
        assert got["emb.weight"].untyped_storage().data_ptr() == got["head.weight"].untyped_storage().data_ptr()
    if name == "views":
        assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()


def test_materialize_dtype(archives, tmp_path):
    out = tmp_path / "bf16.pt"
    rc, _, err = run_ckptool("materialize", archives["tied"], "--device", "cpu", "--dtype", "bfloat16", "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    for k, ref in expected_tensors(load(archives["tied"])).items():
        want = ref.detach().to(torch.bfloat16) if ref.is_floating_point() else ref
        assert torch.equal(got[k], want), k
    assert got["emb.weight"].untyped_storage().data_ptr() == got["head.weight"].untyped_storage().data_ptr()


@pytest.mark.parametrize("name", ["tied", "views", "sym", "multi", "meta", "compiled"])
def test_verify_ok(archives, name):
    rc, out, err = run_ckptool("verify", "--json", archives[name])
    assert rc == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] and doc["format"] == "pt2"


# ---------------------------------------------------------------------------------------
# corrupt archives


def rewrite(src: Path, dst: Path, edit) -> None:
    """Copies the archive record by record (stored, as torch writes it), letting `edit`
    change a record's bytes (or drop it by returning None)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = edit(info.filename[len(root) + 1:], zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename.replace(root + "/", dst.stem + "/", 1), data)


def edit_config(field_edit):
    def edit(record, data):
        if record != "data/weights/model_weights_config.json":
            return data
        cfg = json.loads(data)
        field_edit(cfg["config"]["fc.weight"])
        return json.dumps(cfg).encode()
    return edit


def set_meta(key, value):
    return edit_config(lambda e: e["tensor_meta"].__setitem__(key, value))


CORRUPT = {
    "past_record": (set_meta("storage_offset", {"as_int": 1000}), "model_weights_config.json", "fc.weight"),
    "dtype_enum": (set_meta("dtype", 99), "model_weights_config.json", "dtype 99"),
    "missing_file": (edit_config(lambda e: e.__setitem__("path_name", "weight_99")), "weight_99", "fc.weight"),
    "size_mismatch": (set_meta("sizes", [{"as_int": 30}, {"as_int": 4}]), "model_weights_config.json", "fc.weight"),
    "unknown_tag": (set_meta("storage_offset", {"as_bogus": 0}), "model_weights_config.json", "as_bogus"),
    "unknown_spec": (lambda r, d: d.replace(b'{"parameter": {"arg"', b'{"parametre": {"arg"', 1)
                     if r == "models/model.json" else d, "models/model.json", "parametre"),
    "symbolic_weight": (set_meta("sizes", [{"as_expr": {"expr_str": "Symbol('s0')", "hint": None}}, {"as_int": 4}]),
                        "model_weights_config.json", "symbolic size"),
    "archive_version": (lambda r, d: b"1" if r == "archive_version" else d, "archive_version", "'1'"),
}


def test_rewritten_twin_loads(archives, tmp_path):
    twin = tmp_path / "twin.pt2"
    rewrite(archives["tied"], twin, lambda r, d: d)
    assert list(load(twin).state_dict) == list(load(archives["tied"]).state_dict)
    assert inspect_json(twin)["tensors"] == inspect_json(archives["tied"])["tensors"]
    rc, out, err = run_ckptool("verify", twin)
    assert rc == 0, out + err


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_refused(archives, tmp_path, case):
    edit, record, detail = CORRUPT[case]
    bad = tmp_path / f"{case}.pt2"
    rewrite(archives["tied"], bad, edit)
    for verb in (["inspect"], ["materialize", "--device", "cpu"]):
        rc, out, err = run_ckptool(*verb, bad)
        assert rc == 3, (verb, rc, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert str(bad) in lines[0] and record in lines[0] and detail in lines[0], lines[0]


def edit_program(program_edit):
    def edit(record, data):
        if record != "models/model.json":
            return data
        doc = json.loads(data)
        program_edit(doc)
        return json.dumps(doc).encode()
    return edit


def test_materialize_reads_no_graph_node_but_checks_the_json(archives, tmp_path):
    """materialize needs the signature alone: a graph node it cannot read does not stop
    the weights (verify and inspect refuse it), but the program must still be JSON."""
    unknown = tmp_path / "unknown_node.pt2"
    rewrite(archives["tied"], unknown,
            edit_program(lambda d: d["graph_module"]["graph"]["nodes"][0]["outputs"].__setitem__(0, {"as_bogus": 1})))
    rc, out, err = run_ckptool("inspect", unknown)
    assert rc == 3 and "nodes[0]" in err and "unknown Argument variant 'as_bogus'" in err, (rc, out, err)
    rc, out, err = run_ckptool("verify", unknown)
    assert rc == 1 and "FAILED" in out and "unknown Argument variant 'as_bogus'" in out, (rc, out, err)
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", unknown, "--device", "cpu", "-o", out)
    assert rc == 0, err
    got = torch.load(out, weights_only=True)
    expect = expected_tensors(load(archives["tied"]))
    assert list(got) == list(expect) and all(torch.equal(got[k], v) for k, v in expect.items())

    broken = tmp_path / "broken_node.pt2"
    rewrite(archives["tied"], broken,
            lambda r, d: d.replace(b'"nodes": [', b'"nodes": [,', 1) if r == "models/model.json" else d)
    for verb in (["inspect"], ["materialize", "--device", "cpu"]):
        rc, out, err = run_ckptool(*verb, broken)
        assert rc == 3 and "not valid JSON" in err and "models/model.json" in err, (verb, rc, out, err)
    rc, out, err = run_ckptool("verify", broken)
    assert rc == 1 and "not valid JSON" in out, (rc, out, err)
