#!/usr/bin/env bash
# Build, on the development machine, what scripts/cuda/smoke.sh runs on the
# GPU machine (which has no Go): stripped static ds4, ds4-server, ds4-score,
# ds4-gguf and the CUDA backend's test binary, into dev-out/final
# (git-ignored; other binaries there are removed: the carry limit is 64 MiB
# with the tracked files).
#   scripts/cuda/build-smoke.sh
#   run(command="bash scripts/cuda/smoke.sh", carry=["dev-out/final"])
# SET=bench builds what scripts/cuda/call.sh runs instead: ds4, ds4-bench,
# ds4-gguf and the test binary.
#   SET=bench scripts/cuda/build-smoke.sh
#   run(command="OUT=$OUT ... bash scripts/cuda/call.sh", carry=["dev-out/final"])
# SET=all builds both sets (call.sh with SMOKE=1 and its benchmarks in one
# call: the smoke's ds4-score and ds4-server checks run too). They are past
# the 64 MiB carry limit with the tracked files; PACK=1 also packs them into
# dev-out/pack/bins.tar.xz (≈ 12 MB), which call.sh and smoke.sh unpack:
#   SET=all PACK=1 scripts/cuda/build-smoke.sh
#   run(command="OUT=$OUT SMOKE=1 ABX=... bash scripts/cuda/call.sh", carry=["dev-out/pack"])
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p dev-out/final
find dev-out/final -maxdepth 1 -type f -delete # (folders there, e.g. a BASE cuda/ tree, stay)
cmds="ds4 ds4-server ds4-score ds4-gguf"
[ "${SET:-}" = bench ] && cmds="ds4 ds4-bench ds4-gguf"
[ "${SET:-}" = all ] && cmds="ds4 ds4-server ds4-score ds4-bench ds4-gguf"
for c in $cmds; do
    CGO_ENABLED=0 go build -ldflags="-s -w" -o "dev-out/final/$c" "./cmd/$c"
done
CGO_ENABLED=0 go test -c -ldflags="-s -w" -o dev-out/final/cuda.test ./backend/cuda
du -sh dev-out/final
if [ -n "${PACK:-}" ]; then
    mkdir -p dev-out/pack
    tar cJf dev-out/pack/bins.tar.xz -C dev-out/final $cmds cuda.test
    du -sh dev-out/pack/bins.tar.xz
fi
