"""Every file of the adversarial corpora (../shared/corpora) through `ckptool inspect --json`.

ckptool must never crash, hang or run anything: each file exits 0 (read) or 3 (refused:
corrupt, unsupported or unsafe) within 5 s, a refusal is exactly one stderr line naming the
file, and a file whose pickle imports something torch.load(weights_only=True) would refuse
names it in unsafe_globals. EXPECTED pins today's result per file, so a change in behaviour
is visible in review.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import TIME_SCALE, corpora_dir, run_ckptool

CORPORA = corpora_dir()

# path relative to the corpora root -> exit code. Filled in from the CLI's behaviour and
# reviewed file by file (see the comments); a change must be deliberate.
EXPECTED: dict[str, int] = {}

# Files that exit 0 although their pickle imports unsafe globals: those globals, which
# unsafe_globals must report (sorted).
EXPECTED_UNSAFE: dict[str, list[str]] = {}


def _files() -> list[str]:
    if not CORPORA.is_dir():
        return []
    return sorted(str(p.relative_to(CORPORA)) for p in CORPORA.rglob("*") if p.is_file())


FILES = _files()


def test_corpora_present():
    assert CORPORA.is_dir(), f"corpora not found at {CORPORA} (set CKPTOOL_CORPORA)"
    assert len(FILES) > 100


def test_table_covers_every_file():
    if not EXPECTED:
        pytest.fail("EXPECTED is empty: pin the CLI's results")
    missing = sorted(set(FILES) - set(EXPECTED))
    gone = sorted(set(EXPECTED) - set(FILES))
    assert not missing, f"corpus files without an expected exit code: {missing}"
    assert not gone, f"expected exit codes for files no longer in the corpora: {gone}"


@pytest.mark.parametrize("rel", FILES)
def test_corpus_file(rel):
    p = CORPORA / rel
    t0 = time.perf_counter()
    rc, out, err = run_ckptool("inspect", "--json", p, timeout=30 * TIME_SCALE)
    wall = time.perf_counter() - t0
    assert rc in (0, 3), f"{rel}: exit {rc} (signal {-rc if rc < 0 else '-'}); stderr: {err[:1500]!r}"
    assert wall < 5.0 * TIME_SCALE, f"{rel}: took {wall:.2f}s"
    assert "AddressSanitizer" not in err and "runtime error:" not in err, err[:2000]
    if rc == 3:
        assert out == "", f"{rel}: stdout not empty on error"
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].strip(), f"{rel}: expected one stderr line: {err!r}"
        assert str(p) in lines[0], f"{rel}: the error line does not name the file: {lines[0]!r}"
    else:
        doc = json.loads(out)
        assert doc["file"] == str(p)
        if rel in EXPECTED_UNSAFE:
            assert sorted(doc["unsafe_globals"]) == EXPECTED_UNSAFE[rel], \
                f"{rel}: unsafe_globals {sorted(doc['unsafe_globals'])}"
    if rel in EXPECTED:
        assert rc == EXPECTED[rel], f"{rel}: exit {rc}, pinned {EXPECTED[rel]}; stderr {err.strip()!r}"
