#!/usr/bin/env bash
# The GPU machine check for the interception library (issue 3, item 10). Run from the repo root
# on a machine with an NVIDIA GPU, PyTorch, CuPy and JAX:  bash tests/gpu/run.sh [OUT_DIR]
# Builds native/build/libgpushare.so there, runs each check in its own processes under the
# library, prints one table and writes full logs to OUT_DIR (default ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-gpu-logs}"
mkdir -p "$out"
make -C native build/libgpushare.so >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 470 python3 tests/gpu/isolation_check.py --lib native/build/libgpushare.so \
    --out "$out" 2>&1 | tee "$out/isolation_check.log"
exit "${PIPESTATUS[0]}"
