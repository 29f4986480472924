"""Honest output (issue 11, items 15, 17, 18).

15. Keys, global names and file names reach the terminal escaped: a key or global holding a
    newline, CR, ESC, NUL, C1 control, DEL, invalid UTF-8 or a bidi override can neither
    forge a line ("unsafe globals: none") nor erase one. Checked on the raw bytes of
    stdout and stderr of inspect (table and tree), verify, rekey --dry-run, materialize
    --check-finite and error lines.
17. --map replays exactly the keys it lists; its format version is checked; duplicate JSON
    keys are refused; renames to the empty key (or onto another key) are refused for every
    kind of rename.
18. Flag values are checked when the command line is parsed, and usage errors are one line
    `ckptool: usage: ...`, exit 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from conftest import CKPTOOL, TIME_SCALE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile  # noqa: E402


def run(*args, timeout=30.0):
    """(rc, stdout bytes, stderr bytes)."""
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    p = subprocess.run([str(CKPTOOL), *map(str, args)], capture_output=True, timeout=timeout * TIME_SCALE, env=env)
    return p.returncode, p.stdout, p.stderr


# C0 controls but '\n' (which ends our own lines), DEL.
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")
INVISIBLE = re.compile("[\u0080-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def assert_clean(data: bytes, what: str):
    m = RAW_CONTROL.search(data)
    assert m is None, f"{what}: raw control byte {m.group()!r} at {m.start()}: {data[max(0, m.start() - 60):m.start() + 20]!r}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError(f"{what}: invalid UTF-8 reached the terminal: {e}") from None
    m2 = INVISIBLE.search(text)
    assert m2 is None, f"{what}: raw U+{ord(m2.group()):04X} reached the terminal"
    return text


def lines_starting(text: str, prefix: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(prefix))


HOSTILE_KEYS = [
    "ok.weight",
    "x\nunsafe globals: none",
    "cr\rFAKE",
    "esc\x1b[2Kgone",
    "nul\x00y",
    "rlo\u202eabc",
    "c1\u009b31m",
    "del\x7f",
    "lone\ud800surrogate",  # torch.save writes it as WTF-8: invalid UTF-8 bytes
]
HOSTILE_GLOBAL = ("os\x1b[1A\x1b[2K", "system\nunsafe globals: none")


def tsave(obj, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("honest")
    out = {}
    out["keys"] = tsave({k: torch.tensor([float("nan"), 1.0]) for k in HOSTILE_KEYS}, d / "keys.pt")
    out["base"] = tsave({"w": torch.ones(2)}, d / "base.pt")
    # A global named through STACK_GLOBAL, whose strings may hold anything.
    mod, name = HOSTILE_GLOBAL
    pk = (b"\x80\x04}(" + hostile.binunicode("w") + hostile.binunicode(mod) + hostile.binunicode(name)
          + b"\x93u.")
    out["globals"] = d / "globals.pt"
    out["globals"].write_bytes(hostile.replace_record(out["base"].read_bytes(), "data.pkl", pk))
    named = d / "name\x1b[2K\rverify: OK.pt"
    named.write_bytes(out["base"].read_bytes())
    out["named"] = named
    out["swap"] = tsave({"weight": torch.ones(1), "layer.weight": torch.ones(2), "layer.bias": torch.ones(2),
                         "flag": torch.ones(3), "bf": torch.ones(4)}, d / "swap.pt")
    out["dir"] = d
    return out


# --------------------------------------------------------------------------- 15. terminal injection


@pytest.mark.parametrize("args,rc", [
    (["inspect", "{keys}"], 0),
    (["inspect", "--tree", "{keys}"], 0),
    (["rekey", "{keys}", "--dry-run", "--add-prefix", "p."], 0),
    (["rekey", "{keys}", "--dry-run", "--rename", "^.*$=k"], 1),  # the collision error names keys
], ids=["inspect", "inspect-tree", "rekey-dry-run", "rekey-collision-error"])
def test_hostile_keys_escaped(files, args, rc):
    args = [a.format(keys=files["keys"]) for a in args]
    got, out, err = run(*args)
    assert got == rc, (got, err[-500:])
    text = assert_clean(out, "stdout") + assert_clean(err, "stderr")
    # The genuine summary line is the only one: no key forged a second.
    assert lines_starting(text, "unsafe globals: none") == (1 if args[0] == "inspect" else 0), text
    if rc == 0:
        assert "\\x1b[2K" in text and "\\u202e" in text and "\\n" in text, text


def test_json_keeps_names_exact(files):
    # Regression guard: escaping is for terminals; --json carries every name as it is.
    got, out, err = run("inspect", "--json", files["keys"])
    assert got == 0, err
    doc = json.loads(out)
    names = {t["path"][-1] for t in doc["tensors"]}
    assert names == set(HOSTILE_KEYS), names


def test_materialize_report_escaped(files):
    got, out, err = run("materialize", files["keys"], "--check-finite")
    assert got == 1, err[-500:]  # NaN everywhere: the check fails
    text = assert_clean(out, "stdout") + assert_clean(err, "stderr")
    assert lines_starting(text, "unsafe globals: none") == 0
    assert '"esc\\x1b[2Kgone"' in text, text


@pytest.mark.parametrize("verb", ["inspect", "verify"])
def test_hostile_global_escaped(files, verb):
    got, out, err = run(verb, files["globals"])
    assert got == (0 if verb == "inspect" else 1), err[-500:]
    text = assert_clean(out, "stdout") + assert_clean(err, "stderr")
    # The escape sequence cannot move up and erase the UNSAFE heading, nor add a clean line.
    assert lines_starting(text, "unsafe globals: none") == 0, text
    if verb == "inspect":
        assert "UNSAFE globals" in text
    assert "os\\x1b[1A\\x1b[2K.system\\nunsafe globals: none" in text, text


def test_error_line_escaped(files, tmp_path):
    got, out, err = run("rekey", files["globals"], "-o", tmp_path / "never.pt", "--strip-prefix", "x")
    assert got == 3
    assert out == b""
    text = assert_clean(err, "stderr")
    assert len(text.strip().splitlines()) == 1, text
    assert text.startswith("ckptool: unsafe: ")
    assert not (tmp_path / "never.pt").exists()


def test_hostile_file_name_escaped(files):
    got, out, err = run("verify", files["named"])
    assert got == 0, err
    text = assert_clean(out, "stdout")
    assert text.count("\n") == 1 and "\\x1b[2K\\r" in text, text


def test_usage_error_escapes_argument(files):
    got, out, err = run("materialize", files["base"], "--device", "\x1b[2Kcpu")
    assert got == 2
    assert_clean(err, "stderr")


# --------------------------------------------------------------------------- 17. --map replays exactly


def dry_run_json(path, *ops):
    got, out, err = run("rekey", path, "--dry-run", "--json", *ops)
    assert got == 0, err.decode(errors="replace")
    return {m["old"]: m["new"] for m in json.loads(out)["mapping"]}, err


def write_map(path, text):
    path.write_text(text)
    return path


def test_map_renames_only_listed_keys(files, tmp_path):
    m = write_map(tmp_path / "swap.json",
                  json.dumps({"ckptool_key_map": 1, "mapping": {"weight": "layer.weight", "layer.weight": "weight"}}))
    mapping, _ = dry_run_json(files["swap"], "--map", m)
    # The baseline also moved flag -> layer.flag, bf -> layer.bf and layer.bias -> bias.
    assert mapping == {"weight": "layer.weight", "layer.weight": "weight", "layer.bias": "layer.bias",
                       "flag": "flag", "bf": "bf"}


def test_map_replays_saved_map_exactly(files, tmp_path):
    saved, out = tmp_path / "saved.json", tmp_path / "out.pt"
    got, _, err = run("rekey", files["swap"], "-o", out, "--add-prefix", "m.", "--save-map", saved)
    assert got == 0, err
    mapping, _ = dry_run_json(files["swap"], "--map", saved)
    assert mapping == json.loads(saved.read_text())["mapping"]


@pytest.mark.parametrize("doc,rc,needle", [
    ('{"ckptool_key_map": 2, "mapping": {"flag": "f"}}', 3, "version 2"),
    ('{"mapping": {"flag": "f"}}', 3, "ckptool_key_map"),
    ('{"ckptool_key_map": "1", "mapping": {"flag": "f"}}', 3, 'version "1"'),
    ('{"ckptool_key_map": 1, "mapping": {"flag": "f", "flag": "g"}}', 2, "'flag' twice"),
    ('{"ckptool_key_map": 1, "ckptool_key_map": 1, "mapping": {"flag": "f"}}', 2, "'ckptool_key_map' twice"),
], ids=["version-2", "no-version", "version-string", "duplicate-mapping-key", "duplicate-top-key"])
def test_map_file_refused(files, tmp_path, doc, rc, needle):
    m = write_map(tmp_path / "m.json", doc)
    out = tmp_path / "never.pt"
    got, so, err = run("rekey", files["swap"], "-o", out, "--map", m)
    text = err.decode()
    assert got == rc, text
    assert len(text.strip().splitlines()) == 1 and needle in text and "m.json" in text, text
    assert not out.exists()


@pytest.mark.parametrize("ops", [
    ["--rename", "^flag$="],
    ["--strip-prefix", "flag"],
    ["--map", "{empty_map}"],
], ids=["rename", "strip-prefix", "map"])
def test_rename_to_empty_key_refused(files, tmp_path, ops):
    empty_map = write_map(tmp_path / "e.json", '{"ckptool_key_map": 1, "mapping": {"flag": ""}}')
    ops = [o.format(empty_map=empty_map) for o in ops]
    out = tmp_path / "never.pt"
    got, so, err = run("rekey", files["swap"], "-o", out, *ops)
    text = err.decode()
    assert got == 1, text
    assert "empty" in text and "flag" in text and len(text.strip().splitlines()) == 1, text
    assert not out.exists()


@pytest.mark.parametrize("ops", [
    ["--rename", "^bf$=flag"],
    ["--map", "{onto_map}"],
], ids=["rename", "map"])
def test_rename_onto_untouched_key_refused(files, tmp_path, ops):
    # Regression guard (the baseline refused these too): both names are in the message.
    onto = write_map(tmp_path / "o.json", '{"ckptool_key_map": 1, "mapping": {"bf": "flag"}}')
    ops = [o.format(onto_map=onto) for o in ops]
    got, so, err = run("rekey", files["swap"], "-o", tmp_path / "never.pt", *ops)
    text = err.decode()
    assert got == 1 and "'flag'" in text and "bf" in text, text


# --------------------------------------------------------------------------- 18. parse-time validation


USAGE_CASES = [
    (["materialize", "{base}", "--threads", "0"], "--threads"),
    (["materialize", "{base}", "--threads", "-3"], "--threads"),
    (["materialize", "{base}", "--threads", "100000"], "--threads"),
    (["inspect", "{base}", "--max-depth", "-1"], "--max-depth"),
    (["inspect", "{base}", "--max-depth", "18446744073709551616"], "--max-depth"),
    (["inspect", "{base}", "--max-pickle-bytes", "18446744073709551615"], "--max-pickle-bytes"),
    (["verify", "{base}", "--max-tensors", "-1"], "--max-tensors"),
    (["rekey", "{base}", "--dry-run", "--strip-compiled", "--max-memo", "1e9"], "--max-memo"),
    (["materialize", "{base}", "--dtype", ""], "--dtype"),
    (["materialize", "{base}", "--dtype", "float33"], "float8_e4m3fn"),
    (["materialize", "{base}", "--device", "cpu:1"], "unsupported device"),
    (["materialize", "{base}", "--device", "meta:1"], "unsupported device"),
    (["materialize", "{base}", "--device", "mps"], "unsupported device"),
    (["materialize", "{base}", "--device", "garbage"], "unsupported device"),
    (["materialize", "{base}", "-o", ""], "--output"),
    (["rekey", "{base}", "-o", "", "--strip-compiled"], "got ''"),
    (["rekey", "{base}", "--dry-run", "--strip-compiled", "--save-map", ""], "--save-map"),
    (["inspect", "{base}", "--bogus"], "--bogus"),
    (["inspect"], "FILE"),
]


@pytest.mark.parametrize("args,needle", USAGE_CASES, ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(USAGE_CASES)])
def test_usage_error_one_line(files, args, needle):
    args = [a.format(base=files["base"]) for a in args]
    got, out, err = run(*args)
    text = err.decode(errors="replace")
    assert got == 2, f"{args}: exit {got}, stderr {text!r}"
    assert out == b""
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptool: usage: "), text
    assert needle in lines[0], text
    assert "--help" in lines[0], text


@pytest.mark.parametrize("args,rc", [
    (["materialize", "{base}", "--threads", "4", "--device", "meta"], 0),
    (["materialize", "{base}", "--dtype", "bfloat16", "--device", "meta"], 0),
    (["inspect", "{base}", "--max-depth", "0"], 3),
    (["inspect", "{base}", "--max-depth", "1000000", "--max-pickle-bytes", "1099511627776"], 0),
], ids=["threads-4", "dtype-bfloat16", "depth-0", "bounds"])
def test_valid_values_accepted(files, args, rc):
    # Regression guard: the checks refuse only what is wrong.
    got, out, err = run(*[a.format(base=files["base"]) for a in args])
    assert got == rc, err.decode(errors="replace")
