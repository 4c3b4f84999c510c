#!/usr/bin/env bash
# One device call: the whole test suite on both targets (CUDA through CuPy, WGSL through wgpu on
# the GPU's Vulkan driver), then the benchmark. Logs and results go to $OUT (default ./gpu-out).
#   ATTNGEN_COMMIT=<sha> bash benchmarks/gpu_session.sh [tests|bench|all|checks|lowp|repeat] [pytest args...]
# repeat: N=<runs> rounds of `pytest -n <cores> -rA --tb=long` over the given tests (default the CUDA
# equivalence and backend tests), each round's log kept as $OUT/repeat-<i>.log, its summary printed:
# for a failure seen once in a parallel run (benchmarks/NOTES.md, 2026-11-27, third session).
# lowp: issue 44's FP8 / quantized-cache GPU tests that the full pass leaves long, under memcheck and
# racecheck too, and the WGSL quantized-cache tests on NVIDIA's Vulkan (time-limited), a few minutes.
# checks: the probes and sanitizer runs (probe_tma.py, the WGSL adapter's profile, compute-sanitizer
# racecheck + memcheck on every example, on the bad-input / hidden-value cases and on the backward, the CUDA-graph
# replay loop of stress_graph_replay.py), a few minutes.
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
if [ "$what" = repeat ]; then
    [ $# -gt 0 ] || set -- tests/equivalence tests/backends/cuda
    for i in $(seq "${N:-5}"); do
        python3 -m pytest -q -n "$(nproc)" -p no:cacheprovider -rA --tb=long "$@" >"$out/repeat-$i.log" 2>&1 || rc=1
        echo "round $i: $(tail -n 1 "$out/repeat-$i.log")"; grep -E "^(FAILED|ERROR) " "$out/repeat-$i.log" | head -5
    done
fi
if [ "$what" = checks ]; then
    cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
    step() { echo "=== $*"; timeout 300 "$@" >"$out/check.log" 2>&1; r=$?; tail -n 12 "$out/check.log"; [ $r = 0 ] || rc=$r; }
    step python3 benchmarks/probes/probe_tma.py
    step python3 -c "from attngen.backends import wgsl; p = wgsl.adapter_profile(); print(p.name, p.features)"
    step "$cs" --tool racecheck --error-exitcode 1 python3 benchmarks/tools/racecheck_examples.py
    step "$cs" --tool memcheck --error-exitcode 1 python3 benchmarks/tools/racecheck_examples.py
    step "$cs" --tool racecheck --error-exitcode 1 python3 benchmarks/tools/racecheck_values.py
    step "$cs" --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sanitize.py
    step "$cs" --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sanitize_backward.py
    step "$cs" --tool racecheck --error-exitcode 1 python3 benchmarks/tools/sanitize_backward.py
    step python3 benchmarks/tools/stress_graph_replay.py --rounds 100 --burn
fi
if [ "$what" = lowp ]; then
    # Issue 44's kernels (FP8 prefill, quantized caches): the GPU tests the full pass leaves long, and
    # compute-sanitizer on them (small shapes). WGSL on NVIDIA's Vulkan compiles slowly (~20 s a
    # kernel): its quantized-cache tests run serially with a time limit; LOWP_WGSL_K picks a subset.
    cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
    pt=(python3 -m pytest -q -p no:cacheprovider -rf)
    step() { echo "=== $*"; timeout "${STEP_S:-240}" "$@" >"$out/check.log" 2>&1; r=$?; tail -n 6 "$out/check.log"; [ $r = 0 ] || rc=$r; }
    step "${pt[@]}" tests/equivalence/test_fp8_prefill.py -k swizzle64
    # (-k: a test id holds the schedule as written, split_kv(auto), and -k reads parentheses as its
    # own: `auto` selects it; head_dims: f32 on CUDA cores, i8 with 8-byte scale copies (d192), d256 paged)
    step "$cs" --tool memcheck --error-exitcode 1 "${pt[@]}" -x tests/equivalence/test_cuda_kv_quant.py \
        -k "matches_the_reference or append or head_dims"
    step "$cs" --tool racecheck --error-exitcode 1 "${pt[@]}" -x tests/equivalence/test_cuda_kv_quant.py \
        -k "(matches_the_reference and (auto or two_pass)) or (append and i8 and auto)"
    step "$cs" --tool memcheck --error-exitcode 1 "${pt[@]}" -x tests/equivalence/test_fp8_prefill.py \
        -k "test_fp8_matches_the_reference and lq113-lk1023"
    step "$cs" --tool racecheck --error-exitcode 1 "${pt[@]}" -x tests/equivalence/test_fp8_prefill.py \
        -k "test_fp8_matches_the_reference and lq113-lk1023 and (none or causal-)"
    # the 64-byte swizzle's kernels (Q and K boxes of 64-byte rows) under memcheck too, q 192 and 128
    step "$cs" --tool memcheck --error-exitcode 1 "${pt[@]}" -x tests/equivalence/test_fp8_prefill.py \
        -k "(swizzle64_matches_the_reference or swizzle64_tiles) and lq113-lk1023 and (none or causal-)"
    sel=(); [ -z "${LOWP_WGSL_K:-}" ] || sel=(-k "$LOWP_WGSL_K")
    STEP_S=${LOWP_WGSL_S:-300} step "${pt[@]}" tests/equivalence/test_wgsl_kv_quant.py tests/equivalence/test_wgsl_decode.py \
        "${sel[@]+"${sel[@]}"}"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    start=$(date +%s)
    python3 benchmarks/run_gpu.py --out "$out" >"$out/bench.log" 2>&1 || rc=$?
    echo "bench: rc=$rc in $(( $(date +%s) - start )) s"; tail -n 80 "$out/bench.log"
fi
exit $rc
