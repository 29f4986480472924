"""Tensors a torch.save file holds beside a state dict below its root.

{'w': t1, 'step': 5, 'opt': {'w': t2}}: ckptool takes 'opt' as the state dict (the root
holds too few tensors to be one), which leaves the root's 'w' outside the keys and, being a
tensor, outside the entries. torch.load sees both tensors. Every verb must account for the
root's tensor: diff compares it (a change in it used to pass as equivalent, exit 0),
materialize -o writes it (its name used to overwrite the state dict's 'w': one tensor fewer,
exit 0), convert lists it among what the output cannot hold. Where its name equals a key,
the verbs refuse (exit 3) instead of picking one.
"""

from __future__ import annotations

import json

import torch

from conftest import run_ckptool

UNSUPPORTED = 3


def save(path, root_w, opt_w, root_name="w"):
    torch.save({root_name: root_w, "step": 5, "opt": {"w": opt_w}}, path)
    return path


def test_diff_sees_a_change_in_the_tensor_beside_the_state_dict(tmp_path):
    a = save(tmp_path / "a.pt", torch.ones(2), torch.zeros(3), root_name="x")
    b = save(tmp_path / "b.pt", torch.ones(2) * 7, torch.zeros(3), root_name="x")
    rc, out, err = run_ckptool("diff", a, b, "--json")
    assert rc == 1, (out, err)
    report = json.loads(out)
    assert report["equivalent"] is False
    assert report["values"]["different"] == 1, report
    assert [t["key_a"] for t in report["tensors"] if t["values"] == "different"] == ["x"]
    rc, out, err = run_ckptool("diff", a, a)
    assert rc == 0, (out, err)
    assert "2 tensors" in out


def test_a_name_shared_with_a_key_is_refused_by_every_verb(tmp_path):
    a = save(tmp_path / "a.pt", torch.ones(2), torch.zeros(3))
    b = save(tmp_path / "b.pt", torch.ones(2) * 7, torch.zeros(3))
    loaded = torch.load(a, weights_only=True)
    assert loaded["w"].shape != loaded["opt"]["w"].shape  # torch sees two tensors named 'w'
    rc, out, err = run_ckptool("diff", a, b)
    assert rc == UNSUPPORTED, (out, err)
    assert "'w'" in err and "state dict at 'opt'" in err
    out_pt = tmp_path / "out.pt"
    rc, out, err = run_ckptool("materialize", a, "-o", out_pt)
    assert rc == UNSUPPORTED, (out, err)
    assert "'w'" in err
    assert not out_pt.exists()


def test_materialize_writes_both_tensors(tmp_path):
    a = save(tmp_path / "a.pt", torch.arange(2.0), torch.arange(3.0) + 10, root_name="x")
    out_pt = tmp_path / "out.pt"
    rc, out, err = run_ckptool("materialize", a, "-o", out_pt)
    assert rc == 0, (out, err)
    got = torch.load(out_pt, weights_only=True)
    want = torch.load(a, weights_only=True)
    assert sorted(got) == ["w", "x"]
    assert torch.equal(got["x"], want["x"]) and torch.equal(got["w"], want["opt"]["w"])


def test_convert_names_the_tensor_it_leaves_out(tmp_path):
    a = save(tmp_path / "a.pt", torch.ones(2), torch.zeros(3), root_name="x")
    out_st = tmp_path / "out.safetensors"
    rc, out, err = run_ckptool("convert", a, "-o", out_st, "--to", "safetensors")
    assert rc == UNSUPPORTED, (out, err)
    assert "'x (tensor)'" in err and not out_st.exists()
    rc, out, err = run_ckptool("convert", a, "-o", out_st, "--to", "safetensors", "--drop-other")
    assert rc == 0, (out, err)
    assert "left out x (tensor)" in err


def test_an_integer_key_never_pairs_with_a_string_key(tmp_path):
    """{0: t} and {'0': t} are different dicts to torch.load: diff used to call them equivalent."""
    t = torch.ones(2)
    torch.save({0: t}, tmp_path / "int.pt")
    torch.save({"0": t}, tmp_path / "str.pt")
    torch.save([t], tmp_path / "list.pt")
    rc, out, err = run_ckptool("diff", tmp_path / "int.pt", tmp_path / "str.pt", "--json")
    assert rc == 1, (out, err)
    report = json.loads(out)
    assert report["only_in_a"] == ["[0]"] and report["only_in_b"] == ["0"], report
    rc, out, err = run_ckptool("diff", tmp_path / "list.pt", tmp_path / "list.pt")
    assert rc == 0, (out, err)


def test_a_dcp_item_holding_tensors_in_its_pickle_is_refused(tmp_path):
    """dcp.save with flatten_state_dict=False pickles whole nested dicts as BYTE_IO items:
    materialize wrote an empty file with exit 0."""
    import torch.distributed.checkpoint as dcp
    sd = {"model": {"w": torch.randn(4, 5), "b": torch.randn(5)}, "step": 3}
    d = tmp_path / "nf"
    dcp.save(sd, checkpoint_id=str(d), no_dist=True, planner=dcp.DefaultSavePlanner(flatten_state_dict=False))
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("materialize", d, "-o", out)
    assert rc == UNSUPPORTED, err
    assert "'model'" in err and "2 tensors" in err and not out.exists()
    rc, out_text, err = run_ckptool("inspect", d)
    assert rc == 0 and "not loaded" in out_text
