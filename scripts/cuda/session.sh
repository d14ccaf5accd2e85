#!/usr/bin/env bash
# One device call that checks and times a change (binaries from
# scripts/cuda/build-smoke.sh plus ds4-bench and ds4-gguf, all in
# dev-out/final): the smoke script, the 6-layer decode test (graph modes),
# the latency of the small decode kernels (TestOpLatency), the ncu
# per-kernel profile of one decode token, then the full-size bench.
#   run(kind="nvidia-h200", command="bash scripts/cuda/session.sh", carry=["dev-out/final"])
# Writes at most 8 files under $OUT (the device tool returns 8).
# Environment: SKIP (words: smoke, decode, oplat, profile, bench, fullprof, ktrace), BUDGET for the
# bench (seconds, default 230), FRONTIERS, DECODE_MODE (TestDecodeSpeed's
# mode filter), BW (a regex: TestBandwidth's rows that match it, in
# bw.csv), AB (ds4-bench at 8k once more with this environment
# assignment, e.g. AB=DS4_CUDA_PREFETCH=0, for an A/B on the same model;
# AB_ARGS: ds4-bench flags for that run, e.g. AB_ARGS="--chunk 4096").
# fullprof: ncu's per-kernel times of the 3rd decode token after an 8k
# prompt on the full-size model (DS4_CUDA_PROFILE_DECODE), in fullprof.txt.
# DETAIL (a regex of kernel names): ncu's speed of light, memory, occupancy
# and warp-stall sections of COUNT (default 3) launches of those kernels in
# the 3rd full-size decode token at 8k, in fulldetail.txt. Each launch costs
# ≈ 20 s (ncu saves and restores the 80 GB of device memory for each of its
# replay passes: 24 launches did not fit a 10-minute call); for the small
# kernels, scripts/cuda/ncu-oplat.sh profiles them without the model.
# ktrace: the kernels of full-size decode tokens at 8k as they really run
# (pipelined; CUPTI activity records, scripts/cuda/ktrace.sh), in ktrace.txt;
# KTRACE_AB (an environment assignment): once more with it, in
# ktrace-ab.txt; KTRACE_LINES: lines of each shown (default 45); PREFILL_LINES:
# the prompt's chunks of the first trace too (ktrace-prefill.txt), this many lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/session}; mkdir -p "$OUT"
SKIP=${SKIP:-}
F=dev-out/final
if [[ $SKIP != *smoke* ]]; then
    OUT=/tmp/smoke bash scripts/cuda/smoke.sh >"$OUT/smoke.txt" 2>&1
    cp /tmp/smoke/cuda-tests.log "$OUT/"
    tail -12 "$OUT/smoke.txt"
    grep -E "^(--- )?FAIL|^ok|^PASS|differs" "$OUT/cuda-tests.log" | head -20
else
    bash scripts/cuda/device.sh build >/dev/null 2>&1 || { echo "library build failed"; exit 1; }
fi
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1
if [[ $SKIP != *decode* ]]; then
    DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_MODE="${DECODE_MODE:-graph per layer}" $F/cuda.test -test.run TestDecodeSpeed -test.timeout 300s >"$OUT/decode.txt" 2>&1
    grep -E "^decode|graph stats" "$OUT/decode.txt"
fi
if [[ $SKIP != *oplat* ]]; then
    DS4_CUDA_BENCH=1 $F/cuda.test -test.run TestOpLatency -test.timeout 120s 2>&1 | grep -E "^op latency|FAIL|panic" >"$OUT/oplat.txt"
    cat "$OUT/oplat.txt"
fi
if [ -n "${BW:-}" ]; then # TestBandwidth's rows matching the regex BW, in bw.csv
    DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_OUT=/tmp/bw.csv $F/cuda.test -test.run 'TestBandwidth$' -test.timeout 300s >/tmp/bw.txt 2>&1
    { head -1 /tmp/bw.csv; grep -E "$BW" /tmp/bw.csv; } >"$OUT/bw.csv"; grep -E "FAIL|panic" /tmp/bw.txt | head -5
    cat "$OUT/bw.csv"
fi
if [[ $SKIP != *profile* ]]; then
    CUDA_TEST=$F/cuda.test PROFILE_CHUNKS=1 OUT=/tmp/prof bash scripts/cuda/profile.sh >/dev/null 2>&1
    cp /tmp/prof/profile.txt "$OUT/"
    head -25 "$OUT/profile.txt"
fi
if [[ $SKIP != *bench* ]]; then
    mkdir -p /tmp/b
    OUT=/tmp/b BIN=$F STAGES=ours BUDGET=${BUDGET:-230} bash scripts/cuda/bench-h200.sh >/tmp/b/out.txt 2>&1
    cp /tmp/b/bench.csv /tmp/b/bench.svg "$OUT/"
    tail -8 /tmp/b/out.txt
fi
if [ -n "${AB:-}${AB_ARGS:-}" ]; then
    echo "== A/B: ${AB:-} ${AB_ARGS:-}"
    # AB_ARGS: more ds4-bench flags (word-split), e.g. AB_ARGS="--chunk 4096"
    env ${AB:-DS4_AB=1} $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda --frontiers 8192 --gen 32 ${AB_ARGS:-} 2>&1 | grep -E "frontier 8192|graph decode|rror" | tail -3
fi
if [[ $SKIP != *fullprof* ]] && [ -f /dev/shm/flash-q2.gguf ]; then
    DS4_CUDA_PROFILE_DECODE=3 ncu --clock-control none --cache-control all --profile-from-start off \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw \
        $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda --frontiers 8192 --gen 4 >/tmp/fullprof.csv 2>/tmp/fullprof.err
    echo "== full-size decode token at 8k under ncu: exit $?"
    python3 scripts/cuda/ncu-summary.py /tmp/fullprof.csv >"$OUT/fullprof.txt"; head -32 "$OUT/fullprof.txt"
fi
if [ -n "${DETAIL:-}" ] && [ -f /dev/shm/flash-q2.gguf ]; then
    DS4_CUDA_PROFILE_DECODE=3 ncu --clock-control none --cache-control none --profile-from-start off \
        -k "regex:$DETAIL" --launch-count "${COUNT:-3}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section SourceCounters --page details \
        $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda --frontiers 8192 --gen 4 >"$OUT/fulldetail.txt" 2>/tmp/fulldetail.err
    echo "== ncu detail of /$DETAIL/ at 8k: exit $? ($(grep -c '^  [a-z_].*(' "$OUT/fulldetail.txt") kernels)"
fi
if [[ $SKIP != *ktrace* ]] && [ -f /dev/shm/flash-q2.gguf ]; then
    echo "== full-size decode tokens at 8k, kernel timeline"
    OUT="$OUT" F=$F bash scripts/cuda/ktrace.sh 2>&1
    if [ -n "${KTRACE_AB:-}" ]; then # the timeline once more with this environment assignment
        echo "== the same with $KTRACE_AB"
        env "$KTRACE_AB" OUT=/tmp/kab F=$F bash scripts/cuda/ktrace.sh 2>&1
        cp /tmp/kab/ktrace.txt "$OUT/ktrace-ab.txt"
    fi
fi
