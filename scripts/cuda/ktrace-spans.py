#!/usr/bin/env python3
"""Per-layer spans of decode tokens from a ktrace CSV (scripts/cuda/ktrace.sh
writes it): for each layer L, the median over the last N complete tokens of
the time from its attention hc_pre (number 2·L in the token) to the next
layer's (2·L + 2), in µs; then the median of the layers of each kind, told
apart by the caller's pattern (Flash: layers 0 and 1 window-only, then
ratio 4 at even layers and ratio 128 at odd ones). Two CSVs: the second's
spans beside the first's, and their difference. The layer tables in
cuda/NOTES.md v28 came from it.
    python3 scripts/cuda/ktrace-spans.py a.csv [b.csv] [--tokens N] [--layers]"""
import statistics
import sys

from ktrace_csv import load


def spans(path, ntok):
    ev = load(path)
    starts = [i for i, e in enumerate(ev) if e[2].startswith("k_get_rows")]
    if len(starts) < 3:
        sys.exit(f"{path}: fewer than two complete tokens")
    pairs = list(zip(starts[:-1], starts[1:]))[-ntok - 1:-1]  # (the last may be cut)
    per = {}
    for a, b in pairs:
        ks = ev[a:b]
        pre = [i for i, e in enumerate(ks) if e[2].startswith("k_hc_pre")]
        for L in range(len(pre) // 2 - 1):
            per.setdefault(L, []).append((ks[pre[2 * L + 2]][0] - ks[pre[2 * L]][0]) / 1000)
    return {L: statistics.median(v) for L, v in per.items()}


def kind(L):
    return "window" if L < 2 else ("ratio 4" if L % 2 == 0 else "ratio 128")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args or len(args) > 2:
        sys.exit(__doc__)
    ntok = 10
    if "--tokens" in sys.argv:
        ntok = int(sys.argv[sys.argv.index("--tokens") + 1])
        args = [a for a in args if a != str(ntok)]
    runs = [spans(p, ntok) for p in args]
    layers = sorted(set.intersection(*(set(r) for r in runs)))
    if "--layers" in sys.argv:
        for L in layers:
            vals = [r[L] for r in runs]
            extra = f" {vals[1] - vals[0]:+7.1f}" if len(vals) == 2 else ""
            print(f"{L:3d} {kind(L):9s} " + " ".join(f"{v:7.1f}" for v in vals) + extra)
    for k in ("window", "ratio 4", "ratio 128"):
        ls = [L for L in layers if kind(L) == k]
        if not ls:
            continue
        vals = [statistics.median(r[L] for L in ls) for r in runs]
        extra = f" {vals[1] - vals[0]:+7.1f}" if len(vals) == 2 else ""
        print(f"{k:9s} layers {len(ls):2d}: median span " + " ".join(f"{v:7.1f}" for v in vals) + " µs" + extra)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # (piped into head)
        pass
