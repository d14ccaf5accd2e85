#!/usr/bin/env bash
# Per-kernel GPU time of one decode token and of one 512-token prefill chunk
# (synth.Flash(6), q2, exact, ctx ≈ 1k), measured by Nsight Compute on the
# GPU machine. Build the library and test binary as for device.sh, then
#   run(command="bash scripts/cuda/profile.sh", carry=["dev-out"])
# Writes ncu-<n>.csv and the summary profile.txt under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/profile}
mkdir -p "$OUT"
[ -s build/libds4cuda.so ] || bash scripts/cuda/device.sh build >/dev/null
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1 DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_MODE="exact, no graph"
for n in ${PROFILE_CHUNKS:-1 512}; do
    DS4_CUDA_PROFILE=$n ncu --clock-control none --cache-control ${NCU_CACHE:-all} --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        --csv --page raw ${CUDA_TEST:-dev-out/cuda.test} -test.run TestDecodeSpeed -test.timeout 300s >"$OUT/ncu-$n.csv" 2>"$OUT/ncu-$n.err"
    echo "== chunk of $n token(s): ncu exit $?"
    python3 - "$OUT/ncu-$n.csv" <<'PY' | tee -a "$OUT/profile.txt"
import csv, re, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
rd = csv.DictReader(rows)
tot = collections.defaultdict(float); cnt = collections.Counter(); byt = collections.defaultdict(float)
scale = 1.0  # to µs
bscale = 1.0  # to bytes
units = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
bunits = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
for r in rd:
    u = r.get("gpu__time_duration.sum", "")
    if u in units:
        scale = units[u]
        bscale = bunits.get(r.get("dram__bytes_read.sum", ""), 1.0)
        continue
    name = r.get("Kernel Name", "")
    v = r.get("gpu__time_duration.sum", "")
    try: us = float(v.replace(',', '')) * scale
    except ValueError: continue
    try: b = float(r.get("dram__bytes_read.sum", "0").replace(',', '')) * bscale
    except ValueError: b = 0.0
    short = re.sub(r"\(.*", "", name)
    short = re.sub(r"ds4mv::|\(anonymous namespace\)::|<unnamed>::", "", short)
    tot[short] += us; cnt[short] += 1; byt[short] += b
all_us = sum(tot.values())
print(f"total {all_us/1000:.3f} ms over {sum(cnt.values())} kernels, {sum(byt.values())/1e6:.1f} MB read from DRAM")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:30]:
    print(f"{v/1000:9.3f} ms {100*v/all_us:5.1f}% {cnt[k]:5d}x {byt[k]/1e6:8.1f} MB {byt[k]/v/1e3 if v else 0:6.0f} GB/s  {k[:100]}")
PY
done
