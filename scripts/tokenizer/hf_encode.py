#!/usr/bin/env python3
"""Encodes the tokenizer corpus with Hugging Face `tokenizers` (the reference).

Usage (from the repository root, on a machine with `tokenizers` installed):

    python3 scripts/tokenizer/hf_encode.py tokenizer/testdata/corpus.jsonl OUT.json

It loads tokenizer/data/deepseek-v4-tokenizer.json.gz and writes, for every
corpus sample:

  special  ids of HF `encode(text, add_special_tokens=False)`: added tokens
           (<｜User｜>, <think>, ...) found in the text become their ids, as in
           a rendered chat prompt. ds4go's EncodeWithSpecial must match.
  plain    ids with no added-token matching at all (ds4go's Encode): the
           output of a second HF tokenizer built from the same JSON with the
           added_tokens table emptied; cross-checked against the pipeline run by
           hand (pre_tokenizer.pre_tokenize_str, then model.tokenize per piece).
  pieces   the pre-tokenizer's pieces, in GPT-2 byte-to-unicode form.

Samples given as "hex" are not valid UTF-8, which HF cannot take. For those
the script applies ds4go's documented convention: each byte that is not part
of a valid UTF-8 sequence is pre-tokenized like a control character (U+0001
stands in for it in HF's pre-tokenizer; both are one byte long, so the piece
boundaries map back byte for byte), and the raw bytes of each piece go through
HF's BPE model.
"""

import gzip
import json
import sys

import tokenizers
from tokenizers import Tokenizer

TOKENIZER_PATH = "tokenizer/data/deepseek-v4-tokenizer.json.gz"


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {}
    n = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


B2U = bytes_to_unicode()
U2B = {c: b for b, c in B2U.items()}


def to_bytelevel(data):
    return "".join(B2U[b] for b in data)


def from_bytelevel(s):
    return bytes(U2B[c] for c in s)


def main():
    corpus_path, out_path = sys.argv[1], sys.argv[2]
    with gzip.open(TOKENIZER_PATH, "rt", encoding="utf-8") as f:
        raw = f.read()
    full = Tokenizer.from_str(raw)
    cfg = json.loads(raw)
    added_contents = [a["content"] for a in cfg["added_tokens"]]
    cfg["added_tokens"] = []
    plain_tok = Tokenizer.from_str(json.dumps(cfg, ensure_ascii=False))

    # The README's published expectations: fail loudly if this file disagrees.
    readme = {
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ": [19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20,
                                          6113, 257, 76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98],
        "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>":
            [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1],
    }
    for text, want in readme.items():
        got = full.encode(text, add_special_tokens=False).ids
        assert got == want, ("README expectation", text, got, want)

    samples = []
    mismatches = 0
    with open(corpus_path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for s in lines:
        rec = {"id": s["id"]}
        if "text" in s:
            text = s["text"]
            rec["special"] = full.encode(text, add_special_tokens=False).ids
            rec["plain"] = plain_tok.encode(text, add_special_tokens=False).ids
            pieces = [p for p, _ in full.pre_tokenizer.pre_tokenize_str(text)]
            rec["pieces"] = pieces
            by_hand = [t.id for p in pieces for t in plain_tok.model.tokenize(p)]
            if by_hand != rec["plain"]:
                mismatches += 1
                print("plain mismatch (tokenizer vs pipeline by hand):", s["id"], file=sys.stderr)
            if "".join(from_bytelevel(p).decode("utf-8", "surrogatepass") for p in pieces) != text:
                print("pieces do not cover the text:", s["id"], file=sys.stderr)
                mismatches += 1
        else:
            data = bytes.fromhex(s["hex"])
            esc = data.decode("utf-8", "surrogateescape")
            stand_in = "".join("\x01" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in esc)
            assert len(stand_in.encode("utf-8")) == len(data)
            pieces_in = [p for p, _ in full.pre_tokenizer.pre_tokenize_str(stand_in)]
            pieces, pos = [], 0
            for p in pieces_in:
                n = len(from_bytelevel(p))
                pieces.append(to_bytelevel(data[pos:pos + n]))
                pos += n
            assert pos == len(data), (s["id"], pos, len(data))
            rec["pieces"] = pieces
            rec["plain"] = [t.id for p in pieces for t in plain_tok.model.tokenize(p)]
            assert not any(c.encode("utf-8") in data for c in added_contents), s["id"]
            rec["special"] = rec["plain"]
        samples.append(rec)

    head = {
        "generator": "scripts/tokenizer/hf_encode.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": TOKENIZER_PATH,
        "corpus": corpus_path,
    }
    # One sample per line keeps the file diffable.
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "samples": [\n')
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in samples))
        f.write("\n]}\n")
    print("samples:", len(samples), "mismatches:", mismatches, "tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
