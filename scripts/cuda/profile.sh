#!/usr/bin/env bash
# Per-kernel GPU time of one decode token and of one 512-token prefill chunk
# (synth.Flash(6), q2, exact, ctx ≈ 1k), measured by Nsight Compute on the
# GPU machine. Build the library and test binary as for device.sh, then
#   run(command="bash scripts/cuda/profile.sh", carry=["dev-out"])
# Writes ncu-<n>.csv and the summary profile.txt under $OUT.
source "$(dirname "$0")/ncu-env.sh"
for n in ${PROFILE_CHUNKS:-1 512}; do
    DS4_CUDA_PROFILE=$n ncu --clock-control none --cache-control ${NCU_CACHE:-all} --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        --csv --page raw ${CUDA_TEST:-dev-out/cuda.test} -test.run TestDecodeSpeed -test.timeout 300s >"$OUT/ncu-$n.csv" 2>"$OUT/ncu-$n.err"
    echo "== chunk of $n token(s): ncu exit $?"
    python3 scripts/cuda/ncu-summary.py "$OUT/ncu-$n.csv" | tee -a "$OUT/profile.txt"
done
