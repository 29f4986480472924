"""Tensors saved with the conjugate or negative bit set (x.conj(), x.conj().imag).

torch.save stores the unconjugated, unnegated elements and the bit in the rebuild call's
metadata dict; torch.load sets the bit again. ckptool used to drop it: materialize gave the
stored elements as the values, diff called c.conj() identical to c, exit 0 both.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_ckptool

UNSUPPORTED = 3


@pytest.fixture()
def bits_file(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
    sd = {
        "c": z.conj(),                       # is_conj
        "n": z.clone().conj().imag,          # is_neg (float32; a storage of its own: torch.save
                                             # refuses one storage viewed as two dtypes)
        "plain": torch.arange(3.0),
        "c2": torch.tensor([[1 + 1j, 2 - 2j]], dtype=torch.complex128).conj().t(),  # a strided conjugate view
    }
    assert sd["c"].is_conj() and sd["n"].is_neg()
    path = tmp_path / "bits.pt"
    torch.save(sd, path)
    return path


def test_inspect_shows_the_bits(bits_file):
    rc, out, err = run_ckptool("inspect", bits_file, "--json")
    assert rc == 0, err
    rows = {t["path"][0]: t for t in json.loads(out)["tensors"]}
    assert rows["c"].get("conj") is True and "neg" not in rows["c"]
    assert rows["n"].get("neg") is True and "conj" not in rows["n"]
    assert "conj" not in rows["plain"] and "neg" not in rows["plain"]


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_materialize_gives_what_torch_load_gives(bits_file, tmp_path, dtype):
    out = tmp_path / "out.pt"
    args = ["materialize", bits_file, "-o", out] + (["--dtype", dtype] if dtype else [])
    rc, _, err = run_ckptool(*args)
    assert rc == 0, err
    want = torch.load(bits_file, weights_only=True)
    got = torch.load(out, weights_only=True)
    for k, w in want.items():
        g = got[k]
        if dtype and w.is_floating_point():
            w = w.to(getattr(torch, dtype))  # resolves the bit; ckptool's cast keeps it (and ties)
        else:  # ckptool's cast keeps views and strides; torch's .to() makes a new tensor
            assert g.is_conj() == w.is_conj() and g.is_neg() == w.is_neg(), k
            assert g.stride() == w.stride(), k
        assert g.dtype == w.dtype, k
        assert torch.equal(g.resolve_conj().resolve_neg(), w.resolve_conj().resolve_neg()), k


def test_plan_slices_keep_the_bits(bits_file, tmp_path):
    plan = tmp_path / "plan.json"
    # n (a strided imag view) and c2 (transposed) are not row-major: read whole.
    plan.write_text(json.dumps({"n": "Replicate()", "c2": "Replicate()", "*": "Shard(0)"}))
    want = torch.load(bits_file, weights_only=True)
    for rank in range(2):
        out = tmp_path / f"r{rank}.pt"
        rc, _, err = run_ckptool("materialize", bits_file, "--plan", plan, "--rank", rank, "--world", 2, "-o", out)
        assert rc == 0, err
        got = torch.load(out, weights_only=True)
        for k, w in want.items():
            whole = w.resolve_conj().resolve_neg()
            expect = whole if k in ("n", "c2") else torch.chunk(whole, 2, 0)[rank]
            assert torch.equal(got[k].resolve_conj().resolve_neg(), expect), (k, rank)


def test_diff_refuses_different_bits_and_compares_equal_ones(bits_file, tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
    plain = tmp_path / "plain.pt"
    torch.save({"c": z}, plain)
    conj = tmp_path / "conj.pt"
    torch.save({"c": z.conj()}, conj)
    rc, out, err = run_ckptool("diff", conj, plain)
    assert rc == UNSUPPORTED, (out, err)
    assert "conjugate bit" in err
    rc, out, err = run_ckptool("diff", conj, conj)
    assert rc == 0, (out, err)
    other = tmp_path / "conj2.pt"
    torch.save({"c": (z + 1).conj()}, other)
    rc, out, err = run_ckptool("diff", conj, other)
    assert rc == 1, (out, err)
    rc, out, err = run_ckptool("diff", conj, plain, "--metadata-only")
    assert rc == 0, (out, err)


def test_convert_refuses_a_tensor_whose_bytes_are_not_its_values(bits_file, tmp_path):
    for to, name in (("safetensors", "o.safetensors"), ("torch", "o.pt")):
        out = tmp_path / name
        rc, _, err = run_ckptool("convert", bits_file, "-o", out, "--to", to)
        assert rc == UNSUPPORTED, err
        assert "conjugate bit" in err and not out.exists()
