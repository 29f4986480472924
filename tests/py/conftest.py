"""Shared pytest fixtures for the end-to-end tests: the ckptool binary, the reference
checkpoints (built once per session by real torch / lightning / safetensors), and helpers
to run ckptool.

Environment (set by ctest, see tests/CMakeLists.txt):
  CKPTOOL             path to the ckptool binary (default: <source>/build/ckptool)
  CKPTOOL_SOURCE_DIR  project root (default: two levels above this file)
  CKPTOOL_BUILD_DIR   build directory
  CKPTOOL_CORPORA     the adversarial corpora (default: <source>/../shared/corpora)
  CKPTOOL_FIXTURES    reuse fixtures already built in this directory (optional)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fixtures as fxmod  # noqa: E402

SOURCE_DIR = Path(os.environ.get("CKPTOOL_SOURCE_DIR", HERE.parent.parent)).resolve()
CKPTOOL = Path(os.environ.get("CKPTOOL", SOURCE_DIR / "build" / "ckptool"))
SANITIZED = os.environ.get("CKPTOOL_SANITIZE", "").upper() in ("ON", "1", "TRUE", "YES")
# Sanitized builds are slower; scale time limits.
TIME_SCALE = 4.0 if SANITIZED else 1.0


def corpora_dir() -> Path:
    env = os.environ.get("CKPTOOL_CORPORA")
    if env:
        return Path(env)
    return (SOURCE_DIR / ".." / "shared" / "corpora").resolve()


def run_ckptool(*args, timeout: float = 60, cwd=None, env=None) -> tuple[int, str, str]:
    """Run ckptool; returns (returncode, stdout, stderr). A signal gives a negative code."""
    if not CKPTOOL.exists():
        pytest.fail(f"ckptool binary not found at {CKPTOOL} (set CKPTOOL)")
    e = dict(os.environ)
    e.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    if env:
        e.update(env)
    p = subprocess.run([str(CKPTOOL), *map(str, args)], capture_output=True, timeout=timeout,
                       cwd=cwd, env=e)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def peak_rss_mib(args, timeout: float = 120) -> float:
    """Peak RSS of one successful ckptool run, as GNU time reports it. time runs ckptool from
    a small process of its own: a child forked from pytest would inherit pytest's peak."""
    p = subprocess.run(["/usr/bin/time", "-f", "%M", str(CKPTOOL), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def inspect_json(path, *extra, timeout: float = 60) -> dict:
    """`ckptool inspect --json PATH`, asserting success and one well-formed JSON document."""
    rc, out, err = run_ckptool("inspect", "--json", *extra, path, timeout=timeout)
    assert rc == 0, f"inspect --json {path}: exit {rc}, stderr: {err.strip()[:2000]}"
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        raise AssertionError(f"inspect --json {path}: stdout is not one JSON document: {e}; "
                             f"stdout starts {out[:300]!r}") from None


@pytest.fixture(scope="session")
def ckptool() -> Path:
    if not CKPTOOL.exists():
        pytest.fail(f"ckptool binary not found at {CKPTOOL} (set CKPTOOL)")
    return CKPTOOL


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory) -> Path:
    reuse = os.environ.get("CKPTOOL_FIXTURES")
    if reuse:
        Path(reuse).mkdir(parents=True, exist_ok=True)
        return Path(reuse)
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def fixture_set(fixture_dir) -> dict:
    """name -> fixtures.Fixture, all of fixtures.BUILDERS, built once per session."""
    return fxmod.build_all(fixture_dir)


_lazy_cache: dict = {}


def _lazy(name: str, d: Path):
    if name not in _lazy_cache:
        _lazy_cache[name] = fxmod.LAZY_BUILDERS[name](d)
    return _lazy_cache[name]


@pytest.fixture(scope="session")
def zip64_fixture(fixture_dir):
    return _lazy("zip64", fixture_dir)


@pytest.fixture(scope="session")
def big_fixture(fixture_dir):
    return _lazy("big", fixture_dir)
