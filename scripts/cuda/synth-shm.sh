#!/usr/bin/env bash
# The synthetic Flash q2 model for the GPU-machine scripts (ab-layers.sh,
# bench-h200.sh): generates M with LAYERS layers (43, the default, is the
# full-size file) unless a file of the right size is already there; under
# /dev/shm it first grows the tmpfs when it lacks the room (tmpfs defaults
# to half the memory). Prints what it did; exits non-zero when it cannot
# make the file.
#   BIN=dev-out/final M=/dev/shm/flash-q2.gguf LAYERS=43 LOG=/tmp/synth.log bash scripts/cuda/synth-shm.sh
set -uo pipefail
BIN=${BIN:-dev-out/final}
L=${LAYERS:-43}
M=${M:?M names the model file}
LOG=${LOG:-/tmp/synth-L$L.log}
size=$("$BIN/ds4-gguf" synth --flash-q2 --layers "$L" --dry-run -o "$M" | grep -o '[0-9]* bytes' | head -1 | cut -d' ' -f1)
[ -n "$size" ] || { echo "synth-shm: ds4-gguf synth --dry-run gave no size"; exit 1; }
if [ -f "$M" ] && [ "$(stat -c %s "$M")" = "$size" ]; then
    echo "reusing $M ($size bytes)"
    exit 0
fi
rm -f "$M" # (a file of another size: its room counts)
if [[ $M == /dev/shm/* ]] && [ "$(df -B1 --output=avail /dev/shm | tail -1)" -lt $((size + (1 << 30))) ]; then
    g=$(((size >> 30) + 8))
    mount -o remount,size=${g}G /dev/shm && echo "remounted /dev/shm at ${g}G"
fi
t0=$(date +%s)
if ! timeout 300 "$BIN/ds4-gguf" synth --flash-q2 --layers "$L" -o "$M" >"$LOG" 2>&1; then
    echo "synth-shm: synth failed"
    tail -3 "$LOG"
    exit 1
fi
echo "synth $L layers in $(($(date +%s) - t0)) s ($size bytes)"
