#!/usr/bin/env python3
"""List one layer of one decode token from a ktrace CSV (start,end,stream,name
per kernel, as the GPU ran them; scripts/cuda/ktrace.sh writes it), kernel by
kernel in start order: start and end in µs from the token's first kernel,
the duration, how far the kernel's end moved the latest end so far ("adv":
on the critical path it is the kernel's cost; negative when it ended inside
work already done) and the CUDA stream. A token spans one k_get_rows (its
embedding) to the next; the token listed is the latest complete one with the most kernels among
the last six (the second-to-last in plain decode; a speculative pass's
verification); L = -1 lists the MTP block's layer of the latest draft. A layer spans k_hc_pre
number 2·L to 2·L+2 (its attention and FFN sub-blocks; hc_pre opens each).
    python3 scripts/cuda/ktrace-layer.py ktrace.csv [L]
L defaults to 20 (a ratio-4 layer of Flash; 21 is a ratio-128 one). The
timeline's reading in cuda/NOTES.md (v21, v22) used this listing."""
import sys
from ktrace_csv import load

if len(sys.argv) < 2:
    sys.exit(__doc__)
L = int(sys.argv[2]) if len(sys.argv) > 2 else 20
ev = load(sys.argv[1])
tokens = [i for i, e in enumerate(ev) if e[2].startswith("k_get_rows")]
if len(tokens) < 3:
    sys.exit("fewer than two complete tokens in the trace")
# the latest complete span with the most kernels among the last six (in a
# speculative run the spans of the MTP block's draft are small); L = -1:
# the latest complete small span with a hc_pre (the MTP block's layer)
sp = [(tokens[i], tokens[i + 1]) for i in range(max(0, len(tokens) - 7), len(tokens) - 2)]
if L < 0:
    small = [(a, b) for a, b in sp if b - a < max(y - x for x, y in sp) // 4
             and any(e[2].startswith("k_hc_pre") for e in ev[a:b])]
    if not small:
        sys.exit("no MTP block's span (a small one with a hc_pre) in the trace")
    a, b = small[-1]
else:
    a, b = max(reversed(sp), key=lambda t: t[1] - t[0])
ks = ev[a:b]
t0 = ks[0][0]
pre = [i for i, e in enumerate(ks) if e[2].startswith("k_hc_pre")]
if L < 0:  # the whole span
    pre, L = [0, 0, len(ks)], 0
if 2 * L + 2 >= len(pre):
    sys.exit(f"layer {L} not in the token ({len(pre)} hc_pre launches)")
last = None
try:
    for s, e, n, strm in ks[pre[2 * L]:pre[2 * L + 2]]:
        adv = (e - last) / 1000 if last is not None else 0.0
        print(f"{(s - t0) / 1000:9.2f} {(e - t0) / 1000:9.2f} dur {(e - s) / 1000:6.2f} adv {adv:6.2f} s{strm} {n}")
        last = e if last is None else max(last, e)
except BrokenPipeError:  # (piped into head)
    pass
