set +e
export PYTHONPATH=$PWD:$PYTHONPATH ATTNGEN_CACHE_DIR=/tmp/x ATTNGEN_COMMIT=6fc8992
echo "== wgsl i8 appends (decode twin)"; timeout 110 python3 -u -m pytest -q -p no:cacheprovider tests/equivalence/test_wgsl_kv_quant.py -k "(resident and decode and i8) or (many_appended and i8)" 2>&1 | tail -4
for extra in "target cuda { stages=3 }" "tile kv=64
 target cuda { stages=4 }" "tile kv=256"; do
  echo "== e4m3 extra: $extra"; timeout 45 python3 -u benchmarks/probes/probe_cuda_kvq.py --kv e4m3 --layouts contiguous --lengths 4096,32768 --extra "$extra" 2>&1 | grep -E "Lk|rror" | head -4
done
echo "== fp8 suite"; timeout 260 python3 -u benchmarks/run_gpu.py --only fp8 --out $OUT/fp8 2>&1 | tail -20
