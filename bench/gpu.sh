#!/usr/bin/env bash
# The GPU half of issue 6, for the lent GPU machine (the `device` tool's `run`): the CUDA
# tests of materialize, then `bench/run.sh --gpu`, everything written under $OUT.
#
#   bash bench/gpu.sh [all|tests|bench] [run.sh options...]
#
# Default: all = the benchmark first (the table is what matters), then the CUDA tests, with
# `--scenarios s2 --size-gib 4` (S0 calibration incl. pinned/pageable H2D, then S2 against
# torch.load(map_location=cuda), safetensors load_file(device=cuda), ...). Estimated 6-8 minutes
# for the benchmark on 16 cores; a device command may run 10 minutes at most, so if a call comes
# close, run `gpu.sh bench` and `gpu.sh tests` as two calls (the machine stays warm in between).
# Options after the first word go to run.sh and replace those defaults, e.g.
#   bash bench/gpu.sh bench --scenarios s1,s3,s4 --size-gib 4
# Fixtures stay in /tmp/ckptool-bench-gpu while the machine is held, so a second call reuses
# them (regenerated when the size or the set of scenarios asks for others).
#
# The machine has the same PyTorch (python3, torch 2.11.0+cu130) but no compiler toolchain
# for this project, so ckptool comes from here, built against that LibTorch version. The
# carry limit is 64 MiB in all, so carry stripped copies (about 3 MB) in an ignored folder:
#   mkdir -p .device/gpu-build && cp build/ckptool build/lib*.so .device/gpu-build/ \
#     && strip .device/gpu-build/*
#   run(command="bash bench/gpu.sh", carry=[".device/gpu-build"], timeout_s=600)
# (build/ itself may be carried instead if it fits; CKPTOOL_GPU_BUILD names another folder.)
# What comes back from $OUT: nvidia-smi.txt, cuda-tests.log, bench-gpu.log,
# RESULTS-gpu.md (the report to append to bench/RESULTS.md), bench-gpu.json (every sample).
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
[ $# -gt 0 ] && shift
OUT="${OUT:-/tmp/ckptool-gpu-out}"
mkdir -p "$OUT"

build="${CKPTOOL_GPU_BUILD:-}"
if [ -z "$build" ]; then
  if [ -x .device/gpu-build/ckptool ]; then build=.device/gpu-build; else build=build; fi
fi
export CKPTOOL="$PWD/$build/ckptool"
if [ ! -x "$CKPTOOL" ] || [ ! -f "$build/libckpt_core.so" ] || [ ! -f "$build/libckpt_torch.so" ] ||
   [ ! -f "$build/libckptool_torch.so" ] || [ ! -f "$build/libckptool_torch_cuda.so" ]; then
  echo "gpu.sh: no $build/ckptool + libckpt_core.so + libckpt_torch.so + libckptool_torch.so + libckptool_torch_cuda.so (carry them, see the header)" |
    tee "$OUT/bench-gpu.log"
  exit 1
fi
python="${CKPTOOL_PYTHON:-$(command -v python3)}"
export CKPTOOL_PYTHON="$python"
# The plugin's RUNPATH names this project's .venv; point the loader at the image's LibTorch and CUDA.
torchlib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$torchlib:$torchlib/../../nvidia/cu13/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  nvidia-smi || true
  echo; nproc; free -g; df -h /tmp
  "$python" -c 'import torch, safetensors; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "safetensors", safetensors.__version__)'
  "$CKPTOOL" --version
} >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

rc=0
if [ "$what" = all ] || [ "$what" = bench ]; then
  args=("$@")
  [ ${#args[@]} -eq 0 ] && args=(--scenarios s2 --size-gib 4)
  echo "== bench/run.sh --gpu ${args[*]}"
  bench/run.sh --gpu --scratch /tmp/ckptool-bench-gpu --keep --out "$OUT/RESULTS-gpu.md" \
    --raw "$OUT/bench-gpu.json" "${args[@]}" 2>&1 | tee "$OUT/bench-gpu.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$what" = all ] || [ "$what" = tests ]; then
  echo "== CUDA tests (tests/py/test_materialize.py -k cuda)"
  PYTHONUNBUFFERED=1 CKPTOOL_SOURCE_DIR="$PWD" CKPTOOL_BUILD_DIR="$PWD/$build" \
    timeout "${CKPTOOL_GPU_TEST_TIMEOUT:-240}" "$python" -m pytest -q -p no:cacheprovider tests/py/test_materialize.py -k cuda 2>&1 \
    | tee "$OUT/cuda-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit $rc
