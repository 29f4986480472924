#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; idempotent) and runs each for a while.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [JOBS]      default 60 s, 1 job
#   fuzz/run.sh --ci                             the CI step: 10 s per target, 1 job,
#                                                one target per core at a time
#   FUZZ_TARGETS="pickle torch_archive" fuzz/run.sh 600   only these targets
#
# Per target: -max_total_time=SECONDS, -timeout=1 (an input taking over 1 s is a hang),
# -rss_limit_mb=2048, -malloc_limit_mb=1024, the target's dictionary, and as corpus:
#   fuzz/corpus/<target>/   (written: what the fuzzer finds; git-ignored, kept between runs)
#   fuzz/seeds/<target>/    (committed seeds, fuzz/make_seeds.py)
#   tests/regressions/<target>/  (every crash found so far)
#   samples/, ../shared/corpora/{picklescan,ziplinter}/ where they exist (read only)
# Crashes, timeouts, OOMs and leaks go to fuzz/artifacts/<target>/ (git-ignored) and make
# the script exit 1; the log of each run is fuzz/artifacts/<target>.log. JOBS > 1 runs the
# target in libFuzzer's -fork mode with that many processes. Campaigns run under
# nice -n ${FUZZ_NICE:-10}. Environment: BUILD_DIR (default build-fuzz; CI passes build-asan,
# whose clang build has the targets too), FUZZ_TARGETS,
# FUZZ_EXTRA_ARGS (passed to every libFuzzer run).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=60
jobs=1
ci=0
positional=()
for a in "$@"; do
  case "$a" in
    --ci) ci=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) positional+=("$a") ;;
  esac
done
if [ "$ci" = 1 ]; then seconds=10; jobs=1; fi
[ ${#positional[@]} -ge 1 ] && seconds=${positional[0]}
[ ${#positional[@]} -ge 2 ] && jobs=${positional[1]}
case "$seconds$jobs" in *[!0-9]*) echo "run.sh: SECONDS and JOBS must be integers" >&2; exit 2 ;; esac

build=${BUILD_DIR:-build-fuzz}
# Every target fuzz/CMakeLists.txt builds (its set() and list(APPEND) lines), so a new
# target is fuzzed in CI without a second list to keep in step.
all_targets=$(sed -n -e 's/^set(CKPT_FUZZ_TARGETS \(.*\))$/\1/p' -e 's/^list(APPEND CKPT_FUZZ_TARGETS \(.*\))$/\1/p' \
  fuzz/CMakeLists.txt | tr '\n' ' ')
[ -n "$all_targets" ] || { echo "run.sh: no CKPT_FUZZ_TARGETS in fuzz/CMakeLists.txt" >&2; exit 2; }
targets=${FUZZ_TARGETS:-$all_targets}
nice_level=${FUZZ_NICE:-10}

# --- build (idempotent) ------------------------------------------------------------------
# clang and its libFuzzer runtime come from Debian, installed here when missing (as
# scripts/build.sh does for the rest), so CI on a fresh machine needs no extra step.
fuzzer_runtime() { compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; }
if ! command -v clang++ >/dev/null || ! fuzzer_runtime; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  echo "run.sh: installing clang and libclang-rt-dev (libFuzzer)"
  { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null; } ||
    { echo "run.sh: cannot install clang (apt-get install clang libclang-rt-dev)" >&2; exit 2; }
fi
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCKPTOOL_FUZZ_ONLY=ON >/dev/null || { echo "run.sh: cmake configure failed" >&2; exit 2; }
fi
grep -q '^build fuzz_all:' "$build/build.ninja" ||
  { echo "run.sh: $build has no fuzz targets (it needs clang and CKPTOOL_FUZZ=ON)" >&2; exit 2; }
nice -n "$nice_level" cmake --build "$build" --target fuzz_all -- -j"${FUZZ_BUILD_JOBS:-2}" >/dev/null ||
  { echo "run.sh: build failed (rerun: cmake --build $build --target fuzz_all)" >&2; exit 2; }

# --- dictionaries ------------------------------------------------------------------------
mkdir -p fuzz/artifacts
cat fuzz/zip.dict fuzz/pickle.dict > "$build/torch.dict"
cat fuzz/pickle.dict fuzz/dcp.dict > "$build/dcp.dict"
cat fuzz/sets.dict fuzz/dcp.dict fuzz/hf_index.dict fuzz/safetensors.dict fuzz/zip.dict > "$build/sets.dict"
dict_for() {
  case "$1" in
    pickle) echo fuzz/pickle.dict ;;
    dcp_metadata) echo "$build/dcp.dict" ;;
    zip_index) echo fuzz/zip.dict ;;
    safetensors) echo fuzz/safetensors.dict ;;
    rekey_ops) echo fuzz/rekey.dict ;;
    hf_index) echo fuzz/hf_index.dict ;;
    pt2_json) echo fuzz/pt2_json.dict ;;
    dcp_sets) echo "$build/sets.dict" ;;
    *) echo "$build/torch.dict" ;;
  esac
}
max_len_for() {
  case "$1" in
    pickle|safetensors|dcp_metadata|hf_index|pt2_json) echo 32768 ;;
    rekey_ops) echo 4096 ;;
    *) echo 65536 ;;
  esac
}
extra_dirs_for() {
  local dirs=()
  case "$1" in
    pickle|dcp_metadata) dirs=(../shared/corpora/picklescan) ;;
    zip_index) dirs=(samples ../shared/corpora/ziplinter ../shared/corpora/picklescan) ;;
    torch_archive) dirs=(samples ../shared/corpora/picklescan ../shared/corpora/ziplinter) ;;
    safetensors) dirs=(samples) ;;
    torchscript_meta|rewrite_roundtrip) dirs=(samples) ;;
  esac
  for d in "${dirs[@]}"; do [ -d "$d" ] && echo "$d"; done
}

# --- campaign ----------------------------------------------------------------------------
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
# Targets run side by side, up to one per core (a libFuzzer run without -fork is one
# process): the CI step takes half the time on two cores.
parallel=${FUZZ_PARALLEL:-1}
if [ "$ci" = 1 ]; then parallel=${FUZZ_PARALLEL:-$(nproc)}; fi
echo "run.sh: $seconds s per target, $jobs job(s), $parallel target(s) at a time, targets: $targets"

# Runs one target; its summary line goes to fuzz/artifacts/<target>.summary, its exit
# status says whether it failed.
run_target() {
  local t=$1
  local bin="$build/fuzz/fuzz_$t"
  local out="fuzz/artifacts/$t.summary"
  mkdir -p "fuzz/artifacts"
  if [ ! -x "$bin" ]; then
    echo "run.sh: no such target: $t" >&2
    printf '%-18s FAILED: no such target\n' "$t" > "$out"
    return 1
  fi
  local corpus="fuzz/corpus/$t"
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  local dirs=("$corpus") d
  for d in "fuzz/seeds/$t" "tests/regressions/$t"; do [ -d "$d" ] && dirs+=("$d"); done
  while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(extra_dirs_for "$t")
  local log="fuzz/artifacts/$t.log"
  local args=(-max_total_time="$seconds" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -max_len="$(max_len_for "$t")" -dict="$(dict_for "$t")" -print_final_stats=1
        -artifact_prefix="fuzz/artifacts/$t/")
  if [ "$jobs" -gt 1 ]; then args+=(-fork="$jobs" -ignore_crashes=0 -ignore_timeouts=0 -ignore_ooms=0); fi
  # shellcheck disable=SC2206
  [ -n "${FUZZ_EXTRA_ARGS:-}" ] && args+=(${FUZZ_EXTRA_ARGS})
  echo "run.sh: fuzz_$t ${args[*]} ${dirs[*]}" > "$log"
  local start rc elapsed execs rate cov status why line
  start=$(date +%s)
  nice -n "$nice_level" "$bin" "${args[@]}" "${dirs[@]}" >>"$log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  # Executions: -print_final_stats in single-process mode, else the last status line.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    execs=${execs:-0}
    rate=$(( elapsed > 0 ? execs / elapsed : 0 ))
  fi
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  status=ok
  if [ $rc -ne 0 ]; then
    why=$(grep -m1 -oE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)[^(]*|==ckpt-fuzz==.*|runtime error:.*|uncaught exception|deadly signal|out-of-memory[^)]*|timeout after [0-9]+ seconds' "$log" | head -1)
    [ -n "$why" ] || why=$(tail -1 "$log")
    status="FAILED rc=$rc: $why"
    status="$status; artifacts in fuzz/artifacts/$t/, log $log"
  fi
  line=$(printf '%-18s %6ss %12s execs %8s exec/s  %-22s %s' "$t" "$elapsed" "$execs" "$rate" "$cov" "$status")
  echo "$line"
  echo "$line" > "$out"
  [ $rc -eq 0 ]
}

running=0
for t in $targets; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
summary=()
for t in $targets; do
  summary+=("$(cat "fuzz/artifacts/$t.summary" 2>/dev/null || printf '%-18s FAILED: no summary' "$t")")
done

echo
echo "run.sh: summary ($seconds s per target, $jobs job(s))"
printf '%s\n' "${summary[@]}"
exit $failed
