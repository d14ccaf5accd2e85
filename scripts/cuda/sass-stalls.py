#!/usr/bin/env python3
"""Summarise the per-instruction warp-stall samples of one kernel, as
scripts/cuda/ncu-oplat.sh writes them (ncu --page source --print-source sass
--csv: sass-<kernel>.csv): the stall reasons over all samples, the executed
instruction mix by opcode, and the instructions with the most samples, each
with its main reasons and, where its wait is on a scoreboard, the load that
feeds it (the last earlier load writing one of its source registers)
and how many loads were issued in between. A long-scoreboard wait right
after its own load, with no other load in between, is a load whose consumer
holds the next loads back (cuda/NOTES.md v36: the block scale converted
inside T::load).
    python3 scripts/cuda/sass-stalls.py sass-k_mv_dec_….csv [top]"""
import collections
import csv
import re
import sys


def num(v):
    try:
        return int(str(v).replace(",", ""))
    except ValueError:
        return 0


def opcode(src):
    w = src.split()
    if not w:
        return "?"
    if w[0].startswith("@"):
        w = w[1:]
    return w[0].split(".")[0] if w else "?"


def regs(s):
    return set(re.findall(r"\bR\d+\b", s))


def dst_regs(ins):
    """The registers an instruction writes: its first operand, widened to
    the vector a .64 or .128 load fills."""
    d = re.findall(r"\bR(\d+)\b", ins.split(",", 1)[0])
    if not d:
        return set()
    n = 4 if ".128" in ins else (2 if ".64" in ins else 1)
    return {f"R{int(d[0]) + k}" for k in range(n)}


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    rows = list(csv.reader(open(path)))
    hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    src = [r[col["Source"]].strip() for r in data]
    samples = [num(r[col["Warp Stall Sampling (All Samples)"]]) for r in data]
    total = sum(samples)
    print(f"{path}: {len(data)} instructions, {total} stall samples")
    by = collections.Counter()
    for r in data:
        for h in stalls:
            by[h] += num(r[col[h]])
    for h, v in by.most_common():
        if v:
            print(f"  {h:24s} {v:7d} {100 * v / max(total, 1):5.1f} %")
    mix = collections.Counter()
    for r, s in zip(data, src):
        mix[opcode(s)] += num(r[col["Instructions Executed"]])
    ex = sum(mix.values())
    print(f"executed warp instructions {ex}")
    for k, v in mix.most_common(12):
        print(f"  {k:8s} {v:10d} {100 * v / max(ex, 1):5.1f} %")
    print(f"top {top} instructions by samples:")
    for i in sorted(range(len(data)), key=lambda i: -samples[i])[:top]:
        r = data[i]
        why = sorted(((num(r[col[h]]), h) for h in stalls), reverse=True)[:2]
        line = f"  {samples[i]:5d} {100 * samples[i] / max(total, 1):5.1f} % {src[i][:56]:56s} " + ", ".join(
            f"{h[6:]} {v}" for v, h in why if v)
        if why and why[0][1] in ("stall_long_sb", "stall_short_sb"):
            # the operands: registers after the destination
            ops = src[i].split(None, 2)
            srcregs = regs(ops[2] if len(ops) > 2 and not ops[0].startswith("@") else src[i].split(",", 1)[-1])
            loads, found = 0, False
            for j in range(i - 1, max(-1, i - 200), -1):
                o = opcode(src[j])
                dst = dst_regs(src[j])
                if o.startswith("LD") and dst & srcregs:
                    line += f"  <- {src[j][:40]} ({i - j} back, {loads} loads between)"
                    found = True
                    break
                if o.startswith("LD"):
                    loads += 1
            if not found:
                line += "  (its load: not among the 200 instructions before)"
        print(line)


if __name__ == "__main__":
    main()
