#!/usr/bin/env bash
# Prints the kernels whose ptxas -v report shows spills, by demangled name,
# at most N (default 8) lines: spills.sh [N [REPORT...]], the reports
# build/*.o.ptxas (build-lib.sh's) unless named.
n=${1:-8}
shift $(($# > 0 ? 1 : 0))
[ $# -gt 0 ] || set -- build/*.o.ptxas
awk '/Compiling entry function/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
     /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ {print n ": " $0}' "$@" |
    { c++filt 2>/dev/null || cat; } | sed 's/(ds4mv::TCArgs)//; s/  */ /g' | cut -c1-200 | head -"$n"
