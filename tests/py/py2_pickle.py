"""A pickle module that writes what Python 2's cPickle wrote, for fixtures of the many
pre-2020 checkpoints saved under Python 2 (torch 0.4-1.4). Pass it to torch.save as
`pickle_module=py2_pickle` (any protocol 0-2, either serialization format).

Where its output differs from Python 3's pickle at the same protocol, it follows Python 2:
- str is Python 2's str: SHORT_BINSTRING / BINSTRING ('U', 'T'), or STRING ('S') at
  protocol 0, not BINUNICODE / UNICODE;
- collections.OrderedDict reduces as Python 2.7's OrderedDict.__reduce__ did:
  (OrderedDict, ([[key, value], ...],)), plus the instance dict as BUILD state when it has
  one (a state dict's _metadata), instead of Python 3's (OrderedDict, ()) + SETITEMS;
- globals use Python 2 names (__builtin__, copy_reg), as pickle's fix_imports writes them
  below protocol 3; objects without __reduce__ go through copy_reg._reconstructor below
  protocol 2 and NEWOBJ (copy_reg.__newobj__) at 2, as in Python 2.
Memoization (BINPUT / PUT after each container, string and global) is the pure-Python
pickler's, which is cPickle's.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
from collections import OrderedDict

__name__ = "py2_pickle"  # torch.save looks at pickle_module.__name__ (dill check)


def _py2_repr(data: bytes) -> bytes:
    """repr() of a Python 2 str, the operand of protocol 0's STRING opcode."""
    quote = b'"' if b"'" in data and b'"' not in data else b"'"
    out = bytearray(quote)
    for c in data:
        ch = bytes([c])
        if ch == quote or ch == b"\\":
            out += b"\\" + ch
        elif ch == b"\t":
            out += b"\\t"
        elif ch == b"\n":
            out += b"\\n"
        elif ch == b"\r":
            out += b"\\r"
        elif c < 0x20 or c >= 0x7F:
            out += b"\\x%02x" % c
        else:
            out += ch
    return bytes(out + quote)


def _ordered_dict_reduce(od):
    # Python 2.7 Lib/collections.py, OrderedDict.__reduce__.
    items = [[k, od[k]] for k in od]
    inst_dict = vars(od).copy()
    if inst_dict:
        return (OrderedDict, (items,), inst_dict)
    return (OrderedDict, (items,))


class Pickler(pickle._Pickler):
    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file, protocol=2, **_):
        if protocol is None or protocol > 2:
            protocol = 2
        super().__init__(file, protocol, fix_imports=True)
        self.dispatch_table = dict(copyreg.dispatch_table)
        self.dispatch_table[OrderedDict] = _ordered_dict_reduce

    def save_py2_str(self, obj):
        data = obj.encode("utf-8")
        if self.bin:
            n = len(data)
            if n < 256:
                self.write(pickle.SHORT_BINSTRING + bytes([n]) + data)
            else:
                self.write(pickle.BINSTRING + struct.pack("<i", n) + data)
        else:
            self.write(pickle.STRING + _py2_repr(data) + b"\n")
        self.memoize(obj)

    dispatch[str] = save_py2_str


def dump(obj, file, protocol=2, **_):
    Pickler(file, protocol).dump(obj)


def dumps(obj, protocol=2, **_):
    f = io.BytesIO()
    dump(obj, f, protocol)
    return f.getvalue()


Unpickler = pickle.Unpickler
load = pickle.load
loads = pickle.loads
