#!/usr/bin/env python3
"""Golden data for the MTP (multi-token-prediction) block from the official DeepSeek V4 model.py.

Loads a committed golden case's checkpoint (testdata/golden/<case>, which carries mtp.0.*), runs
the main model over the case's tokens to get the output streams h (the head's input, [n, hc, d]),
then the reference MTPBlock over (h_i, token_{i+1}) at positions i = 0 .. n-2, whose logits
predict token_{i+2} (DeepSeek-V3 report §2.2; vLLM's MTP proposer shifts the ids the same way):

  mtp_prefill   one call over every position (start_pos 0), rows every 8th position + the last 64
  mtp_decode    a prefill of the first n-1-T positions, then one position per call (the last T)

It writes <out>/mtp.safetensors ("<variant>.positions" I32, "<variant>.logits" F32 [rows, V])
and <out>/mtp_meta.json (the reference's self-agreement, and the main model's agreement with the
committed logits, which says the checkpoint was loaded as generated).

  python3 scripts/reference/gen_mtp_golden.py --case flash4_w128_k512 --out testdata/golden/flash4_w128_k512
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_golden as G  # noqa: E402

T_DECODE = 40


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default=".ref/dsv4-flash-inference/inference")
    ap.add_argument("--case", default="flash4_w128_k512")
    ap.add_argument("--golden", default="testdata/golden")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    d = os.path.join(args.golden, args.case)
    with open(os.path.join(d, "inference_config.json")) as f:
        margs = json.load(f)
    with open(os.path.join(d, "tokens.json")) as f:
        toks = json.load(f)["long"]
    M, _ = G.load_reference(args.ref)
    model = G.build_model(M, margs, args.device)
    G.load_weights(model, load_file(os.path.join(d, "model.safetensors")))
    dev = args.device
    ids = torch.tensor(toks, dtype=torch.long, device=dev)
    n = len(toks)

    # Main model: its logits (checked against the committed ones) and the head's input streams.
    cap = {}

    def grab(mod, a):
        cap.setdefault("h", a[0].detach().clone())    # returns None: the inputs stay as they are

    hook = model.head.register_forward_pre_hook(grab)
    G.reset_state(M, model)
    main = model(ids.view(1, -1), 0)[0].float()
    hook.remove()
    h = cap["h"]                                     # [1, n, hc, d]
    committed = load_file(os.path.join(d, "logits.safetensors"))
    cpos = committed["long.prefill.positions"].long()
    main_vs_committed = G.agreement(committed["long.prefill.logits"], main[cpos.to(dev)])

    mtp = model.mtp[0]
    G.reset_state(M, model)
    pre = mtp(h[:, :n - 1], 0, ids[1:n].view(1, -1))[0].float()        # [n-1, V]
    k = n - 1 - T_DECODE
    G.reset_state(M, model)
    rows = [mtp(h[:, :k], 0, ids[1:k + 1].view(1, -1))[0].float()]
    for p in range(k, n - 1):
        rows.append(mtp(h[:, p:p + 1], p, ids[p + 1:p + 2].view(1, 1))[0].float())
    dec = torch.cat(rows, 0)
    self_agree = G.agreement(pre, dec)

    ppos = sorted(set(range(0, n - 1, 8)) | set(range(n - 1 - 64, n - 1)))
    dpos = list(range(k, n - 1))
    out = {
        "mtp_prefill.positions": torch.tensor(ppos, dtype=torch.int32),
        "mtp_prefill.logits": pre[ppos].cpu().contiguous(),
        "mtp_decode.positions": torch.tensor(dpos, dtype=torch.int32),
        "mtp_decode.logits": dec[dpos].cpu().contiguous(),
    }
    os.makedirs(args.out, exist_ok=True)
    G.save_safetensors(out, os.path.join(args.out, "mtp.safetensors"))
    meta = {
        "case": args.case,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "model.py_sha256": G.sha256(os.path.join(args.ref, "model.py")),
        "alignment": "row at position i: MTPBlock(h_i, token_{i+1}) at start_pos i; predicts token_{i+2}",
        "main_vs_committed_prefill": main_vs_committed,
        "mtp_prefill_vs_decode_all_rows": self_agree,
        "mtp_prefill_positions": "every 8th position plus the last 64 of 0..n-2",
        "mtp_decode": f"prefill of positions 0..{k - 1}, then one position per call for {k}..{n - 2}",
    }
    with open(os.path.join(args.out, "mtp_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
