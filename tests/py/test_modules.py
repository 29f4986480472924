"""ckptool's own shared objects: the executable, libckpt_core.so, libckpt_torch.so and the
two modules it opens on demand (libckptool_torch.so, libckptool_torch_cuda.so).

Checked here: the library code exists once in a process (each ckpt symbol is defined in
exactly one file, so no module carries a private copy of the core with its own globals),
metadata-only commands never load LibTorch, and a module from another build is refused by
its build id (a hash of the shared headers) instead of being called with mismatched structs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from conftest import CKPTOOL, run_ckptool

BUILD = CKPTOOL.parent
PER_MODULE = {"ckptool_module_build_id"}  # each module answers for itself, by design


def _files():
    return [BUILD / "ckptool"] + sorted(BUILD.glob("lib*.so"))


def _defined(path: Path, dynamic: bool) -> set[str]:
    args = ["nm", "--defined-only", "-C"] + (["-D"] if dynamic else []) + [str(path)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(" ", 2)
        # Strong definitions only: weak ones (W, V, u) are inline and template code that every
        # user may instantiate and the dynamic linker merges.
        if len(parts) == 3 and parts[1] in "TDBR":
            names.add(parts[2])
    return names


def test_library_code_is_defined_once():
    assert (BUILD / "libckpt_core.so").exists() and (BUILD / "libckpt_torch.so").exists()
    where = defaultdict(list)
    for f in _files():
        for name in _defined(f, dynamic=True):
            if ("ckpt::" in name or name.startswith("ckptool_")) and name not in PER_MODULE:
                where[name].append(f.name)
    twice = {n: fs for n, fs in where.items() if len(fs) > 1}
    assert not twice, sorted(twice.items())[:10]
    # The executable compiles in no library code of its own: the parsers are libckpt_core's.
    in_exe = {n for n in _defined(BUILD / "ckptool", dynamic=False) if "ckpt::zip::" in n or "ckpt::pickle::" in n}
    assert not in_exe, sorted(in_exe)[:10]
    # And the modules hold only their entry points and (for CUDA) the CUDA loader.
    plugin = {n for n in _defined(BUILD / "libckptool_torch.so", dynamic=True) if "ckpt" in n}
    assert plugin == {"ckptool_torch_plugin", "ckptool_module_build_id"}, plugin


def test_metadata_commands_do_not_load_libtorch(tmp_path):
    ckpt = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4.0)}, ckpt)
    log = tmp_path / "ld"
    rc, _, se = run_ckptool("inspect", ckpt, env={"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(log)})
    assert rc == 0, se
    loaded = set()
    for f in tmp_path.glob("ld.*"):
        loaded |= {Path(n).name for n in re.findall(r"file=(\S+?\.so[.\d]*)", f.read_text(errors="replace"))}
    assert "libckpt_core.so" in loaded
    assert not {"libckpt_torch.so", "libckptool_torch.so", "libtorch_cpu.so"} & loaded, sorted(loaded)


def _copy_build(tmp_path: Path) -> Path:
    out = tmp_path / "bin"
    out.mkdir()
    for f in _files():
        shutil.copy2(f, out / f.name)
    return out


def test_module_of_another_build_is_refused(tmp_path):
    ckpt = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4.0)}, ckpt)
    header = (BUILD / "generated" / "ckpt" / "build_id.h").read_text()
    build_id = re.search(r'CKPTOOL_BUILD_ID "([0-9a-f]+)"', header).group(1).encode()
    other = _copy_build(tmp_path)
    plugin = other / "libckptool_torch.so"
    data = plugin.read_bytes()
    assert data.count(build_id) == 1
    plugin.write_bytes(data.replace(build_id, b"0" * len(build_id)))
    rc, out, err = run_ckptool("materialize", ckpt, "--device", "cpu", env={"CKPTOOL_TORCH_PLUGIN": str(plugin)})
    assert rc == 3 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and "was built for another ckptool (build 0000000000000000" in err, err
    # The untouched copy next to it is accepted: the copy itself is not what is refused.
    rc, out, err = run_ckptool("materialize", ckpt, "--device", "cpu",
                               env={"CKPTOOL_TORCH_PLUGIN": str(BUILD / "libckptool_torch.so")})
    assert rc == 0, err


def test_copied_build_runs_from_its_own_directory(tmp_path):
    """The executable and its libraries find each other next to themselves ($ORIGIN), so a
    build directory or an install can be moved as a whole."""
    ckpt = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4.0)}, ckpt)
    other = _copy_build(tmp_path)
    r = subprocess.run([str(other / "ckptool"), "materialize", str(ckpt), "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_installed_tree_runs(tmp_path):
    """`cmake --install` puts the libraries in <prefix>/lib/ckptool and the executable finds
    them there (RUNPATH $ORIGIN/../lib/ckptool), LibTorch modules included."""
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    ckpt = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4.0)}, ckpt)
    env = {k: v for k, v in os.environ.items() if k not in ("CKPTOOL_TORCH_PLUGIN", "LD_LIBRARY_PATH")}
    r = subprocess.run([str(prefix / "bin" / "ckptool"), "materialize", str(ckpt), "--device", "cpu"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
