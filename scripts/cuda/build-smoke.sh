#!/usr/bin/env bash
# Build, on the development machine, what scripts/cuda/smoke.sh runs on the
# GPU machine (which has no Go): stripped static ds4, ds4-server, ds4-score,
# ds4-gguf and the CUDA backend's test binary, into dev-out/final
# (git-ignored; other binaries there are removed: the carry limit is 64 MiB
# with the tracked files).
#   scripts/cuda/build-smoke.sh
#   run(command="bash scripts/cuda/smoke.sh", carry=["dev-out/final"])
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p dev-out/final
rm -f dev-out/final/*
for c in ds4 ds4-server ds4-score ds4-gguf; do
    CGO_ENABLED=0 go build -ldflags="-s -w" -o "dev-out/final/$c" "./cmd/$c"
done
CGO_ENABLED=0 go test -c -ldflags="-s -w" -o dev-out/final/cuda.test ./backend/cuda
du -sh dev-out/final
