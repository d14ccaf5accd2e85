#!/usr/bin/env bash
# Real kernel timeline of full-size decode tokens: ds4-bench at one frontier
# with the CUPTI injection library scripts/cuda/ktrace.c (built here with
# the machine's CUPTI), then ktrace-summary.py over the last decode tokens.
# Needs the model from bench-h200.sh in /dev/shm and ds4-bench in $F.
#   OUT=... FRONTIER=8192 bash scripts/cuda/ktrace.sh
# KTRACE_LINES: lines of the table shown (default 45); PREFILL_LINES=n: also the prompt's chunks (ktrace-prefill.txt), n lines shown
# (PREFILL_SPANS: how many chunks, default 8; PREFILL_ARGS: e.g. "--last --min-ms 50" for the last small chunks of
# FRONTIER=4096,4352,4608,4864 — cuda/NOTES.md v48).
# BENCH_ARGS: extra ds4-bench flags (e.g. --fast). KT_GEN: tokens decoded (default 40; a
# speculative run of deep passes wants more, e.g. 160 for 40 passes of four tokens, so that
# the last 16 passes summarised are past the first ones' graph builds).
# Writes ktrace.txt under $OUT (and the raw CSV to /tmp/ktrace.csv).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/ktrace}; mkdir -p "$OUT"
F=${F:-dev-out/final}
FRONTIER=${FRONTIER:-8192}
CUDA=${CUDA_HOME:-/usr/local/cuda}
inc=$(dirname "$(ls $CUDA/extras/CUPTI/include/cupti_activity.h $CUDA/include/cupti_activity.h $CUDA/targets/*/include/cupti_activity.h 2>/dev/null | head -1)")
lib=$(dirname "$(ls $CUDA/extras/CUPTI/lib64/libcupti.so $CUDA/lib64/libcupti.so $CUDA/targets/*/lib/libcupti.so 2>/dev/null | head -1)")
if [ ! -f "$inc/cupti_activity.h" ] || [ ! -f "$lib/libcupti.so" ]; then echo "CUPTI not found" | tee "$OUT/ktrace.txt"; exit 0; fi
ks=$(grep -ho 'CUpti_ActivityKernel[0-9]\+' "$inc"/cupti_activity*.h | sort -uV | tail -1)
ks=${ks:-CUpti_ActivityKernel}
gcc -O2 -shared -fPIC -DKSTRUCT="$ks" -I"$inc" -I"$CUDA/include" scripts/cuda/ktrace.c -L"$lib" -lcupti -Wl,-rpath,"$lib" \
    -o /tmp/libktrace.so 2>"$OUT/ktrace.txt" || { echo "ktrace build failed ($ks)"; cat "$OUT/ktrace.txt"; exit 0; }
export DS4_CUDA_LIB=${DS4_CUDA_LIB:-$PWD/build/libds4cuda.so}
KTRACE_OUT=/tmp/ktrace.csv CUDA_INJECTION64_PATH=/tmp/libktrace.so LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" \
    $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda --frontiers "$FRONTIER" --gen "${KT_GEN:-40}" ${BENCH_ARGS:-} >/tmp/ktrace-run.log 2>&1
echo "traced run exit $? ($ks)"; grep -E "frontier|dropped" /tmp/ktrace-run.log | tail -4
python3 scripts/cuda/ktrace-summary.py /tmp/ktrace.csv 16 >"$OUT/ktrace.txt" 2>&1
head -"${KTRACE_LINES:-45}" "$OUT/ktrace.txt"
if [ -n "${PREFILL_LINES:-}" ]; then # the prompt's chunks too, in ktrace-prefill.txt
    python3 scripts/cuda/ktrace-summary.py --prefill ${PREFILL_ARGS:-} /tmp/ktrace.csv ${PREFILL_SPANS:-8} >"$OUT/ktrace-prefill.txt" 2>&1
    echo "== the prompt's prefill chunks"; head -"$PREFILL_LINES" "$OUT/ktrace-prefill.txt"
fi
