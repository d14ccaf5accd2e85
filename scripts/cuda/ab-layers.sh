#!/usr/bin/env bash
# A/B of prefill and decode on a Flash q2 model cut to LAYERS layers (default
# 20, ≈ 38 GB: fits one H100), for comparing kernel variants where the
# full-size file does not fit. Generates /dev/shm/flash-q2-L<LAYERS>.gguf
# (reused when its size is right; MODEL names another path, e.g. the
# full-size file bench-h200.sh made, with LAYERS=43), then runs ds4-bench at FRONTIER (default
# 8192) once with the defaults and once per environment assignment given as
# arguments; an argument may hold several words, assignments (NAME=value)
# and ds4-bench flags with their values (any other word), e.g.
#   bash scripts/cuda/ab-layers.sh DS4_CUDA_QUANT_VEC=0 --fast "--fast DS4_CUDA_ATTN_TC=0"
# ROUNDS (default 1) repeats the whole list, interleaved, so that the
# machine's drift falls on every variant alike; GEN (decode tokens, default
# 16), WARMUP (ds4-bench --warmup: tokens prefilled and rewound first) and
# ARGS (ds4-bench flags for every run, e.g. "--fast") apply to all. It ends
# with a table: each variant's prefill and decode tok/s per round (the
# runs' CSV rows and stderr are kept under $AB_OUT, default /tmp/ab).
# Needs dev-out/final/{ds4-gguf,ds4-bench} and build/libds4cuda.so
# (scripts/cuda/device.sh build). Rates are per whole model: compare them
# only with each other.
#   LAYERS=43 MODEL=/dev/shm/flash-q2.gguf ROUNDS=2 GEN=256 WARMUP=4096 ARGS=--fast \
#     bash scripts/cuda/ab-layers.sh DS4_CUDA_MOE_FOLD=0
set -uo pipefail
cd "$(dirname "$0")/../.."
F=${F:-dev-out/final}
L=${LAYERS:-20}
FRONTIER=${FRONTIER:-8192}
M=${MODEL:-/dev/shm/flash-q2-L$L.gguf}
OUTD=${AB_OUT:-/tmp/ab}
mkdir -p "$OUTD"
BIN=$F M=$M LAYERS=$L LOG=/tmp/synth-L.log bash scripts/cuda/synth-shm.sh || exit 1
export DS4_CUDA_LIB=${DS4_CUDA_LIB:-$PWD/build/libds4cuda.so} DS4_CUDA_REQUIRE=1
variants=(DS4_AB=default "$@")
warm=()
[ -n "${WARMUP:-}" ] && warm=(--warmup "$WARMUP")
read -r -a common <<<"${ARGS:-}"
declare -A rows
for r in $(seq 1 "${ROUNDS:-1}"); do
    for i in "${!variants[@]}"; do
        ab=${variants[$i]}
        echo "== $ab (round $r)"
        envs=(DS4_AB=run) flags=()
        for w in $ab; do
            case $w in
            --*) flags+=("$w") ;;
            *=*) envs+=("$w") ;;
            *) flags+=("$w") ;; # a flag's value ("--chunk 4096")
            esac
        done
        csv=$OUTD/v$i-r$r.csv
        env "${envs[@]}" "$F/ds4-bench" -m "$M" --backend cuda --frontiers "$FRONTIER" --gen "${GEN:-16}" \
            "${warm[@]}" "${common[@]}" "${flags[@]}" >"$csv" 2>"$OUTD/v$i-r$r.err"
        rc=$?
        grep -E "frontier $FRONTIER|rror|No such|usage" "$OUTD/v$i-r$r.err" | tail -2
        line=$(tail -1 "$csv")
        if [ $rc -ne 0 ] || [[ $line != "$FRONTIER,"* ]]; then
            rows[$i]+=" failed(rc=$rc)"
        else # frontier,prefill_tokens,prefill_s,prefill_tps,gen_tokens,gen_s,gen_tps,kv_bytes
            rows[$i]+=" $(cut -d, -f4 <<<"$line" | cut -d. -f1)/$(cut -d, -f7 <<<"$line")"
        fi
    done
done
echo "== prefill/decode tok/s at $FRONTIER, per round"
for i in "${!variants[@]}"; do
    printf '%-60s%s\n' "${variants[$i]}" "${rows[$i]:-}"
done
# each variant's mean decode rate, and its ratio to the default's run of the
# same round (mean, lowest … highest): a paired comparison, since the
# machine drifts between rounds (a rebuilt library alone moves ≈ 1 %:
# cuda/NOTES.md v61)
echo "== decode tok/s: mean; against the default, round by round: mean (lowest … highest)"
for i in "${!variants[@]}"; do
    awk -v base="${rows[0]:-}" -v cur="${rows[$i]:-}" -v name="${variants[$i]}" 'BEGIN {
        nb = split(base, b, " "); nc = split(cur, c, " "); s = 0; n = 0; rs = 0; rn = 0; lo = 1e9; hi = -1e9
        for (k = 1; k <= nc; k++) {
            split(c[k], x, "/"); if (x[2] == "") continue
            s += x[2]; n++
            if (k > nb) continue
            split(b[k], y, "/"); if (y[2] + 0 <= 0) continue
            r = x[2] / y[2]; rs += r; rn++; if (r < lo) lo = r; if (r > hi) hi = r
        }
        if (n == 0) { printf "%-60s(no runs)\n", name; exit }
        if (rn) printf "%-60s%8.2f  %+.2f %% (%+.2f … %+.2f)\n", name, s / n, 100 * (rs / rn - 1), 100 * (lo - 1), 100 * (hi - 1)
        else printf "%-60s%8.2f\n", name, s / n
    }'
done
