#!/usr/bin/env python3
"""The path from a layer's first hc_pre to its attention, over many tokens
or passes of a ktrace CSV (start,end,stream,name per kernel; ktrace.sh
writes it, call.sh returns it as ktrace.csv.gz): for each kind of layer
(with an indexer — a top-k kernel before the attention — or without), the
median, minimum and maximum over the last N spans (a span: one k_get_rows
to the next, kept when it has more than 1000 kernels: decode steps or
verification passes, not the MTP block's drafts) and layers 2 … of

  side   the start of the first kernel on another stream than hc_pre's
         (the side stream's first work: k_rope_table in a decode step)
  q_a    the end of the first product on hc_pre's stream
  norms  the end of the last k_norm_rope* kernel before the attention
  attn   the start of the attention's first kernel

in µs from hc_pre's end. cuda/NOTES.md v68 compares v67's and v68's
verification passes with it (the side stream's start moved from ≈ −2.5 to
≈ +3 µs).
    python3 scripts/cuda/ktrace-paths.py ktrace.csv [N]"""
import statistics
import sys

from ktrace_csv import load

if len(sys.argv) < 2:
    sys.exit(__doc__)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 12
ev = load(sys.argv[1])
heads = [i for i, e in enumerate(ev) if e[2].startswith("k_get_rows")]
spans = [(a, b) for a, b in zip(heads, heads[1:]) if b - a > 1000][-N:]
if not spans:
    sys.exit("no span of more than 1000 kernels in the trace")
ATTN = ("k_attn_seg", "k_attn_split", "k_attn_flash", "k_attn_po", "k_attn_scores")
got = {}  # (kind, field) -> values
for a, b in spans:
    ks = ev[a:b]
    pre = [i for i, e in enumerate(ks) if e[2].startswith("k_hc_pre")]
    for L in range(2, len(pre) // 2):
        i0, i1 = pre[2 * L], pre[2 * L + 1]
        end, stream = ks[i0][1], ks[i0][3]
        att = [i for i in range(i0 + 1, i1) if ks[i][2].startswith(ATTN)]
        if not att:
            continue
        ia = att[0]
        kind = "indexer" if any(ks[i][2].startswith("k_topk") for i in range(i0, ia)) else "no indexer"
        rel = lambda t: (t - end) / 1000
        side = [i for i in range(i0 + 1, ia) if ks[i][3] != stream]
        prod = [i for i in range(i0 + 1, ia) if ks[i][3] == stream and ks[i][2].startswith(("k_mv_", "k_matvec"))]
        norms = [i for i in range(i0 + 1, ia) if ks[i][2].startswith("k_norm_rope")]
        for field, v in (
            ("side", rel(ks[side[0]][0]) if side else None),
            ("q_a", rel(ks[prod[0]][1]) if prod else None),
            ("norms", rel(ks[norms[-1]][1]) if norms else None),
            ("attn", rel(ks[ia][0])),
        ):
            if v is not None:
                got.setdefault((kind, field), []).append(v)
print(f"{len(spans)} spans; µs from the layer's hc_pre end: median (min … max), count")
for kind in ("indexer", "no indexer"):
    row = []
    for field in ("side", "q_a", "norms", "attn"):
        v = got.get((kind, field))
        if v:
            row.append(f"{field} {statistics.median(v):6.1f} ({min(v):.1f} … {max(v):.1f}) n={len(v)}")
    if row:
        print(f"{kind:>10}: " + "; ".join(row))
