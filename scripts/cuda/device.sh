#!/usr/bin/env bash
# Build, check and time the CUDA kernels on the GPU machine in one call.
#
# Run it through the device tool from the repository root, with the Go test
# binaries built beforehand here (scripts/cuda/build-tests.sh) and carried:
#   run(command="bash scripts/cuda/device.sh", carry=["dev-out"])
#
# Modes (first argument): all (default: build, tests, benchmark),
# test (build + tests), bench (build + benchmark), sanitize (build +
# compute-sanitizer memcheck on the short tests; a second argument replaces
# the -test.run pattern), build (the library only, for a command that runs
# its own selection of tests next).
# Everything it writes lands in $OUT (or ./dev-out/device when OUT is unset):
# ptxas.txt (registers/spills), test-*.log, bench.csv, bench.log, env.txt.
set -uo pipefail
mode=${1:-all}
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/device}
mkdir -p "$OUT" build
status=0

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
    nvcc --version | tail -2
} 2>&1 | tee "$OUT/env.txt"

# Build: each .cu in parallel, then link (build-lib.sh).
bash scripts/cuda/build-lib.sh || exit 1
cat build/*.o.ptxas >"$OUT/ptxas.txt"
grep -h "spill" "$OUT/ptxas.txt" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -5

export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1

if [ "$mode" = all ] || [ "$mode" = test ]; then
    for bin in dev-out/*.test; do
        [ -x "$bin" ] || continue
        name=$(basename "$bin" .test)
        t0=$(date +%s)
        "$bin" -test.v -test.timeout 400s >"$OUT/test-$name.log" 2>&1
        rc=$?
        [ $rc -eq 0 ] || status=$rc
        echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s"
        grep -E "^(--- FAIL|FAIL|panic)|max error|relative error|device:" "$OUT/test-$name.log" | head -80
    done
fi

if [ "$mode" = sanitize ]; then
    compute-sanitizer --tool memcheck --error-exitcode 9 dev-out/cuda.test -test.short -test.timeout 500s \
        -test.run "${2:-Quantize|Batch|MatVecIDs|Ops|Graph|Exact|BackendMatchesCPU/q8\$}" >"$OUT/sanitize.log" 2>&1
    echo "== compute-sanitizer exit $?"; tail -20 "$OUT/sanitize.log"
fi

if [ "$mode" = all ] || [ "$mode" = bench ]; then
    DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_OUT="$OUT/bench.csv" dev-out/cuda.test -test.run "TestBandwidth|TestDecodeSpeed" -test.v -test.timeout 500s \
        >"$OUT/bench.log" 2>&1 || status=$?
    echo "== bench"
    grep -E "^(decode|  )|FAIL|panic" "$OUT/bench.log"; cat "$OUT/bench.csv" 2>/dev/null || tail -30 "$OUT/bench.log"
fi
exit $status
