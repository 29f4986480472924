"""``ckptool diff A B --strip-compiled`` (and every other rekey edit): A's keys are edited
before pairing, so that "is B exactly A rekeyed?" is answered equivalent (exit 0) when it is;
without the edit a rename is a difference (exit 1). The compiled side is a real
``torch.compile`` module's state dict; reports keep A's own key names.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import run_ckptool  # noqa: E402
from test_diff import diff_json  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(6, 5)
        self.dec = torch.nn.Linear(5, 3)
        self.register_buffer("steps", torch.arange(4, dtype=torch.int64))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """compiled.pt (keys `_orig_mod.enc.weight`, ...) and plain.safetensors (`enc.weight`)."""
    torch.manual_seed(0)
    m = Net()
    d = tmp_path_factory.mktemp("edits")
    compiled = torch.compile(m).state_dict()
    assert all(k.startswith("_orig_mod.") for k in compiled)
    torch.save(compiled, d / "compiled.pt")
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(d / "plain.safetensors"))
    return d


def test_the_edit_given_makes_a_rekeyed_copy_equivalent(pair):
    rc, doc = diff_json(pair / "compiled.pt", pair / "plain.safetensors")
    assert rc == 1 and doc["renamed"]["edit"] == "remove '_orig_mod.'"
    rc, doc = diff_json(pair / "compiled.pt", pair / "plain.safetensors", "--strip-compiled")
    assert rc == 0, doc
    assert doc["renamed"] is None and doc["only_in_a"] == [] and doc["only_in_b"] == []
    assert doc["values"]["identical"] == doc["paired"] == 5
    assert doc["a"]["key_edits"] == ["--strip-compiled"] and doc["a"]["unused_key_edits"] == []
    rc, out, _ = run_ckptool("diff", pair / "compiled.pt", pair / "plain.safetensors", "--strip-compiled")
    assert rc == 0 and "(keys edited: --strip-compiled) vs " in out and ": equivalent (5 tensors" in out


def test_edits_in_order_and_reports_name_a_as_it_holds_its_keys(pair, tmp_path):
    sd = torch.load(pair / "compiled.pt", weights_only=True)
    changed = {"model." + k.replace("_orig_mod.", "").replace("enc.", "encoder."): v.clone() for k, v in sd.items()}
    changed["model.encoder.weight"][2, 3] += 1
    torch.save(changed, tmp_path / "b.pt")
    # The regex sees the key after --strip-compiled, and --add-prefix after both.
    rc, doc = diff_json(pair / "compiled.pt", tmp_path / "b.pt",
                        "--strip-compiled", "--rename", r"^enc\.=encoder.", "--add-prefix", "model.")
    assert rc == 1 and doc["renamed"] is None and doc["only_in_a"] == [] and doc["only_in_b"] == []
    [t] = doc["tensors"]
    assert t["key_a"] == "_orig_mod.enc.weight" and t["key_b"] == "model.encoder.weight"
    assert t["values"] == "different" and t["outside_tolerance"] == 1 and t["first_outside"] == 2 * 6 + 3
    # The same edits in another order give other keys: nothing pairs by name, and the
    # wrapper solver cannot bridge a renamed module.
    rc, doc = diff_json(pair / "compiled.pt", tmp_path / "b.pt",
                        "--add-prefix", "model.", "--rename", r"^enc\.=encoder.", "--strip-compiled")
    assert rc == 1 and doc["a"]["unused_key_edits"] == [r"--rename '^enc\.=encoder.'"]
    assert "_orig_mod.enc.weight" in doc["only_in_a"]


def test_a_rekey_output_against_its_input(pair, tmp_path):
    out = tmp_path / "out.pt"
    rc, _, err = run_ckptool("rekey", pair / "compiled.pt", "-o", out, "--strip-compiled")
    assert rc == 0, err
    assert diff_json(pair / "compiled.pt", out, "--strip-compiled")[0] == 0
    assert diff_json(pair / "compiled.pt", out)[0] == 1


def test_only_a_is_edited_and_an_idle_edit_is_warned_about(pair):
    rc, out, err = run_ckptool("diff", pair / "plain.safetensors", pair / "compiled.pt", "--strip-compiled")
    assert rc == 1 and "--strip-compiled changed no key of A" in err
    assert "renamed: B's keys are A's with add '_orig_mod.'" in out


def test_keys_the_edits_merge_are_a_usage_error(tmp_path):
    t = torch.zeros(2)
    torch.save({"a._orig_mod.w": t, "a.w": t.clone()}, tmp_path / "a.pt")
    torch.save({"a.w": t}, tmp_path / "b.pt")
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "b.pt", "--strip-compiled")
    assert rc == 2 and out == ""
    assert "the edits of A's keys make 2 keys one, 'a.w'" in err and str(tmp_path / "a.pt") in err
    rc, out, err = run_ckptool("diff", tmp_path / "a.pt", tmp_path / "b.pt", "--rename", ".*=")
    assert rc == 2 and "empty" in err


def test_match_is_not_an_edit_of_diff(pair):
    rc, _, err = run_ckptool("diff", pair / "compiled.pt", pair / "plain.safetensors", "--match", pair / "plain.safetensors")
    assert rc == 2 and "--match" in err
