"""The corruption suite (issue 5; docs/security.md §5.1): one table of hostile
inputs, each with the hazard ids it covers, an exact exit code and error category per verb,
and a success twin.

Every hostile file is derived from a VALID file written by the real clients (torch.save, the
legacy torch.save stream, torch.jit.save, safetensors.torch.save_file) by one edit, made by
tests/py/hostile.py, which re-serializes torch's zip layout and safetensors' header byte for
byte (checked in test_builders_reproduce_the_clients_bytes): the twin is the unmodified file,
or, for a case whose hostile file cannot exist as a valid one (a 7z wrapper, a PNG), the file
it wraps. The twin must pass the same verbs with exit 0.

Per case and verb the test asserts:
  * the exit code, exactly;
  * a failure is exactly one stderr line `ckptool: KIND: FILE: byte N: message` naming the
    file, with the expected KIND and a message matching the case's regex; stdout is empty
    (with and without --json: a failing verb prints no JSON document);
  * `verify` reports a structural failure as a failed check (exit 1, man ckptool-verify):
    the problem `KIND: FILE: byte N: message` in its JSON, nothing on stderr;
  * the byte offset is present (test_error_names_a_byte_offset, separate so a missing offset
    is visible on its own);
  * write verbs create no output and no temporary file; the input is never modified.

The shared corpora (../shared/corpora) are part of the suite through test_corpora.py, whose
EXPECTED table pins an exit code for every corpus file (test_table_covers_every_file checks
nothing is missing); test_corpus_files_are_pinned here re-checks that link.

docs/hazards.md maps every hazard id of security.md to tests; test_hazard_map_* keep it true.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

import hostile as H
from conftest import SOURCE_DIR, TIME_SCALE, corpora_dir, run_ckptool

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# --------------------------------------------------------------------------- valid bases

# The zip base, as torch.save writes it: two storages of two dtypes, one tensor a view.
BASE_ZIP_NUMEL = (10, 256)


def _base_obj():
    base = torch.arange(10, dtype=torch.float32)
    return {"v": base[1:], "w": torch.ones(16, 16, dtype=torch.float16)}


def _fake_tensors(**override):
    """Stand-ins pickling exactly as _base_obj() does (checked); keyword overrides edit
    them: v_offset, v_size, v_stride, v_numel, v_key, w_type, w_key, w_numel, ..."""
    o = dict(v_key="0", v_type=torch.FloatStorage, v_numel=10, v_offset=1, v_size=(9,), v_stride=(1,),
             w_key="1", w_type=torch.HalfStorage, w_numel=256, w_offset=0, w_size=(16, 16), w_stride=(16, 1),
             v_location="cpu")
    o.update(override)
    s0 = H.FakeStorage(o["v_key"], o["v_type"], o["v_numel"], o["v_location"])
    if o["w_key"] == o["v_key"] and o.get("share", False):
        s1 = s0
    else:
        s1 = H.FakeStorage(o["w_key"], o["w_type"], o["w_numel"])
    return {"v": H.FakeTensor(s0, o["v_offset"], o["v_size"], o["v_stride"]),
            "w": H.FakeTensor(s1, o["w_offset"], o["w_size"], o["w_stride"])}


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


@dataclass
class Bases:
    zip: bytes
    legacy: bytes
    st: bytes
    ts: bytes
    zip_path: Path
    pickle: bytes  # data.pkl of the zip base
    legacy_fake_eocd: bytes  # a legacy stream holding the bytes of a zip end record


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Bases:
    return make_bases(tmp_path_factory.mktemp("bases"))


def make_bases(d: Path) -> Bases:
    from safetensors.torch import save_file

    zp = H.save(_base_obj(), d / "base.pt")
    lp = H.save(_base_obj(), d / "legacy.pt", _use_new_zipfile_serialization=False)
    sp = d / "base.safetensors"
    save_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64),
               "c": torch.zeros(3, dtype=torch.float16)}, str(sp), metadata={"format": "pt"})

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x)

    tp = d / "scripted.pt"
    torch.jit.save(torch.jit.script(M()), str(tp))
    raw = zp.read_bytes()
    return Bases(raw, lp.read_bytes(), sp.read_bytes(), tp.read_bytes(), zp, H.record(raw, "data.pkl"),
                 _legacy_fake_eocd(d))


# --------------------------------------------------------------------------- builders


def with_pickle(pk: bytes) -> Callable[[Bases], bytes]:
    return lambda b: H.replace_record(b.zip, "data.pkl", pk)


def fake(**kw) -> Callable[[Bases], bytes]:
    return with_pickle(H.torch_pickle(_fake_tensors(**kw)))


def insert_in_pickle(marker: bytes, ops: bytes, after=True) -> Callable[[Bases], bytes]:
    """Insert opcodes into the base data.pkl right after (or before) the first `marker`."""
    def build(b: Bases) -> bytes:
        pk = b.pickle
        i = pk.index(marker) + (len(marker) if after else 0)
        return H.replace_record(b.zip, "data.pkl", pk[:i] + ops + pk[i:])
    return build


def zip_edit(fn) -> Callable[[Bases], bytes]:
    return lambda b: H.edit_zip(b.zip, fn)


def st_edit(fn) -> Callable[[Bases], bytes]:
    return lambda b: H.edit_st(b.st, fn)


def st_header(text, data_len=None) -> Callable[[Bases], bytes]:
    """A safetensors file with this header text over the base's data bytes."""
    def build(b: Bases) -> bytes:
        data = H.Safetensors.parse(b.st).data
        t = text.encode() if isinstance(text, str) else text
        return H.write_st_raw(t, data if data_len is None else data[:data_len])
    return build


def _flip_data_byte(m: H.ZipModel):
    e = m.find("data/1")
    d = bytearray(e.data)
    d[5] ^= 0xFF
    e.data = bytes(d)  # CRC fields keep the old value


def _add_entry_like(m: H.ZipModel, suffix: str, name: str, data: bytes | None = None, at: int | None = None):
    import copy

    e = copy.deepcopy(m.find(suffix))
    e.rename(name)
    if data is not None:
        e.set_data(data)
    m.entries.insert(len(m.entries) - 2 if at is None else at, e)
    return e


def _quoted_overlap(m: H.ZipModel):
    """Fifield's overlap: the record of data/0 is moved inside the payload of data/1 (same
    length, CRC fixed), and the central directory points there."""
    a = m.find("data/1")
    b = m.find("data/0")
    ib = m.index("data/0")
    # b's record as it would be written; its FB padding stays as is
    rec = (struct.pack("<IHHHHHIIIHH", 0x04034B50, b.l_ver, b.l_flags, b.l_method, b.l_time, b.l_date,
                       b.l_crc, b.l_csize, b.l_usize, len(b.l_name), len(b.l_extra))
           + b.l_name + b.l_extra + b.data + b.desc)
    assert len(rec) < len(a.data)
    del m.entries[ib]
    a_data = m.offsets()[m.index("data/1")][1]
    a.set_data(rec + a.data[len(rec):])
    b.c_offset = a_data
    m.entries.insert(ib, b)
    b.skip = True


def _size_past_eof(m: H.ZipModel):
    e = m.find("serialization_id")
    e.c_csize = e.c_usize = len(e.data) + 10_000_000


def _sentinel_without_zip64(m: H.ZipModel):
    e = m.find("data/1")
    e.c_csize = 0xFFFFFFFF


def _symlink(m: H.ZipModel):
    e = m.find("byteorder")
    e.c_made = (3 << 8) | 0x1E
    e.c_eattr = (0o120777 << 16)


def _deflate(m: H.ZipModel):
    e = m.find("data/1")
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    comp = co.compress(e.data) + co.flush()
    crc = zlib.crc32(e.data)
    e.data = comp
    e.l_method = e.c_method = 8
    e.c_crc, e.c_csize, e.c_usize = crc, len(comp), 256 * 2
    e.desc = H.DESC_SIG + struct.pack("<III", crc, len(comp), 256 * 2)


def _legacy_pieces(raw: bytes):
    """The pickles of a legacy stream: (start, end) of the magic, protocol, sys_info, object,
    storage-key list, then the storage area."""
    import pickletools

    spans = []
    pos = 0
    for _ in range(5):
        for op, arg, at in pickletools.genops(raw[pos:]):
            if op.name == "STOP":
                spans.append((pos, pos + at + 1))
                pos = pos + at + 1
                break
    return spans, pos


def _legacy_computed_magic(b: Bases) -> bytes:
    spans, _ = _legacy_pieces(b.legacy)
    s, e = spans[0]
    magic = 0x1950A86A20F9469CFC6C
    computed = H.p(b"\x80\x02cbuiltins\nint\n", H.binunicode(hex(magic)), b"K\x10\x86R.")
    return b.legacy[:s] + computed + b.legacy[e:]


def _legacy_storage_size(b: Bases) -> bytes:
    _, storages = _legacy_pieces(b.legacy)
    raw = bytearray(b.legacy)
    n = struct.unpack_from("<q", raw, storages)[0]
    struct.pack_into("<q", raw, storages, n + 1_000_000)
    return bytes(raw)


def _legacy_fake_eocd(d: Path) -> bytes:
    obj = _base_obj()
    obj["PK\x05\x06" + "\x00" * 18] = 1  # Python's zipfile.is_zipfile says yes
    return H.save(obj, d / "fake_eocd.pt", _use_new_zipfile_serialization=False).read_bytes()


# pickle fragments (protocol 2; data.pkl replaced whole)
PROTO = b"\x80\x02"
# os.system('true') called, then a byte that is no opcode: CPython has run the call when it
# fails (nullifAI's broken pickles)
BROKEN_AFTER_PAYLOAD = H.p(PROTO, b"cposix\nsystem\n", H.binunicode("true"), b"\x85R\xff")
def deep_lists(n: int) -> bytes:
    return PROTO + b"]" * n + b"a" * (n - 1) + b"."


def memo_laughs(levels: int = 9, width: int = 10, first: int = 0x60) -> bytes:
    """Billion laughs through the memo: list i holds `width` references to list i-1
    (width**levels leaves); memo slots from `first` on."""
    out = bytearray(PROTO + b"]q" + bytes([first]) + b"0")
    for i in range(first + 1, first + levels + 1):
        out += b"(" + (b"h" + bytes([i - 1])) * width + b"lq" + bytes([i]) + (b"0" if i < first + levels else b"")
    out += b"."
    return bytes(out)


def dup_laughs(levels: int = 64) -> bytes:
    """Billion laughs through DUP: (x, x) nested `levels` times: 2**levels leaves."""
    return PROTO + b"K\x00" + b"2\x86" * levels + b"."


def dict_with(value_ops: bytes) -> bytes:
    """{'v': <the base's tensor v ...>} is not needed: a dict whose 'x' is value_ops."""
    return H.p(PROTO, b"}", H.binunicode("x"), value_ops, b"s.")


# --------------------------------------------------------------------------- the table


@dataclass
class Expect:
    rc: int
    kind: str | None = None  # corrupt / unsupported / unsafe / limit (failures)
    msg: str = ""  # regex the message must match (failures)


OK = Expect(0)


@dataclass
class Case:
    id: str
    hazards: tuple
    base: str  # zip / legacy / st / ts: the twin's format, and which verbs apply
    build: Callable
    expect: Expect  # inspect; rekey and materialize too unless `verbs` says otherwise
    verbs: dict = field(default_factory=dict)  # verb -> Expect, overriding / adding
    twin: Callable | None = None  # bytes of the twin (default: the base file)
    suffix: str = ".pt"
    materialize: bool = False  # also run materialize --device meta (loads LibTorch: slow)
    no_offset: str = ""  # why the message has no byte offset today (test_error_names_a_byte_offset xfails)
    bug: str = ""  # a ckptool bug (reported): the case's test_case xfails (strict) with this reason

    def expected(self) -> dict:
        fmt_verbs = {"zip": ["inspect", "verify", "rekey-dry", "rekey-out"],
                     "legacy": ["inspect", "verify"], "st": ["inspect", "verify", "rekey-dry", "rekey-out"],
                     "ts": ["inspect", "verify"]}[self.base]
        out = {v: self.expect for v in fmt_verbs}
        if self.materialize:
            out["materialize-meta"] = self.expect
        # verify lists what it found wrong in a file it reads (exit 1); a file it cannot read
        # at all (unsupported) is refused as every verb refuses it.
        if self.expect.rc == 3 and self.expect.kind != UNSUP:
            out["verify"] = Expect(1, self.expect.kind, self.expect.msg)
        out.update(self.verbs)
        return out


E = Expect
C = Case
CORRUPT, UNSUP, UNSAFE, LIMIT = "corrupt", "unsupported", "unsafe", "limit"

CASES: list[Case] = [
    # ---------------------------------------------------------------- pickle: calls, globals
    C("pickle-global-reduce-os-system", ("P1", "P2"), "zip",
      with_pickle(H.torch_pickle({**_fake_tensors(), "evil": _Evil()})), E(0),
      verbs={"verify": E(1, None, r"unsafe global posix\.system"),
             "rekey-dry": E(3, UNSAFE, r"posix\.system"), "rekey-out": E(3, UNSAFE, r"posix\.system")},
      materialize=True),
    C("pickle-inst-opcode", ("P1",), "zip", insert_in_pickle(b"}q\x00(", H.p(
        H.binunicode("x"), b"(", H.binunicode("true"), b"ios\nsystem\n")), E(0),
      verbs={"verify": E(1, None, r"unsafe global (os|posix)\.system"),
             "rekey-dry": E(3, UNSAFE, r"system"), "rekey-out": E(3, UNSAFE, r"system")}),
    C("pickle-stack-global-from-STRING-operands", ("P3",), "zip", insert_in_pickle(b"}q\x00(", H.p(
        H.binunicode("x"), b"S'os'\nS'system'\n\x93", H.binunicode("true"), b"\x85R")), E(0),
      verbs={"verify": E(1, None, r"unsafe global (os|posix)\.system"),
             "rekey-dry": E(3, UNSAFE, r"system"), "rekey-out": E(3, UNSAFE, r"system")}),
    C("pickle-stack-global-int-operand", ("P3",), "zip",
      with_pickle(dict_with(b"K\x01K\x02\x93")), E(3, CORRUPT, r"STACK_GLOBAL")),
    C("pickle-memo-int-as-module-name", ("P3",), "zip",
      with_pickle(dict_with(H.p(b"K\x05q\x50\x30", b"h\x50", H.binunicode("system"), b"\x93"))),
      E(3, CORRUPT, r"STACK_GLOBAL")),
    C("pickle-memo-get-missing-key", ("P3",), "zip", with_pickle(dict_with(b"h\x63")),
      E(3, CORRUPT, r"memo")),
    C("pickle-frame-straddle", ("P4",), "zip", with_pickle(
        b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00}\x8c\x01x\x8c\x01y\x73."), E(3, CORRUPT, r"[Ff][Rr][Aa][Mm][Ee]")),
    C("pickle-frame-inside-frame", ("P4",), "zip", with_pickle(
        b"\x80\x04\x95\x0d\x00\x00\x00\x00\x00\x00\x00}\x95\x01\x00\x00\x00\x00\x00\x00\x00.."),
      E(3, CORRUPT, r"[Ff][Rr][Aa][Mm][Ee]")),
    C("pickle-broken-after-payload", ("P5", "P1"), "zip", with_pickle(BROKEN_AFTER_PAYLOAD),
      E(3, CORRUPT, r"invalid opcode 0xff")),
    C("pickle-truncated", ("P5",), "zip", lambda b: H.replace_record(b.zip, "data.pkl", b.pickle[:len(b.pickle) // 2]),
      E(3, CORRUPT, r"truncated pickle"), materialize=True),
    C("pickle-no-stop", ("P5",), "zip", lambda b: H.replace_record(b.zip, "data.pkl", b.pickle[:-1]),
      E(3, CORRUPT, r"pickle ends without a STOP opcode")),
    C("pickle-unknown-opcode", ("P5",), "zip", with_pickle(dict_with(b"\xfe")), E(3, CORRUPT, r"opcode")),
    # ---------------------------------------------------------------- pickle: resources
    C("pickle-billion-laughs-memo", ("P8",), "zip", insert_in_pickle(b"}q\x00(", H.p(
        H.binunicode("lol"), memo_laughs()[2:-1])),
      E(0)),
    C("pickle-billion-laughs-dup", ("P8",), "zip", insert_in_pickle(b"}q\x00(", H.p(
        H.binunicode("lol"), dup_laughs()[2:-1])), E(0)),
    C("pickle-deep-nesting-100k", ("P8",), "zip", with_pickle(deep_lists(100_000)),
      E(3, LIMIT, r"pickle nesting deeper than 1000 \(raise with --max-depth\)"), materialize=True),
    C("pickle-deep-marks-100k", ("P8",), "zip", with_pickle(PROTO + b"(" * 100_000 + b"."),
      E(3, LIMIT, r"MARK nesting deeper than 1000 \(raise with --max-depth\)")),
    C("pickle-binunicode8-length-past-end", ("P8",), "zip",
      with_pickle(dict_with(b"\x8d" + struct.pack("<Q", 1 << 62) + b"abc")), E(3, CORRUPT, r"BINUNICODE8: truncated pickle")),
    C("pickle-binbytes-length-past-end", ("P8",), "zip",
      with_pickle(dict_with(b"B" + struct.pack("<I", 0xFFFFFFF0) + b"abc")), E(3, CORRUPT, r"BINBYTES: truncated pickle")),
    C("pickle-long4-huge", ("P8",), "zip",
      with_pickle(dict_with(b"\x8b" + struct.pack("<i", 200_000) + b"\x01" * 200_000)), E(3, LIMIT, r"integer longer in bytes than 65536 \(raise with --max-long-bytes\)")),
    # ---------------------------------------------------------------- pickle: opcode misuse
    C("opcode-setitem-on-list", ("P9",), "zip", with_pickle(dict_with(b"]K\x00K\x01s")), E(3, CORRUPT, r"SETITEM")),
    C("opcode-append-on-dict", ("P9",), "zip", with_pickle(dict_with(b"}K\x00a")), E(3, CORRUPT, r"APPEND")),
    C("opcode-build-on-int", ("P9",), "zip", with_pickle(dict_with(H.p(b"K\x01}", H.binunicode("a"), b"K\x02sb"))),
      E(3, CORRUPT, r"BUILD")),
    C("opcode-pop-on-empty-stack", ("P3",), "zip", with_pickle(PROTO + b"0}."), E(3, CORRUPT, r"stack")),
    C("opcode-tuple-without-mark", ("P3",), "zip", with_pickle(dict_with(b"K\x01t")), E(3, CORRUPT, r"MARK|mark")),
    C("opcode-setitem-on-tensor-CVE-2026-24747", ("P9",), "zip",
      insert_in_pickle(b"Rq\r", b"K\x00K\x01s"), E(3, CORRUPT, r"mutates a tensor with APPEND/SETITEM")),
    C("opcode-setitems-on-tensor", ("P9",), "zip",
      insert_in_pickle(b"Rq\r", b"(K\x00K\x01K\x01K\x02u"), E(3, CORRUPT, r"CVE-2026-24747 pattern")),
    # ---------------------------------------------------------------- persistent ids, storages
    C("persid-not-a-tuple", ("P10",), "zip",
      with_pickle(H.torch_pickle(_fake_tensors(), persid_override=lambda s: "storage")), E(3, CORRUPT, r"persistent")),
    C("persid-typename-not-storage", ("P10",), "zip",
      with_pickle(H.torch_pickle(_fake_tensors(), persid_override=lambda s: ("module", s.storage_type, s.key, "cpu", s.numel))),
      E(3, CORRUPT, r"persistent|storage")),
    C("persid-key-not-decimal", ("P10",), "zip", fake(v_key="../0"), E(3, CORRUPT, r"key")),
    C("persid-key-without-record", ("P10",), "zip", fake(v_key="7"), E(3, CORRUPT, r"data/7")),
    C("storage-key-reused-with-another-dtype", ("P10",), "zip", fake(w_key="0", w_numel=10, w_size=(2,), w_stride=(1,)),
      E(3, CORRUPT, r"storage '0' reused as float16 x 10 after float32")),
    C("storage-numel-differs-from-record", ("P9", "P10"), "zip", fake(v_numel=11), E(3, CORRUPT, r"record base/data/0 holds 40 bytes but its storage declares 44")),
    C("storage-record-short", ("P9",), "zip",
      lambda b: H.replace_record(b.zip, "data/0", H.record(b.zip, "data/0")[:8]), E(3, CORRUPT, r"record base/data/0 holds 8 bytes but its storage declares 40")),
    C("persid-location-is-data", ("P10",), "zip", fake(v_location="/dev/sda;cuda:99"), E(0), materialize=True),
    # ---------------------------------------------------------------- tensor views
    C("view-past-storage-end", ("P9",), "zip", fake(v_offset=2), E(3, CORRUPT, r"tensor view needs 44 bytes of storage '0', which has 40"), materialize=True),
    C("view-offset-negative", ("P9",), "zip", fake(v_offset=-1, v_size=(1,)), E(3, CORRUPT, r"negative storage offset")),
    C("view-stride-negative", ("P9",), "zip", fake(v_offset=9, v_size=(9,), v_stride=(-1,)), E(3, UNSUP, r"negative stride in tensor view")),
    C("view-shape-times-stride-overflows", ("P9",), "zip",
      fake(v_offset=0, v_size=(1 << 62, 4), v_stride=(4, 1)), E(3, CORRUPT, r"overflows"), materialize=True),
    C("view-size-2pow63", ("P9",), "zip", fake(v_offset=0, v_size=(1 << 63,), v_stride=(1,)), E(3, CORRUPT, r"size must be an integer")),
    C("view-offset-2pow63", ("P9",), "zip", fake(v_offset=(1 << 63) - 1, v_size=(2,)), E(3, CORRUPT, r"extent overflows")),
    # ---------------------------------------------------------------- zip structure
    C("zip-duplicate-name", ("Z5",), "zip", zip_edit(lambda m: _add_entry_like(m, "byteorder", "base/byteorder", b"big")),
      E(3, CORRUPT, r"duplicate entry name"), materialize=True),
    C("zip-duplicate-data-pkl", ("Z5",), "zip", zip_edit(lambda m: _add_entry_like(m, "data.pkl", "base/data.pkl", at=1)),
      E(3, CORRUPT, r"duplicate entry name")),
    C("zip-duplicate-name-case-folded", ("Z5",), "zip",
      zip_edit(lambda m: _add_entry_like(m, "byteorder", "base/BYTEORDER")), E(3, CORRUPT, r"duplicate")),
    C("zip-duplicate-name-backslash", ("Z5", "Z10"), "zip",
      zip_edit(lambda m: _add_entry_like(m, "byteorder", "base\\byteorder")), E(3, CORRUPT, r"contains a backslash")),
    C("zip-second-root", ("Z5",), "zip", zip_edit(lambda m: _add_entry_like(m, "data.pkl", "other/data.pkl")),
      E(3, CORRUPT, r"outside the top-level folder")),
    C("zip-local-central-name-mismatch", ("Z4",), "zip",
      zip_edit(lambda m: setattr(m.find("data.pkl"), "l_name", b"base/datap.kl")), E(3, CORRUPT, r"local header name")),
    C("zip-local-central-method-mismatch", ("Z4",), "zip",
      zip_edit(lambda m: setattr(m.find("data/0"), "l_method", 8)), E(3, CORRUPT, r"local header method")),
    C("zip-local-central-flags-mismatch", ("Z4",), "zip",
      zip_edit(lambda m: setattr(m.find("data/0"), "l_flags", 0x800)), E(3, CORRUPT, r"local header flags 0x800 .* differ")),
    C("zip-descriptor-crc-mismatch", ("Z4",), "zip", zip_edit(lambda m: setattr(
        m.find("data/0"), "desc", m.find("data/0").desc[:4] + b"\0\0\0\0" + m.find("data/0").desc[8:])),
      E(3, CORRUPT, r"data descriptor of 'base/data/0' .* differs from the central directory")),
    C("zip-descriptor-size-mismatch", ("Z4",), "zip", zip_edit(lambda m: setattr(
        m.find("data/0"), "desc", m.find("data/0").desc[:8] + struct.pack("<II", 1, 1))), E(3, CORRUPT, r"data descriptor of 'base/data/0' .*sizes 1/1")),
    C("zip-encrypted-flag-0x1", ("Z3",), "zip", zip_edit(lambda m: [
        setattr(m.find("data/0"), "l_flags", 0x809), setattr(m.find("data/0"), "c_flags", 0x809)]),
      E(3, UNSUP, r"encrypted"), materialize=True),
    C("zip-flag-0x20", ("Z3",), "zip", zip_edit(lambda m: [
        setattr(m.find("data/0"), "l_flags", 0x828), setattr(m.find("data/0"), "c_flags", 0x828)]),
      E(3, UNSUP, r"0x20")),
    C("zip-strong-encryption-flag-0x40", ("Z3",), "zip", zip_edit(lambda m: [
        setattr(m.find("data/0"), "l_flags", 0x848), setattr(m.find("data/0"), "c_flags", 0x848)]),
      E(3, UNSUP, r"encrypted")),
    C("zip-bad-crc", ("Z2",), "zip", zip_edit(_flip_data_byte), E(0),
      verbs={"inspect-crc": E(3, CORRUPT, r"CRC"), "verify": E(1, None, r"CRC-32 mismatch in base/data/1"),
             "materialize-crc": E(3, CORRUPT, r"CRC"), "rekey-crc": E(3, CORRUPT, r"CRC")}),
    C("zip-quoted-overlap", ("Z6",), "zip", zip_edit(_quoted_overlap), E(3, CORRUPT, r"runs past the next entry"), materialize=True),
    C("zip-declared-size-past-eof", ("Z7",), "zip", zip_edit(_size_past_eof), E(3, CORRUPT, r"runs past the central directory"), materialize=True),
    C("zip-stored-sizes-differ", ("Z7",), "zip",
      zip_edit(lambda m: setattr(m.find("data/1"), "c_usize", 1 << 31)), E(3, CORRUPT, r"stored entry .* compressed size 512 but uncompressed size")),
    C("zip-deflated-record", ("Z7",), "zip", zip_edit(_deflate), E(3, UNSUP, r"tensor record base/data/1 is compressed")),
    C("zip64-sentinel-without-extra", ("Z8",), "zip", zip_edit(_sentinel_without_zip64), E(3, CORRUPT, r"ZIP64 sentinel but no ZIP64 extra field")),
    C("zip64-end-record-offset-lie", ("Z8",), "zip", zip_edit(lambda m: setattr(m, "eocd64_cd_offset", 64)),
      E(3, CORRUPT, r"disagrees with the ZIP64 end record")),
    C("zip-entry-count-lie", ("Z8", "Z9"), "zip", zip_edit(lambda m: setattr(m, "eocd_count", 9)), E(3, CORRUPT, r"central directory ends inside entry")),
    C("zip-trailing-junk", ("Z9",), "zip", zip_edit(lambda m: setattr(m, "trailer", b"junk")),
      E(3, CORRUPT, r"trailing"), materialize=True),
    C("zip-bytes-before-central-directory", ("Z9",), "zip", zip_edit(lambda m: setattr(m, "between", b"\0" * 64)),
      E(3, CORRUPT, r"do not form a data descriptor")),
    C("zip-comment-length-lie", ("Z9",), "zip", zip_edit(lambda m: setattr(m, "eocd_comment_len", 40)),
      E(3, CORRUPT, r"comment length 40 runs past the end of the file")),
    C("zip-comment", ("Z9",), "zip", zip_edit(lambda m: setattr(m, "comment", b"hello")), E(0)),
    C("zip-prefix-bytes", ("Z9", "Z1"), "zip", zip_edit(lambda m: setattr(m, "prefix", b"\0" * 64)),
      E(3, UNSUP, r"byte 0: unrecognized format")),
    C("zip-name-dotdot", ("Z10",), "zip", zip_edit(lambda m: m.find("byteorder").rename("base/../byteorder")),
      E(3, CORRUPT, r"'\.\.' component")),
    C("zip-name-absolute", ("Z10",), "zip", zip_edit(lambda m: [e.rename(b"/" + e.c_name) for e in m.entries]),
      E(3, CORRUPT, r"absolute")),
    C("zip-name-nul", ("Z10",), "zip", zip_edit(lambda m: m.find("byteorder").rename(b"base/byte\0order")),
      E(3, CORRUPT, r"NUL")),
    C("zip-name-not-utf8", ("Z10",), "zip", zip_edit(lambda m: [
        m.find("byteorder").rename(b"base/\xffbyteorder"),
        setattr(m.find("byteorder"), "l_flags", 8), setattr(m.find("byteorder"), "c_flags", 8)]),
      E(3, CORRUPT, r"UTF-8")),
    C("zip-symlink-entry", ("Z10",), "zip", zip_edit(_symlink), E(3, CORRUPT, r"symbolic link")),
    C("zip-unknown-record-name", ("Z10",), "zip", zip_edit(lambda m: _add_entry_like(m, "byteorder", "base/notes.txt",
                                                                                    b"hello")), E(0)),
    # a code/ record makes the archive TorchScript (security.md P11's rule); without constants.pkl
    # no TorchScript loader can read it, and every verb says so before LibTorch is involved
    C("zip-code-record-makes-torchscript", ("P11", "Z10"), "zip", zip_edit(lambda m: _add_entry_like(
        m, "byteorder", "base/code/evil.py", b"import os\n")), E(3, CORRUPT, r"code/evil\.py makes this a TorchScript archive")),
    C("zip-unaligned-records", ("Z11",), "zip", zip_edit(lambda m: [
        (setattr(e, "l_extra", b""), setattr(e, "realign", False)) for e in m.entries]), E(0)),
    C("zip-version-plus-sign", ("Z12",), "zip", lambda b: H.replace_record(b.zip, "/version", b"+3"), E(3, CORRUPT, r"version")),
    C("zip-version-space", ("Z12",), "zip", lambda b: H.replace_record(b.zip, "/version", b" 3"), E(3, CORRUPT, r"version")),
    C("zip-version-suffix", ("Z12",), "zip", lambda b: H.replace_record(b.zip, "/version", b"3x"), E(3, CORRUPT, r"version")),
    C("zip-version-huge", ("Z12",), "zip",
      lambda b: H.replace_record(b.zip, "/version", b"99999999999999999999"), E(3, CORRUPT, r"version")),
    C("zip-byteorder-middle", ("Z12",), "zip", lambda b: H.replace_record(b.zip, "byteorder", b"middle"),
      E(3, CORRUPT, r"byteorder")),
    C("zip-storage-alignment-junk", ("Z12",), "zip", lambda b: H.replace_record(b.zip, ".storage_alignment", b"6 4"),
      E(3, CORRUPT, r"\.storage_alignment is not an integer")),
    # ---------------------------------------------------------------- format routing
    C("route-7z-wrapper", ("Z1", "P5"), "zip", lambda b: H.sevenzip_store("model.pt", b.zip), E(3, UNSUP, r"7z archive"),
      materialize=True),
    C("route-png-named-pt", ("Z1",), "zip", lambda b: H.png_bytes(), E(3, UNSUP, r"PNG image")),
    C("route-png-zip-polyglot", ("Z1", "Z9"), "zip", zip_edit(lambda m: setattr(m, "prefix", H.png_bytes())),
      E(3, UNSUP, r"PNG image")),
    C("route-zip-then-pickle-polyglot", ("Z1", "Z9"), "zip",
      lambda b: b.zip + H.p(PROTO, b"cposix\nsystem\n", H.binunicode("true"), b"\x85R."), E(3, CORRUPT, r"trailing data after the end of central directory record")),
    C("route-legacy-then-zip-polyglot", ("Z1", "P6"), "legacy", lambda b: b.legacy + b.zip, E(3, CORRUPT, r"unexpected bytes after the last storage")),
    C("route-legacy-with-fake-eocd", ("Z1",), "legacy", lambda b: b.legacy_fake_eocd, E(0)),
    C("route-safetensors-then-zip-polyglot", ("Z1", "S5", "S9"), "st", lambda b: b.st + b.zip, E(3, CORRUPT, r"bytes after the last tensor")),
    C("route-zip-named-safetensors", ("Z1",), "zip", lambda b: b.zip, E(0), suffix=".safetensors"),
    C("route-safetensors-named-pt", ("Z1",), "st", lambda b: b.st, E(0), suffix=".pt"),
    C("route-torchscript-to-rekey", ("P11",), "ts", lambda b: b.ts, E(0),
      verbs={"rekey-out": E(3, UNSUP, r"TorchScript"), "rekey-dry": E(3, UNSUP, r"TorchScript")},
      twin=lambda b: b.zip),
    C("route-legacy-tar", ("P7",), "legacy", lambda b: H.legacy_tar(b.legacy), E(3, UNSUP, r"byte 257: tar archive: .*legacy tar format")),
    # ---------------------------------------------------------------- legacy streams
    C("legacy-computed-magic", ("P6",), "legacy", _legacy_computed_magic, E(3, UNSUP, r"byte 0: bare pickle stream.*builtins\.int"),
      materialize=True),
    C("legacy-trailing-bytes", ("P6",), "legacy", lambda b: b.legacy + b"\0" * 16, E(3, CORRUPT, r"16 unexpected bytes after the last storage")),
    C("legacy-storage-size-past-eof", ("P6", "P8"), "legacy", _legacy_storage_size, E(3, CORRUPT, r"elements on disk, \d+ in the pickle")),
    C("legacy-truncated", ("P5", "P6"), "legacy", lambda b: b.legacy[:-40], E(3, CORRUPT, r"runs past the end of the file")),
    # ---------------------------------------------------------------- TorchScript
    C("ts-constants-pkl-broken", ("P11", "P5"), "ts",
      lambda b: H.replace_record(b.ts, "constants.pkl", H.record(b.ts, "constants.pkl")[:-3]), E(3, CORRUPT, r"truncated pickle")),
    # ckptool's own pass finds the global and refuses the archive before LibTorch sees it
    C("ts-data-pkl-unsafe-global", ("P11", "P1"), "ts", lambda b: H.replace_record(b.ts, "/data.pkl", H.p(
        PROTO, b"cposix\nsystem\n", H.binunicode("true"), b"\x85R.")),
      E(3, UNSAFE, r"data\.pkl names globals outside TorchScript's own: posix\.system \(not handed to LibTorch"),
      verbs={"verify": E(1, None, r"unsafe global posix\.system")}),
    # ---------------------------------------------------------------- safetensors
    C("st-file-shorter-than-8-bytes", ("S1",), "st", lambda b: b.st[:5], E(3, UNSUP, r"unrecognized format")),
    C("st-header-length-past-eof", ("S1",), "st", lambda b: struct.pack("<Q", len(b.st)) + b.st[8:],
      E(3, CORRUPT, r"byte 0: safetensors: header length \d+ runs past the end of the file")),
    C("st-header-too-large", ("S1", "S8"), "st", lambda b: struct.pack("<Q", 100_000_001) + b.st[8:],
      E(3, CORRUPT, r"byte 0: safetensors: header length 100000001 exceeds the format's maximum"), materialize=True),
    C("st-header-not-utf8", ("S2",), "st", st_header(b'{"a\xff":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"ill-formed UTF-8")),
    C("st-header-not-json", ("S2",), "st", st_header("{not json}"), E(3, CORRUPT, r"header is not valid JSON")),
    C("st-header-trailing-comma", ("S2",), "st",
      st_header('{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},}', 24), E(3, CORRUPT, r"header is not valid JSON")),
    C("st-header-nan", ("S2",), "st", st_header('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"header is not valid JSON")),
    C("st-header-comment", ("S2",), "st", st_header('{/*c*/"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"header is not valid JSON")),
    C("st-header-deep-json-100k", ("S2", "P8"), "st", st_header(
        '{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":' + "[" * 100_000
        + "]" * 100_000 + "}}", 24), E(3, CORRUPT, r"not a string")),
    C("st-header-leading-and-trailing-whitespace", ("S2",), "st", lambda b: H.write_st_raw(
        b"  \n" + b.st[8:8 + struct.unpack_from("<Q", b.st)[0]] + b"\t\r\n", H.Safetensors.parse(b.st).data), E(0)),
    C("st-duplicate-key", ("S3",), "st", st_header(
        '{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"duplicate key 'a'"), materialize=True),
    C("st-metadata-not-string", ("S4",), "st", st_edit(lambda s: s.header.__setitem__("__metadata__", {"format": 1})),
      E(3, CORRUPT, r"metadata")),
    C("st-overlap", ("S5",), "st", st_edit(lambda s: s.header["a"].__setitem__("data_offsets", [8, 32])),
      E(3, CORRUPT, r"overlaps the previous tensor"), materialize=True),
    C("st-gap", ("S5",), "st", st_edit(lambda s: [s.header[k].__setitem__("data_offsets", [x + 8 for x in s.header[k]["data_offsets"]])
                                              for k in s.header if k != "__metadata__"] and setattr(s, "data", s.data + b"\0" * 8)),
      E(3, CORRUPT, r"unused bytes before tensor")),
    C("st-trailing-bytes", ("S5", "S9"), "st", lambda b: b.st + b"\0" * 8, E(3, CORRUPT, r"8 bytes after the last tensor")),
    C("st-begin-after-end", ("S5",), "st", st_header('{"a":{"dtype":"F32","shape":[0],"data_offsets":[24,0]}}', 24),
      E(3, CORRUPT, r"end before they begin")),
    C("st-offset-negative", ("S5",), "st", st_header('{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[-24,0]}}', 24),
      E(3, CORRUPT, r"negative value -24")),
    C("st-offset-float", ("S5",), "st", st_header('{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24.0]}}', 24),
      E(3, CORRUPT, r"not a non-negative integer")),
    C("st-offset-exponent", ("S5",), "st", st_header('{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,2.4e1]}}', 24),
      E(3, CORRUPT, r"not a non-negative integer")),
    C("st-shape-overflow", ("S6",), "st",
      st_header('{"a":{"dtype":"F32","shape":[2,18446744073709551614],"data_offsets":[0,24]}}', 24), E(3, CORRUPT, r"overflows")),
    C("st-shape-2x2pow63", ("S6",), "st",
      st_header('{"a":{"dtype":"F32","shape":[2,9223372036854775807],"data_offsets":[0,24]}}', 24), E(3, CORRUPT, r"overflows")),
    C("st-shape-range-mismatch", ("S6",), "st", st_header('{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"spans 24 bytes but F32 \[2, 2\] needs 16")),
    C("st-f4-odd-element-count", ("S6", "S7"), "st", st_header('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', 2),
      E(3, CORRUPT, r"does not fill whole bytes")),
    C("st-negative-shape", ("S6",), "st", st_header('{"a":{"dtype":"F32","shape":[-2,-3],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"negative value -2")),
    C("st-unknown-dtype", ("S7",), "st", st_header('{"a":{"dtype":"F33","shape":[2,3],"data_offsets":[0,24]}}', 24),
      E(3, CORRUPT, r"dtype")),
    C("st-name-longer-than-64KiB", ("S8",), "st", lambda b: H.edit_st(b.st, lambda s: s.header.__setitem__(
        "x" * 70000, s.header.pop("c"))), E(3, LIMIT, r"tensor name of 70000 bytes is longer than 65536")),
]

CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "duplicate case ids"
BY_ID = {c.id: c for c in CASES}


# --------------------------------------------------------------------------- running verbs

EXT = {"zip": ".pt", "legacy": ".pt", "st": ".safetensors", "ts": ".pt"}
LINE_RE = re.compile(r"^ckptool: (?P<kind>[a-z-]+): (?P<rest>.*)$")


def verb_args(verb: str, path: Path, out: Path) -> list:
    return {
        "inspect": ["inspect", path],
        "inspect-json": ["inspect", "--json", path],
        "inspect-crc": ["inspect", "--verify-crc", path],
        "verify": ["verify", "--json", path],
        "rekey-dry": ["rekey", "--dry-run", "--add-prefix", "x.", path],
        "rekey-out": ["rekey", path, "-o", out, "--add-prefix", "x."],
        "rekey-crc": ["rekey", "--verify-crc", path, "-o", out, "--add-prefix", "x."],
        "materialize-meta": ["materialize", "--device", "meta", path],
        "materialize-crc": ["materialize", "--device", "meta", "--verify-crc", path],
    }[verb]


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run_verb(verb: str, path: Path, workdir: Path):
    """Run one verb in a fresh directory; returns (rc, out, err, files left besides path)."""
    out = workdir / ("out" + path.suffix)
    before = sha256(path)
    rc, so, se = run_ckptool(*verb_args(verb, path, out), timeout=30 * TIME_SCALE)
    assert sha256(path) == before, f"{verb} modified its input"
    left = sorted(p.name for p in workdir.iterdir() if p != path)
    return rc, so, se, left


def pairs(twin: bool = False):
    out = []
    for c in CASES:
        for verb in c.expected():
            marks = [pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug and not twin else []
            out.append(pytest.param(c.id, verb, id=f"{c.id}/{verb}", marks=marks))
    return out


@pytest.fixture(scope="module")
def built(bases, tmp_path_factory) -> dict:
    """case id -> (hostile bytes, twin bytes)."""
    out = {}
    for c in CASES:
        hostile = c.build(bases)
        twin = (c.twin or (lambda b: getattr(b, c.base)))(bases)
        out[c.id] = (hostile, twin)
    return out


def _place(data: bytes, d: Path, name: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_bytes(data)
    return p


def check_failure(case: Case, verb: str, exp: Expect, path: Path, rc, so, se, left):
    what = f"{case.id} / {verb}"
    assert rc == exp.rc, f"{what}: exit {rc}, expected {exp.rc}\nstdout: {so[:600]!r}\nstderr: {se[:1200]!r}"
    assert "Traceback" not in se and "terminate called" not in se and "AddressSanitizer" not in se, se
    if verb == "verify" and exp.rc == 1:
        # a failed check: the problems are the JSON document on stdout, stderr stays quiet
        assert se == "", f"{what}: verify wrote to stderr: {se!r}"
        doc = json.loads(so)
        assert doc["ok"] is False and doc["problems"], doc
        hit = [p for p in doc["problems"] if re.search(exp.msg, p)]
        assert hit, f"{what}: no problem matches {exp.msg!r}: {doc['problems']}"
        if exp.kind is not None:
            first = doc["problems"][0]
            assert first.startswith(f"{exp.kind}: {path}: "), f"{what}: problem {first!r}"
        return
    assert so == "", f"{what}: stdout must be empty on failure, got {so[:300]!r}"
    lines = se.rstrip("\n").split("\n")
    assert len(lines) == 1, f"{what}: expected one stderr line, got {se!r}"
    m = LINE_RE.match(lines[0])
    assert m, f"{what}: not 'ckptool: KIND: ...': {lines[0]!r}"
    assert m["kind"] == exp.kind, f"{what}: kind {m['kind']!r}, expected {exp.kind!r}: {lines[0]!r}"
    assert m["rest"].startswith(f"{path}: "), f"{what}: the line does not name the file first: {lines[0]!r}"
    assert re.search(exp.msg, m["rest"]), f"{what}: message does not match {exp.msg!r}: {lines[0]!r}"
    assert not [n for n in left if n.startswith("out") or ".ckptool" in n], f"{what}: files left: {left}"


def check_success(case: Case, verb: str, path: Path, rc, so, se, left, twin: bool):
    what = f"{case.id} / {verb}{' (twin)' if twin else ''}"
    exp = case.expected()[verb]
    assert rc == 0, f"{what}: exit {rc}\nstdout: {so[:600]!r}\nstderr: {se[:1200]!r}"
    if verb == "verify":
        assert json.loads(so)["ok"] is True
    if verb in ("rekey-out", "rekey-crc"):
        assert any(n.startswith("out") for n in left), f"{what}: no output written: {left}"


@pytest.mark.parametrize("case_id,verb", pairs())
def test_case(case_id, verb, built, tmp_path):
    case = BY_ID[case_id]
    exp = case.expected()[verb]
    path = _place(built[case_id][0], tmp_path, "in" + case.suffix)
    runs = [verb] + (["inspect-json"] if verb == "inspect" else [])
    for v in runs:
        for extra in os.listdir(tmp_path):
            if extra != path.name:
                (tmp_path / extra).unlink()
        rc, so, se, left = run_verb(v, path, tmp_path)
        if exp.rc == 0:
            check_success(case, verb, path, rc, so, se, left, twin=False)
        else:
            check_failure(case, v, exp, path, rc, so, se, left)


_twin_cache: dict = {}


@pytest.mark.parametrize("case_id,verb", pairs(twin=True))
def test_twin(case_id, verb, built, tmp_path):
    """The unmodified (or minimal valid) file passes the same verb."""
    case = BY_ID[case_id]
    data = built[case_id][1]
    suffix = EXT[case.base] if case.twin is None or case.base != "ts" else ".pt"
    key = (hashlib.sha256(data).hexdigest(), verb, suffix)
    if key not in _twin_cache:
        path = _place(data, tmp_path, "twin" + suffix)
        _twin_cache[key] = (path,) + run_verb(verb, path, tmp_path)
    path, rc, so, se, left = _twin_cache[key]
    what = f"{case.id} / {verb} (twin)"
    assert rc == 0, f"{what}: exit {rc}\nstdout: {so[:600]!r}\nstderr: {se[:1200]!r}"
    assert "Traceback" not in se
    if verb == "verify":
        assert json.loads(so)["ok"] is True
    if verb in ("rekey-out", "rekey-crc"):
        assert any(n.startswith("out") for n in left), f"{what}: no output written: {left}"


FAILING = [pytest.param(c.id, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.no_offset)] if c.no_offset else [])
           for c in CASES if c.expect.rc != 0 and not c.bug]


@pytest.mark.parametrize("case_id", FAILING)
def test_error_names_a_byte_offset(case_id, built, tmp_path):
    """README: errors are `ckptool: KIND: FILE: byte N: message`; security.md §5.1: the
    message names the byte offset."""
    case = BY_ID[case_id]
    path = _place(built[case_id][0], tmp_path, "in" + case.suffix)
    rc, so, se = run_ckptool("inspect", path, timeout=30 * TIME_SCALE)
    assert re.match(rf"^ckptool: [a-z]+: {re.escape(str(path))}: byte \d+: ", se), \
        f"{case_id}: no byte offset in {se.strip()!r}"


# --------------------------------------------------------------------------- the builders


def test_builders_reproduce_the_clients_bytes(bases):
    """With no edit, hostile.py writes exactly what torch.save / save_file wrote: the twins
    are the clients' own files, and every hostile file differs from one by its edit only."""
    assert H.roundtrip_ok(bases.zip)
    assert H.roundtrip_ok(bases.ts)
    assert H.torch_pickle(_fake_tensors()) == bases.pickle
    assert H.Safetensors.parse(bases.st).serialize() == bases.st
    assert H.ZipModel.parse(bases.zip).offsets()[0] == (0, 64)


def test_every_case_names_known_hazards():
    known = security_hazard_ids()
    for c in CASES:
        assert c.hazards and set(c.hazards) <= known, f"{c.id}: {c.hazards}"


def test_corpus_files_are_pinned():
    """Every file of ../shared/corpora is part of the suite through test_corpora.py, which
    pins an exact exit code for each (and test_corpus_file asserts it)."""
    import test_corpora as TC

    files = TC._files()
    assert len(files) > 100, f"corpora not found at {corpora_dir()}"
    assert set(files) == set(TC.EXPECTED), sorted(set(files) ^ set(TC.EXPECTED))
    assert set(TC.EXPECTED.values()) <= {0, 3}


# --------------------------------------------------------------------------- P5 / P12


class _Touch:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def test_payload_never_runs_and_there_is_no_fallback(bases, tmp_path):
    """P1/P5/P12: a pickle that would create a file when unpickled, whole and broken right
    after its call, through every verb and every flag that relaxes a refusal: the file never
    appears, and no verb offers an unsafe-load fallback."""
    marker = tmp_path / "PWNED"
    pk = H.torch_pickle({**_fake_tensors(), "evil": _Touch(marker)})
    whole = H.replace_record(bases.zip, "data.pkl", pk)
    broken = H.replace_record(bases.zip, "data.pkl", pk[:-2] + b"\xff.")
    for name, data in (("whole.pt", whole), ("broken.pt", broken)):
        p = _place(data, tmp_path, name)
        for args in (["inspect", p], ["inspect", "--json", p], ["verify", p],
                     ["rekey", p, "-o", tmp_path / "o1.pt", "--add-prefix", "x.", "--keep-unsafe"],
                     ["rekey", p, "-o", tmp_path / "o2.pt", "--add-prefix", "x.", "--drop-unsafe"],
                     ["materialize", "--device", "cpu", p]):
            rc, so, se = run_ckptool(*args, timeout=60 * TIME_SCALE)
            assert rc in (0, 1, 3), (args, rc, se)
            assert not marker.exists(), f"ckptool {' '.join(map(str, args))} ran the payload"
            if name == "broken.pt":
                assert rc == (1 if args[0] == "verify" else 3), (args, rc, se)
    for verb in ("inspect", "verify", "rekey", "materialize"):
        rc, so, se = run_ckptool(verb, "--help")
        assert rc == 0
        opts = re.findall(r"--[a-z][a-z0-9-]*", so)
        bad = [o for o in opts if re.search(r"fallback|weights-only|unpickle|pickle-load|trust|unsafe-load|full-load", o)]
        assert not bad, f"{verb} offers {bad}"


def test_unknown_record_is_reported(built, tmp_path):
    """security.md Z10: torch.load ignores records torch.save never writes; inspect names them."""
    p = _place(built["zip-unknown-record-name"][0], tmp_path, "in.pt")
    rc, so, se = run_ckptool("inspect", "--json", p)
    assert rc == 0, se
    assert json.loads(so)["unknown_records"] == ["notes.txt"]
    rc, so, se = run_ckptool("inspect", p)
    assert rc == 0 and "records torch.save never writes" in so and "  notes.txt" in so, so
    twin = _place(built["zip-unknown-record-name"][1], tmp_path, "twin.pt")
    rc, so, se = run_ckptool("inspect", "--json", twin)
    assert rc == 0 and json.loads(so)["unknown_records"] == []


def test_broken_pickle_names_globals_seen_before_the_error(bases, tmp_path):
    p = _place(H.replace_record(bases.zip, "data.pkl", BROKEN_AFTER_PAYLOAD), tmp_path, "in.pt")
    rc, so, se = run_ckptool("inspect", p)
    assert rc == 3
    assert "posix.system" in se, se


# --------------------------------------------------------------------------- S10 / W3


def test_safetensors_rewrite_onto_itself(bases, tmp_path):
    """safetensors #762: save_file(load_file(p), p) zero-filled p. rekey refuses OUT == IN
    without --force; with --force the file is replaced by a rename, never truncated."""
    from safetensors.torch import load_file

    p = _place(bases.st, tmp_path, "m.safetensors")
    rc, so, se = run_ckptool("rekey", p, "-o", p, "--add-prefix", "x.")
    assert rc == 2 and "--force" in se and p.read_bytes() == bases.st
    ino = os.stat(p).st_ino
    rc, so, se = run_ckptool("rekey", p, "-o", p, "--add-prefix", "x.", "--force")
    assert rc == 0, se
    assert os.stat(p).st_ino != ino, "replaced in place, not by a rename"
    got = load_file(str(p))
    assert sorted(got) == ["x.a", "x.b", "x.c"] and torch.equal(got["x.a"], torch.arange(6.0).reshape(2, 3))
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


# --------------------------------------------------------------------------- the hazard map

SECURITY_MD = SOURCE_DIR / "docs" / "security.md"
HAZARDS_MD = SOURCE_DIR / "docs" / "hazards.md"
REF_RE = re.compile(r"`([^`]+?)`")


def security_hazard_ids() -> set:
    text = SECURITY_MD.read_text()
    return set(re.findall(r"^\*\*([PZSW]\d+)\.", text, re.M))


def hazard_rows() -> dict:
    """hazard id -> the text of its row in docs/hazards.md."""
    rows = {}
    for line in HAZARDS_MD.read_text().splitlines():
        m = re.match(r"^\|\s*([PZSW]\d+)\s*\|", line)
        if m:
            assert m[1] not in rows, f"{m[1]} has two rows"
            rows[m[1]] = line
    return rows


def _test_exists(ref: str) -> str | None:
    """None if the reference names a test that exists, else why not. Forms:
    tests/py/FILE.py::test_name[param], tests/unit/FILE.cpp::"doctest case name",
    fuzz:fuzz_<target>."""
    if ref.startswith("fuzz:"):
        targets = re.search(r"set\(CKPT_FUZZ_TARGETS ([^)]*)\)", (SOURCE_DIR / "fuzz" / "CMakeLists.txt").read_text())
        ok = ref[5:].removeprefix("fuzz_") in targets[1].split()
        return None if ok else f"no fuzz target {ref}"
    path, sep, name = ref.partition("::")
    f = SOURCE_DIR / path
    if not sep or not f.is_file():
        return f"no file {path}"
    src = f.read_text()
    if path.endswith(".cpp"):
        return None if f"TEST_CASE({name}" in src else f"no TEST_CASE({name}) in {path}"
    m = re.fullmatch(r"(\w+)(?:\[(.+)\])?", name)
    if not m:
        return f"cannot parse {name!r}"
    func, param = m[1], m[2]
    if not re.search(rf"^def {func}\(", src, re.M):
        return f"no def {func} in {path}"
    if param:
        if path.endswith("test_corruption.py"):
            case = param.split("/")[0]
            if case not in BY_ID:
                return f"no case {case} in CASES"
            if "/" in param and param.split("/", 1)[1] not in BY_ID[case].expected():
                return f"case {case} has no verb {param.split('/', 1)[1]}"
        elif param not in src and not (corpora_dir() / param).is_file():
            return f"parameter {param!r} of {func} not found"
    return None


def test_hazard_map_covers_every_hazard():
    ids = security_hazard_ids()
    assert len(ids) >= 40, f"hazard ids not found in {SECURITY_MD}"
    rows = hazard_rows()
    missing = sorted(ids - set(rows), key=lambda h: (h[0], int(h[1:])))
    assert not missing, f"docs/hazards.md has no row for {missing}"
    unknown = sorted(set(rows) - ids)
    assert not unknown, f"docs/hazards.md maps hazards security.md does not define: {unknown}"
    for h, row in rows.items():
        refs = REF_RE.findall(row)
        assert refs or "not applicable:" in row, f"{h}: neither a test nor 'not applicable: why'"


def test_hazard_map_references_exist():
    problems = []
    for h, row in hazard_rows().items():
        for ref in REF_RE.findall(row):
            if "::" in ref or ref.startswith("fuzz:"):
                why = _test_exists(ref)
                if why:
                    problems.append(f"{h}: {ref}: {why}")
    assert not problems, "\n".join(problems)


def test_every_case_is_in_the_hazard_map():
    """Each case shows up in the map under (at least) the hazards it claims."""
    rows = hazard_rows()
    for c in CASES:
        for h in c.hazards:
            assert h in rows, h
    mapped = {m.split("[", 1)[1].split("/")[0].rstrip("]")
              for row in rows.values() for m in REF_RE.findall(row) if m.startswith("tests/py/test_corruption.py::test_case[")}
    assert mapped <= set(BY_ID), sorted(mapped - set(BY_ID))
