#!/usr/bin/env python3
"""Lists code points assigned in a newer Unicode version than Python's.

Usage: python3 scripts/tokenizer/newer_unicode.py > tokenizer/testdata/unicode_newer.txt

Writes the ranges of code points that the `regex` module's Unicode tables
(17.0 in regex 2026.5.9) consider assigned but Python's `unicodedata` (14.0 in
Python 3.11) does not. The tokenizer tests use the list to tell which corpus
samples hold characters that Go's Unicode 15.0 tables may classify differently
from Hugging Face's Oniguruma (docs/tokenizer.md).
"""

import sys
import unicodedata

import regex

cn = regex.compile(r"\p{Cn}")
ranges = []
for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    if unicodedata.category(c) == "Cn" and not cn.match(c):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
print("# code points assigned in Unicode %s (regex %s) but not in %s (Python unicodedata)" % (
    "17.0", regex.__version__, unicodedata.unidata_version))
for lo, hi in ranges:
    print("%04X..%04X" % (lo, hi))
sys.stderr.write("%d ranges, %d code points\n" % (len(ranges), sum(h - l + 1 for l, h in ranges)))
