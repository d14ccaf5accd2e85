#!/usr/bin/env bash
# Builds build/libds4cuda.so from cuda/*.cu on the GPU machine: each file
# compiled in parallel (ptxas register and spill report in
# build/<file>.o.ptxas), then linked. Every file targets sm_90 except
# the *_wg.cu files (mm_wg.cu, ix_wg.cu, attn_wg.cu), whose wgmma kernels exist only
# for sm_90a (compute capability 9.0 exactly; the library checks the
# device before it launches them).
# Prints "BUILD FAILED: <object>" with the compiler's output, or
# "LINK FAILED", and exits non-zero on failure. device.sh, smoke.sh and
# bench-h200.sh call it. NVFLAGS adds compiler flags to every file, e.g.
# NVFLAGS=-DDS4_PHASE_PROBE for the phase probe of k_hc_pre and k_router
# (model.cu; never in a shipped build).
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build
t0=$(date +%s)
objs=()
for f in cuda/*.cu; do
    o=build/$(basename "$f" .cu).o
    objs+=("$o")
    arch=(-arch=sm_90)
    case "$(basename "$f")" in *_wg.cu) arch=(-gencode arch=compute_90a,code=sm_90a) ;; esac
    rm -f "$o"
    nvcc -O3 ${NVFLAGS:-} "${arch[@]}" -Xcompiler -fPIC -Xptxas -v -c "$f" -o "$o" 2>"$o.ptxas" &
done
wait
for o in "${objs[@]}"; do
    [ -s "$o" ] || { echo "BUILD FAILED: $o"; grep -v "^ptxas info\|^ptxas       \|bytes stack frame" "$o.ptxas" | head -40; exit 1; }
done
nvcc -O3 -arch=sm_90 -shared "${objs[@]}" -o build/libds4cuda.so || { echo "LINK FAILED"; exit 1; }
echo "built build/libds4cuda.so in $(( $(date +%s) - t0 )) s"
