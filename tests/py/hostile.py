"""Byte-level surgery on files the real clients wrote, for the corruption and resource-limit
suites (test_corruption.py, test_resource_limits.py).

Nothing here looks at ckptool. Every hostile file starts from a VALID file written by
torch.save / safetensors.torch.save_file and changes one thing:

  * ZipModel: parses a torch.save zip (local headers, data, data descriptors, central
    directory, ZIP64 end records) into editable fields and writes it back. With no edit the
    output is byte-identical to the input (checked by `roundtrip_ok`), so the success twin of
    a zip edit is the unmodified torch.save file. Records stay 64-byte aligned with torch's
    FB padding when names or sizes change.
  * torch_pickle(): the data.pkl torch.save writes, produced by the standard Pickler from
    stand-in tensors whose storage / offset / size / stride / dtype can be set to anything;
    with the real tensors' values it is byte-identical to torch.save's data.pkl (checked).
  * Safetensors: header JSON + data, re-serialized the way safetensors does (compact JSON,
    space padding to 8 bytes), byte-identical to save_file's output when unchanged.
  * p(): a tiny pickle assembler for the opcode-level cases.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import warnings
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

# --------------------------------------------------------------------------- zip

LOCAL_SIG = b"PK\x03\x04"
CENTRAL_SIG = b"PK\x01\x02"
DESC_SIG = b"PK\x07\x08"
EOCD_SIG = b"PK\x05\x06"
EOCD64_SIG = b"PK\x06\x06"
LOC64_SIG = b"PK\x06\x07"


@dataclass
class Entry:
    # local header
    l_ver: int
    l_flags: int
    l_method: int
    l_time: int
    l_date: int
    l_crc: int
    l_csize: int
    l_usize: int
    l_name: bytes
    l_extra: bytes
    data: bytes
    desc: bytes  # the data descriptor as written (b"" if none)
    # central directory entry
    c_made: int
    c_ver: int
    c_flags: int
    c_method: int
    c_time: int
    c_date: int
    c_crc: int
    c_csize: int
    c_usize: int
    c_name: bytes
    c_extra: bytes
    c_comment: bytes
    c_disk: int
    c_iattr: int
    c_eattr: int
    c_offset: int | None = None  # None: wherever the local header lands
    after: bytes = b""  # bytes after the record (none in torch files)
    realign: bool = True  # recompute the FB padding so data stays 64-byte aligned
    skip: bool = False  # write no local record (c_offset must point somewhere else)

    @property
    def name(self) -> str:
        return self.c_name.decode("utf-8", "surrogateescape")

    def set_data(self, data: bytes, crc: int | None = None):
        """Replace the payload; CRC and sizes follow in the central entry and the descriptor
        (and in the local header if it carries them)."""
        self.data = data
        c = zlib.crc32(data) if crc is None else crc
        self.c_crc, self.c_csize, self.c_usize = c, len(data), len(data)
        if self.desc:
            self.desc = DESC_SIG + struct.pack("<III", c, len(data), len(data))
        if not (self.l_flags & 8) or self.l_crc:
            self.l_crc, self.l_csize, self.l_usize = c, len(data), len(data)

    def rename(self, name: bytes | str):
        if isinstance(name, str):
            name = name.encode()
        self.l_name = self.c_name = name


@dataclass
class ZipModel:
    entries: list[Entry]
    prefix: bytes = b""  # bytes before the first local header
    between: bytes = b""  # bytes between the last record and the central directory
    zip64: bool = True  # write the ZIP64 end record and locator (torch always does)
    eocd64_head: bytes = b""  # made_by, needed, disk, cd_disk of the ZIP64 end record
    comment: bytes = b""
    trailer: bytes = b""  # bytes after the end record
    # overrides for the end records (None: computed)
    eocd_count: int | None = None
    eocd_cd_size: int | None = None
    eocd_cd_offset: int | None = None
    eocd_comment_len: int | None = None
    eocd64_cd_offset: int | None = None

    @staticmethod
    def parse(raw: bytes) -> "ZipModel":
        eocd = raw.rfind(EOCD_SIG)
        assert eocd >= 0, "no end record"
        (_, _, _, n_this, n_total, cd_size, cd_off, clen) = struct.unpack_from("<IHHHHIIH", raw, eocd)
        comment = raw[eocd + 22:eocd + 22 + clen]
        zip64 = raw[eocd - 20:eocd - 16] == LOC64_SIG
        head = b""
        if zip64:
            off64 = struct.unpack_from("<Q", raw, eocd - 20 + 8)[0]
            assert raw[off64:off64 + 4] == EOCD64_SIG
            head = raw[off64 + 12:off64 + 24]
            n_total, cd_size, cd_off = struct.unpack_from("<QQQ", raw, off64 + 32)
        entries = []
        first = len(raw)
        pos = cd_off
        for _ in range(n_total):
            assert raw[pos:pos + 4] == CENTRAL_SIG
            (_, made, ver, flags, method, tm, dt, crc, cs, us, nl, el, cl, disk, iattr, eattr,
             off) = struct.unpack_from("<IHHHHHHIIIHHHHHII", raw, pos)
            name = raw[pos + 46:pos + 46 + nl]
            extra = raw[pos + 46 + nl:pos + 46 + nl + el]
            ccomment = raw[pos + 46 + nl + el:pos + 46 + nl + el + cl]
            pos += 46 + nl + el + cl
            real_cs, real_off = cs, off
            big = False
            x = 0
            while x + 4 <= len(extra):  # the ZIP64 extra field, if any
                tag, ln = struct.unpack_from("<HH", extra, x)
                if tag == 1:
                    big = True
                    vals = list(struct.unpack_from("<%dQ" % (ln // 8), extra, x + 4))
                    if us == 0xFFFFFFFF:
                        vals.pop(0)
                    if cs == 0xFFFFFFFF:
                        real_cs = vals.pop(0)
                    if off == 0xFFFFFFFF:
                        real_off = vals.pop(0)
                x += 4 + ln
            first = min(first, real_off)
            (_, lver, lflags, lmethod, ltm, ldt, lcrc, lcs, lus, lnl, lel) = struct.unpack_from(
                "<IHHHHHIIIHH", raw, real_off)
            lname = raw[real_off + 30:real_off + 30 + lnl]
            lextra = raw[real_off + 30 + lnl:real_off + 30 + lnl + lel]
            d0 = real_off + 30 + lnl + lel
            data = raw[d0:d0 + real_cs]
            desc = b""
            if lflags & 8:
                dl = 24 if big else 16
                desc = raw[d0 + real_cs:d0 + real_cs + dl]
            entries.append(Entry(lver, lflags, lmethod, ltm, ldt, lcrc, lcs, lus, lname, lextra, data,
                                 desc, made, ver, flags, method, tm, dt, crc, cs, us, name, extra,
                                 ccomment, disk, iattr, eattr, None))
        if not entries:
            first = cd_off
        m = ZipModel(entries, prefix=raw[:first], zip64=zip64, eocd64_head=head, comment=comment,
                     trailer=raw[eocd + 22 + clen:])
        return m

    def serialize(self) -> bytes:
        out = bytearray(self.prefix)
        offsets = []
        for e in self.entries:
            off = len(out)
            offsets.append(off)
            if e.skip:
                continue
            extra = e.l_extra
            if e.realign and extra[:2] == b"FB":
                pad = (-(off + 30 + len(e.l_name) + 4)) % 64
                extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            out += struct.pack("<IHHHHHIIIHH", 0x04034B50, e.l_ver, e.l_flags, e.l_method, e.l_time,
                               e.l_date, e.l_crc, e.l_csize, e.l_usize, len(e.l_name), len(extra))
            out += e.l_name + extra + e.data + e.desc + e.after
        out += self.between
        cd_off = len(out)
        for e, off in zip(self.entries, offsets):
            o = off if e.c_offset is None else e.c_offset
            out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, e.c_made, e.c_ver, e.c_flags, e.c_method,
                               e.c_time, e.c_date, e.c_crc, e.c_csize, e.c_usize, len(e.c_name),
                               len(e.c_extra), len(e.c_comment), e.c_disk, e.c_iattr, e.c_eattr, o)
            out += e.c_name + e.c_extra + e.c_comment
        cd_size = len(out) - cd_off
        n = len(self.entries) if self.eocd_count is None else self.eocd_count
        size = cd_size if self.eocd_cd_size is None else self.eocd_cd_size
        where = cd_off if self.eocd_cd_offset is None else self.eocd_cd_offset
        if self.zip64:
            e64 = len(out)
            where64 = where if self.eocd64_cd_offset is None else self.eocd64_cd_offset
            out += EOCD64_SIG + struct.pack("<Q", 44) + (self.eocd64_head or bytes(12))
            out += struct.pack("<QQQQ", n, n, size, where64)
            out += LOC64_SIG + struct.pack("<IQI", 0, e64, 1)
        clen = len(self.comment) if self.eocd_comment_len is None else self.eocd_comment_len
        out += EOCD_SIG + struct.pack("<HHHHIIH", 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                                      min(size, 0xFFFFFFFF), min(where, 0xFFFFFFFF), clen)
        out += self.comment + self.trailer
        return bytes(out)

    # -- conveniences
    def find(self, suffix: str) -> Entry:
        for e in self.entries:
            if e.name.endswith(suffix):
                return e
        raise KeyError(suffix)

    def index(self, suffix: str) -> int:
        return next(i for i, e in enumerate(self.entries) if e.name.endswith(suffix))

    def offsets(self) -> list[tuple[int, int]]:
        """(local header offset, data offset) of every entry in serialize()'s output."""
        raw = self.serialize()
        z = ZipModel.parse(raw)
        out = []
        pos = len(self.prefix)
        for e in z.entries:
            out.append((pos, pos + 30 + len(e.l_name) + len(e.l_extra)))
            pos += 30 + len(e.l_name) + len(e.l_extra) + len(e.data) + len(e.desc) + len(e.after)
        return out

    def central_offset(self) -> int:
        raw = self.serialize()
        return struct.unpack_from("<I", raw, raw.rfind(EOCD_SIG) + 16)[0]


def roundtrip_ok(raw: bytes) -> bool:
    return ZipModel.parse(raw).serialize() == raw


def edit_zip(raw: bytes, fn) -> bytes:
    m = ZipModel.parse(raw)
    fn(m)
    return m.serialize()


def replace_record(raw: bytes, suffix: str, data: bytes) -> bytes:
    return edit_zip(raw, lambda m: m.find(suffix).set_data(data))


# --------------------------------------------------------------------------- torch pickles


class FakeStorage:
    def __init__(self, key: str, storage_type, numel: int, location: str = "cpu"):
        self.key, self.storage_type, self.numel, self.location = key, storage_type, numel, location


class FakeTensor:
    """Pickles as torch.save pickles a tensor: _rebuild_tensor_v2(storage, offset, size,
    stride, requires_grad, OrderedDict()), the storage as a persistent id."""

    def __init__(self, storage: FakeStorage, offset: int, size, stride, requires_grad=False):
        self.storage, self.offset = storage, offset
        self.size, self.stride, self.requires_grad = tuple(size), tuple(stride), requires_grad

    def __reduce_ex__(self, proto):
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, self.offset, self.size, self.stride, self.requires_grad, OrderedDict()))


_STORAGE = "storage"


class _TorchPickler(pickle.Pickler):
    def __init__(self, f, persid_override=None):
        super().__init__(f, protocol=2)
        self._ids: dict = {}
        self._override = persid_override

    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            if self._override is not None:
                return self._override(obj)
            if id(obj) not in self._ids:
                self._ids[id(obj)] = (_STORAGE, obj.storage_type, obj.key, obj.location, obj.numel)
            return self._ids[id(obj)]
        return None


def torch_pickle(obj, persid_override=None) -> bytes:
    """data.pkl for obj (FakeTensors inside), as torch.save writes it."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _TorchPickler(buf, persid_override).dump(obj)
    return buf.getvalue()


def save(obj, path: Path, **kw) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, **kw)
    return path


def record(raw: bytes, suffix: str) -> bytes:
    return ZipModel.parse(raw).find(suffix).data


# --------------------------------------------------------------------------- pickle assembly


def p(*parts) -> bytes:
    """Concatenate opcodes: bytes as they are, str as UTF-8."""
    return b"".join(x.encode() if isinstance(x, str) else x for x in parts)


def binunicode(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def binint(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


# --------------------------------------------------------------------------- safetensors


@dataclass
class Safetensors:
    header: dict
    data: bytes
    header_text: bytes | None = None  # set to write these bytes instead of json.dumps(header)
    length: int | None = None  # set to declare another header length

    @staticmethod
    def parse(raw: bytes) -> "Safetensors":
        n = struct.unpack_from("<Q", raw)[0]
        return Safetensors(json.loads(raw[8:8 + n], object_pairs_hook=OrderedDict), raw[8 + n:])

    def serialize(self) -> bytes:
        if self.header_text is None:
            text = json.dumps(self.header, separators=(",", ":"), ensure_ascii=False).encode()
            text += b" " * ((-len(text)) % 8)
        else:
            text = self.header_text
        n = len(text) if self.length is None else self.length
        return struct.pack("<Q", n) + text + self.data


def edit_st(raw: bytes, fn) -> bytes:
    s = Safetensors.parse(raw)
    fn(s)
    return s.serialize()


def write_st_raw(header_text: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + data


# --------------------------------------------------------------------------- other containers


def png_bytes(width: int = 2, height: int = 2) -> bytes:
    """A valid PNG image (8-bit grey)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _7z_number(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    if n < 0x4000:
        return bytes([0x80 | (n >> 8), n & 0xFF])
    assert n < (1 << 56)
    return b"\xff" + struct.pack("<Q", n)[:8]


def sevenzip_store(name: str, payload: bytes) -> bytes:
    """A 7z archive holding `payload` as file `name`, with the Copy coder (stored): the
    payload sits verbatim right after the 32-byte signature header, as in the nullifAI
    uploads (a torch.save zip inside a 7z)."""
    num = _7z_number
    header = bytearray()
    header += b"\x01"  # kHeader
    header += b"\x04"  # kMainStreamsInfo
    header += b"\x06" + num(0) + num(1) + b"\x09" + num(len(payload)) + b"\x00"  # kPackInfo
    header += b"\x07" + b"\x0b" + num(1) + b"\x00"  # kUnPackInfo, kFolder, 1 folder, not external
    header += num(1) + b"\x01" + b"\x00"  # 1 coder: simple, id size 1, id 0x00 (Copy)
    header += b"\x0c" + num(len(payload)) + b"\x00"  # kCodersUnPackSize, kEnd
    header += b"\x08" + b"\x0a" + b"\x01" + struct.pack("<I", zlib.crc32(payload)) + b"\x00"  # kSubStreamsInfo: CRC
    header += b"\x00"  # end of streams info
    names = name.encode("utf-16-le") + b"\x00\x00"
    header += b"\x05" + num(1)  # kFilesInfo, 1 file
    header += b"\x11" + num(len(names) + 1) + b"\x00" + names  # kName, not external
    header += b"\x00"  # end of files info
    header += b"\x00"  # end of header
    header = bytes(header)
    start = struct.pack("<QQI", len(payload), len(header), zlib.crc32(header))
    sig = b"7z\xbc\xaf\x27\x1c" + b"\x00\x04" + struct.pack("<I", zlib.crc32(start)) + start
    return sig + payload + header


def legacy_tar(legacy: bytes) -> bytes:
    """A tar shaped like PyTorch <= 0.1.10's format (members sys_info, pickle, storages,
    tensors), filled with pieces of a legacy stream."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, body in (("sys_info", pickle.dumps({"protocol_version": 1001, "little_endian": True,
                                                     "type_sizes": {"short": 2, "int": 4, "long": 4}},
                                                    protocol=2)),
                           ("pickle", legacy[:256]), ("storages", b"\x80\x02K\x00."),
                           ("tensors", b"\x80\x02K\x00.")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mtime = 0
            t.addfile(info, io.BytesIO(body))
    return buf.getvalue()
