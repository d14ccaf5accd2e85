#!/usr/bin/env bash
# Where a fresh process's first prompt loses time: ds4-bench --fast at one
# frontier (default 8192) in fresh processes, with warm-ups of WARMUPS
# tokens (default "0 64 4096": none, a small chunk, a whole chunk) before
# the row, for each ';'-separated set of ds4-bench flags in COLD_ARGS (e.g.
# "--no-warm;-": without and with the load's warm-up; "-" alone: no flags), COLD_ROUNDS=2 twice
# over. With DS4_CUDA_SLOW_CALL_US=n each run's library calls slower than n
# µs after the backend was ready are summed by op (cold-W.log keeps them):
# they name the one-time costs (cuBLAS's first products, kernels' first
# launches, scratch grown). The device machine has no nsys.
# Needs the full-size synth in /dev/shm (synth-shm.sh) and ds4-bench in $F.
#   OUT=... bash scripts/cuda/coldstart.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/cold}; mkdir -p "$OUT"
F=${F:-dev-out/final}
FRONTIER=${FRONTIER:-8192}
M=${MODEL:-/dev/shm/flash-q2.gguf}
export DS4_CUDA_LIB=${DS4_CUDA_LIB:-$PWD/build/libds4cuda.so}
IFS=';' read -ra SETS <<<"${COLD_ARGS:--}"
for r in 1 2; do for a in "${SETS[@]}"; do for w in ${WARMUPS:-0 64 4096}; do
    [ "$a" = "-" ] && a=
    $F/ds4-bench -m "$M" --backend cuda --fast --frontiers "$FRONTIER" --gen 16 --warmup "$w" \
        $a >/tmp/cold-$w.csv 2>/tmp/cold-$w.err
    echo "round $r, warmup $w ${a:-(no flags)}: $(grep -E "ready in|frontier $FRONTIER" /tmp/cold-$w.err | sed 's/.*ready in/ready in/' | tr '\n' ' ')"
    # (DS4_CUDA_SLOW_CALL_US set: the slow calls and grown buffers after the
    # backend was ready, summed by op)
    if grep -q "slow call\|scratch grows" /tmp/cold-$w.err; then
        sed -n '/ready in/,$p' /tmp/cold-$w.err >"$OUT/cold-$w.log"
        python3 - "$OUT/cold-$w.log" <<'PY'
import re, sys, collections
ops, grows, first = collections.Counter(), 0, []
for line in open(sys.argv[1]):
    m = re.search(r'op=(\S+) us=(\d+)', line)
    if m:
        ops[m.group(1)] += int(m.group(2))
        first.append((int(m.group(2)), m.group(1)))
    if 'scratch grows' in line:
        grows += 1
print(f"  slow calls after ready, by op (ms): " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in ops.most_common(12)))
print(f"  scratch buffers grown: {grows}")
PY
    fi
done; done; [ "${COLD_ROUNDS:-1}" -ge 2 ] || break; done
