#!/usr/bin/env bash
# One device call: the whole test suite on both targets (CUDA through CuPy, WGSL through wgpu on
# the GPU's Vulkan driver), then the benchmark. Logs and results go to $OUT (default ./gpu-out).
#   ATTNGEN_COMMIT=<sha> bash benchmarks/gpu_session.sh [tests|bench|all] [pytest args...]
# (on a GPU machine prepared as benchmarks/README.md says)
# The device machine's copy of .git may be stale: pass the commit you run (git rev-parse --short
# HEAD, here) as ATTNGEN_COMMIT, or the results say "unknown".
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
out=${OUT:-gpu-out}; mkdir -p "$out"
export ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}
export ATTNGEN_COMMIT=${ATTNGEN_COMMIT:-unknown}
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
    start=$(date +%s)
    python3 -m pytest -q -n "$(nproc)" -p no:cacheprovider tests "$@" >"$out/tests.log" 2>&1; rc=$?
    echo "tests: rc=$rc in $(( $(date +%s) - start )) s"; tail -n 25 "$out/tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    start=$(date +%s)
    python3 benchmarks/run_gpu.py --out "$out" >"$out/bench.log" 2>&1 || rc=$?
    echo "bench: rc=$rc in $(( $(date +%s) - start )) s"; tail -n 80 "$out/bench.log"
fi
exit $rc
