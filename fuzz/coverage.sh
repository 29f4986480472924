#!/usr/bin/env bash
# Source coverage of the parser sources over the fuzz corpora (clang source-based
# coverage: -fprofile-instr-generate -fcoverage-mapping, no sanitizers).
#
#   fuzz/coverage.sh            build build-fuzz-cov/ (idempotent), replay every target's
#                               corpus once (-runs=0), print the llvm-cov report
#   fuzz/coverage.sh --html     also write an HTML report to fuzz/coverage/html/
#
# Corpus per target, as in fuzz/run.sh: fuzz/corpus/<t>/ (what campaigns found),
# fuzz/seeds/<t>/, tests/regressions/<t>/, samples/ and ../shared/corpora/ where present.
# Output: fuzz/coverage/ (git-ignored): <t>.profraw, merged.profdata, report.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

html=0
[ "${1:-}" = "--html" ] && html=1
build=${COV_BUILD_DIR:-build-fuzz-cov}
tool() {
  for c in "$1-14" "/usr/lib/llvm-14/bin/$1" "$1"; do command -v "$c" >/dev/null && { echo "$c"; return; }; done
  echo "coverage.sh: $1 not found (llvm-14 tools come with clang-14)" >&2; exit 2
}
profdata=$(tool llvm-profdata)
cov=$(tool llvm-cov)

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCKPTOOL_FUZZ_ONLY=ON -DCKPTOOL_FUZZ_COVERAGE=ON >/dev/null
fi
nice -n "${FUZZ_NICE:-10}" cmake --build "$build" --target fuzz_all -- -j"${FUZZ_BUILD_JOBS:-2}" >/dev/null

out=fuzz/coverage
rm -rf "$out"
mkdir -p "$out"
targets="pickle zip_index torch_archive safetensors torchscript_meta rewrite_roundtrip"
objects=()
for t in $targets; do
  dirs=()
  for d in "fuzz/corpus/$t" "fuzz/seeds/$t" "tests/regressions/$t"; do [ -d "$d" ] && dirs+=("$d"); done
  case "$t" in
    pickle) extra=(../shared/corpora/picklescan) ;;
    zip_index|torch_archive) extra=(samples ../shared/corpora/picklescan ../shared/corpora/ziplinter) ;;
    *) extra=(samples) ;;
  esac
  for d in "${extra[@]}"; do [ -d "$d" ] && dirs+=("$d"); done
  files=$(find "${dirs[@]}" -type f | wc -l)
  echo "coverage.sh: fuzz_$t over $files files"
  LLVM_PROFILE_FILE="$out/$t.profraw" nice -n "${FUZZ_NICE:-10}" "$build/fuzz/fuzz_$t" -runs=0 \
    -max_len=1048576 "${dirs[@]}" >"$out/$t.log" 2>&1 || echo "coverage.sh: fuzz_$t exited non-zero (see $out/$t.log)"
  objects+=(-object "$build/fuzz/fuzz_$t")
done
"$profdata" merge -sparse "$out"/*.profraw -o "$out/merged.profdata"

parsers=(src/pickle/pickle_machine.cpp src/pickle/pickle_names.cpp src/pickle/pickle_text.cpp src/pickle/pickle_repr.cpp
         src/pickle/pickle_value.cpp src/pickle/pickle_keys.cpp src/pickle/pickle_writer.cpp
         src/zip/zip_reader.cpp src/zip/zip_names.cpp src/zip/zip_writer.cpp src/formats/safetensors.cpp
         src/model/checkpoint.cpp src/formats/tensor_collector.cpp src/formats/legacy_reader.cpp src/formats/format_detect.cpp
         src/rekey/rekey_file.cpp)
# The first -object is the "binary"; the rest add their coverage mappings.
first=("${objects[@]:1:1}")
"$cov" report "${first[@]}" "${objects[@]:2}" -instr-profile="$out/merged.profdata" \
  "${parsers[@]}" | tee "$out/report.txt"
if [ "$html" = 1 ]; then
  "$cov" show "${first[@]}" "${objects[@]:2}" -instr-profile="$out/merged.profdata" \
    -format=html -output-dir="$out/html" -show-branches=count "${parsers[@]}"
  echo "coverage.sh: HTML report in $out/html/index.html"
fi
