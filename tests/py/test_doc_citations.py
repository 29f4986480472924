"""Every document the code and the manuals cite lives in this repository (issue 13 item 3).

Comments, man pages, the README and the tests cite notes as `formats.md §2.1`,
`security.md Z10`, `docs/findings.md` or `security.md S1-S8`. Each cited file must exist in
the repository (docs/, or next to the citing file), each cited section must be a heading of
that file, and each cited hazard id must be defined in docs/security.md. Nothing may point
outside the repository (`../shared/docs/...`): a clone could not follow it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SOURCE_DIR

# Where citations are looked for: the code, the manuals, the README, and the docs, tests
# and fuzzing notes that cite each other.
SCAN = ["src", "cli", "man", "README.md", "docs", "tests/py", "tests/unit", "tests/tools",
        "tests/tools_torch", "tests/CMakeLists.txt", "fuzz", "bench", "samples", "scripts",
        "CMakeLists.txt"]
TEXT_SUFFIXES = {".h", ".cpp", ".py", ".md", ".1", ".txt", ".sh", ".cmake", ""}
SKIP_DIRS = {"seeds", "corpus", "regressions"}

# Notes are named in lower case (docs/formats.md); upper-case names (README.md, RESULTS.md,
# upstream's SECURITY.md) and names in string literals or shell variables (a report a test
# writes) are not citations of a note.
CITATION = re.compile(r"(?<![\"'$/{}\w.-])(?P<path>(?:\.\./)*(?:[\w.-]+/)*)(?P<name>[a-z][\w-]*\.md)\b")
# What may follow a file name to point into it: "§2.1", "§2.B", "§ 5", "P6", "S1-S8",
# "Z3–Z10", separated by spaces, commas, "and", "(" or ":".
REF = re.compile(r"^[\s,;:(]*(?:and\s+)?(?:§\s?(?P<section>\d+(?:\.[\dA-Z]+)*)"
                 r"|(?P<h1>[PZSW])(?P<n1>\d+)(?:\s?[-–]\s?(?P<h2>[PZSW])?(?P<n2>\d+))?)(?![\w.])")


def _files() -> list[Path]:
    out = []
    for entry in SCAN:
        p = SOURCE_DIR / entry
        if p.is_file():
            out.append(p)
            continue
        for f in sorted(p.rglob("*")):
            if f.is_file() and f.suffix in TEXT_SUFFIXES and not SKIP_DIRS & set(f.relative_to(SOURCE_DIR).parts):
                out.append(f)
    return out


def _headings(doc: Path) -> set[str]:
    """Section numbers of a markdown file: '## 2. The torch.save zip' -> '2',
    '### 2.B Zip container' -> '2.B'."""
    found = set()
    for line in doc.read_text().splitlines():
        m = re.match(r"^#{2,6}\s+(\d+(?:\.[\dA-Z]+)*)\.?\s", line)
        if m:
            found.add(m[1])
    return found


def _hazard_ids(doc: Path) -> set[str]:
    return set(re.findall(r"^\*\*([PZSW]\d+)\.", doc.read_text(), re.M))


def _resolve(citing: Path, path: str, name: str) -> Path | None:
    if path:
        for base in (citing.parent, SOURCE_DIR):
            p = (base / path / name).resolve()
            if p.is_file():
                return p
        return None
    for base in (citing.parent, SOURCE_DIR / "docs", SOURCE_DIR):
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def citations() -> list[tuple[str, int, str, str]]:
    """(citing file, line, cited path as written, what follows the name)."""
    out = []
    for f in _files():
        try:
            lines = f.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(lines, 1):
            for m in CITATION.finditer(line):
                out.append((str(f.relative_to(SOURCE_DIR)), i, m["path"] + m["name"], line[m.end():]))
    return out


CITATIONS = citations()


def test_citations_found():
    cited = {c[2].rsplit("/", 1)[-1] for c in CITATIONS}
    assert {"formats.md", "security.md", "findings.md", "hazards.md"} <= cited, sorted(cited)


def test_every_cited_document_is_in_the_repository():
    problems = []
    root = SOURCE_DIR.resolve()
    for where, line, cited, _ in CITATIONS:
        path, _, name = cited.rpartition("/")
        target = _resolve(SOURCE_DIR / where, path + "/" if path else "", name)
        if target is None:
            problems.append(f"{where}:{line}: {cited} does not exist")
        elif root not in target.parents:
            problems.append(f"{where}:{line}: {cited} is outside the repository")
    assert not problems, "\n".join(problems)


def test_every_cited_section_and_hazard_exists():
    problems = []
    checked = 0
    for where, line, cited, rest in CITATIONS:
        path, _, name = cited.rpartition("/")
        target = _resolve(SOURCE_DIR / where, path + "/" if path else "", name)
        if target is None:
            continue  # reported by the test above
        headings, hazards = _headings(target), _hazard_ids(target)
        while (m := REF.match(rest)):
            rest = rest[m.end():]
            checked += 1
            if m["section"]:
                if m["section"] not in headings:
                    problems.append(f"{where}:{line}: {cited} has no section {m['section']}")
                continue
            ids = [m["h1"] + m["n1"]]
            if m["n2"]:
                ids.append((m["h2"] or m["h1"]) + m["n2"])
            for h in ids:
                if h not in hazards:
                    problems.append(f"{where}:{line}: {cited} defines no hazard {h}")
    assert checked >= 20, f"only {checked} section or hazard references found: is the pattern broken?"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", ["formats.md", "security.md"])
def test_docs_name_their_upstream_sources(doc):
    text = (SOURCE_DIR / "docs" / doc).read_text()
    for source in ("torch/serialization.py", "inline_container.cc", "tensor.rs"):
        assert source in text, f"docs/{doc} does not cite {source}"
