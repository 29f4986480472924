"""TorchScript modules built on the meta device (src/torch/torchscript.cpp), compared with
what the real torch.jit.load reports for the same files.

Drives tests/tools_torch/ts_inspect.cpp ($CKPTOOL_BUILD_DIR/tests/ts_inspect), which
prints ckpt::inspect_torchscript / ckpt::run_on_meta results as JSON.
"""

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

BUILD_DIR = os.environ.get("CKPTOOL_BUILD_DIR")
TOOL = Path(BUILD_DIR) / "tests" / "ts_inspect" if BUILD_DIR else None

pytestmark = [
    pytest.mark.skipif(TOOL is None, reason="CKPTOOL_BUILD_DIR not set (run through ctest)"),
    # torch.jit.load is deprecated in favour of torch.export; scripting warns about style.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def run_tool(*args: str, expect_rc: int = 0) -> dict:
    assert TOOL is not None and TOOL.exists(), f"{TOOL} not built (ninja ts_inspect)"
    proc = subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == expect_rc, (
        f"ts_inspect {' '.join(map(str, args))}: rc {proc.returncode}, expected {expect_rc}\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    )
    return json.loads(proc.stdout)


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def spec(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) + ":" + dtype_name(t.dtype)


# --------------------------------------------------------------------------- modules


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    num_classes: int
    name: str
    scale: float
    labels: List[str]
    table: Dict[str, int]
    maybe: Optional[float]

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.act = nn.ReLU()  # parameter-free submodule
        self.head = nn.Linear(8, 10)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mask", torch.ones(10, dtype=torch.bool))
        self.register_buffer("codes", torch.arange(6, dtype=torch.int32).reshape(2, 3))
        self.num_classes = 10
        self.name = "net"
        self.scale = 0.5
        self.labels = ["a", "b"]
        self.table = {"x": 1}
        self.maybe = None

    def forward(self, x):
        y = self.act(self.blocks(self.stem(x)))
        y = y.mean(dim=(2, 3))
        return self.head(y) * self.scale

    @torch.jit.export
    def evaluation_step(self, x: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.forward(x)
        return logits, F.cross_entropy(logits, target)

    @torch.jit.export
    def features(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        y = self.stem(x)
        return {"stem": y, "pooled": y.mean(dim=(2, 3))}


class NoParams(nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y], dim=1).softmax(dim=-1), x.shape[0]


class HalfMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32).to(torch.bfloat16)
        self.b = nn.Linear(32, 4).to(torch.float16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).half())


class Traced(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.offset = torch.linspace(0, 1, 3)  # becomes a tensor constant (constants/)

    def forward(self, x):
        return self.fc(x) + self.offset, x.sum(dim=1)


class DataDependent(nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):
            return x * 2
        return x


class Big(nn.Module):
    def __init__(self, n: int = 4, d: int = 512):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Dict[str, Path]:
    d = tmp_path_factory.mktemp("ts")
    torch.manual_seed(0)
    out: Dict[str, Path] = {}

    def save(name: str, module) -> None:
        path = d / f"{name}.pt"
        torch.jit.save(module, str(path))
        out[name] = path

    save("net", torch.jit.script(Net().eval()))
    save("net_train", torch.jit.script(Net().train()))
    save("noparams", torch.jit.script(NoParams()))
    save("half", torch.jit.script(HalfMLP()))
    save("traced", torch.jit.trace(Traced(), torch.randn(2, 5)))
    save("datadep", torch.jit.script(DataDependent()))
    save("big", torch.jit.script(Big()))  # 4 MiB of float32 weights
    sd = d / "state_dict.pt"
    torch.save(Net().state_dict(), sd)
    out["state_dict"] = sd
    return out


def reference(path: Path) -> dict:
    m = torch.jit.load(str(path))
    return {
        "type": m._c._type().qualified_name(),
        "training": m.training,
        "parameters": [
            {"name": n, "dtype": dtype_name(p.dtype), "shape": list(p.shape)} for n, p in m.named_parameters()
        ],
        "buffers": [
            {"name": n, "dtype": dtype_name(b.dtype), "shape": list(b.shape)} for n, b in m.named_buffers()
        ],
        "methods": [{"name": n, "schema": str(getattr(m, n).schema)} for n in m._c._method_names()],
        "submodules": [{"name": n, "type": s._c._type().qualified_name()} for n, s in m.named_modules() if n],
    }


# --------------------------------------------------------------------------- inspect


@pytest.mark.parametrize("name", ["net", "net_train", "noparams", "half", "traced", "datadep", "big"])
def test_matches_torch_jit_load(files, name):
    got = run_tool(files[name])
    want = reference(files[name])
    for key in ("type", "training", "parameters", "buffers", "submodules"):
        assert got[key] == want[key], key
    assert sorted(got["methods"], key=lambda m: m["name"]) == sorted(want["methods"], key=lambda m: m["name"])


def test_net_details(files):
    got = run_tool(files["net"])
    methods = {m["name"]: m["schema"] for m in got["methods"]}
    assert got["type"].endswith(".Net")
    assert methods["forward"] == f"forward({got['type']} self, Tensor x) -> Tensor"
    assert "evaluation_step" in methods and "features" in methods
    bufs = {b["name"]: b for b in got["buffers"]}
    assert bufs["step"] == {"name": "step", "dtype": "int64", "shape": []}
    assert bufs["mask"]["dtype"] == "bool"
    assert bufs["codes"] == {"name": "codes", "dtype": "int32", "shape": [2, 3]}
    assert bufs["blocks.1.bn.num_batches_tracked"]["dtype"] == "int64"
    subs = {s["name"]: s["type"] for s in got["submodules"]}
    assert subs["act"] == "__torch__.torch.nn.modules.activation.ReLU"
    assert subs["blocks.0.bn"] == "__torch__.torch.nn.modules.batchnorm.BatchNorm2d"
    attrs = {a["name"]: a for a in got["attributes"]}
    assert attrs["num_classes"] == {"name": "num_classes", "type": "int", "value": "10", "constant": False}
    assert attrs["name"]["value"] == "'net'"
    assert attrs["scale"]["value"] == "0.5"
    assert attrs["labels"]["type"] == "List[str]" and attrs["labels"]["value"] == "['a', 'b']"
    assert attrs["table"]["value"] == "{'x': 1}"
    assert attrs["maybe"]["type"] == "Optional[float]" and attrs["maybe"]["value"] == "None"
    # Class constants (__constants__ / Final) are listed too.
    assert attrs["blocks.0.bn.eps"] == {"name": "blocks.0.bn.eps", "type": "float", "value": "1e-05", "constant": True}
    assert attrs["stem.stride"]["value"] == "(1, 1)" and attrs["head.in_features"]["value"] == "8"
    assert "training" not in attrs and "step" not in attrs
    assert got["training"] is False


def test_reads_no_tensor_data(files):
    got = run_tool(files["big"])
    size = files["big"].stat().st_size
    assert size > 4 * 2**20
    assert got["bytes_read"] < size / 100, got["bytes_read"]
    assert got["bytes_skipped"] >= 4 * 512 * 512 * 4
    # What the process read overall (the tool's /proc/self/io delta) stays small as well;
    # plain torch::jit::load reads everything.
    assert got["process"]["rchar"] < size / 10, got["process"]
    plain = run_tool(files["big"], "--plain-load")
    assert plain["process"]["rchar"] >= 4 * 512 * 512 * 4


def test_not_torchscript(files, tmp_path):
    got = run_tool(files["state_dict"], expect_rc=3)
    assert got["error"] == "unsupported"
    assert "not a TorchScript archive" in got["message"]
    assert str(files["state_dict"]) in got["message"]


def test_broken_code_is_reported_on_one_line(files, tmp_path):
    # The same archive with its TorchScript source made invalid (rewritten with zipfile,
    # since code/ records are deflated): LibTorch fails to compile it, and the error is
    # one line naming the file.
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(files["noparams"]) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if "/code/" in info.filename and info.filename.endswith(".py"):
                data = data.replace(b"def forward(", b"dxf forward(", 1)
            zout.writestr(info.filename, data, compress_type=zipfile.ZIP_STORED)
    got = run_tool(bad, expect_rc=3)
    assert got["error"] in ("unsupported", "corrupt")
    assert "\n" not in got["message"] and str(bad) in got["message"]


# --------------------------------------------------------------------------- run on meta


def out_shapes(value, path=""):
    if isinstance(value, torch.Tensor):
        return [{"path": path, "dtype": dtype_name(value.dtype), "shape": list(value.shape)}]
    if isinstance(value, (tuple, list)):
        res = []
        for i, v in enumerate(value):
            res += out_shapes(v, f"{path}.{i}" if path else str(i))
        return res
    if isinstance(value, dict):
        res = []
        for k, v in value.items():
            res += out_shapes(v, f"{path}.{k}" if path else str(k))
        return res
    return [{"path": path, "value": repr(value)}]


def meta_shapes(outputs):
    res = []
    for o in outputs:
        if o["is_tensor"]:
            res.append({"path": o["path"], "dtype": o["dtype"], "shape": o["shape"]})
        else:
            res.append({"path": o["path"], "value": o["value"]})
    return res


@pytest.mark.parametrize(
    "name,method,inputs",
    [
        ("net", "forward", [torch.randn(2, 3, 16, 16)]),
        ("net_train", "forward", [torch.randn(4, 3, 8, 8)]),
        ("net", "evaluation_step", [torch.randn(2, 3, 16, 16), torch.tensor([1, 7])]),
        ("net", "features", [torch.randn(1, 3, 5, 7)]),
        ("half", "forward", [torch.randn(3, 16, dtype=torch.bfloat16)]),
        ("traced", "forward", [torch.randn(4, 5)]),
        ("big", "forward", [torch.randn(2, 512)]),
    ],
)
def test_run_on_meta_matches_cpu(files, name, method, inputs):
    m = torch.jit.load(str(files[name]))
    with torch.no_grad():
        want = out_shapes(getattr(m, method)(*[t.clone() for t in inputs]))
    got = run_tool(files[name], "--run", method, *[spec(t) for t in inputs])
    assert meta_shapes(got["outputs"]) == want


def test_run_non_tensor_output(files):
    got = run_tool(files["noparams"], "--run", "forward", "2x3:float32", "2x5:float32")
    outs = got["outputs"]
    assert outs[0] == {"path": "0", "is_tensor": True, "type": "Tensor", "dtype": "float32", "shape": [2, 8]}
    assert outs[1] == {"path": "1", "is_tensor": False, "type": "int", "value": "2"}


def test_run_errors(files):
    bad_shape = run_tool(files["net"], "--run", "forward", "2x5x16x16:float32", expect_rc=2)
    assert bad_shape["error"] == "usage" and "\n" not in bad_shape["message"]
    missing = run_tool(files["net"], "--run", "nope", "2x3x4x4:float32", expect_rc=2)
    assert "evaluation_step" in missing["message"]
    too_few = run_tool(files["net"], "--run", "evaluation_step", "2x3x4x4:float32", expect_rc=2)
    assert too_few["error"] == "usage"
    data_dep = run_tool(files["datadep"], "--run", "forward", "3:float32", expect_rc=3)
    assert data_dep["error"] == "unsupported", data_dep
    assert "\n" not in data_dep["message"]


# LibTorch's C++ library lacks meta kernels for many common operators (Python registers
# them in Python); src/torch/meta_kernels.cpp fills the gaps. Each case's output shapes
# must equal those of a real CPU run.
class Ops(nn.Module):
    def forward(self, x, y, g, t):
        return (
            F.relu(x), F.relu6(x), F.hardswish(x), F.prelu(x, torch.ones(4)),
            torch.logit(x.sigmoid(), 1e-6), x.flip([0, 2]), torch.roll(x, 1, 2),
            F.channel_shuffle(x, 2), x.isnan(), torch.floor_divide(x, y), torch.rsub(x, y),
            F.logsigmoid(x), F.adaptive_avg_pool2d(x, (3, 5)),
            F.adaptive_avg_pool3d(x.unsqueeze(0), (2, 3, 4)), F.pad(x, (1, 2, 2, 1), mode="reflect"),
            F.unfold(x, (2, 3), padding=1, stride=2), F.grid_sample(x, g, align_corners=False),
            x.var(dim=1), x.std(dim=(1, 2), keepdim=True), torch.var_mean(x, dim=-1), torch.std_mean(x),
            x.prod(), x.long().prod(), x.max(), x.min(), torch.dot(x.flatten(), y.flatten()),
            F.binary_cross_entropy(x.sigmoid(), y.sigmoid()),
            F.binary_cross_entropy(x.sigmoid(), y.sigmoid(), reduction="none"), F.huber_loss(x, y),
            F.cross_entropy(x, t), F.cross_entropy(x, t, reduction="none"),
            torch._weight_norm(x, y[:, :1, :1, :1], 0), torch.where(x > 0, x, y),
            F.embedding(t, y.flatten(0, 2)), torch.index_select(x, 1, t[0, 0, :2]),
            F.batch_norm(x, torch.zeros(4), torch.ones(4)), F.layer_norm(x, [8]), F.group_norm(x, 2),
            F.conv2d(x, y[:3, :, :3, :3], stride=2, padding=1, dilation=1, groups=1),
            F.conv_transpose2d(x, y.reshape(-1, 3, 4, 4)[:4], stride=2, output_padding=1),
            F.conv1d(x[0], y[0, :2, :3], groups=2), F.scaled_dot_product_attention(x, y, y),
        )


class Models(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.lstm = nn.LSTM(8, 6, batch_first=True)
        self.gru = nn.GRU(8, 6)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        a = self.enc(x)
        b, _ = self.lstm(x)
        c, _ = self.gru(x)
        d, w = self.mha(x, x, x)
        return a, b, c, d, w


@pytest.mark.parametrize("train", [False, True])
def test_meta_kernel_shims(tmp_path, train):
    inputs = [
        torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 5, 7, 2), torch.randint(0, 4, (2, 6, 8)),
    ]
    for module, args in ((Ops(), inputs), (Models(), [torch.randn(2, 3, 8)])):
        module.train(train)
        path = tmp_path / f"{type(module).__name__}.pt"
        torch.jit.save(torch.jit.script(module), str(path))
        m = torch.jit.load(str(path))
        with torch.no_grad():
            want = out_shapes(m(*[a.clone() for a in args]))
        got = run_tool(path, "--run", "forward", *[spec(a) for a in args])
        assert meta_shapes(got["outputs"]) == want


def test_overloaded_forward(tmp_path):
    # A scripted nn.LSTM keeps only forward__0 / forward__1 (overloads); "forward" picks the
    # one whose schema takes the given tensors.
    path = tmp_path / "lstm.pt"
    torch.jit.save(torch.jit.script(nn.LSTM(4, 6)), str(path))
    got = run_tool(path, "--run", "forward", "5x2x4:float32")
    assert [o["shape"] for o in got["outputs"]] == [[5, 2, 6], [1, 2, 6], [1, 2, 6]]
