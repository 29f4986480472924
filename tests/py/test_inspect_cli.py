"""`ckptool inspect` as a command: exit codes, error lines, the malicious pickle, human
output, --filter, --tree, --input, and the metadata-only guarantee.

Exit codes (man ckptool): 0 ok; 2 usage error; 3 corrupt, unsupported or unsafe input;
4 I/O error. Errors are exactly one line on stderr naming the file; stdout stays empty.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import fixtures as F
import reference as R
from conftest import CKPTOOL, TIME_SCALE, inspect_json, run_ckptool


def assert_one_error_line(path, rc, out, err, code):
    assert rc == code, f"{path}: expected exit {code}, got {rc}; stderr: {err.strip()[:1000]}"
    assert out == "", f"{path}: stdout must be empty on error, got {out[:300]!r}"
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"{path}: expected one stderr line, got {err!r}"
    assert str(path) in lines[0], f"{path}: the error line does not name the file: {lines[0]!r}"
    assert "Traceback" not in err and "terminate called" not in err


# --------------------------------------------------------------------------- usage: exit 2


@pytest.mark.parametrize("args", [
    [],
    ["inspect"],
    ["inspect", "--json"],
    ["inspect", "--no-such-flag", "FILE"],
    ["no-such-verb", "FILE"],
    ["inspect", "--input", "4xq", "FILE"],
])
def test_usage_errors_exit_2(args, fixture_set):
    args = [str(fixture_set["plain"].path) if a == "FILE" else a for a in args]
    rc, out, err = run_ckptool(*args)
    assert rc == 2, f"ckptool {args}: expected 2, got {rc}; stderr {err[:500]!r}"
    assert out == "", f"ckptool {args}: stdout must be empty on a usage error: {out[:300]!r}"
    assert err.strip(), "a usage error says what is wrong on stderr"


def test_input_on_non_torchscript_is_usage_error(fixture_set):
    p = fixture_set["plain"].path
    rc, out, err = run_ckptool("inspect", "--input", "4x4", p)
    assert rc == 2, f"expected 2, got {rc}: {err!r}"
    assert out == ""


def test_help_and_version():
    rc, out, _ = run_ckptool("--help")
    assert rc == 0 and "inspect" in out
    rc, out, _ = run_ckptool("inspect", "--help")
    assert rc == 0 and "--json" in out and "--filter" in out and "--tree" in out
    rc, out, err = run_ckptool("--version")
    assert rc == 0 and "0.1.0" in (out + err)


# --------------------------------------------------------------------------- I/O: exit 4


def test_missing_file_exit_4(tmp_path):
    p = tmp_path / "does-not-exist.pt"
    rc, out, err = run_ckptool("inspect", "--json", p)
    assert_one_error_line(p, rc, out, err, 4)
    rc, out, err = run_ckptool("inspect", p)
    assert_one_error_line(p, rc, out, err, 4)


def test_directory_exit_2(tmp_path):
    """Not a regular file (issue 11 item 10): a usage error, like a FIFO or a device."""
    d = tmp_path / "a_directory.pt"
    d.mkdir()
    rc, out, err = run_ckptool("inspect", "--json", d)
    assert_one_error_line(d, rc, out, err, 2)


# --------------------------------------------------------------------------- corrupt: exit 3


def _rebuild_zip(src: Path, dst: Path, fn) -> Path:
    with zipfile.ZipFile(src) as z:
        items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
            for n, b in fn(items):
                z.writestr(n, b)
    return dst


def _corrupt_cases(fx: dict, d: Path) -> dict:
    plain = fx["plain"].path.read_bytes()
    st = fx["safetensors"].path.read_bytes()
    n_hdr = int.from_bytes(st[:8], "little")
    cases = {}

    def w(name, data):
        p = d / name
        p.write_bytes(data)
        cases[name] = p

    w("empty.pt", b"")
    w("random.pt", random.Random(1).randbytes(4096))
    w("text.pt", b"this is not a checkpoint\n" * 10)
    w("png_named.pt", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100)
    w("zip_half.pt", plain[: len(plain) // 2])
    w("zip_no_eocd.pt", plain[:-10])
    w("zip_only_magic.pt", b"PK\x03\x04")
    w("fake_eocd.pt", b"PK\x05\x06" + b"\x00" * 18)
    w("st_truncated.safetensors", st[: 8 + n_hdr + 4])
    w("st_huge_header.safetensors", (1 << 60).to_bytes(8, "little") + st[8:])
    w("st_header_past_eof.safetensors", (n_hdr + 100).to_bytes(8, "little") + st[8:])
    w("st_bad_json.safetensors", len(b"{not json").to_bytes(8, "little") + b"{not json")
    w("legacy_truncated.pt", fx["legacy"].path.read_bytes()[:-40])
    w("legacy_header_only.pt", fx["legacy"].path.read_bytes()[:40])
    w("torchscript_half.pt", fx["scripted"].path.read_bytes()[:-4000])
    # zip archives rebuilt from a real torch.save file
    src = fx["plain"].path
    cases["zip_storage_short.pt"] = _rebuild_zip(src, d / "zip_storage_short.pt", lambda it: [
        (n, b[:8] if n.endswith("/data/0") else b) for n, b in it])
    cases["zip_bad_pickle.pt"] = _rebuild_zip(src, d / "zip_bad_pickle.pt", lambda it: [
        (n, b[:2] + b"\xff\xfe" + b[4:] if n.endswith("/data.pkl") else b) for n, b in it])
    cases["zip_pickle_truncated.pt"] = _rebuild_zip(src, d / "zip_pickle_truncated.pt", lambda it: [
        (n, b[: len(b) // 2] if n.endswith("/data.pkl") else b) for n, b in it])
    cases["zip_no_data_pkl.pt"] = _rebuild_zip(src, d / "zip_no_data_pkl.pt", lambda it: [
        (n, b) for n, b in it if not n.endswith("/data.pkl")])
    cases["zip_missing_storage.pt"] = _rebuild_zip(src, d / "zip_missing_storage.pt", lambda it: [
        (n, b) for n, b in it if not n.endswith("/data/0")])
    cases["zip_duplicate_name.pt"] = _rebuild_zip(src, d / "zip_duplicate_name.pt",
                                                  lambda it: it + [it[-2]])
    cases["zip_of_text.pt"] = _rebuild_zip(src, d / "zip_of_text.pt",
                                           lambda it: [("readme.txt", b"hello")])
    return cases


# Files torch itself refuses too (checked below), and the ones only ckptool's stricter
# rules refuse (docs/security.md Z5: duplicate names).
STRICTER_THAN_TORCH = {"zip_duplicate_name.pt"}


@pytest.fixture(scope="module")
def corrupt_cases(fixture_set, tmp_path_factory):
    return _corrupt_cases(fixture_set, tmp_path_factory.mktemp("corrupt"))


def _reference_refuses(p: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if p.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(p), framework="pt") as f:
                    for k in f.keys():
                        f.get_tensor(k)
                return False
            except Exception:  # noqa: BLE001
                return True
        try:
            torch.load(p, weights_only=True)
            return False
        except Exception:  # noqa: BLE001
            pass
        try:
            torch.jit.load(str(p))
            return False
        except Exception:  # noqa: BLE001
            return True


CORRUPT_NAMES = [
    "empty.pt", "random.pt", "text.pt", "png_named.pt", "zip_half.pt", "zip_no_eocd.pt",
    "zip_only_magic.pt", "fake_eocd.pt", "st_truncated.safetensors",
    "st_huge_header.safetensors", "st_header_past_eof.safetensors", "st_bad_json.safetensors",
    "legacy_truncated.pt", "legacy_header_only.pt", "torchscript_half.pt",
    "zip_storage_short.pt", "zip_bad_pickle.pt", "zip_pickle_truncated.pt", "zip_no_data_pkl.pt",
    "zip_missing_storage.pt", "zip_duplicate_name.pt", "zip_of_text.pt",
]


@pytest.mark.parametrize("name", CORRUPT_NAMES)
def test_corrupt_input_exit_3(name, corrupt_cases):
    p = corrupt_cases[name]
    if name not in STRICTER_THAN_TORCH:
        assert _reference_refuses(p), f"test bug: the reference client reads {name}"
    for args in (["inspect", "--json", p], ["inspect", p]):
        rc, out, err = run_ckptool(*args, timeout=10 * TIME_SCALE)
        assert_one_error_line(p, rc, out, err, 3)


# --------------------------------------------------------------------------- malicious


def test_malicious_pickle_reported_never_run(fixture_set):
    fx = fixture_set["malicious"]
    assert fx.marker is not None and not fx.marker.exists()
    rc, out, err = run_ckptool("inspect", "--json", fx.path)
    assert not fx.marker.exists(), "ckptool ran the pickle's payload"
    assert rc in (0, 3), f"exit {rc}: {err!r}"
    if rc == 0:
        doc = json.loads(out)
        unsafe = set(doc["unsafe_globals"])
        assert unsafe & {"posix.system", "os.system"}, f"unsafe_globals: {sorted(unsafe)}"
        # the rest of the file is still described
        paths = {tuple(t["path"]) for t in doc["tensors"]}
        assert ("weight",) in paths
    else:
        assert_one_error_line(fx.path, rc, out, err, 3)
        assert "posix.system" in err or "os.system" in err
    rc, out, err = run_ckptool("inspect", fx.path)
    assert not fx.marker.exists(), "ckptool ran the pickle's payload"
    assert rc in (0, 3)
    assert "posix.system" in (out + err) or "os.system" in (out + err)


def test_malicious_legacy_and_raw_pickle_never_run(tmp_path):
    """The same payload in a legacy stream and as a bare pickle."""
    marker = tmp_path / "PWNED_legacy"
    p1 = tmp_path / "malicious_legacy.pt"
    torch.save({"w": torch.ones(1), "x": F.Evil(marker)}, p1, _use_new_zipfile_serialization=False)
    import pickle

    p2 = tmp_path / "malicious_raw.pkl"
    p2.write_bytes(pickle.dumps(F.Evil(marker), protocol=4))
    for p in (p1, p2):
        for args in (["inspect", "--json", p], ["inspect", p]):
            rc, out, err = run_ckptool(*args)
            assert not marker.exists(), f"{p.name}: ckptool ran the payload"
            assert rc in (0, 3), f"{p.name}: exit {rc}: {err!r}"
            if rc == 3:
                assert_one_error_line(p, rc, out, err, 3)
            else:
                assert "posix.system" in out or "os.system" in out, f"{p.name}: not reported"


# --------------------------------------------------------------------------- human output


def test_human_output_plain(fixture_set):
    fx = fixture_set["plain"]
    rc, out, err = run_ckptool("inspect", fx.path)
    assert rc == 0, err
    assert re.search(r"torch[- ]?zip|torch\.save", out, re.I), "format not shown"
    sd = torch.load(fx.path, weights_only=True)
    for k, t in sd.items():
        assert k in out, f"tensor {k} not shown"
    assert "float32" in out and "int64" in out
    assert "[8, 4]" in out or "8x4" in out or "(8, 4)" in out, "shapes not shown"
    total = sum(t.numel() for t in sd.values())
    assert f"{total:,}" in out or str(total) in out, f"total numel {total} not shown"


def test_human_output_lightning(fixture_set):
    fx = fixture_set["lightning"]
    rc, out, err = run_ckptool("inspect", fx.path)
    assert rc == 0, err
    ck = torch.load(fx.path, weights_only=True)
    n = len(ck["state_dict"])
    for k in ck["state_dict"]:
        assert k in out
    line = [ln for ln in out.splitlines() if "_orig_mod." in ln and "model._orig_mod.enc" not in ln
            and "model._orig_mod.dec" not in ln]
    assert any(re.search(rf"\b{n}\b", ln) for ln in line), \
        f"wrapper count '_orig_mod.' = {n} not shown; candidate lines: {line}"
    for k in ("epoch", "global_step", "hidden", "lr"):
        assert k in out, f"entry {k} not shown"
    assert "state_dict" in out


def test_human_output_torchscript(fixture_set):
    fx = fixture_set["scripted"]
    rc, out, err = run_ckptool("inspect", fx.path)
    assert rc == 0, err
    assert "torchscript" in out.lower()
    m = torch.jit.load(str(fx.path))
    for name in m._c._method_names():
        assert name in out
    for n, _ in list(m.named_parameters()) + list(m.named_buffers()):
        assert n.split(".")[-1] in out
    assert "evaluation_step" in out


def test_human_output_safetensors_and_legacy(fixture_set):
    rc, out, err = run_ckptool("inspect", fixture_set["safetensors"].path)
    assert rc == 0, err
    assert "safetensors" in out.lower() and "t_bfloat16" in out and "bfloat16" in out
    rc, out, err = run_ckptool("inspect", fixture_set["legacy"].path)
    assert rc == 0, err
    assert "legacy" in out.lower()


def test_human_output_whole_module_names_globals(fixture_set):
    fx = fixture_set["whole_module"]
    rc, out, err = run_ckptool("inspect", fx.path)
    assert rc == 0, err
    assert f"{F.WholeNet.__module__}.WholeNet" in out


# --------------------------------------------------------------------------- --filter / --tree


def test_filter_narrows_json(fixture_set):
    fx = fixture_set["plain"]
    sd = torch.load(fx.path, weights_only=True)
    want = {k for k in sd if fnmatch.fnmatchcase(k, "*.weight")}
    doc = inspect_json(fx.path, "--filter", "*.weight")
    got = {t["path"][-1] for t in doc["tensors"]}
    assert got == want, f"--filter '*.weight': expected {sorted(want)}, got {sorted(got)}"


def _stdout_on_a_terminal(*args) -> str:
    """ckptool's stdout when it is a terminal (a pseudo-terminal read to the end)."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([str(CKPTOOL), *map(str, args)], stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert p.wait(timeout=60) == 0, p.stderr.read().decode()
    # The terminal's line discipline turns each "\n" into "\r\n".
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_json_layout_compact_unless_terminal_or_pretty(fixture_set):
    """One line when read by a program (a third of a large set's document is indentation);
    indented as json.dumps(indent=2) at a terminal or with --pretty. Same document in all."""
    p = fixture_set["plain"].path
    rc, compact, err = run_ckptool("inspect", "--json", p)
    assert rc == 0, err
    doc = json.loads(compact)
    assert compact == json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"
    rc, pretty, err = run_ckptool("inspect", "--json", "--pretty", p)
    assert rc == 0, err
    assert pretty == json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    assert _stdout_on_a_terminal("inspect", "--json", p) == pretty
    rc, out, err = run_ckptool("inspect", "--pretty", p)
    assert rc == 2 and out == "" and "--pretty requires --json" in err


def test_filter_narrows_human(fixture_set):
    fx = fixture_set["plain"]
    sd = torch.load(fx.path, weights_only=True)
    rc, out, err = run_ckptool("inspect", "--filter", "*.bias", fx.path)
    assert rc == 0, err
    for k in sd:
        if fnmatch.fnmatchcase(k, "*.bias"):
            assert k in out, f"{k} filtered out"
        else:
            assert k not in out, f"{k} shown despite --filter '*.bias'"


def test_filter_lightning_state_dict_keys(fixture_set):
    fx = fixture_set["lightning"]
    ck = torch.load(fx.path, weights_only=True)
    want = {k for k in ck["state_dict"] if fnmatch.fnmatchcase(k, "model._orig_mod.enc.*")}
    doc = inspect_json(fx.path, "--filter", "model._orig_mod.enc.*")
    got = {t["path"][-1] for t in doc["tensors"]}
    assert got == want


def test_filter_json_matches_a_tied_tensor_by_either_key(fixture_set):
    """One Parameter saved under two keys is one tensor record (listed at its first path):
    --filter on the second key keeps it in the JSON, as the human output lists that key."""
    fx = fixture_set["tied_params"]
    sd = torch.load(fx.path, weights_only=True)
    assert sd["lm_head.weight"] is sd["embed.weight"]
    doc = inspect_json(fx.path, "--filter", "lm_head.*")
    assert [t["shape"] for t in doc["tensors"]] == [list(sd["lm_head.weight"].shape)]
    assert doc["tensors"][0]["path"] == ["embed.weight"]


def test_tree_groups_keys(fixture_set):
    fx = fixture_set["compiled"]
    sd = torch.load(fx.path, weights_only=True)
    rc, out, err = run_ckptool("inspect", "--tree", fx.path)
    assert rc == 0, err
    per_module = {}
    for k, t in sd.items():
        mod = k.rsplit(".", 1)[0].split(".")[-1]
        per_module[mod] = per_module.get(mod, 0) + t.numel()
    lines = out.splitlines()
    for mod, n in per_module.items():  # enc: 40, dec: 18
        hits = [ln for ln in lines if re.search(rf"\b{mod}\b", ln)]
        assert any(re.search(rf"\b{n}\b", ln) for ln in hits), \
            f"--tree: module {mod} with {n} elements not shown; lines: {hits}"
    total = sum(per_module.values())
    assert re.search(rf"\b{total}\b", out), f"--tree: total {total} not shown"


# --------------------------------------------------------------------------- --input (TorchScript)


def test_input_shape_inference_matches_torch(fixture_set):
    fx = fixture_set["scripted"]
    m = torch.jit.load(str(fx.path))
    expected = m(torch.randn(4, 3))
    doc = inspect_json(fx.path, "--input", "4x3")
    vals = doc["outputs"]["values"]
    assert len(vals) == 1
    assert vals[0]["shape"] == list(expected.shape)
    assert vals[0]["dtype"] == R.dtype_name(expected.dtype)
    expected = m.evaluation_step(torch.randn(4, 3), torch.randn(4, 2))
    doc = inspect_json(fx.path, "--method", "evaluation_step", "--input", "4x3", "--input", "4x2")
    vals = doc["outputs"]["values"]
    assert vals[0]["shape"] == list(expected.shape)


# --------------------------------------------------------------------------- metadata only


def _data_ranges(fx) -> list[tuple[int, int]]:
    """Byte ranges of tensor data in the file, found independently of ckptool."""
    if fx.format == "safetensors":
        n, _ = R.safetensors_header(fx.path)
        return [(8 + n, os.path.getsize(fx.path) - 8 - n)]
    if fx.format == "torch-legacy":
        return list(R.legacy_layout(fx.path)[1].values())
    return list(R.zip_storage_offsets(fx.path).values())


def _garble(src: Path, dst: Path, ranges) -> int:
    shutil.copyfile(src, dst)
    total = 0
    with open(dst, "r+b") as f:
        for off, n in ranges:
            if n <= 0:
                continue
            f.seek(off)
            b = f.read(n)
            f.seek(off)
            f.write((np.frombuffer(b, dtype=np.uint8) ^ 0xFF).tobytes())
            total += n
    return total


def _strip(doc):
    """The document without what names the file (its path, also in files[]) or counts reads."""
    out = {k: v for k, v in doc.items() if k not in ("file", "io")}
    out["files"] = [{k: v for k, v in f.items() if k != "path"} for f in doc.get("files", [])]
    return out


GARBLED = ["plain", "views", "dtypes", "lightning", "legacy", "scripted", "safetensors", "meta",
           "big"]


@pytest.mark.parametrize("name", GARBLED)
def test_data_never_looked_at(name, fixture_set, big_fixture, tmp_path):
    """Overwrite every tensor data byte: inspect must say exactly the same (but for io)."""
    fx = big_fixture if name == "big" else fixture_set[name]
    garbled = tmp_path / ("garbled_" + fx.path.name)
    n = _garble(fx.path, garbled, _data_ranges(fx))
    assert n > 0 or name == "meta"
    a = inspect_json(fx.path)
    b = inspect_json(garbled)
    assert _strip(a) == _strip(b), f"{name}: inspect output depends on tensor data bytes"
    if fx.format in ("torch-zip", "torchscript") and n > 0:
        # the garbling is real: a reader that checks the data notices it
        rc, out, err = run_ckptool("inspect", "--json", "--verify-crc", garbled)
        assert rc == 3, f"--verify-crc on garbled data: expected 3, got {rc}: {err!r}"


def test_big_checkpoint_reads_under_one_percent(big_fixture):
    fx = big_fixture
    size = os.path.getsize(fx.path)
    assert size > 40 << 20
    t0 = time.perf_counter()
    doc = inspect_json(fx.path)
    wall = time.perf_counter() - t0
    assert doc["io"]["bytes_read"] < size / 100, \
        f"io.bytes_read {doc['io']['bytes_read']} of {size}"
    assert wall < 3.0 * TIME_SCALE, f"inspect of a {size >> 20} MB file took {wall:.2f}s"


def strace_file_io(cmd: list, path: Path, log: Path) -> tuple[int, int, int]:
    """Run cmd under strace -f; return (bytes read from `path` through read-like calls,
    bytes of `path` mmapped, number of opens of `path`)."""
    p = subprocess.run(["strace", "-f", "-qq", "-s", "0", "-o", str(log), "-e",
                        "trace=open,openat,read,pread64,readv,preadv,preadv2,mmap,close,"
                        "dup,dup2,dup3,fcntl",
                        *map(str, cmd)], capture_output=True, timeout=120)
    if p.returncode != 0 and b"ptrace" in p.stderr:
        pytest.skip(f"strace cannot trace here: {p.stderr[:200]!r}")
    assert p.returncode == 0, p.stderr[-1000:]
    fds: set[int] = set()
    pending: dict[str, tuple[str, str]] = {}
    read_bytes = mapped = opens = 0
    for ln in log.read_text(errors="replace").splitlines():
        m = re.match(r"(\d+)\s+(.*)$", ln)
        pid, rest = (m.group(1), m.group(2)) if m else ("0", ln)
        m = re.match(r"(\w+)\((.*) <unfinished \.\.\.>$", rest)
        if m:
            pending[pid] = (m.group(1), m.group(2))
            continue
        m = re.match(r"<\.\.\. (\w+) resumed>(.*)$", rest)
        if m and pid in pending:
            call, args0 = pending.pop(pid)
            rest = f"{call}({args0}{m.group(2)}"
        m = re.match(r"(\w+)\((.*)\)\s+=\s+(-?\d+|0x[0-9a-f]+)", rest)
        if not m:
            continue
        call, args, ret = m.group(1), m.group(2), m.group(3)
        r = int(ret, 16) if ret.startswith("0x") else int(ret)
        first = args.split(",")[0].strip()
        if call in ("open", "openat"):
            if f'"{path}"' in args and r >= 0:
                fds.add(r)
                opens += 1
            elif r in fds:
                fds.discard(r)
        elif call == "close":
            fds.discard(int(first))
        elif call in ("dup", "dup2", "dup3") or (call == "fcntl" and "F_DUPFD" in args):
            if first.isdigit() and int(first) in fds and r >= 0:
                fds.add(r)
        elif call in ("read", "pread64", "readv", "preadv", "preadv2"):
            if first.isdigit() and int(first) in fds and r > 0:
                read_bytes += r
        elif call == "mmap":
            a = [x.strip() for x in args.split(",")]
            if len(a) >= 5 and a[4].lstrip("-").isdigit() and int(a[4]) in fds:
                mapped += int(a[1])
    return read_bytes, mapped, opens


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_big_checkpoint_bytes_read_by_syscalls(big_fixture, tmp_path):
    """Independent of ckptool's own counter: count read/pread bytes on the file's fds."""
    fx = big_fixture
    size = os.path.getsize(fx.path)
    read_bytes, mapped, opens = strace_file_io([CKPTOOL, "inspect", "--json", fx.path], fx.path,
                                               tmp_path / "strace.log")
    assert opens > 0, "strace saw no open of the file"
    assert read_bytes < size / 100, f"read {read_bytes} bytes of a {size}-byte file"
    if mapped:
        pytest.skip(f"file is mmapped ({mapped} bytes): page touches are invisible to strace; "
                    f"test_data_never_looked_at covers it (read() bytes: {read_bytes})")
