#!/usr/bin/env bash
# Nsight Compute detail (speed of light, memory, occupancy, warp stalls) of
# the kernels of one profiled pass of TestDecodeSpeed's op breakdown
# (synth.Flash(6), q2, exact): KERNELS is a regex of kernel names, CHUNK the
# chunk (1: a decode token). Build as for smoke.sh / device.sh, then
#   run(command="KERNELS='k_matvec' bash scripts/cuda/ncu-detail.sh", carry=[...])
# Writes ncu-detail-<chunk>.txt under $OUT.
source "$(dirname "$0")/ncu-env.sh"
n=${CHUNK:-1}
DS4_CUDA_PROFILE=$n ncu --clock-control none --cache-control none --profile-from-start off \
    -k "regex:${KERNELS:-k_matvec}" --launch-count "${COUNT:-40}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --page details \
    ${CUDA_TEST:-dev-out/cuda.test} -test.run TestDecodeSpeed -test.timeout 300s >"$OUT/ncu-detail-$n.txt" 2>"$OUT/ncu-detail-$n.err"
echo "== ncu detail, chunk $n: exit $? ($(grep -c '^  [a-z_].*(' "$OUT/ncu-detail-$n.txt") kernels)"
