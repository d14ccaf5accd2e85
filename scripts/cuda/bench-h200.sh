#!/usr/bin/env bash
# Full-size ds4-bench on one H200, in one device call: build libds4cuda.so,
# generate the published-layout Flash q2 model (random weights, 80.76 GiB)
# into /dev/shm, and run ds4-bench on the CUDA backend.
#
# Build the Go binaries here first (the GPU machine has no Go):
#   mkdir -p dev-out/bench
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o dev-out/bench/ds4-gguf ./cmd/ds4-gguf
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o dev-out/bench/ds4-bench ./cmd/ds4-bench
# then run(kind="nvidia-h200", command="bash scripts/cuda/bench-h200.sh",
#          carry=["dev-out/bench"], timeout_s=600)
#
# With STAGES containing ds4c (default: ours,ds4c) it then builds and runs
# ds4.c's CUDA ds4-bench on the same file (scripts/cuda/bench-ds4c.sh; carry
# dev-out/ds4c too). Both stages rarely fit one 600 s call: run
# STAGES=ds4c and STAGES=ours as two calls on the warm machine (the model
# in /dev/shm is reused when its size is right).
#
# Environment: FRONTIERS (default 2048,4096,8192,16384,32768), GEN (32),
# BUDGET (seconds for the whole script, default 560: ds4-bench stops at the
# frontier it cannot finish in time and keeps the rows done), BENCH_ARGS
# (extra ds4-bench flags, e.g. --fast). Writes env.txt, synth.log,
# bench.csv, bench.svg, bench.log under $OUT (default dev-out/bench-h200).
set -uo pipefail
start=$(date +%s)
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/bench-h200}
FRONTIERS=${FRONTIERS:-2048,4096,8192,16384,32768}
GEN=${GEN:-32}
BUDGET=${BUDGET:-560}
BIN=${BIN:-dev-out/bench}
MODEL=/dev/shm/flash-q2.gguf
STAGES=${STAGES:-ours,ds4c}
mkdir -p "$OUT" build
elapsed() { echo $(( $(date +%s) - start )); }

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
    nvcc --version | tail -2
    nproc; free -g; df -h /dev/shm /
} 2>&1 | tee "$OUT/env.txt"
for b in ds4-gguf ds4-bench; do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (build it here first, see the header)"; exit 1; }
done

# Build the library (as device.sh does) while the model is generated
# (LIB_BUILT=1: a build/libds4cuda.so built earlier in the same call is used).
(
    if [ -n "${LIB_BUILT:-}" ] && [ -s build/libds4cuda.so ]; then echo "(library built earlier in this call)"; else bash scripts/cuda/build-lib.sh; fi
) >"$OUT/build.log" 2>&1 &
buildpid=$!
ds4cpid=
if [[ $STAGES == *ds4c* ]] && [ -f dev-out/ds4c/Makefile ] && [ ! -x dev-out/ds4c/ds4-bench ]; then
    ( t0=$(date +%s); make -C dev-out/ds4c -j8 ds4-bench CUDA_ARCH=sm_90 >"$OUT/ds4c-build.log" 2>&1
      echo "ds4c build exit $? in $(( $(date +%s) - t0 )) s" >>"$OUT/ds4c-build.log" ) &
    ds4cpid=$!
fi

# the full-size file in /dev/shm (synth-shm.sh grows the tmpfs when needed)
BIN=$BIN M=$MODEL LAYERS=43 LOG=$OUT/synth.log bash scripts/cuda/synth-shm.sh | tee -a "$OUT/env.txt"
ls -l "$MODEL" || exit 1
free -g | head -2

wait $buildpid; cat "$OUT/build.log"
[ -s build/libds4cuda.so ] || exit 1
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1

if [[ $STAGES == *ds4c* ]]; then
    [ -z "$ds4cpid" ] || { wait "$ds4cpid"; tail -2 "$OUT/ds4c-build.log"; }
    DS4C_BUDGET=$(( BUDGET - $(elapsed) )) OUT=$OUT MODEL=$MODEL bash scripts/cuda/bench-ds4c.sh
fi
[[ $STAGES == *ours* ]] || exit 0

rem=$(( BUDGET - $(elapsed) ))
echo "bench starts at $(elapsed) s, time limit ${rem} s"
nvidia-smi --query-gpu=memory.used --format=csv
timeout $(( rem + 15 )) "$BIN/ds4-bench" -m "$MODEL" --backend cuda --frontiers "$FRONTIERS" --gen "$GEN" \
    --csv "$OUT/bench.csv" --plot "$OUT/bench.svg" --time-limit "${rem}s" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
echo "bench exit ${PIPESTATUS[0]}; total $(elapsed) s"
cat "$OUT/bench.csv"
