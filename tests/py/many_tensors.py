"""A torch.save archive of N one-element tensors, written fast (issue 11 item 14).

torch.save of a dict of a million tensors takes about 40 s; this writes the same archive in a
few seconds: the pickle comes from Python's own pickler driven the way torch.save drives it
(protocol 2, `_rebuild_tensor_v2` reduce calls, ('storage', torch.FloatStorage, key, 'cpu', 1)
persistent ids, memo included), and the records are laid out as PyTorchStreamWriter lays them
out (data.pkl, .format_version, .storage_alignment, byteorder, data/0 .. data/N-1, version,
.data/serialization_id; data aligned to 64 bytes; ZIP64 end records). torch.load reads it;
the tests check that on every file they make.

Tensor i is named `model.layers.{i // 8}.sub{i % 8}.weight` and holds float(i).

    python tests/py/many_tensors.py N OUT    # e.g. 1000000 /tmp/m1.pt for the benchmark
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import zlib

import torch

ALIGN = 64


def key_of(i: int) -> str:
    return f"model.layers.{i // 8}.sub{i % 8}.weight"


class _Storage:
    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key


class _Tensor:
    """Pickles as torch.save pickles a contiguous one-element float32 CPU tensor."""
    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key

    def __reduce_ex__(self, protocol):
        return (torch._utils._rebuild_tensor_v2,
                (_Storage(self.key), 0, (1,), (1,), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", 1)
        return None


def data_pickle(n: int) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump({key_of(i): _Tensor(str(i)) for i in range(n)})
    return buf.getvalue()


class _ZipWriter:
    """Stored records, names under one folder, data aligned as torch aligns it."""

    def __init__(self, f, prefix: str):
        self.f, self.prefix, self.pos, self.central = f, prefix, 0, []

    def add(self, record: str, data: bytes) -> None:
        name = f"{self.prefix}/{record}".encode()
        start = self.pos + 30 + len(name) + 4
        pad = (ALIGN - start % ALIGN) % ALIGN
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zlib.crc32(data)
        head = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0x800, 0, 0, 0, crc, len(data), len(data),
                           len(name), len(extra))
        self.f.write(head + name + extra + data)
        self.central.append((name, crc, len(data), self.pos))
        self.pos += len(head) + len(name) + len(extra) + len(data)

    def finish(self) -> None:
        cd_offset, parts = self.pos, []
        for name, crc, size, offset in self.central:
            parts.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0x800, 0, 0, 0, crc, size, size,
                                     len(name), 0, 0, 0, 0, 0, offset) + name)
        cd = b"".join(parts)
        self.f.write(cd)
        n, zip64_end = len(self.central), cd_offset + len(cd)
        self.f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), cd_offset))
        self.f.write(struct.pack("<IIQI", 0x07064B50, 0, zip64_end, 1))
        self.f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                                 min(len(cd), 0xFFFFFFFF), min(cd_offset, 0xFFFFFFFF), 0))


def write(path, n: int) -> None:
    with open(path, "wb") as f:
        z = _ZipWriter(f, "archive")
        z.add("data.pkl", data_pickle(n))
        z.add(".format_version", b"1")
        z.add(".storage_alignment", b"64")
        z.add("byteorder", b"little")
        for i in range(n):
            z.add(f"data/{i}", struct.pack("<f", float(i)))
        z.add("version", b"3\n")
        z.add(".data/serialization_id", b"0" * 40)
        z.finish()


if __name__ == "__main__":
    write(sys.argv[2], int(sys.argv[1]))
