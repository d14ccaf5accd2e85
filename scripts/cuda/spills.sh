#!/usr/bin/env bash
# Prints the kernels whose ptxas report (build/*.o.ptxas, from build-lib.sh)
# shows spills, by demangled name, at most N (default 8) lines.
awk '/Compiling entry function/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
     /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ {print n ": " $0}' build/*.o.ptxas |
    { c++filt 2>/dev/null || cat; } | sed 's/(ds4mv::TCArgs)//; s/  */ /g' | cut -c1-200 | head -"${1:-8}"
