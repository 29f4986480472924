"""`rekey --rename REGEX=REPLACEMENT` on RE2 (issue 11, item 6).

std::regex recursed once per character: `.*=x`, `[a-z]+=x`, `a+=x` on a 50,000-character
key and `(a)+=x` on a 20,000-character one overflowed the stack (SIGSEGV), and `(a|aa)*c=z`
backtracked exponentially on 60 characters. RE2 matches in linear time without recursion
on the input. Also covered: a '=' inside REGEX (written \\=), the ECMAScript replacement
syntax kept ($1, $&, $$), and constructs RE2 lacks refused as usage errors naming the spec.
"""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch

from conftest import TIME_SCALE, run_ckptool


def save(path, keys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({k: torch.ones(1) for k in keys}, path)
    return path


def dry_run(path, *specs, timeout=10.0):
    """rekey --dry-run --json with each spec as --rename; returns (rc, doc or None, stderr, seconds)."""
    args = ["rekey", str(path), "--dry-run", "--json"] + [f"--rename={s}" for s in specs]
    start = time.monotonic()
    rc, out, err = run_ckptool(*args, timeout=timeout * TIME_SCALE)
    seconds = time.monotonic() - start
    doc = json.loads(out) if rc == 0 else None
    return rc, doc, err, seconds


def new_keys(doc):
    return [m["new"] for m in doc["mapping"]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("rename_regex")
    return {
        "long50k": save(d / "long50k.pt", ["a" * 50_000]),
        "long20k": save(d / "long20k.pt", ["a" * 20_000]),
        "a60": save(d / "a60.pt", ["a" * 60]),
        "plain": save(d / "plain.pt", ["a=b.weight", "fc.weight", "fc.bias", "x.y"]),
    }


# --------------------------------------------------------------------------- linear time, no recursion


@pytest.mark.parametrize("spec,key,expected", [
    (".*=x", "long50k", "x"),
    ("[a-z]+=x", "long50k", "x"),
    ("a+=x", "long50k", "x"),
    ("(a)+=x", "long20k", "x"),
    ("^(a+)$=k.$1", "long50k", "k." + "a" * 50_000),
], ids=["dotstar", "class-plus", "a-plus", "group-plus", "group-rewrite"])
def test_long_key_no_crash(files, spec, key, expected):
    rc, doc, err, seconds = dry_run(files[key], spec)
    assert rc == 0, f"--rename {spec!r} on a {key} key: exit {rc} (baseline: SIGSEGV, -11), stderr {err[-300:]!r}"
    assert new_keys(doc) == [expected]
    assert seconds < 1.0 * TIME_SCALE, f"--rename {spec!r} took {seconds:.2f} s"


def test_exponential_backtracking_pattern_is_linear(files):
    # std::regex never finished this one (the baseline hangs past the timeout).
    rc, doc, err, seconds = dry_run(files["a60"], "(a|aa)*c=z", timeout=5.0)
    assert rc == 0, err
    assert new_keys(doc) == ["a" * 60]
    assert "changed no key" in err
    assert seconds < 1.0 * TIME_SCALE, f"took {seconds:.2f} s"


# --------------------------------------------------------------------------- '=' in the pattern


def test_escaped_equals_in_pattern(files):
    rc, doc, err, _ = dry_run(files["plain"], r"^a\=b\.=ab.")
    assert rc == 0, f"exit {rc} (the baseline split at the first '=' and refused 'a\\'), {err!r}"
    assert new_keys(doc) == ["ab.weight", "fc.weight", "fc.bias", "x.y"]


def test_equals_in_replacement_is_literal(files):
    rc, doc, err, _ = dry_run(files["plain"], r"^x\.y$=x=y")
    assert rc == 0, err
    assert new_keys(doc)[-1] == "x=y"


# --------------------------------------------------------------------------- replacement syntax kept
# Regression guards: these pass on the baseline too and must keep passing after the switch.


def test_replacement_groups_and_literals(files):
    rc, doc, err, _ = dry_run(files["plain"], r"^(\w+)\.(weight|bias)$=$2_of_$1", r"^x\.y$=$$&[$&]")
    assert rc == 0, err
    assert new_keys(doc) == ["a=b.weight", "weight_of_fc", "bias_of_fc", "$&[x.y]"]


def test_backslash_in_replacement_is_literal(files):
    rc, doc, err, _ = dry_run(files["plain"], r"^x\.y$=x\1")
    assert rc == 0, err
    assert new_keys(doc)[-1] == "x\\1"


# --------------------------------------------------------------------------- refused clearly


def one_usage_line(rc, err, *needles):
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("ckptool: usage: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("spec,needle", [
    (r"(a)\1=x", "backreferences"),        # std::regex accepted it
    (r"(?=f)fc=x", "lookahead"),           # std::regex accepted it
    (r"(?<=f)c=x", "lookbehind"),
    (r"^(fc)\.=$2.", "$2"),                # std::regex gave an empty group, exit 0
    (r"^fc=$`", "$`"),
])
def test_unsupported_constructs_refused(files, spec, needle):
    rc, doc, err, _ = dry_run(files["plain"], spec)
    one_usage_line(rc, err, spec, needle)


def test_bad_pattern_names_it(files):
    rc, doc, err, _ = dry_run(files["plain"], "(fc=x")
    one_usage_line(rc, err, "'(fc'")
