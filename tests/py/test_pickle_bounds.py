"""Memory bounded by the input (issue 11, item 12): the pickle machine's cost per decoded value
is small, and --max-values bounds how many it decodes.

The hostile file is a torch.save zip whose data.pkl is deflated (about 100 KB in the zip) and
inflates to 100 MB of 1-byte opcodes: EMPTY_LIST + APPEND pairs, 50 million empty lists in
one list. Before the fix `inspect` took about 50 bytes per pickle byte (5+ GB for this file).
Now each list costs one node (72 bytes) and one element (8-16 bytes); the default
--max-values (48,000,000) stops the run at 24 million lists, with peak RSS under BOUND.

Smaller shapes check that every way of making values or elements is counted (exit 3 naming
--max-values under a low limit), and that what CPython shares (None, True, False, small ints,
the empty tuple) costs no node at all.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import torch

import hostile as H
from conftest import CKPTOOL, SANITIZED, TIME_SCALE, run_ckptool

PROTO = b"\x80\x02"
GiB = 1 << 30
# Peak RSS allowed for `inspect` of the 100 MB hostile pickle with default limits: 48 M values
# at up to ~45 bytes each for this shape (measured: 2.0 GiB), plus the inflated pickle
# (100 MB) and the binary.
BOUND = 2.5 * GiB
# Address-space cap for the runs, so that a regression (or the baseline) fails instead of
# taking the machine's memory.
AS_CAP = 6 * GiB

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


def _deflated(base_zip: bytes, pk: bytes) -> bytes:
    def edit(m: H.ZipModel):
        e = m.find("data.pkl")
        co = zlib.compressobj(6, zlib.DEFLATED, -15)
        comp = co.compress(pk) + co.flush()
        crc = zlib.crc32(pk)
        e.set_data(comp)
        e.l_method = e.c_method = 8
        e.l_crc = e.c_crc = crc
        e.l_csize = e.c_csize = len(comp)
        e.l_usize = e.c_usize = len(pk)
        if e.desc:
            e.desc = H.DESC_SIG + struct.pack("<III", crc, len(comp), len(pk))
    return H.edit_zip(base_zip, edit)


def _run_measured(args, timeout: float):
    """ckptool under RLIMIT_AS = AS_CAP; returns (rc, stderr, seconds, peak RSS bytes).
    GNU time reports the peak from a small process of its own: wait4 on a child forked from
    pytest would count pytest's own pages as the child's peak."""
    import resource
    import tempfile

    def preexec():
        if not SANITIZED:
            resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))

    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    with tempfile.NamedTemporaryFile("r") as peak_kib:
        t0 = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak_kib.name, str(CKPTOOL), *map(str, args)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=preexec, env=env,
                           timeout=timeout * TIME_SCALE * 4)
        secs = time.perf_counter() - t0
        lines = peak_kib.read().split()
    return p.returncode, p.stderr.decode("utf-8", "replace"), secs, int(lines[-1]) * 1024


@pytest.fixture(scope="module")
def base_zip(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("bounds")
    return H.save({"w": torch.arange(4, dtype=torch.float32)}, d / "base.pt").read_bytes()


def test_100mb_of_one_byte_containers(base_zip, tmp_path):
    pk = PROTO + b"]" + b"]a" * 50_000_000 + b"."
    f = tmp_path / "lists.pt"
    f.write_bytes(_deflated(base_zip, pk))
    assert f.stat().st_size < 1 << 20
    rc, err, secs, peak = _run_measured(["inspect", f], timeout=120)
    assert rc >= 0, f"killed by signal {-rc}: {err[-500:]!r}"
    assert "out of memory" not in err, err
    assert rc in (0, 3), err
    if rc == 3:
        assert re.fullmatch(r"ckptool: limit: .*--max-values\)\n", err), err
    assert secs < 20 * TIME_SCALE, f"{secs:.1f} s"
    if not SANITIZED:
        assert peak < BOUND, f"peak RSS {peak / GiB:.2f} GiB"


LOW = 1_000_000


def _shapes():
    n = 2 * LOW
    return {
        # a node and an element per 2 bytes
        "empty-lists": PROTO + b"]" + b"]a" * n + b".",
        # no node at all: one list appending itself (DUP, APPEND), elements only
        "self-append": PROTO + b"]" + b"2a" * n + b".",
        # elements only: a tuple of Nones (None is one node)
        "tuple-of-none": PROTO + b"(" + b"N" * n + b"t.",
        # dict entries with distinct int keys
        "dict-int-keys": PROTO + b"}(" + b"".join(b"J" + struct.pack("<i", 1000 + i) + b"N" for i in range(n)) + b"u.",
        # a fresh dict per 2 bytes, kept on the stack under a MARK
        "dicts-on-stack": PROTO + b"(" + b"}" * n + b"l.",
        # objects: each REDUCE makes a node with its slots
        "objects": PROTO + b"(cbuiltins\nobject\nq\x00" + b"h\x00)R" * n + b"l.",
    }


@pytest.mark.parametrize("shape", list(_shapes()))
def test_every_value_is_counted(base_zip, tmp_path, shape):
    f = tmp_path / "h.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", _shapes()[shape]))
    t0 = time.perf_counter()
    rc, out, err = run_ckptool("inspect", "--max-values", str(LOW), "--max-stack", str(10 * LOW), f,
                               timeout=30 * TIME_SCALE)
    assert rc == 3 and out == "", (rc, err)
    assert re.fullmatch(r"ckptool: limit: .*h\.pt: byte \d+: .*more values than 1000000 \(raise with --max-values\)"
                        r"( \(before it, the pickle named unsafe globals: builtins\.object\))?\n",
                        err), err
    assert time.perf_counter() - t0 < 5 * TIME_SCALE


def test_shared_scalars_cost_nothing(base_zip, tmp_path):
    # 3 million None / True / False / small ints / empty tuples in one list: only the list's
    # elements count, so a limit of 3.1 million values lets it through.
    n = 600_000
    pk = PROTO + b"](" + b"N\x88\x89K\x07)" * n + b"e."
    f = tmp_path / "scalars.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", pk))
    rc, out, err = run_ckptool("inspect", "--max-values", str(5 * n + 100), f, timeout=30 * TIME_SCALE)
    assert rc == 0, err
    rc, out, err = run_ckptool("inspect", "--max-values", str(5 * n - 100), f, timeout=30 * TIME_SCALE)
    assert rc == 3 and "--max-values" in err, err


def test_real_checkpoint_within_default(tmp_path):
    # 20,000 tensors in a state dict pass with the default limit and with a limit of
    # 31 values per tensor (a torch.save checkpoint needs 30 per 1-D tensor: 1,000,000 tensors
    # fit in the default 48,000,000).
    n = 20_000
    sd = {f"layer.{i}.weight": torch.zeros(1) for i in range(n)}
    f = H.save(sd, tmp_path / "many.pt")
    rc, out, err = run_ckptool("inspect", f, timeout=60 * TIME_SCALE)
    assert rc == 0, err
    rc, out, err = run_ckptool("inspect", "--max-values", str(31 * n), f, timeout=60 * TIME_SCALE)
    assert rc == 0, err


def test_alias_paths_are_counted(base_zip, tmp_path):
    # One tensor referenced 200,000 times at the bottom of 900 nested lists: 400 KB of
    # pickle, and every reference is an alias whose path (901 steps) is stored. The baseline
    # used 7 GB and 37 s on it under the default limits; the paths now count against
    # --max-values.
    from test_pickle_depth import _tensor_ops
    ops = _tensor_ops()
    i = ops.rfind(b"R")
    assert ops[i + 1:i + 2] == b"q", ops[i:i + 3]  # REDUCE, BINPUT k: the tensor's memo slot
    get = b"h" + ops[i + 2:i + 3]
    n, k = 900, 200_000
    pk = PROTO + b"}X\x01\x00\x00\x00w" + b"]" * n + b"(" + ops + get * k + b"e" + b"a" * (n - 1) + b"s."
    f = tmp_path / "alias.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", pk))
    rc, err, secs, peak = _run_measured(["inspect", "--max-values", "4000000", f], timeout=60)
    assert rc == 3, err
    assert re.fullmatch(r"ckptool: limit: .*alias\.pt: byte \d+: tensor paths hold more than 4000000 .*"
                        r"\(raise with --max-values\)\n", err), err
    assert secs < 5 * TIME_SCALE, f"{secs:.1f} s"
    if not SANITIZED:
        assert peak < 512 << 20, f"peak RSS {peak >> 20} MiB"
