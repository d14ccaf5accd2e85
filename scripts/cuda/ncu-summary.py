#!/usr/bin/env python3
"""Summarise an ncu --csv --page raw file (gpu__time_duration.sum and
dram__bytes_read.sum per kernel): total, then the 30 kernels of most time
with their share, launches, DRAM bytes and bandwidth.
    python3 scripts/cuda/ncu-summary.py ncu.csv"""
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
