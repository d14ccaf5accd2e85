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
# Needs dev-out/final/{ds4-gguf,ds4-bench} and build/libds4cuda.so
# (scripts/cuda/device.sh build). Rates are per whole model: compare them
# only with each other.
set -uo pipefail
cd "$(dirname "$0")/../.."
F=dev-out/final
L=${LAYERS:-20}
FRONTIER=${FRONTIER:-8192}
M=${MODEL:-/dev/shm/flash-q2-L$L.gguf}
BIN=$F M=$M LAYERS=$L LOG=/tmp/synth-L.log bash scripts/cuda/synth-shm.sh || exit 1
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1
for ab in DS4_AB=default "$@"; do
    echo "== $ab"
    envs=(DS4_AB=run) flags=()
    for w in $ab; do
        case $w in
        --*) flags+=("$w") ;;
        *=*) envs+=("$w") ;;
        *) flags+=("$w") ;; # a flag's value ("--chunk 4096")
        esac
    done
    env "${envs[@]}" "$F/ds4-bench" -m "$M" --backend cuda --frontiers "$FRONTIER" --gen "${GEN:-16}" "${flags[@]}" 2>&1 |
        grep -E "frontier $FRONTIER|rror|No such|usage" | tail -2
done
