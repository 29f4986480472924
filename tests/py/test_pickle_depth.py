"""Deep nesting (issue 11, item 7): no recursion in ckptool follows the input's nesting.

`--max-depth` is a policy limit, not what keeps the process alive: raised to the largest value
the command line accepts, a pickle nested 50,000 and 1,000,000 levels deep must still leave
every verb (inspect, inspect --json, verify, rekey -o, materialize --device meta) with a
documented exit code (0; 1 for verify; 3 with one `ckptool: limit|...` line), never a signal.
The base file is torch.save's; its data.pkl is rewritten so that the state dict entry 'w' is
the tensor wrapped in N nested lists (its path is N+1 steps long), or sits next to N nested
lists.

On the baseline every verb but rekey died of SIGSEGV at 50,000 levels.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

import hostile as H
from conftest import CKPTOOL, TIME_SCALE, run_ckptool

PROTO = b"\x80\x02"


def _tensor_ops() -> bytes:
    """The opcodes of one tensor value as torch.save pickles it, memo slots from 2 on."""
    t = H.FakeTensor(H.FakeStorage("0", torch.FloatStorage, 4), 0, (4,), (1,))
    pk = H.torch_pickle({"w": t})
    head = PROTO + b"}q\x00X\x01\x00\x00\x00wq\x01"
    assert pk.startswith(head) and pk.endswith(b"s."), pk[:40]
    return pk[len(head):-2]


def deep_pickle(n: int, around_tensor: bool) -> bytes:
    key = lambda s: b"X" + struct.pack("<I", len(s)) + s.encode()
    if around_tensor:  # {'w': [[[...[tensor]...]]]}
        return PROTO + b"}" + key("w") + b"]" * n + _tensor_ops() + b"a" * n + b"s."
    # {'w': tensor, 'deep': [[[...]]]}
    return PROTO + b"}(" + key("w") + _tensor_ops() + key("deep") + b"]" * n + b"a" * (n - 1) + b"u."


@pytest.fixture(scope="module")
def base_zip(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("depth")
    return H.save({"w": torch.arange(4, dtype=torch.float32)}, d / "base.pt").read_bytes()


@pytest.fixture(scope="module")
def max_depth(base_zip, tmp_path_factory) -> str:
    """The largest --max-depth the command line takes (it may cap absurd values)."""
    f = tmp_path_factory.mktemp("probe") / "base.pt"
    f.write_bytes(base_zip)
    for v in (str(2**64 - 1), str(2**63 - 1), str(2**32), str(10**9), str(10**8), str(10**7), str(2 * 10**6)):
        rc, _, _ = run_ckptool("inspect", "--max-depth", v, f)
        if rc == 0:
            return v
    pytest.fail("no --max-depth of 2,000,000 or more is accepted")


def _check(what, rc, out, err, ok):
    assert rc >= 0, f"{what}: killed by signal {-rc}; stderr {err[-800:]!r}"
    assert rc in ok, f"{what}: exit {rc}; stderr {err[-800:]!r}"
    if rc == 3:
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("ckptool: "), f"{what}: {err[-800:]!r}"
        assert "out of memory" not in err, f"{what}: {err!r}"


def _verbs(f: Path, out: Path, depth: str):
    lim = ["--max-depth", depth]
    return {
        "inspect": (["inspect", *lim, f], (0, 3)),
        "inspect --json": (["inspect", "--json", *lim, f], (0, 3)),
        "verify": (["verify", *lim, f], (0, 1, 3)),
        "rekey -o": (["rekey", *lim, f, "-o", out, "--add-prefix", "m."], (0, 3)),
        "materialize meta": (["materialize", *lim, f, "--device", "meta"], (0, 3)),
    }


@pytest.mark.parametrize("around_tensor", [False, True], ids=["beside", "around"])
@pytest.mark.parametrize("n", [50_000, 1_000_000])
def test_deep_nesting_every_verb(base_zip, max_depth, tmp_path, n, around_tensor):
    f = tmp_path / "deep.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", deep_pickle(n, around_tensor)))
    for what, (args, ok) in _verbs(f, tmp_path / "out.pt", max_depth).items():
        rc, out, err = run_ckptool(*args, timeout=60 * TIME_SCALE)
        _check(f"{what} (depth {n})", rc, out, err, ok)
        if what == "inspect":
            # The machine decodes every level; whatever stops, stops with a named limit.
            assert rc == 0 or "limit" in err, err
    (tmp_path / "out.pt").unlink(missing_ok=True)


def test_default_depth_limit_still_applies(base_zip, tmp_path):
    f = tmp_path / "deep.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", deep_pickle(50_000, True)))
    rc, out, err = run_ckptool("inspect", f)
    _check("inspect", rc, out, err, (3,))
    assert "--max-depth" in err, err


def test_deep_nesting_reaches_the_tensor(base_zip, max_depth, tmp_path):
    # The iterative walk finds the tensor under 50,000 lists, at its full path.
    n = 50_000
    f = tmp_path / "deep.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", deep_pickle(n, True)))
    import json
    rc, out, err = run_ckptool("inspect", "--json", "--max-depth", max_depth, f)
    assert rc == 0, err
    doc = json.loads(out)
    tensors = doc["tensors"]
    assert len(tensors) == 1, tensors
    assert tensors[0]["path"] == ["w"] + [0] * n


def test_tree_of_a_key_with_200000_dots(base_zip, tmp_path):
    # inspect --tree splits keys at dots: the tree (and its indentation) stops at 32 levels,
    # the rest of the key is one node. The baseline recursed per segment: SIGSEGV.
    pk = H.record(base_zip, "data.pkl")
    key = ("a." * 200_000 + "w").encode()
    pk = pk.replace(b"X\x01\x00\x00\x00w", b"X" + struct.pack("<I", len(key)) + key, 1)
    f = tmp_path / "dots.pt"
    f.write_bytes(H.replace_record(base_zip, "data.pkl", pk))
    rc, out, err = run_ckptool("inspect", "--tree", f, timeout=30 * TIME_SCALE)
    _check("inspect --tree", rc, out, err, (0,))
    assert len(out) < 2 * len(key), len(out)
    tree = out[out.index("tree:"):].splitlines()
    assert max(len(line) - len(line.lstrip()) for line in tree[1:] if line.strip()) <= 2 + 2 * 32
