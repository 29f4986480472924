#!/usr/bin/env bash
# ckptool benchmark (issue 6): fixtures made by real PyTorch, calibration, then scenarios
# S1..S5 against PyTorch, safetensors and cp, each tool a fresh process per sample.
#
#   bench/run.sh [--quick] [--gpu] [--out FILE] [options]
#
#   --quick          CI-sized run (64 MiB fixtures, 3 repeats, fewer peers; a few minutes)
#   --gpu            also S2 (materialize to CUDA) and the host-to-device calibration
#   --out FILE       append the report to FILE (default: bench/RESULTS.md for a full run;
#                    a --quick run appends nowhere unless --out is given)
#   --raw FILE       also write every sample as JSON
#   --size-gib N     size of the main fixtures (default: by machine, at most 4 GiB here,
#                    12 GiB with --gpu: min(cap, RAM/10, free disk/16), a power of two)
#   --repeats N      samples per tool (default 5; --quick 3)
#   --scenarios L    comma list out of s1,s2,s3,s4,s5,s6,s7,s8,s9,s10,s11 (default: s1..s5; s6 = sharded
#                    sets, s7 = convert, s8 = diff, s10 = parallel convert, s11 = torch.export .pt2)
#   --scratch DIR    where fixtures go (default: a new directory under $TMPDIR or /tmp,
#                    removed at the end); --keep keeps it
#   --fixtures DIR   reuse fixtures a previous --keep run generated (DIR/manifest.json)
#   -v               one line per sample
#
# Environment: CKPTOOL (binary; default build/ckptool), CKPTOOL_PYTHON (python with torch and
# safetensors; default .venv/bin/python, else python3), CKPTOOL_BENCH_TINY=1 (smoke test:
# ~8 MB fixtures, 2 repeats, fewest peers; implies --quick).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"

quick=0 gpu=0 keep=0 out="" out_set=0 scratch="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --gpu) gpu=1; extra+=(--gpu) ;;
    --out) out="$2"; out_set=1; shift ;;
    --raw) extra+=(--raw "$2"); shift ;;
    --size-gib) extra+=(--size "$(awk -v g="$2" 'BEGIN { printf "%d", g * 1073741824 }')"); shift ;;
    --repeats) extra+=(--repeats "$2"); shift ;;
    --scenarios) extra+=(--scenarios "$2"); shift ;;
    --scratch) scratch="$2"; shift ;;
    --fixtures) extra+=(--fixtures "$2"); shift ;;
    --keep) keep=1 ;;
    -v) extra+=(-v) ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

ckptool="${CKPTOOL:-$root/build/ckptool}"
if [ ! -x "$ckptool" ]; then
  echo "run.sh: no ckptool at $ckptool (build it, or set CKPTOOL)" >&2
  exit 1
fi
python="${CKPTOOL_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python="$(command -v python3)"; fi
fi
if ! "$python" -c 'import torch, safetensors' 2>/dev/null; then
  echo "run.sh: $python cannot import torch and safetensors (set CKPTOOL_PYTHON)" >&2
  exit 1
fi

mode_args=()
if [ "${CKPTOOL_BENCH_TINY:-0}" = 1 ]; then
  mode_args=(--tiny); quick=1
elif [ $quick = 1 ]; then
  mode_args=(--quick)
fi
if [ $out_set = 0 ] && [ $quick = 0 ]; then out="$here/RESULTS.md"; fi

# Scratch space: bench.py checks that the fixtures fit (8x the main size + 10x the S3 size)
# before writing anything.
base="${TMPDIR:-/tmp}"
if [ -z "$scratch" ]; then
  scratch="$(mktemp -d "$base/ckptool-bench.XXXXXX")"
  made_scratch=1
else
  mkdir -p "$scratch"
  made_scratch=0
fi
cleanup() {
  if [ $keep = 0 ]; then
    if [ $made_scratch = 1 ]; then rm -rf "$scratch"; else rm -rf "$scratch/fixtures" "$scratch/bin" "$scratch"/out.*; fi
  else
    echo "run.sh: kept $scratch"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
df -h "$scratch" | sed 's/^/run.sh: /'

# Run a snapshot of the binaries: a rebuild of build/ while the benchmark runs must neither
# break it nor mix two versions into one table. ckptool loads libckptool_torch.so from its
# own directory, and its shared libraries (libckpt_core.so, libckpt_torch.so) from there too.
mkdir -p "$scratch/bin"
cp -p "$ckptool" "$scratch/bin/ckptool"
for lib in "$(dirname "$ckptool")"/lib*.so; do [ -f "$lib" ] && cp -p "$lib" "$scratch/bin/"; done
ckptool_src="$ckptool"
ckptool="$scratch/bin/ckptool"
cmd="bench/run.sh"
[ $quick = 1 ] && [ "${CKPTOOL_BENCH_TINY:-0}" != 1 ] && cmd+=" --quick"
[ "${CKPTOOL_BENCH_TINY:-0}" = 1 ] && cmd="CKPTOOL_BENCH_TINY=1 $cmd --quick"
[ $gpu = 1 ] && cmd+=" --gpu"
for a in "${extra[@]}"; do case "$a" in --gpu) ;; *) cmd+=" $a" ;; esac; done
[ $out_set = 1 ] && cmd+=" --out $out"

# Python peers use every core for their intra-op threads, as users' processes would.
PYTHONUNBUFFERED=1 "$python" "$here/bench.py" --scratch "$scratch" --ckptool "$ckptool" --ckptool-source "$ckptool_src" \
  --python "$python" \
  "${mode_args[@]}" ${out:+--out "$out"} --command "$cmd" "${extra[@]}"
