#!/usr/bin/env bash
# Where a fresh process's first prompt loses time: ds4-bench --fast at one
# frontier (default 8192) in fresh processes, with warm-ups of WARMUPS
# tokens (default "0 64 4096": none, a small chunk, a whole chunk) before
# the row, for each ';'-separated set of ds4-bench flags in COLD_ARGS (e.g.
# "--no-warm;-": without and with the load's warm-up; "-" alone: no flags), COLD_ROUNDS=2 twice
# over, then (when nsys is installed) the cold run once more under
# `nsys profile -t cuda` with its CUDA API and kernel summaries, which name
# the one-time costs (module loading, allocations, cuBLAS's start).
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
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
    rm -f /tmp/cold.nsys-rep /tmp/cold.sqlite
    $NSYS profile -t cuda -o /tmp/cold --force-overwrite true \
        $F/ds4-bench -m "$M" --backend cuda --fast --frontiers "$FRONTIER" --gen 16 >/tmp/cold-nsys.log 2>&1
    echo "nsys run: exit $?"
    $NSYS stats -q -r cuda_api_sum,cuda_api_trace -f csv -o /tmp/cold-stats /tmp/cold.nsys-rep >/dev/null 2>&1
    ls /tmp/cold-stats* >&2
    # the calls after the first kernel launch (the prompt's, and the decode
    # tokens'): summed by name, and the longest ones with their times
    python3 - /tmp/cold-stats_cuda_api_trace.csv "${TAIL:-2.0}" >"$OUT/cold-nsys.txt" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
def col(r, *names):
    for n in names:
        for k in r:
            if k.lower().startswith(n):
                return r[k]
    return None
ev = []
for r in rows:
    st, du, nm = col(r, 'start'), col(r, 'duration'), col(r, 'name')
    if st is None or du is None or nm is None:
        continue
    ev.append((int(st), int(du), nm))
ev.sort()
# the prompt and its 16 tokens are the run's last ≈ 1.2 s: the calls of
# the last TAIL seconds (the load's uploads end well before)
tail = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
end = max(s + d for s, d, n in ev) if ev else 0
first = end - int(tail * 1e9)
after = [e for e in ev if e[0] >= first]
print(f"{len(ev)} CUDA API calls, {len(after)} in the last {tail} s")
print("== API time in each 100 ms of the last 3 s (ms)")
b = collections.Counter()
for s, d, n in ev:
    if s >= end - 3e9:
        b[int((s - (end - 3e9)) // 1e8)] += d
print(" ".join(f"{b[i] / 1e6:.0f}" for i in range(30)))
sums = collections.defaultdict(lambda: [0, 0])
for s, d, n in after:
    sums[n][0] += d; sums[n][1] += 1
print("== by name, in that tail (ms, calls)")
for n, (d, c) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"{d / 1e6:10.2f} {c:8d}  {n}")
print("== the longest calls in that tail (start s from its beginning, ms)")
for s, d, n in sorted(after, key=lambda e: -e[1])[:40]:
    print(f"{(s - first) / 1e9:8.3f} {d / 1e6:9.3f}  {n}")
PY
    head -50 "$OUT/cold-nsys.txt"
else
    echo "nsys not found"
fi
