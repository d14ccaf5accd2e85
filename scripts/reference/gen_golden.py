#!/usr/bin/env python3
"""Generate golden forward-pass data for ds4go from the OFFICIAL DeepSeek V4 reference.

Runs the official `inference/model.py` (imported from a git-ignored copy, see
scripts/reference/README.md) in float32 on tiny random checkpoints in the official HF layout,
with `kernel` replaced by scripts/reference/dsv4_kernels.py (pure torch, f32, FP8/FP4
simulations that round). For every case it writes testdata/golden/<case>/:

  config.json            HF-style config (the format shipped with the official checkpoint)
  inference_config.json  the same config as `ModelArgs` JSON (what model.py consumes)
  model.safetensors      the checkpoint, official tensor names (model.py module names)
  tokens.json            {"<run>": [token ids]}
  logits.safetensors     next-token logits (F32) + the positions (I32) of every stored row
  hidden.safetensors     per-layer activations at a few positions, indexer picks, compressed rows
  meta.json              what was run, positions, prefill-vs-decode agreement, coverage stats

Usage (on the GPU machine, from the repo root):
  python3 scripts/reference/gen_golden.py --ref .ref/dsv4-flash-inference/inference \
      --out /tmp/golden [--cases a,b] [--smoke] [--device cuda]
"""
import argparse
import hashlib
import importlib
import json
import math
import os
import sys
import time
import types

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# Case definitions (HF-style config fields; everything not listed is the Flash value).
# ---------------------------------------------------------------------------------------------

FLASH_HF = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "compress_rope_theta": 160000,
}

CASES = {
    # Main case: every mechanism, small window and top-k so a 640-token sequence crosses the
    # window 40 times, 5 ratio-128 boundaries and makes the indexer select 8 of up to 160 rows.
    "flash6_w16_k8": {
        "description": "6 layers (ratios 0,0,4,128,4,128; no MTP), 3 hash-routed layers, window 16, "
                       "indexer top-k 8 with 16 indexer heads, 16 experts (6 active, inter 16), head_dim 192 "
                       "(2 FP8 blocks), dim 64, vocab 512; runs of 448 tokens (3 ratio-128 rows, up to "
                       "112 ratio-4 rows) and 37 tokens",
        "hf": {
            "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 6, "num_hash_layers": 3,
            "num_nextn_predict_layers": 0,
            "num_attention_heads": 4, "head_dim": 192, "qk_rope_head_dim": 64,
            "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
            "sliding_window": 16,
            "compress_ratios": [0, 0, 4, 128, 4, 128],
            "index_n_heads": 16, "index_head_dim": 128, "index_topk": 8,
            "n_routed_experts": 16, "num_experts_per_tok": 6, "moe_intermediate_size": 16,
            "max_position_embeddings": 1024,
        },
        "seed": 1001,
        "runs": {
            # name: (n_tokens, prefill rows to store, decode-from-0 prefix, prefill+decode split)
            "long": {"n": 448, "decode0": 448, "split": 203},
            "short": {"n": 37, "decode0": 37, "split": 13},
        },
        "hidden_positions": {
            "long": [0, 1, 2, 3, 4, 7, 15, 16, 17, 63, 127, 128, 129, 255, 256, 383, 384, 447],
            "short": [0, 1, 3, 4, 8, 15, 16, 31, 36],
        },
    },
    # The real indexer top-k 512 (needs > 2048 tokens), real window 128.
    "flash4_w128_k512": {
        "description": "4 layers (ratios 0,0,4,128; MTP 0), 2 hash-routed layers, window 128, "
                       "indexer top-k 512 with 16 indexer heads, 8 experts (3 active), dim 64, vocab 512, "
                       "2112 tokens (up to 528 ratio-4 rows, so positions >= 2052 select 512 of them; "
                       "16 ratio-128 rows), with MTP weights (unused by the forward pass)",
        "hf": {
            "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_hash_layers": 2,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64,
            "q_lora_rank": 48, "o_groups": 2, "o_lora_rank": 32,
            "sliding_window": 128,
            "compress_ratios": [0, 0, 4, 128, 0],
            "index_n_heads": 16, "index_head_dim": 128, "index_topk": 512,
            "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
            "max_position_embeddings": 4096,
        },
        "seed": 2001,
        "runs": {
            "long": {"n": 2112, "decode0": 0, "split": 1999},
        },
        "hidden_positions": {
            "long": [0, 1, 3, 4, 127, 128, 129, 511, 1023, 2047, 2048, 2051, 2052, 2111],
        },
    },
}


def hf_to_model_args(hf: dict, max_batch_size: int = 1) -> dict:
    """Map the HF-style config to the official ModelArgs JSON (inference/config.json format)."""
    rs = hf["rope_scaling"]
    return {
        "max_batch_size": max_batch_size,
        "max_seq_len": hf["max_position_embeddings"],
        "dtype": "bf16",              # unquantised weights (we load them as float32, see below)
        "scale_fmt": "ue8m0",         # power-of-two scales for the FP8 KV simulation (Flash)
        "vocab_size": hf["vocab_size"],
        "dim": hf["hidden_size"],
        "moe_inter_dim": hf["moe_intermediate_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_hash_layers": hf["num_hash_layers"],
        "n_mtp_layers": hf["num_nextn_predict_layers"],
        "n_heads": hf["num_attention_heads"],
        "n_routed_experts": hf["n_routed_experts"],
        "n_shared_experts": hf["n_shared_experts"],
        "n_activated_experts": hf["num_experts_per_tok"],
        "score_func": hf["scoring_func"],
        "route_scale": hf["routed_scaling_factor"],
        "swiglu_limit": hf["swiglu_limit"],
        "q_lora_rank": hf["q_lora_rank"],
        "head_dim": hf["head_dim"],
        "rope_head_dim": hf["qk_rope_head_dim"],
        "norm_eps": hf["rms_norm_eps"],
        "o_groups": hf["o_groups"],
        "o_lora_rank": hf["o_lora_rank"],
        "window_size": hf["sliding_window"],
        "compress_ratios": hf["compress_ratios"],
        "compress_rope_theta": hf["compress_rope_theta"],
        "original_seq_len": rs["original_max_position_embeddings"],
        "rope_theta": hf["rope_theta"],
        "rope_factor": rs["factor"],
        "beta_fast": rs["beta_fast"],
        "beta_slow": rs["beta_slow"],
        "index_n_heads": hf["index_n_heads"],
        "index_head_dim": hf["index_head_dim"],
        "index_topk": hf["index_topk"],
        "hc_mult": hf["hc_mult"],
        "hc_sinkhorn_iters": hf["hc_sinkhorn_iters"],
        "hc_eps": hf["hc_eps"],
    }


# ---------------------------------------------------------------------------------------------
# Loading the official code with the f32 kernels.
# ---------------------------------------------------------------------------------------------

def load_reference(ref_dir: str):
    sys.path.insert(0, HERE)
    import dsv4_kernels
    sys.modules["kernel"] = dsv4_kernels          # model.py does `from kernel import ...`
    sys.path.insert(0, os.path.abspath(ref_dir))
    model = importlib.import_module("model")
    # rotate_activation asserts bf16 and needs fast_hadamard_transform: replace with f32 WHT.
    model.rotate_activation = dsv4_kernels.hadamard
    return model, dsv4_kernels


def clear_caches(M):
    for fn in ("precompute_freqs_cis", "get_window_topk_idxs", "get_compress_topk_idxs"):
        getattr(M, fn).cache_clear()


def build_model(M, margs: dict, device: str):
    clear_caches(M)
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(device)
    args = M.ModelArgs(**margs)
    model = M.Transformer(args)
    model = model.float()  # bf16 Linear weights -> f32 (freqs_cis stays complex64, tid2eid int32)
    model.eval()
    # head: return logits of every position (the official get_logits returns the last one only)
    head = model.head

    def get_logits_all(x, _head=head):
        _head._last_hidden = x.float()
        return F.linear(x.float(), _head.weight)

    head.get_logits = get_logits_all
    return model


def reset_state(M, model):
    """Fresh decode state (as after construction): caches zero, compressor scores -inf."""
    for mod in model.modules():
        if isinstance(mod, M.Compressor):
            mod.kv_state.zero_()
            mod.score_state.fill_(float("-inf"))
        if isinstance(mod, (M.Attention, M.Indexer)):
            mod.kv_cache.zero_()


# ---------------------------------------------------------------------------------------------
# Random checkpoint in the official layout.
# ---------------------------------------------------------------------------------------------

F32_NAMES = ("ape", "attn_sink", "gate.bias", "hc_attn_fn", "hc_attn_base", "hc_attn_scale",
             "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "hc_head_fn", "hc_head_base", "hc_head_scale")


def stored_dtype(name: str):
    if name.endswith("tid2eid"):
        return torch.int64
    for s in F32_NAMES:
        if name.endswith(s):
            return torch.float32
    return torch.bfloat16


def make_weights(model, margs: dict, seed: int):
    """Random weights, exactly representable in bf16, scaled to exercise every mechanism."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    D = margs["dim"]
    hc = margs["hc_mult"]

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32, device="cpu")

    def uni(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float32, device="cpu")

    out = {}
    sd = model.state_dict()
    for name in sd:
        if name.startswith("mtp.") and (name.endswith("embed.weight") or name.endswith("head.weight")):
            continue  # shared with the main model; the release does not store them
        t = sd[name]
        shape = tuple(t.shape)
        last = name.split(".")[-1]
        if name.endswith("tid2eid"):
            V, k = shape
            E = margs["n_routed_experts"]
            w = torch.stack([torch.randperm(E, generator=g, device="cpu")[:k] for _ in range(V)]).to(torch.int64)
            out[name] = w
            continue
        if name == "embed.weight":
            w = randn(*shape)
        elif name.endswith("head.weight"):
            w = randn(*shape) * (2.0 / math.sqrt(shape[1]))
        elif "norm" in name and last == "weight":
            w = 1.0 + 0.1 * randn(*shape)
        elif last.endswith("_fn"):                     # hc_{attn,ffn,head}_fn [mix, hc*D]
            w = randn(*shape) / math.sqrt(shape[1])
        elif last.endswith("_base"):
            w = randn(*shape) * (0.5 if "head" in last else 1.0)
        elif last.endswith("_scale"):                  # hc_*_scale [3] or hc_head_scale [1]
            if shape[0] == 3:
                w = torch.stack([uni(0.5, 1.5, 1), uni(0.5, 1.5, 1), uni(1.5, 2.5, 1)]).flatten()
            else:
                w = uni(0.5, 1.5, *shape)
        elif last == "attn_sink":
            w = randn(*shape)
        elif last == "ape":
            w = 0.5 * randn(*shape)
        elif name.endswith("gate.bias"):
            w = 0.2 * randn(*shape)
        elif name.endswith(".ffn.gate.weight"):
            w = randn(*shape) * (1.5 / math.sqrt(shape[1]))
        elif ".experts." in name and not ".shared_experts." in name:
            if last == "weight" and (".w1." in name or ".w3." in name):
                w = randn(*shape) * (6.0 / math.sqrt(shape[1]))   # ~10% of up pass +-10, ~5% of gate pass 10
            else:  # w2
                w = randn(*shape) / (16.0 * math.sqrt(shape[1]))
        elif ".shared_experts." in name:
            # as large as the routed experts: ~10% of |up| pass 10, so the golden data shows that
            # the official shared expert is NOT clamped (ds4.c clamps it)
            if ".w2." in name:
                w = randn(*shape) / (16.0 * math.sqrt(shape[1]))
            else:
                w = randn(*shape) * (6.0 / math.sqrt(shape[1]))
        elif name.endswith("compressor.wgate.weight"):
            w = randn(*shape) * (1.5 / math.sqrt(shape[1]))
        elif last == "weight" and len(shape) == 2:     # every other projection
            w = randn(*shape) / math.sqrt(shape[1])
        else:
            raise ValueError(f"no init rule for {name} {shape}")
        w = w.to(torch.bfloat16)                        # exactly representable in bf16
        out[name] = w.to(stored_dtype(name)) if stored_dtype(name) != torch.bfloat16 else w
        assert tuple(out[name].shape) == shape, name
    return out


def load_weights(model, weights: dict):
    dev = next(model.parameters()).device
    sd = {k: v.to(dev) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed_missing = {k for k in model.state_dict() if k.startswith("mtp.") and
                       (k.endswith("embed.weight") or k.endswith("head.weight"))}
    assert not unexpected, unexpected
    assert set(missing) <= allowed_missing, set(missing) - allowed_missing


# ---------------------------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------------------------

class Capture:
    """Forward hooks capturing activations at chosen positions during a prefill."""

    def __init__(self, M, model):
        self.M, self.model = M, model
        self.pos = None
        self.data = {}
        self.handles = []
        self.enabled = False
        self.gate_stats = {"tokens": 0, "bias_changed": 0}
        self.clamp_stats = {"up_elems": 0, "up_clamped": 0, "gate_clamped": 0}
        self.shared_stats = {"up_elems": 0, "up_beyond_limit": 0, "gate_beyond_limit": 0,
                             "note": "shared expert is not clamped by the reference; counts of values a clamp would change"}
        self.limit = model.layers[0].ffn.experts[0].swiglu_limit
        for i, blk in enumerate(model.layers):
            self.handles.append(blk.register_forward_hook(self._hook(f"layers.{i}.block_out", lambda o: o)))
            self.handles.append(blk.attn.register_forward_hook(self._hook(f"layers.{i}.attn_out", lambda o: o, with_input=f"layers.{i}.attn_in")))
            self.handles.append(blk.ffn.register_forward_hook(self._hook(f"layers.{i}.ffn_out", lambda o: o, with_input=f"layers.{i}.ffn_in")))
            if getattr(blk.attn, "indexer", None) is not None:
                self.handles.append(blk.attn.indexer.register_forward_hook(self._idx_hook(f"layers.{i}.indexer_topk")))
            if not blk.ffn.gate.hash:
                self.handles.append(blk.ffn.gate.register_forward_hook(self._gate_hook()))
            for e in blk.ffn.experts:
                self.handles.append(e.register_forward_hook(self._expert_hook()))
            self.handles.append(blk.ffn.shared_experts.register_forward_hook(self._shared_hook()))
        self.handles.append(model.embed.register_forward_hook(self._hook("embed", lambda o: o)))

    def _sel(self, t):
        return t[0, self.pos].detach().float().cpu().clone()

    def _hook(self, name, f, with_input=None):
        def h(mod, inp, out):
            if not self.enabled:
                return
            self.data[name] = self._sel(f(out))
            if with_input is not None:
                self.data[with_input] = self._sel(inp[0])
        return h

    def _idx_hook(self, name):
        def h(mod, inp, out):
            if not self.enabled:
                return
            seqlen = inp[0].size(1)
            t = out[0, self.pos].detach().long().cpu()
            t = torch.where(t >= 0, t - seqlen, t)     # prefill offset = seqlen
            self.data[name] = t.to(torch.int32)
        return h

    def _gate_hook(self):
        def h(mod, inp, out):
            if not self.enabled:
                return
            x = inp[0]
            scores = F.softplus(F.linear(x.float(), mod.weight.float())).sqrt()
            nobias = scores.topk(mod.topk, dim=-1)[1].sort(-1)[0]
            withb = out[1].sort(-1)[0]
            self.gate_stats["tokens"] += x.size(0)
            self.gate_stats["bias_changed"] += int((nobias != withb).any(-1).sum())
        return h

    def _shared_hook(self):
        def h(mod, inp, out):
            if not self.enabled:
                return
            x = inp[0]
            gate = mod.w1(x).float()
            up = mod.w3(x).float()
            self.shared_stats["up_elems"] += up.numel()
            self.shared_stats["up_beyond_limit"] += int((up.abs() > self.limit).sum())
            self.shared_stats["gate_beyond_limit"] += int((gate > self.limit).sum())
        return h

    def _expert_hook(self):
        def h(mod, inp, out):
            if not self.enabled:
                return
            x = inp[0]
            gate = mod.w1(x).float()
            up = mod.w3(x).float()
            lim = mod.swiglu_limit
            self.clamp_stats["up_elems"] += up.numel()
            self.clamp_stats["up_clamped"] += int((up.abs() > lim).sum())
            self.clamp_stats["gate_clamped"] += int((gate > lim).sum())
        return h


def row_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row max|a-b| / max|a| (a is the reference)."""
    return (a - b).abs().amax(-1) / a.abs().amax(-1)


def agreement(ref: torch.Tensor, other: torch.Tensor) -> dict:
    ref = ref.double().cpu()
    other = other.double().cpu()
    e = row_err(ref, other)
    lp_r = torch.log_softmax(ref, -1)
    lp_o = torch.log_softmax(other, -1)
    kl = (lp_r.exp() * (lp_r - lp_o)).sum(-1)
    q = torch.quantile(e, torch.tensor([0.5, 0.95, 0.99], dtype=e.dtype, device="cpu"))
    return {
        "rows": int(e.numel()),
        "max_row_err": float(e.max()),
        "median_row_err": float(q[0]),
        "p95_row_err": float(q[1]),
        "p99_row_err": float(q[2]),
        "worst_row": int(e.argmax()),
        "mean_kl": float(kl.mean()),
        "top1_agree": float((ref.argmax(-1) == other.argmax(-1)).double().mean()),
    }


@torch.no_grad()
def prefill(model, toks: torch.Tensor) -> torch.Tensor:
    return model(toks.view(1, -1), 0)[0].float()           # [n, V]


@torch.no_grad()
def decode_from(model, toks: torch.Tensor, n_prefill: int, n_total: int) -> torch.Tensor:
    """Prefill toks[:n_prefill] at position 0 (n_prefill >= 1), then one token per call."""
    rows = [model(toks[:n_prefill].view(1, -1), 0)[0].float()]
    for p in range(n_prefill, n_total):
        rows.append(model(toks[p:p + 1].view(1, 1), p)[0].float())
    return torch.cat(rows, 0)


def stored_positions(n: int, every: int, tail: int, head: int = 0):
    ps = set(range(0, n, every)) | set(range(max(0, n - tail), n)) | set(range(min(head, n)))
    return sorted(ps)


def cpu_prefills(M, margs, weights, toks_by_run, device):
    """One-shot prefill of each run on the CPU (a second, independent f32 arithmetic)."""
    cm = build_model(M, margs, "cpu")
    load_weights(cm, weights)
    out = {}
    for rname, toks in toks_by_run.items():
        reset_state(M, cm)
        out[rname] = prefill(cm, toks.cpu())
    del cm
    torch.set_default_device(device)
    clear_caches(M)
    return out


def fmt(v):
    return f"max {v['max_row_err']:.2e} med {v['median_row_err']:.2e} p99 {v['p99_row_err']:.2e} top1 {v['top1_agree']:.4f}"


def run_case(M, K, name: str, case: dict, device: str, outdir: str, smoke: bool, log,
             max_attempts: int = 400, time_budget: float = 240.0, thr: float = 1e-4):
    """Try seeds until the reference agrees with itself everywhere (<= thr max row error).

    Screening (cheap): CUDA one-shot prefill (the golden) vs CPU one-shot prefill and vs a CUDA
    one-shot prefill of a prefix. Seeds that pass are checked against token-by-token decode.
    Discrete events (an FP4 rounding flip in the indexer that changes a top-k pick, an FP8 flip
    in a cached KV element) make a few seeds disagree by 1e-3..1e-1 on some rows; those seeds
    are rejected.
    """
    hf = dict(FLASH_HF)
    hf.update(case["hf"])
    margs = hf_to_model_args(hf)
    results = None
    t_case = time.time()
    tried = []
    for attempt in range(max_attempts):
        if attempt > 0 and time.time() - t_case > time_budget:
            log(f"[{name}] time budget spent after {attempt} seeds")
            break
        seed = case["seed"] + 1000 * attempt
        t0 = time.time()
        model = build_model(M, margs, device)
        weights = make_weights(model, margs, seed)
        load_weights(model, weights)
        gtok = torch.Generator(device="cpu").manual_seed(seed + 7)
        runs = {}
        toks_by_run = {}
        for rname, r in case["runs"].items():
            n = min(r["n"], 80) if smoke else r["n"]
            toks_cpu = torch.randint(0, hf["vocab_size"], (n,), generator=gtok, device="cpu")
            toks = toks_cpu.to(device)
            toks_by_run[rname] = toks
            cap = Capture(M, model)
            cap.pos = torch.tensor([p for p in case["hidden_positions"][rname] if p < n], dtype=torch.long)
            K.stats_reset()
            K.COLLECT = True
            reset_state(M, model)
            cap.enabled = True
            ref = prefill(model, toks)
            cap.enabled = False
            K.COLLECT = False
            hidden = dict(cap.data)
            hidden["final_hidden"] = model.head._last_hidden[0, cap.pos.to(device)].cpu().clone()
            comp = {}
            win = margs["window_size"]
            for i, blk in enumerate(model.layers):
                a = blk.attn
                if a.compress_ratio:
                    nr = min(n // a.compress_ratio, 64)
                    if nr == 0:
                        continue
                    comp[f"layers.{i}.attn_compressed_kv"] = a.kv_cache[0, win:win + nr].float().cpu().clone()
                    if a.indexer is not None:
                        comp[f"layers.{i}.indexer_compressed_kv"] = a.indexer.kv_cache[0, :nr].float().cpu().clone()
            stats = {"kernels": dict(K.STATS), "gate": dict(cap.gate_stats), "swiglu": dict(cap.clamp_stats),
                     "shared_expert": dict(cap.shared_stats)}
            for hnd in cap.handles:
                hnd.remove()
            variants = {}
            # screening variant 1: a prefill of a prefix on the same device
            m = n - 37 if n > 74 else n - 5
            reset_state(M, model)
            pre = prefill(model, toks[:m])
            variants[f"cuda_prefill_prefix_{m}"] = agreement(ref[:m], pre)
            runs[rname] = {"n": n, "tokens": toks_cpu.tolist(), "ref": ref.cpu(), "hidden": hidden,
                           "comp": comp, "variants": variants, "dec_rows": {}, "stats": stats}
        # screening variant 2: CPU
        cpu = cpu_prefills(M, margs, weights, toks_by_run, device)
        screen = 0.0
        ok = True
        for rname, r in runs.items():
            r["variants"]["cpu_prefill"] = agreement(r["ref"], cpu[rname])
            for v in r["variants"].values():
                screen = max(screen, v["max_row_err"])
                ok = ok and v["top1_agree"] == 1.0
            log(f"[{name}] seed {seed} {rname} n={r['n']} screen: " +
                "; ".join(f"{k}: {fmt(v)}" for k, v in r["variants"].items()))
        worst = screen
        if screen <= thr:
            for rname, r in runs.items():
                n = r["n"]
                spec = case["runs"][rname]
                toks = toks_by_run[rname]
                ref = r["ref"]
                if spec.get("decode0"):
                    nd = min(spec["decode0"], n)
                    reset_state(M, model)
                    d = decode_from(model, toks, 1, nd).cpu()
                    r["variants"]["decode_from_0"] = agreement(ref[:nd], d)
                    r["dec_rows"]["decode_from_0"] = (list(range(nd)), d)
                if spec.get("split") and spec["split"] < n:
                    sp = spec["split"]
                    reset_state(M, model)
                    d = decode_from(model, toks, sp, n).cpu()
                    vn = f"prefill_{sp}_then_decode"
                    r["variants"][vn] = agreement(ref, d)
                    r["variants"][vn]["prefill_part"] = agreement(ref[:sp], d[:sp])
                    r["variants"][vn]["decode_part"] = agreement(ref[sp:], d[sp:])
                    r["dec_rows"][vn] = (list(range(n)), d)
                for v in r["variants"].values():
                    worst = max(worst, v["max_row_err"])
                    ok = ok and v["top1_agree"] == 1.0
                log(f"[{name}] seed {seed} {rname} decode: " +
                    "; ".join(f"{k}: {fmt(v)}" for k, v in r["variants"].items() if "decode" in k))
                log(f"    stats {json.dumps(r['stats'])}")
        full = screen <= thr
        log(f"[{name}] seed {seed}: screen {screen:.2e} worst {worst:.2e} decode-checked {full} ({time.time() - t0:.1f}s)")
        tried.append([seed, float(f"{screen:.3g}"), float(f"{worst:.3g}"), full])
        cand = (full and ok and worst <= thr, full, ok, -worst)
        if results is None or cand > results[0]:
            results = (cand, seed, weights, runs)
        if full and ok and worst <= thr:
            break
    (cand, seed, weights, runs) = results
    write_case(name, case, hf, margs, seed, weights, runs, outdir, device, smoke, tried, accepted=cand[0])
    return weights, runs, margs


def save_safetensors(tensors: dict, path: str, metadata=None):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)


def write_case(name, case, hf, margs, seed, weights, runs, outdir, device, smoke, tried, accepted):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    with open(os.path.join(d, "inference_config.json"), "w") as f:
        json.dump(margs, f, indent=2)
    save_safetensors(weights, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({r: v["tokens"] for r, v in runs.items()}, f)
    logits, hidden = {}, {}
    meta_runs = {}
    for rname, r in runs.items():
        n = len(r["tokens"])
        if n <= 1024:
            ppos = list(range(n))
        else:
            ppos = stored_positions(n, 8, 64)
        logits[f"{rname}.prefill.positions"] = torch.tensor(ppos, dtype=torch.int32, device="cpu")
        logits[f"{rname}.prefill.logits"] = r["ref"][ppos].contiguous()
        mr = {"n_tokens": n, "prefill_positions": "all" if len(ppos) == n else "every 8th position plus the last 64",
              "variants": r["variants"], "stats": r["stats"]}
        for vname, (pos, rows) in r["dec_rows"].items():
            if vname == "decode_from_0":
                keep = stored_positions(len(pos), 8, 16, head=64) if len(pos) > 128 else list(range(len(pos)))
                desc = "all" if len(keep) == len(pos) else "positions 0-63, every 8th, last 16"
            else:
                sp = int(vname.split("_")[1])
                keep = [p for p in stored_positions(len(pos), 4 if n <= 1024 else 8, 32) if p >= sp - 1]
                desc = f"every {4 if n <= 1024 else 8}th position >= {sp - 1} plus the last 32"
            logits[f"{rname}.{vname}.positions"] = torch.tensor(keep, dtype=torch.int32, device="cpu")
            logits[f"{rname}.{vname}.logits"] = rows[keep].contiguous()
            mr["variants"][vname]["stored_positions"] = desc
        hidden[f"{rname}.positions"] = torch.tensor(
            [p for p in case["hidden_positions"][rname] if p < n], dtype=torch.int32, device="cpu")
        for k, v in r["hidden"].items():
            hidden[f"{rname}.{k}"] = v
        for k, v in r["comp"].items():
            hidden[f"{rname}.{k}"] = v
        meta_runs[rname] = mr
    save_safetensors(logits, os.path.join(d, "logits.safetensors"))
    save_safetensors(hidden, os.path.join(d, "hidden.safetensors"))
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)}
    meta = {
        "case": name,
        "description": case["description"],
        "smoke": smoke,
        "weights_seed": seed,
        "tokens_seed": seed + 7,
        "generator": "scripts/reference/gen_golden.py",
        "device": device if device == "cpu" else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "reference": REFERENCE_INFO,
        "accepted": accepted,
        "acceptance": "every variant's max row error (max|a-b|/max|a| over the vocabulary) <= 1e-4 and identical top-1",
        "seeds_tried": {"columns": ["seed", "screen_max_row_err", "worst_max_row_err", "decode_checked"], "rows": tried},
        "runs": meta_runs,
        "n_params": {k: int(v.numel()) for k, v in weights.items()},
        "file_sizes": sizes,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


REFERENCE_INFO = {}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def self_test(K, device, log):
    """Check the e4m3 rounding against torch's own cast and a few hand-made FP4 cases."""
    x = torch.randn(1 << 20, device=device) * 100
    x = torch.cat([x, torch.tensor([0.0, 1e-9, -1e-9, 448.0, -448.0, 0.0009765625 * 1.5, 0.001953125 * 0.5,
                                   1.0625, 1.1875, 17.0, 19.0, 240.0, 432.0, 416.0], device=device)])
    x = x.clamp(-448, 448)
    a = K.e4m3_round(x)
    b = x.to(torch.float8_e4m3fn).float()
    n_bad = int((a != b).sum())
    log(f"self-test e4m3 vs torch cast: {n_bad} mismatches of {x.numel()}")
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.9, 0.2, -0.25, -0.75, -5.0, 6.0], device=device)
    exp = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0, -0.0, -1.0, -4.0, 6.0], device=device)
    got = K.e2m1_round(y)
    log(f"self-test e2m1: {got.tolist()} ok={bool((got == exp).all())}")
    v = torch.tensor([448.0, 449.0, 224.0, 1e-4, 3.0, 7.0], device=device)
    log(f"self-test pow2_ceil(v/448): {K._pow2_ceil(v * torch.tensor(1/448, device=device)).tolist()}")
    h = K.hadamard(torch.eye(8, device=device))
    log(f"self-test hadamard orthonormal: {float((h @ h.T - torch.eye(8, device=device)).abs().max()):.2e}")
    return n_bad == 0 and bool((got == exp).all())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default=".ref/dsv4-flash-inference/inference")
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds of seed search per case")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "gen_log.txt"), "a")

    def log(s):
        print(s, flush=True)
        if logf:
            logf.write(s + "\n")
            logf.flush()


    # float32 everywhere, no TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    M, K = load_reference(args.ref)
    REFERENCE_INFO.update({
        "source": "github.com/Mockingjay1316/deepseek-v4-flash-spark @ 0825add42734731a285e30f657b0ccfc5bad74c9 "
                  "(a copy of the official DeepSeek-V4-Flash inference/ code)",
        "model.py_sha256": sha256(os.path.join(args.ref, "model.py")),
        "kernel": "scripts/reference/dsv4_kernels.py (replaces inference/kernel.py)",
    })
    log(f"torch {torch.__version__} device {args.device} model.py sha256 {REFERENCE_INFO['model.py_sha256']}")
    if not self_test(K, args.device, log):
        log("SELF-TEST FAILED")
    summary = {}
    for name in args.cases.split(","):
        weights, runs, margs = run_case(M, K, name, CASES[name], args.device, args.out, args.smoke, log,
                                        time_budget=args.time_budget)
        summary[name] = {r: v["variants"] for r, v in runs.items()}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
