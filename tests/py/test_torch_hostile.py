"""Hostile-user cases of issue 11 on the LibTorch side: TorchScript files whose code runs
on load (item 11), --check-finite on broadcast views (13) and on meta (16), a checkpoint
truncated while mapped (8), and the messages of --run, out of memory and a missing plugin
(18). Every case here failed on the code before the fix.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Tuple

import pytest
import torch
from torch import nn

from conftest import CKPTOOL, TIME_SCALE, run_ckptool

HOSTILE_SECONDS = 1.0 * TIME_SCALE  # a refusal must be this quick


def timed(*args, timeout: float = 10, env=None):
    t0 = time.monotonic()
    try:
        rc, out, err = run_ckptool(*args, timeout=timeout * TIME_SCALE, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptool {' '.join(map(str, args))}: still running after {timeout} s")
    return rc, out, err, time.monotonic() - t0


def one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err[:1000]!r}"
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- item 11: code on load

State = Tuple[torch.Tensor, int, bool]


class Benign(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.n = 1

    def forward(self, x):
        return x * self.w + self.n

    @torch.jit.export
    def __getstate__(self) -> State:
        return (self.w, self.n, self.training)

    @torch.jit.export
    def __setstate__(self, state: State) -> None:
        print("SETSTATE-RAN")  # TorchScript's print writes to stdout: proof that it ran
        self.w = state[0]
        self.n = state[1] + 1
        self.training = state[2]


class Spin(Benign):
    @torch.jit.export
    def __setstate__(self, state: State) -> None:
        i = 0
        while i >= 0:  # the compiler cannot see that this never ends
            i = (i + 1) % 7
        self.w = state[0]
        self.n = state[1]
        self.training = state[2]


class Hog(Benign):
    @torch.jit.export
    def __setstate__(self, state: State) -> None:
        self.w = state[0]
        self.n = int(torch.ones(1 << 30, dtype=torch.float64).sum().item())  # 8 GiB
        self.training = state[2]


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, n: int = 3):
        return self.lin(x) + n


# A default value that calls the file's own function: LibTorch's compiler evaluates
# defaults by running them (ir_emitter.cpp evaluateDefaults) while it loads the file.
CALLING_DEFAULT = '''class Plain(Module):
  __parameters__ = []
  __buffers__ = []
  training : bool
  _is_full_backward_hook : Optional[bool]
  lin : {LIN}
  def forward(self: {Q}.Plain,
    x: Tensor,
    n: int={Q}.side()) -> Tensor:
    lin = self.lin
    return torch.add((lin).forward(x, ), n)
def side() -> int:
  i = 0
  while i >= 0:
    i = (i + 1) % 7
  return 3
'''


# No code of the file runs, but LibTorch's compiler folds built-in operations on constants
# while loading: this makes it build a 600 MB string (17 s and 1.9 GB peak unbounded).
FOLDING_BOMB = '''class Plain(Module):
  __parameters__ = []
  __buffers__ = []
  training : bool
  _is_full_backward_hook : Optional[bool]
  lin : {LIN}
  def forward(self: {Q}.Plain,
    x: Tensor,
    n: int=3) -> Tensor:
    lin = self.lin
    return torch.add((lin).forward(x, ), len("ab".ljust(600000000)))
'''


def _rewrite_code(src: Path, dst: Path, text: str) -> Path:
    """`src` with the code record that defines Plain replaced by `text`, whose {Q} is that
    record's qualified name ("__torch__.test_torch_hostile")."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(".debug_pkl"):
                continue
            if "/code/" in info.filename and b"class Plain(" in data:
                q = info.filename.split("/code/", 1)[1][:-len(".py")].replace("/", ".")
                # Linear's qualified name is mangled when another module of this process
                # scripted nn.Linear first: keep the one this file was saved with.
                lin = re.search(rb"lin : (\S+)", data)
                data = text.replace("{Q}", q).replace("{LIN}", lin.group(1).decode() if lin else "").encode()
            zout.writestr(info.filename, data)
    return dst


@pytest.fixture(scope="module")
def code_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("code_on_load")
    out = {}
    for name, cls in (("benign", Benign), ("spin", Spin), ("hog", Hog), ("plain", Plain)):
        torch.manual_seed(0)
        m = cls()
        torch.jit.save(torch.jit.script(m), str(d / f"{name}.pt"))
        out[name] = d / f"{name}.pt"
    out["default"] = _rewrite_code(out["plain"], d / "default.pt", CALLING_DEFAULT)
    out["folding"] = _rewrite_code(out["plain"], d / "folding.pt", FOLDING_BOMB)
    torch.manual_seed(0)
    torch.save(Benign().state_dict(), d / "weights.pt")
    out["weights"] = d / "weights.pt"
    return out


@pytest.mark.parametrize("name", ["benign", "spin", "hog"])
def test_inspect_refuses_setstate(code_files, name):
    rc, out, err, secs = timed("inspect", code_files[name], timeout=5)
    line = one_line(err)
    assert rc == 3, (rc, err)
    assert "ckptool: unsafe:" in line and "__setstate__" in line and "code/__torch__/" in line, line
    assert "--allow-code" in line and ("." + type_name(name) + " defines __setstate__") in line, line
    assert secs < HOSTILE_SECONDS, f"{secs:.2f} s"
    assert out == "" and "SETSTATE-RAN" not in err


def type_name(name: str) -> str:
    return {"benign": "Benign", "spin": "Spin", "hog": "Hog"}[name]


def test_inspect_refuses_evaluated_default(code_files):
    rc, _, err, secs = timed("inspect", code_files["default"], timeout=5)
    line = one_line(err)
    assert rc == 3 and "Plain.forward: the default of parameter 'n'" in line, (rc, line)
    assert secs < HOSTILE_SECONDS


def test_verify_reports_code_on_load(code_files):
    for name in ("spin", "default"):
        rc, out, err, _ = timed("verify", code_files[name], timeout=5)
        assert rc == 1, (name, rc, out, err)
        assert "FAILED" in out and "code runs on load" in out, out
    rc, out, _, _ = timed("verify", code_files["plain"], timeout=10)
    assert rc == 0 and "OK" in out


def test_materialize_model_refused(code_files, tmp_path):
    rc, out, err, secs = timed("materialize", code_files["weights"], "--model", code_files["benign"],
                               "-o", tmp_path / "out.pt", timeout=5)
    assert rc == 3 and "SETSTATE-RAN" not in out + err, (rc, out, err)
    rc, _, err, secs = timed("materialize", code_files["weights"], "--model", code_files["spin"],
                             "-o", tmp_path / "out.pt", timeout=5)
    line = one_line(err)
    assert rc == 3 and "__setstate__" in line and str(code_files["spin"]) in line, (rc, line)
    assert secs < HOSTILE_SECONDS
    assert list(tmp_path.iterdir()) == []


def test_rekey_match_refused(code_files, tmp_path):
    rc, _, err, secs = timed("rekey", code_files["weights"], "-o", tmp_path / "out.pt",
                             "--match", code_files["spin"], timeout=5)
    line = one_line(err)
    assert rc == 3 and "__setstate__" in line, (rc, line)
    assert secs < HOSTILE_SECONDS
    assert list(tmp_path.iterdir()) == []


def test_allow_code_runs_benign_setstate(code_files):
    rc, out, err, _ = timed("inspect", "--allow-code", code_files["benign"], timeout=30)
    assert rc == 0, err
    assert "__torch__.test_torch_hostile.Benign" in out
    assert "SETSTATE-RAN" in out  # the fixture does run when allowed: its refusal above means something


def test_allow_code_is_bounded_in_time(code_files):
    rc, out, err, secs = timed("inspect", "--allow-code", "--load-timeout", "0.5", code_files["spin"], timeout=10)
    line = one_line(err)
    assert rc == 3 and "ran longer than 0.5 s" in line, (rc, line)
    assert secs < 5 * TIME_SCALE, f"{secs:.2f} s"
    rc, _, err, _ = timed("materialize", code_files["weights"], "--model", code_files["spin"], "--allow-code",
                          "--load-timeout", "0.5", timeout=10)
    assert rc == 3 and "ran longer than" in one_line(err)


def test_constant_folding_is_bounded_without_code(code_files):
    # verify has nothing to say about it (no code of the file runs); the load is bounded.
    rc, out, err, secs = timed("inspect", "--load-timeout", "0.5", code_files["folding"], timeout=10)
    line = one_line(err)
    assert rc == 3 and "ran longer than 0.5 s" in line, (rc, line)
    assert secs < 5 * TIME_SCALE, f"{secs:.2f} s"


def test_plain_torchscript_unaffected(code_files):
    rc, out, err, _ = timed("inspect", code_files["plain"], timeout=30)
    assert rc == 0, err
    assert "forward" in out


# ---------------------------------------------------------------- items 13, 16: --check-finite

@pytest.fixture(scope="module")
def finite_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("finite")
    big = (1 << 20, 1 << 20)  # 2^40 elements: 4 TiB as a dense float32 tensor
    one = torch.tensor([0.5])
    nan = torch.tensor([float("nan")])
    mixed = torch.tensor([1.0, float("nan"), 3.0, 4.0, 5.0, 6.0])
    sd = {
        "broadcast": one.expand(*big),
        "row": torch.arange(4.0).expand(1 << 30, 4),
        "every_other": mixed[::2],            # 1, 3, 5: its storage holds a NaN, it does not
        "overlapping": mixed.as_strided((3, 2), (1, 1), 2),  # 3..6, some twice
    }
    torch.save(sd, d / "finite.pt")
    torch.save({"broadcast_nan": nan.expand(*big), "ok": one.expand(7),
                "overlapping_nan": mixed.as_strided((3, 3), (1, 1), 0),
                "tail": mixed[1:2]}, d / "nan.pt")
    return d


def test_check_finite_broadcast_is_storage_sized(finite_files):
    rc, out, err, secs = timed("materialize", finite_files / "finite.pt", "--check-finite", timeout=20)
    assert rc == 0, (rc, err)
    assert "all floating tensors are finite" in out
    assert secs < 5 * TIME_SCALE


def test_check_finite_names_exactly_the_views_with_nan(finite_files):
    rc, out, err, _ = timed("materialize", finite_files / "nan.pt", "--check-finite", "--json", timeout=20)
    assert rc == 1, (rc, err)
    import json
    assert sorted(json.loads(out)["non_finite"]) == ["broadcast_nan", "overlapping_nan", "tail"]


def test_check_finite_on_meta_refused(finite_files):
    rc, out, err, _ = timed("materialize", finite_files / "nan.pt", "--device", "meta", "--check-finite", timeout=20)
    line = one_line(err)
    assert rc == 2 and "meta" in line and "check-finite" in line, (rc, line)
    assert "finite" not in out


# ---------------------------------------------------------------- item 8: SIGBUS

def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("extra", [["--check-finite"], ["--dtype", "bfloat16"], ["-o", "OUT"]])
def test_truncated_while_mapped(tmp_path, extra):
    # -o reads the mapped pages while its temporary file is open: the SIGBUS exit removes it.
    extra = [str(tmp_path / "out.pt") if a == "OUT" else a for a in extra]
    path = tmp_path / "big.pt"
    torch.save({"w": torch.ones(4 << 20)}, path)  # 16 MiB of data
    env = dict(os.environ, CKPTOOL_TEST_STOP_AFTER_MAP="1", ASAN_OPTIONS="detect_leaks=0:handle_sigbus=0")
    p = subprocess.Popen([str(CKPTOOL), "materialize", str(path), "--mmap", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20 * TIME_SCALE
        while p.poll() is None and _state(p.pid) != "T":
            assert time.monotonic() < deadline, "never reached the mapped state"
            time.sleep(0.01)
        assert p.poll() is None, "ckptool did not stop once the file was mapped (no test hook)"
        with open(path, "r+b") as f:
            f.truncate(4096)
        os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=20 * TIME_SCALE)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err.decode()
    assert p.returncode == 4, (p.returncode, err)
    line = one_line(err)
    assert line.startswith("ckptool: io: ") and str(path) in line and "changed size while mapped" in line, line
    assert sorted(x.name for x in tmp_path.iterdir()) == ["big.pt"], "an output or temporary file was left"


# ---------------------------------------------------------------- item 18: messages

class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)

    def forward(self, x):
        return self.emb(x)

    @torch.jit.export
    def huge(self, x):
        return x.new_zeros(1 << 45)


@pytest.fixture(scope="module")
def embed_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")
    m = Embed()
    torch.jit.save(torch.jit.script(m), str(d / "model.pt"))
    torch.save(m.state_dict(), d / "weights.pt")
    return d


def test_run_wrong_input_dtype_is_one_usage_line(embed_files):
    rc, _, err, _ = timed("materialize", embed_files / "weights.pt", "--model", embed_files / "model.pt",
                          "--run", "forward", "--input", "4:float32", timeout=30)
    line = one_line(err)
    assert rc == 2 and line.startswith("ckptool: usage: ") and "--run forward failed" in line, (rc, line)
    assert "Traceback" not in line


def test_run_out_of_memory_is_exit_4(embed_files):
    # AddressSanitizer aborts on an impossible allocation unless told to fail it as the
    # real allocator does.
    asan = os.environ.get("ASAN_OPTIONS", "detect_leaks=0") + ":allocator_may_return_null=1"
    rc, _, err, _ = timed("materialize", embed_files / "weights.pt", "--model", embed_files / "model.pt",
                          "--run", "huge", "--input", "2:int64", timeout=30, env={"ASAN_OPTIONS": asan})
    err = "".join(l for l in err.splitlines(True) if "WARNING: AddressSanitizer failed to allocate" not in l)
    line = one_line(err)
    assert rc == 4 and "out of memory" in line, (rc, line)


def test_missing_plugin_named(embed_files, tmp_path):
    missing = tmp_path / "no-such-plugin.so"
    rc, _, err, _ = timed("materialize", embed_files / "weights.pt", timeout=10,
                          env={"CKPTOOL_TORCH_PLUGIN": str(missing)})
    line = one_line(err)
    assert rc == 4 and f"CKPTOOL_TORCH_PLUGIN={missing}" in line and "No such file" in line, (rc, line)
