#!/usr/bin/env python3
"""Summarise a ktrace CSV (start,end,stream,name per kernel, as the GPU ran
them) over the last N decode tokens (a token starts at its embedding's
k_get_rows; in a speculative run, a pass: a verification and the spans of
its draft): wall time, kernels and busy time (the union of kernel
intervals) per token, then per kernel name the time it advanced the token:
kernels sorted by end, each charged the time from the previous end to its
own, so the charges add up to the wall time; on a serial chain that is the
kernel's cost including the gap before it. Beside it the mean duration
(start to end: with PDL a kernel starts before its predecessor ends) and
the streams it ran on, numbered in order of first use within the token
(1: the batch's main stream, 2: its side stream), most used first.
With --prefill the same table covers the prompt's chunks instead: every
span from one k_get_rows to the next that lasts longer than 100 ms (a decode
token takes ≈ 10, a chunk of 2048 tokens ≈ 1000), the first N of them;
with --last the last N instead (a bench whose last frontiers add small
chunks after the big ones: cuda/NOTES.md v48's 256-token chunks), and
--min-ms M sets the span's least duration (default 100). Then the GPU's idle gaps (3 µs or more in decode, 20
in prefill) by the kernel before them.
    python3 scripts/cuda/ktrace-summary.py [--prefill [--last] [--min-ms M]] ktrace.csv [N]"""
import sys, collections
from ktrace_csv import load
argv = sys.argv[1:]
MIN_NS = 100_000_000
if "--min-ms" in argv:
    i = argv.index("--min-ms")
    MIN_NS = int(float(argv[i + 1]) * 1e6)
    del argv[i:i + 2]
LAST = "--last" in argv
PREFILL = "--prefill" in argv
args = [a for a in argv if a not in ("--prefill", "--last")]
PASSES = False
N = int(args[1]) if len(args) > 1 else 16
ev = load(args[0])
starts = [i for i, e in enumerate(ev) if e[2].startswith("k_get_rows")]
if PREFILL:
    starts.append(len(ev) - 1)
    spans = [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)
             if ev[starts[i + 1]][0] - ev[starts[i]][0] > MIN_NS]
    spans = spans[-N:] if LAST else spans[:N]
    if not spans:
        print("no prefill chunk (a span over 100 ms) in the trace"); raise SystemExit(1)
elif len(starts) < N + 2:
    print(f"only {len(starts)} tokens in the trace; kernels seen:", *sorted({e[2] for e in ev})[:20], sep="\n  ")
    raise SystemExit(1)
if PREFILL:
    toks = spans
else:
    # A speculative pass has small spans after its verification (the MTP
    # block's embedding, its head's row gather): when most of the last 6N
    # spans are small, a unit runs from one span of at least a quarter of
    # the largest kernel count to the next.
    # A pass's head is a big span followed by a small one: plain tokens
    # before the speculative run (ds4-bench decodes plainly first) are big
    # spans followed by big ones and are left out, so that a short run of
    # deep passes (--gen 40: ten of four tokens) is not averaged with them.
    sp = [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)][-6 * N:]
    big = max(b - a for a, b in sp)
    isbig = [b - a >= big // 4 for a, b in sp]
    heads = [i for i in range(len(sp)) if isbig[i] and (i + 1 == len(sp) or not isbig[i + 1])]
    PASSES = sum(isbig) < len(sp) * 3 // 4
    if PASSES: # (a unit holds no big span but its head: none reaching back over plain tokens)
        toks = [(sp[h][0], sp[g][0]) for h, g in zip(heads, heads[1:]) if not any(isbig[h + 1:g])][-N:]
    else:
        toks = sp[-N:]

charge = collections.defaultdict(float); dur = collections.defaultdict(float); cnt = collections.Counter()
streams = collections.defaultdict(collections.Counter)
walls, busys, nks = [], [], []
for a, b in toks:
    t0, t1 = ev[a][0], ev[b][0]
    ks = ev[a:b]
    walls.append(t1 - t0); nks.append(len(ks))
    busy, cs, ce = 0, None, None
    order = {}
    for _, _, n, st in ks:
        order.setdefault(st, len(order) + 1)
        streams[n][order[st]] += 1
    for s, e, _, _ in ks:
        if ce is None or s > ce:
            if ce is not None: busy += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    busy += min(ce, t1) - cs
    busys.append(busy)
    prev = t0
    for s, e, n, _ in sorted(ks, key=lambda k: k[1]):
        e = min(e, t1)
        charge[n] += max(0, e - prev); prev = max(prev, e)
        dur[n] += e - s; cnt[n] += 1
    charge["(after the last kernel)"] += max(0, t1 - prev)
T = len(toks)
what = "prefill chunks" if PREFILL else ("passes (a verification and its draft)" if PASSES else "decode tokens")
u = "chunk" if PREFILL else ("pass" if PASSES else "token")
rate = "" if PREFILL or PASSES else f" ({1e9*T/sum(walls):.1f} tok/s)"
print(f"{T} {what}: {sum(walls)/T/1e6:.3f} ms/{u}{rate}, "
      f"{sum(nks)/T:.0f} kernels/{u}, GPU busy {sum(busys)/T/1e6:.3f} ms/{u}")
if PREFILL:
    print(f"all {T} spans: {sum(walls)/1e6:.1f} ms wall, GPU busy {sum(busys)/1e6:.1f} ms "
          f"({100*sum(busys)/sum(walls):.0f}%), {sum(nks)} kernels")
    print("each: " + ", ".join(f"{w/1e6:.1f} ms (busy {b/1e6:.1f}, {k} kernels)" for w, b, k in zip(walls, busys, nks)))
print(f"{'charged ms':>10} {'share':>6} {'calls':>6} {'µs/call':>8} {'mean dur µs':>11} {'stream':>6}  kernel")
tot = sum(charge.values())
for n, c in sorted(charge.items(), key=lambda kv: -kv[1]):
    k = cnt[n] / T
    st = "/".join(str(o) for o, _ in streams[n].most_common()) if n in streams else "-"
    print(f"{c/T/1e6:10.3f} {100*c/tot:5.1f}% {k:6.0f} {c/cnt[n]/1e3 if cnt[n] else 0:8.2f} "
          f"{dur[n]/cnt[n]/1e3 if cnt[n] else 0:11.2f} {st:>6}  {n}")
if True:
    # where the GPU idles inside the prompt: every gap of 20 µs or more
    # between the end of all kernels so far and the next kernel's start,
    # totalled by the kernel that ends before it
    GAP = 20_000 if PREFILL else 3_000
    gaps = collections.defaultdict(lambda: [0, 0])
    big = []
    for a, b in toks:
        ce, last = None, None
        for s, e, n, _ in ev[a:b]:
            if ce is not None and s - ce >= GAP:
                g = gaps[last]; g[0] += s - ce; g[1] += 1
                big.append((s - ce, last, n))
            if ce is None or e > ce:
                ce, last = e, n
    idle = sum(g[0] for g in gaps.values())
    print(f"\nidle gaps of {GAP // 1000} µs or more: {idle/T/1e6:.3f} ms/{u} in {sum(g[1] for g in gaps.values())/T:.0f} gaps; by the kernel before:")
    for n, (t, k) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"  {t/T/1e6:8.3f} ms/{u} {k/T:6.0f} gaps  after {n}")
    print("largest:", ", ".join(f"{d/1e3:.0f} µs {p} → {n}" for d, p, n in sorted(big, reverse=True)[:6]))
