#!/usr/bin/env bash
# Installs what is missing (Debian packages, the project venv with the pinned torch), then
# configures and builds into build/ (or $BUILD_DIR). Idempotent: quick when nothing changed.
#   CKPTOOL_SANITIZE=1  build with AddressSanitizer + UBSan (default dir build-asan/)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

sanitize=${CKPTOOL_SANITIZE:-0}
if [ "$sanitize" = 1 ]; then build=${BUILD_DIR:-build-asan}; else build=${BUILD_DIR:-build}; fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: the C++ dependencies and tools.
packages=(cmake ninja-build g++ pkg-config zlib1g-dev libcli11-dev nlohmann-json3-dev libspdlog-dev doctest-dev libre2-dev libzstd-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || packages+=(python3-venv)
# The sanitized build is clang's, so that it also builds the libFuzzer targets (fuzz/) from
# the same objects: one build for the ASan suite and the fuzzing CI runs.
[ "$sanitize" = 1 ] && packages+=(clang libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build.sh: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The project venv: LibTorch (inside the torch wheel) and the reference clients.
req=scripts/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "build.sh: setting up .venv (torch and friends; a few GB on first run)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # No wheel cache: it would hold a second copy of torch's ~3 GB of wheels on a fresh
  # machine's disk, which the test suite needs more.
  .venv/bin/python -m pip install -q --no-cache-dir --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

torch_prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The sanitizer build only has to find bugs: -O1 with line tables is what ASan reports
# need. -O0 compiles a file about 2.5x faster under ASan + UBSan (entry_leaves.cpp: 8.5 s
# against 21.5 s of CPU), but the suite then ran much longer than the build saved (a
# clean-clone rehearsal, 2026-11-28): the python tests run ckptool thousands of times.
# No CUDA loader there: no GPU runs it under the sanitizers, and the normal build compiles it
# (its pipeline logic is LibTorch-free and runs in the unit tests against a hostile engine).
# The normal build keeps -O2 with line tables only (-g1): backtraces keep files and lines,
# and a file compiles about 20% faster than with full debug information.
# Both builds compile the library and the CLI in unity batches (CMakeLists.txt,
# CKPTOOL_UNITY): most of a file's compile time is the inline code of the headers it shares
# with the others (JSON, CLI11, LibTorch), which a batch compiles once. Under ASan + UBSan,
# twelve ckpt_core files took 72 CPU s as one batch against 140 s one by one (2026-11-28).
if [ "$sanitize" = 1 ]; then build_type=(-DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" -DCKPTOOL_FUZZ=ON -DCKPTOOL_CUDA=OFF);
else build_type=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"); fi
build_type+=(-DCKPTOOL_UNITY=${CKPTOOL_UNITY:-ON})
# A sanitized build dir configured before it became clang's (GCC has no libFuzzer): CMake
# cannot switch compilers in place, so configure it again.
if [ "$sanitize" = 1 ] && [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' "$build/CMakeCache.txt"; then
  echo "build.sh: $build was configured with another compiler; configuring it again with clang"
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles" "$build/build.ninja"
fi
if [ ! -f "$build/build.ninja" ]; then
  compiler=()
  [ "$sanitize" = 1 ] && compiler=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
  cmake -S . -B "$build" -G Ninja "${build_type[@]}" "${compiler[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" \
    -DCKPTOOL_SANITIZE=$([ "$sanitize" = 1 ] && echo ON || echo OFF) \
    -DCKPTOOL_PYTHON="$root/.venv/bin/python" >/dev/null
fi
# Two cores and LibTorch translation units of ~1 GB each: keep parallelism modest.
cmake --build "$build" -- -j "${JOBS:-$(nproc)}"
echo "build.sh: built $build/ckptool"
