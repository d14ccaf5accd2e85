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
# SMALL_AT: the prefix's frontiers (default 24576; e.g. 65536,131072 for
# chunks deep in a long context, the table then also giving the prefill
# rate of the last prefix interval).
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
AT=${SMALL_AT:-24576}
b=${AT##*,}
FR="$AT,$((b + 256)),$((b + 512)),$((b + 1024)),$((b + 1536)),$((b + 2560)),$((b + 3584))"
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${VS[@]}"; do
        label=${v%%:*} assigns=
        [[ $v == *:* ]] && assigns=${v#*:}
        # shellcheck disable=SC2086
        env $assigns bash -c 'exec timeout 300 "${BENCH:-$0}" "$@"' "$F/ds4-bench" -m "${MODEL:-/dev/shm/flash-q2.gguf}" --backend cuda --fast \
            --frontiers "$FR" --gen 4 --csv "$D/$label-$r.csv" >"$D/$label-$r.log" 2>&1 ||
            echo "small-ab: $label round $r failed: $(tail -2 "$D/$label-$r.log")"
    done
done
# the last six rows' second, fourth and sixth: the second chunk of 256,
# 512, 1024 tokens; and the prefix's last interval's prefill rate
printf '%-12s %5s %10s %10s %10s %12s\n' variant round 256 512 1024 "prefix tok/s"
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${VS[@]}"; do
        label=${v%%:*}
        f=$D/$label-$r.csv
        [ -s "$f" ] || continue
        awk -F, -v l="$label" -v r="$r" 'NR>1{s[NR]=$3; p[NR]=$4} END{n=NR; printf "%-12s %5s %10.1f %10.1f %10.1f %12.0f\n", l, r, s[n-4]*1000, s[n-2]*1000, s[n]*1000, p[n-6]}' "$f"
    done
done
