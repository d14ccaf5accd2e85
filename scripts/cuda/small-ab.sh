#!/usr/bin/env bash
# Small prompt chunks after a cached prefix, A/B: ds4-bench --fast walks a
# prompt to 24k tokens and then on by chunks of 256, 256, 512, 512, 1024,
# 1024 tokens (an agent's turns after a cached prefix), once per variant and
# round, interleaved so that the machine's drift falls on every variant
# alike. Each variant is LABEL or LABEL:ASSIGNMENTS (space-separated
# environment assignments, e.g. base:DS4_CUDA_LIB=/tmp/lib-base.so; BENCH=
# names another ds4-bench, e.g. one built from the base commit when the
# library's ABI changed), the variants ';'-separated in SMALL. Prints a table of each variant's ms for
# the second chunk of each size (the first pays any one-time cost), and
# keeps the CSVs under $OUT/small.
#   SMALL='new;base:DS4_CUDA_LIB=/tmp/lib-base.so' ROUNDS=2 OUT=$OUT bash scripts/cuda/small-ab.sh
# Needs dev-out/final/ds4-bench, the full-size synth at /dev/shm/flash-q2.gguf
# (call.sh makes it) and build/libds4cuda.so.
set -uo pipefail
cd "$(dirname "$0")/../.."
F=${F:-dev-out/final}
OUT=${OUT:-dev-out/small}
D=$OUT/small
mkdir -p "$D"
export DS4_CUDA_LIB=${DS4_CUDA_LIB:-$PWD/build/libds4cuda.so} DS4_CUDA_REQUIRE=1
IFS=';' read -ra VS <<<"${SMALL:?SMALL lists the variants}"
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${VS[@]}"; do
        label=${v%%:*} assigns=
        [[ $v == *:* ]] && assigns=${v#*:}
        # shellcheck disable=SC2086
        env $assigns bash -c 'exec timeout 300 "${BENCH:-$0}" "$@"' "$F/ds4-bench" -m "${MODEL:-/dev/shm/flash-q2.gguf}" --backend cuda --fast \
            --frontiers 24576,24832,25088,25600,26112,27136,28160 --gen 4 --csv "$D/$label-$r.csv" >"$D/$label-$r.log" 2>&1 ||
            echo "small-ab: $label round $r failed: $(tail -2 "$D/$label-$r.log")"
    done
done
# rows 3, 5 and 7 of each CSV (after the header): the second chunk of 256, 512, 1024 tokens
printf '%-12s %5s %10s %10s %10s\n' variant round 256 512 1024
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${VS[@]}"; do
        label=${v%%:*}
        f=$D/$label-$r.csv
        [ -s "$f" ] || continue
        awk -F, -v l="$label" -v r="$r" 'NR==4{a=$3*1000} NR==6{b=$3*1000} NR==8{c=$3*1000} END{printf "%-12s %5s %10.1f %10.1f %10.1f\n", l, r, a, b, c}' "$f"
    done
done
