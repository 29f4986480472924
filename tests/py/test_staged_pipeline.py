"""The CUDA loader's staging pipeline, proven on CPU: every reference fixture is loaded
through it (tests/tools/staged_load: CPU memory stands in for device memory, and a hostile
copy engine for CUDA: copies complete late, out of order, from another thread, and poison
the staging buffer once done), and every storage must equal, bit for bit, the storage of
the tensor torch.load / torch.jit.load / safetensors gives for the same path. Small staging
buffers (4 KiB, 2 or 3 of them) make records be cut and buffers be reused many times.
A failing copy must fail the load with one line naming the file; the deliberately broken
pipeline (buffers reused before their copies are done) must be caught."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import SOURCE_DIR
from reference import load_reference, resolve

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", SOURCE_DIR / "build"))
TOOL = BUILD_DIR / "tests" / "staged_load"

# Fixtures whose data torch can give back (the malicious one is never loaded; meta has no data).
SKIP = {"malicious", "meta"}


def staged(path: Path, out: Path, *flags) -> tuple[int, dict | None, str]:
    if not TOOL.exists():
        pytest.fail(f"{TOOL} not built")
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    p = subprocess.run([str(TOOL), str(path), str(out), *map(str, flags)], capture_output=True, timeout=300, env=env)
    doc = json.loads(p.stdout) if p.returncode == 0 else None
    return p.returncode, doc, p.stderr.decode("utf-8", "replace")


def unhex(h: str) -> str:
    return bytes.fromhex(h).decode("utf-8", "surrogatepass")


def path_of(p: list) -> list:
    return [unhex(step["hex"]) if isinstance(step, dict) else step for step in p]


def storage_bytes(t: torch.Tensor) -> bytes:
    return torch.tensor([], dtype=torch.uint8).set_(t.untyped_storage()).numpy().tobytes()


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def mismatches(fx, doc: dict, blob: bytes) -> list[str]:
    """Storages of `doc` (staged_load's output) that differ from the reference's."""
    assert doc["byteorder"] == "little", "big-endian data is byte-swapped after the pipeline"
    storages = doc["storages"]
    ours = [blob[s["at"]:s["at"] + s["nbytes"]] for s in storages]
    bad = []
    if fx.load == "safetensors":
        from safetensors.torch import load_file
        ref = load_file(str(fx.path))
        assert len(doc["tensors"]) == len(ref)
        for t in doc["tensors"]:
            if ours[t["storage"]] != tensor_bytes(ref[unhex(t["key"])]):
                bad.append(t["key"])
        return bad
    root = load_reference(fx)
    checked = 0
    for t in doc["tensors"]:
        try:
            want = resolve(root, path_of(t["path"]))
        except (KeyError, AttributeError, IndexError, RuntimeError):
            continue  # a record the loaded object does not expose under that path
        if not isinstance(want, torch.Tensor) or want.layout != torch.strided:
            continue
        checked += 1
        if ours[t["storage"]] != storage_bytes(want):
            bad.append(repr(path_of(t["path"])))
    assert checked > 0 or not doc["tensors"], f"{fx.name}: no tensor could be compared"
    return bad


def fixture_names():
    import fixtures as fxmod
    return [n for n in fxmod.BUILDERS if n not in SKIP]


@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_lands_bit_for_bit(name, fixture_set, tmp_path):
    fx = fixture_set[name]
    if fx.load not in ("weights_only", "full", "torchscript", "safetensors"):
        pytest.skip(f"no reference loader for {fx.load}")
    for seed, slots, threads, hold in ((1, 2, 3, 0), (2, 3, 2, 2), (3, 2, 1, 1)):
        out = tmp_path / f"{seed}.bin"
        rc, doc, err = staged(fx.path, out, "--seed", seed, "--slots", slots, "--threads", threads, "--hold", hold)
        assert rc == 0, err
        bad = mismatches(fx, doc, out.read_bytes())
        assert not bad, f"{name} (seed {seed}): storages differ from the reference: {bad[:5]}"


def test_big_fixture_lands_bit_for_bit(big_fixture, tmp_path):
    # ~50 MB through 2 buffers of 1 MiB: records longer than a buffer, cut and reassembled.
    out = tmp_path / "big.bin"
    rc, doc, err = staged(big_fixture.path, out, "--slots", 2, "--slot-bytes", 1 << 20, "--threads", 2, "--hold", 1)
    assert rc == 0, err
    assert doc["reads"] > 40
    assert not mismatches(big_fixture, doc, out.read_bytes())


def test_failed_copy_is_one_line_naming_the_file(fixture_set, tmp_path):
    fx = fixture_set["views"]
    out = tmp_path / "out.bin"
    for fail_at in (0, 1):
        rc, doc, err = staged(fx.path, out, "--fail-at", fail_at, "--slot-bytes", 256)
        assert rc == 4, err  # a device error
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(fx.path) in lines[0] and "injected copy failure" in lines[0], err
        assert not out.exists(), "a failed load must not produce output"


def test_hostile_engine_catches_buffers_reused_too_early(fixture_set, tmp_path):
    # Copies are held back until waited for, so a pipeline that does not wait before
    # refilling a buffer copies the last bytes read into it, not its own.
    fx = fixture_set["dtypes"]
    out = tmp_path / "out.bin"
    rc, doc, err = staged(fx.path, out, "--hold", 1 << 30, "--slot-bytes", 256)
    assert rc == 0, err
    assert doc["reads"] > 4
    assert not mismatches(fx, doc, out.read_bytes())
    rc, doc, err = staged(fx.path, out, "--hold", 1 << 30, "--slot-bytes", 256, "--too-early")
    assert rc == 0, err
    assert mismatches(fx, doc, out.read_bytes()), "the broken pipeline went unnoticed"
