#!/usr/bin/env bash
# The GPU path on a GPU machine (issue 32): the `gpu` tests, then benchmarks/device_check.py's JSON summary.
# About 8 minutes of device time. Usage, from the repository root on a machine with CUDA and a CUDA build of torch:
#     bash benchmarks/device_check.sh [OUT_DIR]        # default OUT_DIR: ${OUT:-reports/device}
# Needs tropt importable: `pip install -e ".[dev]"` into an environment whose torch has CUDA (never the CPU pin).
set -u
OUT_DIR="${1:-${OUT:-reports/device}}"
PY="${PY:-python3}"
mkdir -p "$OUT_DIR"
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 2)" \
  || { echo "device_check: no CUDA here; nothing to run" >&2; exit 2; }
"$PY" -c "import tropt" 2>/dev/null || "$PY" -m pip install -q -e . || exit 2
start=$(date +%s)
timeout 300 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider --junitxml="$OUT_DIR/gpu_tests.xml" \
  2>&1 | tee "$OUT_DIR/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout 300 "$PY" benchmarks/device_check.py --device cuda --out "$OUT_DIR/device_summary.json" \
  2>&1 | tee "$OUT_DIR/device_check.txt"
check_rc=${PIPESTATUS[0]}
echo "{\"gpu_tests_rc\": $tests_rc, \"device_check_rc\": $check_rc, \"seconds\": $(( $(date +%s) - start ))}" \
  > "$OUT_DIR/device_rc.json"
cat "$OUT_DIR/device_rc.json"
[ "$tests_rc" = 0 ] && [ "$check_rc" = 0 ]
