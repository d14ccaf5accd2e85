#!/usr/bin/env bash
# Nsight Compute detail of the small decode kernels as TestOpLatency runs
# them (Flash shapes, 8k context; no model loaded, so no device-memory
# backup between replay passes): one launch of each kernel in KERNELS
# (space-separated names), the details page (speed of light, occupancy,
# warp stalls, source counters) into ncu-oplat.txt and the SASS with
# per-instruction stall samples into sass-<kernel>.csv under $OUT.
# TEST names another test of the CUDA package (e.g. TestBandwidth); KERNELS
# then holds ';'-separated regexes of demangled names, as ncu spells them
# ("void ds4mv::k_matvec<ds4mv::TIQ2_XXS, (int)1, (int)1, (int)4, (bool)1>(...)"),
# e.g. "k_matvec<ds4mv::TIQ2_XXS, .int.1, .int.1, .int.4;k_mv_pipe<ds4mv::TQ8_0"
# (the first launch that matches each is profiled).
#   run(command="bash scripts/cuda/ncu-oplat.sh", carry=["dev-out/final"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/ncu-oplat}
mkdir -p "$OUT"
F=${F:-dev-out/final}
[ -s build/libds4cuda.so ] || bash scripts/cuda/device.sh build | grep -E "FAILED|error" 
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1 DS4_CUDA_BENCH=1
TEST=${TEST:-TestOpLatency}
KERNELS=${KERNELS:-k_topk_warp;k_index_tile;k_attn_scores;k_attn_po}
IFS=';' read -ra KS <<<"$KERNELS"
for k in "${KS[@]}"; do
    f=$(echo "$k" | tr -c 'A-Za-z0-9_\n' '_' | sed 's/__*/_/g; s/_$//')
    ncu --clock-control none --cache-control none --kernel-name-base demangled -k "regex:$k" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters \
        -o "/tmp/oplat-$f" -f $F/cuda.test -test.run "$TEST\$" -test.timeout 300s >"/tmp/ncu-oplat-$f.log" 2>&1
    echo "== ncu $k: exit $?"; tail -3 "/tmp/ncu-oplat-$f.log"
    ncu -i "/tmp/oplat-$f.ncu-rep" --page details >>"$OUT/ncu-oplat.txt" 2>&1
    ncu -i "/tmp/oplat-$f.ncu-rep" --page source --print-source sass --csv >"$OUT/sass-$f.csv" 2>&1
done
ls -la "$OUT"
