# Sourced by profile.sh and ncu-detail.sh: the repository root, $OUT, the
# library (built when missing) and the environment of TestDecodeSpeed's
# profiled passes (synth.Flash(6), q2, exact, plain launches).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-dev-out/profile}
mkdir -p "$OUT"
[ -s build/libds4cuda.so ] || bash scripts/cuda/device.sh build >/dev/null
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1 DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_MODE="exact, no graph"
