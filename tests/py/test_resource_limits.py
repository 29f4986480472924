"""Resource limits (issue 5): a single input must not make ckptool use more than a bounded
amount of memory beyond the tensor data it was asked to materialize.

Hostile inputs built to blow memory (billion laughs through the memo and DUP, 10^6-deep
nesting, huge declared string / bytes / integer lengths, huge declared storages and shapes, a
zip whose end records declare billions of entries or a terabyte central directory, a
safetensors header declaring a huge length, a header with 100,000 tensors) run under an
address-space limit (RLIMIT_AS, as `ulimit -v` sets it):

  * inspect / verify / rekey --dry-run (no LibTorch): 1 GiB;
  * materialize --device meta (dlopens LibTorch, whose libraries alone map a few GB): the
    measured address-space need of materializing a tiny valid file, plus 512 MiB.

Each exits with its documented code (0, or 3 with a one-line error; verify: 1), never with a
signal, std::bad_alloc ("out of memory", exit 4) or an abort. The --max-* flags (inspect
--help, group "Limits") work: just over a limit is a `limit` error naming the flag, and the
flag raised lets the same file through; for the two limits whose defaults are cheap to
exceed (--max-depth, --max-long-bytes) that is shown against the default itself.

RLIMIT_AS cannot work under AddressSanitizer (it reserves terabytes of shadow memory): the
limited runs are skipped for sanitized builds (CKPTOOL_SANITIZE, or libasan in `ldd`).
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import subprocess
import time

import pytest
import torch

import hostile as H
import test_corruption as T
from conftest import CKPTOOL, SANITIZED, TIME_SCALE

MiB = 1 << 20
GiB = 1 << 30
CORE_LIMIT = 1 * GiB  # inspect / verify / rekey: no LibTorch
TORCH_HEADROOM = 512 * MiB  # materialize --device meta: on top of its measured baseline


def _asan_build() -> bool:
    if SANITIZED:
        return True
    try:
        out = subprocess.run(["ldd", str(CKPTOOL)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libasan" in out or "libclang_rt.asan" in out


ASAN = _asan_build()
needs_rlimit = pytest.mark.skipif(ASAN, reason="AddressSanitizer reserves terabytes of address space: RLIMIT_AS "
                                               "cannot bound it")

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def run_limited(args, limit: int | None, timeout: float = 60):
    """ckptool under RLIMIT_AS = limit bytes (None: unlimited). Returns (rc, out, err, seconds)."""
    def preexec():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    t0 = time.perf_counter()
    p = subprocess.run([str(CKPTOOL), *map(str, args)], capture_output=True, timeout=timeout * TIME_SCALE,
                       preexec_fn=preexec, env=env)
    return (p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
            time.perf_counter() - t0)


def check_outcome(what, rc, out, err, expect_rc, kind=None, msg=""):
    assert rc >= 0, f"{what}: killed by signal {-rc}; stderr {err[-1500:]!r}"
    assert "out of memory" not in err and "bad_alloc" not in err and "terminate called" not in err, \
        f"{what}: allocation failure: {err[-1500:]!r}"
    assert rc == expect_rc, f"{what}: exit {rc}, expected {expect_rc}; stderr {err[-1500:]!r}"
    if expect_rc == 3:
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and out == "", f"{what}: expected one stderr line: {err!r} / {out[:200]!r}"
        if kind:
            assert lines[0].startswith(f"ckptool: {kind}: "), f"{what}: {lines[0]!r}"
        assert re.search(msg, lines[0]), f"{what}: {lines[0]!r} does not match {msg!r}"


# --------------------------------------------------------------------------- hostile inputs


def _zip_count(n):
    def edit(m: H.ZipModel):
        m.eocd_count = n  # the ZIP64 end record carries it; the 16-bit field says 0xFFFF
    return T.zip_edit(edit)


def _zip_cd_size(n):
    def build(b: T.Bases) -> bytes:
        raw = bytearray(b.zip)
        e64 = raw.rfind(H.EOCD64_SIG)
        struct.pack_into("<Q", raw, e64 + 40, n)
        return bytes(raw)
    return build


def _st_many(n: int):
    def build(b: T.Bases) -> bytes:
        header = {"__metadata__": {"format": "pt"}}
        for i in range(n):
            header[f"t{i}"] = {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
        return H.Safetensors(header, bytes(n)).serialize()
    return build


def _legacy_huge_storage(b: T.Bases) -> bytes:
    _, storages = T._legacy_pieces(b.legacy)
    raw = bytearray(b.legacy)
    struct.pack_into("<q", raw, storages, 1 << 60)
    return bytes(raw)


# name -> (builder, expected exit of inspect/rekey-dry (verify: 0 -> 0, 3 -> 1), kind, message)
HOSTILE = {
    "memo-laughs-10^30": (T.insert_in_pickle(b"}q\x00(", H.p(H.binunicode("lol"), T.memo_laughs(30, 10)[2:-1])),
                          0, None, ""),
    "dup-laughs-2^64": (T.insert_in_pickle(b"}q\x00(", H.p(H.binunicode("lol"), T.dup_laughs(64)[2:-1])), 0, None, ""),
    "nesting-10^6-lists": (T.with_pickle(T.deep_lists(1_000_000)), 3, "limit", r"--max-depth"),
    "nesting-10^6-marks": (T.with_pickle(T.PROTO + b"(" * 1_000_000 + b"."), 3, "limit", r"--max-depth"),
    "long4-declares-2GiB": (T.with_pickle(T.dict_with(b"\x8b" + struct.pack("<i", 0x7FFFFFFF))), 3, None, r"byte \d+"),
    "binbytes8-declares-2^62": (T.with_pickle(T.dict_with(b"\x8e" + struct.pack("<Q", 1 << 62))), 3, "corrupt",
                                r"truncated"),
    "binunicode-declares-4GiB": (T.with_pickle(T.dict_with(b"X" + struct.pack("<I", 0xFFFFFFFF))), 3, "corrupt",
                                 r"truncated"),
    "storage-declares-2^60-elements": (T.fake(v_numel=1 << 60), 3, "corrupt", r"storage declares"),
    "shape-2^40-elements-stride-0": (T.fake(v_offset=0, v_size=(1 << 40,), v_stride=(0,)), 0, None, ""),
    "zip-declares-2^40-entries": (_zip_count(1 << 40), 3, "corrupt", r"zip"),
    "zip-declares-10^7-entries": (_zip_count(10_000_000), 3, "corrupt", r"zip"),
    "zip-central-directory-1TiB": (_zip_cd_size(1 << 40), 3, "corrupt", r"zip"),
    "safetensors-header-declares-2^62": (lambda b: struct.pack("<Q", 1 << 62) + b.st[8:], 3, "corrupt",
                                         r"header length \d+ exceeds the format's maximum"),
    "safetensors-header-declares-100MB": (lambda b: struct.pack("<Q", 100_000_000) + b.st[8:], 3, "corrupt",
                                          r"header length 100000000 runs past the end of the file"),
    "safetensors-100k-tensors": (_st_many(100_000), 0, None, ""),
    "legacy-storage-declares-2^60": (_legacy_huge_storage, 3, "corrupt", r"storage"),
}
SUFFIX = {"safetensors": ".safetensors"}


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hostile")
    b = T.make_bases(d)
    out = {}
    for name, (build, *_rest) in HOSTILE.items():
        suffix = ".safetensors" if name.startswith("safetensors") else ".pt"
        p = d / (name + suffix)
        p.write_bytes(build(b))
        out[name] = p
    out["_base_zip"] = b.zip_path
    return out


CORE_VERBS = {
    "inspect": lambda p, o: ["inspect", p],
    "inspect-json": lambda p, o: ["inspect", "--json", p],
    "verify": lambda p, o: ["verify", p],
    "rekey-dry": lambda p, o: ["rekey", "--dry-run", "--add-prefix", "x.", p],
}


@needs_rlimit
@pytest.mark.parametrize("verb", list(CORE_VERBS))
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_bounded_memory(name, verb, hostile_files, tmp_path):
    p = hostile_files[name]
    _build, rc_expected, kind, msg = HOSTILE[name]
    if verb == "rekey-dry" and name.startswith("legacy"):
        pytest.skip("rekey reads torch zip and safetensors files only")
    rc, out, err, secs = run_limited(CORE_VERBS[verb](p, tmp_path / "out.pt"), CORE_LIMIT)
    what = f"{verb} {name} under RLIMIT_AS={CORE_LIMIT >> 20} MiB"
    if verb == "verify":
        check_outcome(what, rc, out, err, 1 if rc_expected == 3 else 0)
        assert err == "", f"{what}: {err!r}"
    else:
        check_outcome(what, rc, out, err, rc_expected, kind, msg)
    assert secs < 10 * TIME_SCALE, f"{what}: took {secs:.1f}s"


@needs_rlimit
def test_laughs_rekey_output_stays_small(hostile_files, tmp_path):
    """rekey writes the billion-laughs pickle back with its shared nodes still shared."""
    for name in ("memo-laughs-10^30", "dup-laughs-2^64"):
        p = hostile_files[name]
        out = tmp_path / f"{name}.out.pt"
        rc, so, se, secs = run_limited(["rekey", p, "-o", out, "--add-prefix", "x."], CORE_LIMIT)
        check_outcome(f"rekey -o {name}", rc, so, se, 0)
        assert out.stat().st_size < p.stat().st_size + 64 * 1024, out.stat().st_size


# --------------------------------------------------------------------------- materialize (LibTorch)


@pytest.fixture(scope="module")
def torch_baseline(hostile_files) -> int:
    """The smallest RLIMIT_AS (to 64 MiB) under which materialize --device meta of a tiny
    valid file succeeds: LibTorch's own address-space need (its libraries and reservations)."""
    p = hostile_files["_base_zip"]
    ok = lambda lim: run_limited(["materialize", "--device", "meta", p], lim)[0] == 0  # noqa: E731
    lo, hi = 256 * MiB, 8 * GiB
    if not ok(hi):
        lo, hi = hi, 64 * GiB
        if not ok(hi):
            pytest.fail("materialize --device meta fails even under a 64 GiB address-space limit")
    while hi - lo > 64 * MiB:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    print(f"materialize --device meta baseline: {hi >> 20} MiB of address space")
    return hi


MATERIALIZE_CASES = ["memo-laughs-10^30", "dup-laughs-2^64", "nesting-10^6-lists", "long4-declares-2GiB",
                     "storage-declares-2^60-elements", "shape-2^40-elements-stride-0", "zip-declares-2^40-entries",
                     "zip-central-directory-1TiB", "safetensors-header-declares-2^62", "safetensors-100k-tensors",
                     "legacy-storage-declares-2^60"]


@needs_rlimit
def test_materialize_meta_bounded_memory(hostile_files, torch_baseline):
    limit = torch_baseline + TORCH_HEADROOM
    for name in MATERIALIZE_CASES:
        _build, rc_expected, kind, msg = HOSTILE[name]
        rc, out, err, secs = run_limited(["materialize", "--device", "meta", hostile_files[name]], limit)
        check_outcome(f"materialize --device meta {name} under RLIMIT_AS={limit >> 20} MiB", rc, out, err,
                      rc_expected, kind, msg)


# --------------------------------------------------------------------------- the --max-* flags


def _st_n(n):
    return _st_many(n)


def _pickle_file(pk):
    return T.with_pickle(pk)


def _dict_of(value_ops):
    """The base state dict plus an entry 'x' (so rekey still finds its state dict)."""
    return T.insert_in_pickle(b"}q\x00(", H.p(H.binunicode("x"), value_ops))


# flag -> (builder just over, the limit it is over (None: the default), value that lets it through)
LIMIT_FLAGS = {
    "--max-depth": (_dict_of(b"]" * 1001 + b"a" * 1000), None, 1100),
    "--max-long-bytes": (_dict_of(b"\x8b" + struct.pack("<i", 65537) + b"\x01" * 65537), None, 65537),
    "--max-string": (_dict_of(H.binunicode("s" * 1001)), 1000, 1001),
    "--max-container": (_dict_of(b"(" + b"K\x01" * 101 + b"l"), 100, 101),
    "--max-stack": (_dict_of(b"(" + b"K\x01" * 101 + b"l"), 100, 200),
    "--max-memo": (_dict_of(b"(" + b"K\x01q\xf0" * 1 + b"".join(b"K\x01q" + bytes([i]) for i in range(0x80, 0xe0)) + b"l"),
                   50, 200),
    "--max-pickle-bytes": (lambda b: b.zip, 100, 1 << 20),
    "--max-tensors": (_st_n(5), 4, 5),
}


@pytest.fixture(scope="module")
def limit_files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("limits")
    b = T.make_bases(d)
    out = {}
    for flag, (build, _, _) in LIMIT_FLAGS.items():
        p = d / (flag.strip("-") + (".safetensors" if flag == "--max-tensors" else ".pt"))
        p.write_bytes(build(b))
        out[flag] = p
    return out


@pytest.mark.parametrize("verb", ["inspect", "rekey-dry"])
@pytest.mark.parametrize("flag", list(LIMIT_FLAGS))
def test_limit_flag_raises_the_default(flag, verb, limit_files):
    _, over, through = LIMIT_FLAGS[flag]
    p = limit_files[flag]
    lower = [] if over is None else [flag, str(over)]

    def args(extra):
        if verb == "inspect":
            return ["inspect", *extra, p]
        return ["rekey", "--dry-run", "--add-prefix", "x.", *extra, p]

    limit = None if ASAN else CORE_LIMIT
    rc, out, err, _ = run_limited(args(lower), limit)
    check_outcome(f"{verb} {flag} just over {'the default' if over is None else over}", rc, out, err, 3, "limit",
                  rf"{re.escape(str(p))}: byte \d+: ")
    rc, out, err, _ = run_limited(args([flag, str(through)]), limit)
    check_outcome(f"{verb} {flag} {through}", rc, out, err, 0)


@pytest.mark.parametrize("flag", list(LIMIT_FLAGS))
def test_limit_error_names_its_flag(flag, limit_files):
    _, over, _ = LIMIT_FLAGS[flag]
    rc, out, err, _ = run_limited(["inspect", *([] if over is None else [flag, str(over)]), limit_files[flag]], None)
    assert rc == 3 and f"(raise with {flag})" in err, err


@needs_rlimit
def test_many_records_need_no_more_address_space_than_one_thread(tmp_path):
    """Archives of 2048+ records read their local headers on several threads, whose stacks
    (8 MiB) and malloc arenas count against RLIMIT_AS; under a limit the reader stays on
    one thread. The least limit that opens 5,000 records exceeds the one for 100 records by
    their tables alone (~12 MiB), not by a thread's stack and arena as well (~22 MiB)."""
    def least_limit(path):
        lo, hi = 4 << 20, 512 << 20
        while hi - lo > 256 << 10:
            mid = (lo + hi) // 2
            if run_limited(["inspect", "--json", path], mid)[0] == 0:
                hi = mid
            else:
                lo = mid
        return hi

    many, small = tmp_path / "many.pt", tmp_path / "small.pt"
    torch.save({f"w{i}": torch.zeros(2) for i in range(5000)}, many)
    torch.save({f"w{i}": torch.zeros(2) for i in range(100)}, small)
    extra = least_limit(many) - least_limit(small)
    assert extra < 16 << 20, f"5,000 records need {extra >> 20} MiB more address space than 100"
    rc, out, err, _ = run_limited(["inspect", "--json", many], least_limit(many))
    check_outcome("inspect of 5,000 records at its least RLIMIT_AS", rc, out, err, 0)
    assert len(json.loads(out)["tensors"]) == 5000
