#!/usr/bin/env bash
# check-local.sh: a front-end check of cuda/*.cu on the development machine,
# which has no GPU: Debian bookworm's nvcc (CUDA 11.8, package
# nvidia-cuda-toolkit from the non-free component) compiles each file for
# sm_90, so C++ errors in the kernels show before a device call is spent.
# CUDA 11.8 lacks a few later host APIs (cudaGraphExecUpdateResultInfo,
# cudaFuncGetName) and PTX forms (barrier.cluster's .release/.acquire);
# those errors are filtered out, and the device build (build-lib.sh, CUDA
# 13) stays the judge. Extra nvcc flags: NVFLAGS (e.g. -DDS4_MV_PROBE).
# SPILLS=1 also assembles each file's PTX with ptxas 11.8 (barrier.cluster's
# .release/.acquire dropped, which 11.8 does not know; the *_wg.cu files'
# wgmma kernels compile empty there) and lists the kernels that spill
# (spills.sh): an early hint, CUDA 13's ptxas allocates differently.
#   apt-get install nvidia-cuda-toolkit   # once, with non-free enabled
#   bash scripts/cuda/check-local.sh
#   SPILLS=1 bash scripts/cuda/check-local.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v nvcc >/dev/null || { echo "check-local: no nvcc (see the header)"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
known='cudaGraphExecUpdateResultInfo|too few arguments in function call|cudaFuncGetName|barrier\.cluster|Ptx assembly aborted|errors? detected in the compilation'
bad=0
for f in cuda/*.cu; do
    o="$tmp/$(basename "$f" .cu)"
    nvcc -O3 -std=c++17 -arch=sm_90 ${NVFLAGS:-} -c "$f" -o "$o.o" >"$o.log" 2>&1
    if grep -E "error" "$o.log" | grep -vEq "$known"; then
        echo "== $f"; grep -E "error" "$o.log" | grep -vE "$known" | head -10
        bad=1
    fi
done
if [ -n "${SPILLS:-}" ]; then
    for f in cuda/*.cu; do
        o="$tmp/$(basename "$f" .cu)"
        nvcc -O3 -std=c++17 -arch=sm_90 ${NVFLAGS:-} -ptx "$f" -o "$o.ptx" >/dev/null 2>&1 || continue
        sed -i 's/barrier\.cluster\.arrive\.release/barrier.cluster.arrive/; s/barrier\.cluster\.wait\.acquire/barrier.cluster.wait/' "$o.ptx"
        ptxas -arch=sm_90 -O3 -v "$o.ptx" -o "$o.cubin" >"$o.ptxas" 2>&1
    done
    bash scripts/cuda/spills.sh 1000 "$tmp"/*.ptxas
fi
[ $bad = 0 ] && echo "check-local: cuda/*.cu pass nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')'s front end (known CUDA 11.8 gaps filtered)"
exit $bad
