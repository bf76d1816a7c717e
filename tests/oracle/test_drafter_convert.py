#!/usr/bin/env python3
"""Oracle test of `dspec convert` for block-diffusion drafters (src/convert/convert_dflash.c).

Every drafter fixture under tests/fixtures/drafter/ (HF layout: config.json + model.safetensors) is
converted with the dspec binary to the anchor's `qwen35-dflash-draft` GGUF (f32 and q8_0) and read
back with gguf-py: architecture, every metadata key against config.json (taps, block size, mask
id, DFlash 2 conv/selector keys, DSpark Markov/confidence keys, per-layer causality and windows),
the exact tensor set and GGUF shapes (anchor-lucebox.md §3.1 names), tensor types (norms, conv
bases and the confidence head F32), and the data (bit-exact at f32; q8_0 within its rounding
error). Malformed configs must be refused naming the field. numpy + gguf only (CI venv).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import quants

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "drafter")
VARIANTS = ["dflash_b4_mixed", "dflash_b8_yarn_bidir", "dflash2_b8", "dspark_b4_markov_conf",
            "dspark_b8_conf_hidden", "dflash_b4_trained", "dspark_b4_trained"]
ARCH = "qwen35-dflash-draft"
Q8_REL_RMSE = 0.01   # q8_0 round trip: 8-bit blocks of 32, well under 1% RMS of the tensor

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", flush=True)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(info["shape"])
    return out


def lookup(cfg, key, default=None):
    sub = cfg.get("dflash_config") or {}
    return sub[key] if key in sub else cfg.get(key, default)


def expected_tensors(cfg, st):
    """GGUF name -> (HF name, GGUF shape ne[]) for the anchor layout."""
    arch = cfg["architectures"][0]
    m = {"dflash.fc.weight": "fc.weight", "dflash.hidden_norm.weight": "hidden_norm.weight",
         "output_norm.weight": "norm.weight"}
    per = {"attn_norm.weight": "input_layernorm.weight",
           "ffn_norm.weight": "post_attention_layernorm.weight",
           "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
           "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
           "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
           "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
           "ffn_down.weight": "mlp.down_proj.weight"}
    if arch == "DFlash2DraftModel":
        per.update({"attn_conv.base": "attention_conv.base_kernel",
                    "attn_conv.proj.weight": "attention_conv.kernel_projection.weight",
                    "ffn_conv.base": "mlp_conv.base_kernel",
                    "ffn_conv.proj.weight": "mlp_conv.kernel_projection.weight"})
        m.update({"dflash.selector.hproj.weight": "candidate_selector.hidden_projection.weight",
                  "dflash.selector.pred_cb": "candidate_selector.predecessor_codebook",
                  "dflash.selector.succ_cb": "candidate_selector.successor_codebook"})
    if arch == "Qwen3DSparkModel":
        if lookup(cfg, "markov_rank", 0) > 0:
            m.update({"dflash.dspark.markov.w1": "markov_head.markov_w1.weight",
                      "dflash.dspark.markov.w2": "markov_head.markov_w2.weight"})
        if lookup(cfg, "enable_confidence_head", False):
            m.update({"dflash.dspark.confidence.weight": "confidence_head.proj.weight",
                      "dflash.dspark.confidence.bias": "confidence_head.proj.bias"})
    for i in range(cfg["num_hidden_layers"]):
        for g, h in per.items():
            m[f"blk.{i}.{g}"] = f"layers.{i}.{h}"
    out = {}
    for g, h in m.items():
        shape = st[h].shape
        ne = list(reversed(shape))
        if g.endswith("conv.base"):            # [2, K, H] -> {H, 2K}
            ne = [shape[2], shape[0] * shape[1]]
        out[g] = (h, ne)
    return out


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.contents()
    return v


def check_variant(dspec, name, ftype, tmp):
    vdir = os.path.join(FIX, name)
    out = os.path.join(tmp, f"{name}.{ftype}.gguf")
    p = subprocess.run([dspec, "convert", vdir, out, "--type", ftype, "--quiet"],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"{name} {ftype}: convert exit {p.returncode}: {p.stderr.strip()}")
    if p.returncode != 0:
        return
    cfg = json.load(open(os.path.join(vdir, "config.json")))
    st = read_safetensors(os.path.join(vdir, "model.safetensors"))
    r = gguf.GGUFReader(out)
    arch = cfg["architectures"][0]
    check(field(r, "general.architecture") == ARCH, f"{name}: architecture")
    k = lambda s: field(r, f"{ARCH}.{s}")
    want = {"embedding_length": cfg["hidden_size"], "block_count": cfg["num_hidden_layers"],
            "feed_forward_length": cfg["intermediate_size"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.key_length": cfg["head_dim"], "vocab_size": cfg["vocab_size"],
            "dflash.block_size": lookup(cfg, "block_size"),
            "dflash.mask_token_id": lookup(cfg, "mask_token_id"),
            "dflash.n_target_layers": len(lookup(cfg, "target_layer_ids")),
            "dflash.target_layer_ids": lookup(cfg, "target_layer_ids"),
            "dflash.sample_from_anchor": arch == "Qwen3DSparkModel"}
    if arch == "DFlash2DraftModel":
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            want[f"dflash.dflash2.{key}"] = lookup(cfg, key)
    if arch == "Qwen3DSparkModel":
        r_m = lookup(cfg, "markov_rank", 0)
        want.update({"dflash.dspark.enabled": True, "dflash.dspark.markov_rank": r_m,
                     "dflash.dspark.vocab_size": cfg["vocab_size"],
                     "dflash.dspark.confidence.enabled": bool(lookup(cfg, "enable_confidence_head")),
                     "dflash.dspark.confidence_dim": cfg["hidden_size"] + (
                         r_m if lookup(cfg, "confidence_head_with_markov") else 0)})
    for key, v in want.items():
        got = k(key)
        check(got == v, f"{name}: {key} = {got}, expected {v}")
    # rope and attention pattern
    rp = dict(cfg.get("rope_scaling") or {})
    rp.update(cfg.get("rope_parameters") or {})
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    check(abs(k("rope.freq_base") - theta) <= 1e-6 * theta, f"{name}: rope.freq_base")
    if rp.get("rope_type") == "yarn":
        check(k("rope.scaling.type") == "yarn", f"{name}: yarn type")
        check(k("rope.scaling.factor") == rp["factor"], f"{name}: yarn factor")
        check(k("rope.scaling.original_context_length") == rp["original_max_position_embeddings"],
              f"{name}: yarn original context")
        att = 0.1 * np.log(rp["factor"]) + 1.0
        check(abs(k("rope.scaling.attn_factor") - att) < 1e-6, f"{name}: yarn attn_factor")
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    sliding = [t == "sliding_attention" and arch != "Qwen3DSparkModel" for t in types]
    if any(sliding):
        check(k("attention.sliding_window") == cfg["sliding_window"], f"{name}: sliding_window")
        check(k("attention.sliding_window_pattern") == sliding, f"{name}: window pattern")
    else:
        check(k("attention.sliding_window") is None, f"{name}: no sliding window")
    if arch == "Qwen3DSparkModel":
        causal = [False] * len(types)
    elif "is_causal" in cfg:
        causal = [bool(cfg["is_causal"])] * len(types)
    else:
        causal = sliding
    check(k("dflash.causal") == causal, f"{name}: dflash.causal {k('dflash.causal')} vs {causal}")
    # tensors
    exp = expected_tensors(cfg, st)
    names = {t.name for t in r.tensors}
    check(names == set(exp), f"{name}: tensor set differs: extra {sorted(names - set(exp))[:4]} "
                              f"missing {sorted(set(exp) - names)[:4]}")
    for t in r.tensors:
        if t.name not in exp:
            continue
        hf, ne = exp[t.name]
        check([int(x) for x in t.shape] == ne, f"{name}: {t.name} shape {list(t.shape)} vs {ne}")
        keep_f32 = len(ne) == 1 or "norm.weight" in t.name or "conv.base" in t.name \
            or "confidence" in t.name
        want_t = "F32" if keep_f32 or ftype == "f32" else ("Q8_0" if ne[0] % 32 == 0 else "F16")
        check(t.tensor_type.name == want_t, f"{name}: {t.name} type {t.tensor_type.name} vs {want_t}")
        ref = st[hf].reshape(-1)
        got = quants.dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
        if t.tensor_type.name == "F32":
            check(np.array_equal(got, ref), f"{name}: {t.name} data differs")
        else:
            rel = float(np.sqrt(np.mean((got - ref) ** 2)) / (np.sqrt(np.mean(ref ** 2)) + 1e-30))
            check(rel < Q8_REL_RMSE, f"{name}: {t.name} {t.tensor_type.name} rel rmse {rel:.3g}")


def check_refusals(dspec, tmp):
    cases = [("dflash2_b8", "conv_group_size", 7, "conv_group_size"),
             ("dflash_b4_mixed", "block_size", 1, "block_size"),
             ("dflash_b4_mixed", "mask_token_id", 100000, "mask_token_id"),
             ("dflash_b4_mixed", "target_layer_ids", [4, 1], "target_layer_ids"),
             ("dflash_b4_mixed", "intermediate_size", 32, "mlp.gate_proj"),
             ("dflash_b4_mixed", "attention_bias", True, "attention_bias"),
             ("dspark_b4_markov_conf", "markov_head_type", "gated", "markov_head_type")]
    for variant, key, val, want in cases:
        cfg = json.load(open(os.path.join(FIX, variant, "config.json")))
        sub = cfg.get("dflash_config") or {}
        (sub if key in sub else cfg)[key] = val
        d = os.path.join(tmp, f"bad_{variant}_{key}")
        os.makedirs(d, exist_ok=True)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        link = os.path.join(d, "model.safetensors")
        if not os.path.exists(link):
            os.symlink(os.path.join(FIX, variant, "model.safetensors"), link)
        out = os.path.join(d, "out.gguf")
        p = subprocess.run([dspec, "convert", d, out, "--quiet"], capture_output=True, text=True)
        check(p.returncode != 0 and want in p.stderr and not os.path.exists(out),
              f"refusal {variant} {key}={val}: exit {p.returncode}, stderr {p.stderr.strip()!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", default=".")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for v in VARIANTS:
            for ft in ("f32", "q8_0"):
                check_variant(a.dspec, v, ft, tmp)
        check_refusals(a.dspec, tmp)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
