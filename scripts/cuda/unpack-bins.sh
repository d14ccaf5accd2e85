#!/usr/bin/env bash
# Binaries carried packed (PACK=1 scripts/cuda/build-smoke.sh writes
# dev-out/pack/bins.tar.xz): unpacked into dev-out/final once a call, when
# the archive was carried. call.sh and smoke.sh run it first.
cd "$(dirname "$0")/../.."
if [ -f dev-out/pack/bins.tar.xz ] && [ ! -e dev-out/final/.unpacked ]; then
    mkdir -p dev-out/final && tar xJf dev-out/pack/bins.tar.xz -C dev-out/final && touch dev-out/final/.unpacked
fi
