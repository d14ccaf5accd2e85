#!/usr/bin/env bash
# Build, on the development machine, the Go test binaries that
# scripts/cuda/device.sh runs on the GPU machine (which has no Go).
# They go to dev-out/ (git-ignored); pass it in the device run's `carry`.
#
#   scripts/cuda/build-tests.sh [package ...]   (default: ./backend/cuda)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p dev-out
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./backend/cuda)
for p in "${pkgs[@]}"; do
    name=$(basename "$p")
    GOOS=linux GOARCH=amd64 CGO_ENABLED=0 go test -c -o "dev-out/$name.test" "$p"
    echo "dev-out/$name.test"
done
