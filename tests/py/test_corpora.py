"""Every file of the adversarial corpora (../shared/corpora) through `ckptool inspect --json`.

ckptool must never crash, hang or run anything: each file exits 0 (read) or 3 (refused:
corrupt, unsupported or unsafe) within 5 s, a refusal is exactly one stderr line naming the
file, and a file whose pickle imports something torch.load(weights_only=True) would refuse
names it in unsafe_globals. EXPECTED pins today's result per file, so a change in behaviour
is visible in review.
"""

from __future__ import annotations

import _compat_pickle
import json
import pickletools
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import fixtures as F
import reference as R
from conftest import TIME_SCALE, corpora_dir, run_ckptool

CORPORA = corpora_dir()

# path relative to the corpora root -> exit code, pinned from the CLI's behaviour (0.1.0)
# and reviewed: only the two real PyTorch files are read; everything else (bare pickles,
# non-checkpoint zips, encrypted / oddly flagged / mismatched zips, 7z, PNG, text) is
# refused with 3. A change must be deliberate.
EXPECTED: dict[str, int] = {
    "README.md": 3,
    "picklescan/bad_pytorch.pt": 3,
    "picklescan/benign0_v0.pkl": 3,
    "picklescan/benign0_v3.pkl": 3,
    "picklescan/benign0_v4.pkl": 3,
    "picklescan/benign_password_protected.zip": 3,
    "picklescan/broken_model.pkl": 3,
    "picklescan/malicious-invalid-bytes.pkl": 3,
    "picklescan/malicious0.pkl": 3,
    "picklescan/malicious1.7z": 3,
    "picklescan/malicious1.zip": 3,
    "picklescan/malicious10.pkl": 3,
    "picklescan/malicious11.pkl": 3,
    "picklescan/malicious12.pkl": 3,
    "picklescan/malicious13a.pkl": 3,
    "picklescan/malicious13b.pkl": 3,
    "picklescan/malicious14.pkl": 3,
    "picklescan/malicious15a.pkl": 3,
    "picklescan/malicious15b.pkl": 3,
    "picklescan/malicious16.pkl": 3,
    "picklescan/malicious17.pkl": 3,
    "picklescan/malicious18.pkl": 3,
    "picklescan/malicious19.pkl": 3,
    "picklescan/malicious1_0x1.zip": 3,
    "picklescan/malicious1_0x20.zip": 3,
    "picklescan/malicious1_0x40.zip": 3,
    "picklescan/malicious1_central_directory.zip": 3,
    "picklescan/malicious1_v0.pkl": 3,
    "picklescan/malicious1_v3.pkl": 3,
    "picklescan/malicious1_v4.pkl": 3,
    "picklescan/malicious1_wrong_ext.zip": 3,
    "picklescan/malicious20.pkl": 3,
    "picklescan/malicious2_v0.pkl": 3,
    "picklescan/malicious2_v3.pkl": 3,
    "picklescan/malicious2_v4.pkl": 3,
    "picklescan/malicious3.pkl": 3,
    "picklescan/malicious4.pickle": 3,
    "picklescan/malicious5.pickle": 3,
    "picklescan/malicious6.pkl": 3,
    "picklescan/malicious7.pkl": 3,
    "picklescan/malicious8.pkl": 3,
    "picklescan/malicious9.pkl": 3,
    "picklescan/new_pytorch_model.bin": 0,
    "picklescan/not_a_pickle.bin": 3,
    "picklescan/pytorch_magic_bypass.pt": 3,
    "picklescan/pytorch_model.bin": 0,
    "picklescan/sys_module_override_sploit.pkl": 3,
    "ziplinter/absolute-name.zip": 3,
    "ziplinter/binary_comment.zip": 3,
    "ziplinter/blue.png": 3,
    "ziplinter/concatenated.zip": 3,
    "ziplinter/cp-437.zip": 3,
    "ziplinter/crc32-not-streamed.zip": 3,
    "ziplinter/dd.zip": 3,
    "ziplinter/found-me-bzip2.zip": 3,
    "ziplinter/found-me-deflate64.zip": 3,
    "ziplinter/found-me-lzma.zip": 3,
    "ziplinter/found-me-zstd.zip": 3,
    "ziplinter/found-me.txt": 3,
    "ziplinter/go-no-datadesc-sig.zip": 3,
    "ziplinter/go-with-datadesc-sig.zip": 3,
    "ziplinter/gophercolor16x16.png": 3,
    "ziplinter/long_file_name.zip": 3,
    "ziplinter/long_file_name_comment.zip": 3,
    "ziplinter/meta.zip": 3,
    "ziplinter/readme.absolutefilename": 3,
    "ziplinter/readme.binarycontentzip": 3,
    "ziplinter/readme.directory_no_slash": 3,
    "ziplinter/readme.extra_data_before_central_directory": 3,
    "ziplinter/readme.longfilenamecommentzip": 3,
    "ziplinter/readme.longfilenamezip": 3,
    "ziplinter/readme.mismatched_compression": 3,
    "ziplinter/readme.mismatchednameszip": 3,
    "ziplinter/readme.notzip": 3,
    "ziplinter/readme.password": 3,
    "ziplinter/readme.relativenameszip": 3,
    "ziplinter/readme.samenameszip": 3,
    "ziplinter/readme.streamingzip": 3,
    "ziplinter/readme.trailingzip": 3,
    "ziplinter/readme.zip": 3,
    "ziplinter/relative.zip": 3,
    "ziplinter/same-names.zip": 3,
    "ziplinter/secret-a.zip": 3,
    "ziplinter/secret.zip": 3,
    "ziplinter/shift-jis.zip": 3,
    "ziplinter/streaming.zip": 3,
    "ziplinter/symlink.zip": 3,
    "ziplinter/test-mismatched-names.zip": 3,
    "ziplinter/test-more-trailing-junk.zip": 3,
    "ziplinter/test-trailing-junk.zip": 3,
    "ziplinter/test.zip": 3,
    "ziplinter/test_dir_no_slash.zip": 3,
    "ziplinter/test_mismatched_compression_central.zip": 3,
    "ziplinter/test_mismatched_compression_local.zip": 3,
    "ziplinter/test_with_extra_data_before_central_directory.zip": 3,
    "ziplinter/time-22738.zip": 3,
    "ziplinter/time-7zip.zip": 3,
    "ziplinter/time-go.zip": 3,
    "ziplinter/time-infozip.zip": 3,
    "ziplinter/time-osx.zip": 3,
    "ziplinter/time-win7.zip": 3,
    "ziplinter/time-winrar.zip": 3,
    "ziplinter/time-winzip.zip": 3,
    "ziplinter/unix.zip": 3,
    "ziplinter/unused-range.zip": 3,
    "ziplinter/utf8-7zip.zip": 3,
    "ziplinter/utf8-infozip.zip": 3,
    "ziplinter/utf8-osx.zip": 3,
    "ziplinter/utf8-winrar.zip": 3,
    "ziplinter/utf8-winzip.zip": 3,
    "ziplinter/winxp.zip": 3,
    "ziplinter/zip64-2.zip": 3,
    "ziplinter/zip64.zip": 3,
    "ziplinter/zip_password.zip": 3,
}

# Files read with exit 0: the unsafe globals unsafe_globals must report (sorted). Both load
# with torch.load(weights_only=True), so the list is empty.
EXPECTED_UNSAFE: dict[str, list[str]] = {
    "picklescan/new_pytorch_model.bin": [],
    "picklescan/pytorch_model.bin": [],
}


def _files() -> list[str]:
    if not CORPORA.is_dir():
        return []
    return sorted(str(p.relative_to(CORPORA)) for p in CORPORA.rglob("*") if p.is_file())


FILES = _files()


def test_corpora_present():
    assert CORPORA.is_dir(), f"corpora not found at {CORPORA} (set CKPTOOL_CORPORA)"
    assert len(FILES) > 100


def test_table_covers_every_file():
    if not EXPECTED:
        pytest.fail("EXPECTED is empty: pin the CLI's results")
    missing = sorted(set(FILES) - set(EXPECTED))
    gone = sorted(set(EXPECTED) - set(FILES))
    assert not missing, f"corpus files without an expected exit code: {missing}"
    assert not gone, f"expected exit codes for files no longer in the corpora: {gone}"


@pytest.mark.parametrize("rel", FILES)
def test_corpus_file(rel):
    p = CORPORA / rel
    t0 = time.perf_counter()
    rc, out, err = run_ckptool("inspect", "--json", p, timeout=30 * TIME_SCALE)
    wall = time.perf_counter() - t0
    assert rc in (0, 3), f"{rel}: exit {rc} (signal {-rc if rc < 0 else '-'}); stderr: {err[:1500]!r}"
    assert wall < 5.0 * TIME_SCALE, f"{rel}: took {wall:.2f}s"
    assert "AddressSanitizer" not in err and "runtime error:" not in err, err[:2000]
    if rc == 3:
        assert out == "", f"{rel}: stdout not empty on error"
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].strip(), f"{rel}: expected one stderr line: {err!r}"
        assert str(p) in lines[0], f"{rel}: the error line does not name the file: {lines[0]!r}"
    else:
        doc = json.loads(out)
        assert doc["file"] == str(p)
        if rel in EXPECTED_UNSAFE:
            assert sorted(doc["unsafe_globals"]) == EXPECTED_UNSAFE[rel], \
                f"{rel}: unsafe_globals {sorted(doc['unsafe_globals'])}"
    if rel in EXPECTED:
        assert rc == EXPECTED[rel], f"{rel}: exit {rc}, pinned {EXPECTED[rel]}; stderr {err.strip()!r}"


# --------------------------------------------------------------------------- globals in refusals


_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
               "SHORT_BINUNICODE", "BINUNICODE8"}


def _map_name(module: str, name: str) -> str:
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def scan_globals(data: bytes) -> set[str]:
    """Globals a pickle stream imports (GLOBAL, INST, and STACK_GLOBAL with operands pushed
    as strings or fetched from the memo), up to the first undecodable opcode. A rough static
    scan, independent of ckptool; enough to know which names a refusal should mention."""
    found: set[str] = set()
    stack: list = []
    memo: dict = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            n = op.name
            if n in ("GLOBAL", "INST"):
                module, name = arg.split(" ", 1)
                found.add(_map_name(module, name))
                stack.append(None)
            elif n == "STACK_GLOBAL":
                name = stack.pop() if stack else None
                module = stack.pop() if stack else None
                if isinstance(module, str) and isinstance(name, str):
                    found.add(_map_name(module, name))
                stack.append(None)
            elif n in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else None)
            elif n in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1] if stack else None
            elif n == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack else None
            elif n in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg))
            elif n == "POP":
                if stack:
                    stack.pop()
            else:
                stack.append(None)
    except Exception:  # noqa: BLE001 - broken pickles: keep what was seen before the break
        pass
    return found


def _pickles_of(p: Path) -> list[bytes]:
    data = p.read_bytes()
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(p) as z:
                return [z.read(i) for i in z.namelist() if i.endswith(".pkl")]
        except Exception:  # noqa: BLE001
            return []
    return [data]


PICKLE_FILES = [f for f in FILES if f.startswith("picklescan/")]


@pytest.mark.parametrize("rel", PICKLE_FILES)
def test_refusal_names_unsafe_globals(rel):
    """A refused pickle that imports globals torch would refuse names (at least one of) them
    in its one-line message (security.md P5: the report lists the globals seen)."""
    p = CORPORA / rel
    unsafe = set()
    for data in _pickles_of(p):
        unsafe |= scan_globals(data) - R.allowed_globals()
    rc, out, err = run_ckptool("inspect", "--json", p, timeout=30 * TIME_SCALE)
    if rc == 0:
        assert set(json.loads(out)["unsafe_globals"]) >= unsafe
        return
    if not unsafe:
        return
    if ": zip: " in err:
        # Refused on the container before any pickle is read (malicious1.zip keeps data.pkl
        # outside a top-level folder, which PyTorch's reader refuses too). Parsing pickles
        # out of a structurally broken archive is the riskier choice, so none are named.
        return
    assert any(g in err for g in unsafe), \
        f"{rel}: refused (exit {rc}) without naming its unsafe globals {sorted(unsafe)}: {err.strip()!r}"


# The corpus files that are genuine PyTorch checkpoints (torch.load(weights_only=True) reads
# them; checked in the test). No other corpus file is ever handed to torch.load.
TORCH_READABLE = ["picklescan/new_pytorch_model.bin", "picklescan/pytorch_model.bin"]


@pytest.mark.parametrize("rel", TORCH_READABLE)
def test_torch_loadable_corpus_files_match_reference(rel):
    """Corpus files torch.load(weights_only=True) reads: the full comparison with torch."""
    p = CORPORA / rel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.load(p, weights_only=True)  # a genuine checkpoint
    fmt = "torch-zip" if zipfile.is_zipfile(p) else "torch-legacy"
    fx = F.Fixture("corpus:" + rel, p, fmt, F.WEIGHTS_ONLY)
    rc, out, err = run_ckptool("inspect", "--json", p)
    assert rc == 0, err
    m = R.compare(fx, json.loads(out))
    assert not m, m.report(rel)
