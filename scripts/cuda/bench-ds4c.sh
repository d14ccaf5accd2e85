#!/usr/bin/env bash
# ds4.c's own CUDA build on the same full-size synthetic file that
# bench-h200.sh benchmarks, for the side-by-side ratio. Run on the GPU
# machine, normally from bench-h200.sh (STAGES containing ds4c).
#
# ds4.c's source is never committed here: export its tree into
# dev-out/ds4c first (fetch github:antirez/ds4, then
# git --git-dir=<mirror> archive HEAD | tar -x -C dev-out/ds4c, or
# git show file by file) and carry dev-out/ds4c.
#
# Environment: MODEL (default /dev/shm/flash-q2.gguf), OUT, DS4C
# (source tree, default dev-out/ds4c), CTX_MAX (32768), GEN (32),
# DS4C_BUDGET (seconds for build + bench, default 400), DS4C_ARGS (extra
# ds4-bench flags). Writes ds4c-build.log, ds4c-bench.csv, ds4c-bench.log
# under $OUT.
set -uo pipefail
start=$(date +%s)
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/bench-h200}
MODEL=${MODEL:-/dev/shm/flash-q2.gguf}
DS4C=${DS4C:-dev-out/ds4c}
CTX_MAX=${CTX_MAX:-32768}
GEN=${GEN:-32}
DS4C_BUDGET=${DS4C_BUDGET:-400}
mkdir -p "$OUT"
[ -f "$DS4C/Makefile" ] || { echo "ds4c: no source tree in $DS4C"; exit 1; }

# Build (skipped when a previous call on this machine already did).
if [ ! -x "$DS4C/ds4-bench" ]; then
    t0=$(date +%s)
    make -C "$DS4C" -j"$(nproc)" ds4-bench CUDA_ARCH=sm_90 >"$OUT/ds4c-build.log" 2>&1
    rc=$?
    echo "ds4c build exit $rc in $(( $(date +%s) - t0 )) s"
    [ $rc -eq 0 ] || { tail -30 "$OUT/ds4c-build.log"; exit 1; }
fi

# A fixed text long enough for ctx-max tokens (the synth tokenizer turns
# 80k words into well over 32k tokens).
prompt=$OUT/ds4c-prompt.txt
awk 'BEGIN{srand(1); split("the of model token graph kernel memory speed test value river stone light number quiet paper",w," ");
     for(i=0;i<40000;i++) printf "%s %d ", w[1+int(rand()*16)], int(rand()*1000); print ""}' >"$prompt"

rem=$(( DS4C_BUDGET - ($(date +%s) - start) ))
echo "ds4c bench starts, time limit ${rem} s"
timeout "$rem" "$DS4C/ds4-bench" -m "$MODEL" --cuda --prompt-file "$prompt" --ctx-start 2048 --ctx-max "$CTX_MAX" \
    --step-mul 2 --gen-tokens "$GEN" --csv "$OUT/ds4c-bench.csv" ${DS4C_ARGS:-} >"$OUT/ds4c-bench.log" 2>&1
echo "ds4c bench exit $? after $(( $(date +%s) - start )) s"
grep -v "prefill layer" "$OUT/ds4c-bench.log" | tail -15
cat "$OUT/ds4c-bench.csv" 2>/dev/null
