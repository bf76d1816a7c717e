#!/usr/bin/env python3
"""Build the drafter fixtures under tests/fixtures/drafter/ (see its README.md for the formats).

Run from the repository root with the reference venv (torch + transformers, CPU only):

    /opt/refvenv/bin/python tools/reference/make_drafter_fixtures.py            # (re)write fixtures
    /opt/refvenv/bin/python tools/reference/make_drafter_fixtures.py --check    # recompute, compare, write nothing

What it does, for a tiny random Qwen3.5 target (by default the one this script builds under
tests/fixtures/drafter/target/ with the dimensions of tests/fixtures/target/dense_a; --target DIR
switches to another HF checkpoint such as tests/fixtures/target/dense_a/hf_f32):
  1. builds random tiny drafters of every variant (DFlash mixed causal/sliding; DFlash YaRN
     bidirectional; DFlash2 convs + selector + output multiplier/softcap; DSpark Markov +
     confidence with and without the Markov embedding), every parameter randomized;
  2. saves them in the published HF layout (config.json field names, safetensors tensor names);
  3. records reference outputs for fixed contexts (per-slot draft logits, selector paths,
     Markov-corrected proposals, confidences, sampled q rows with fixed uniforms) and full greedy
     speculative runs (token streams + per-round accept counts) at block sizes 2, B, 2B;
  4. self-checks the reference: split (append-only) context == one-shot context, every
     speculative stream == plain greedy, DFlash2 at identity init == its DFlash backbone, our
     RoPE/YaRN == transformers' Qwen3RotaryEmbedding, our attention == torch SDPA. Any failed
     check exits non-zero.
Everything is seeded; a rerun writes byte-identical files.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_reference as R  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "drafter")
OWN_TARGET = os.path.join(OUT_DIR, "target")

# Tolerances of the self-checks (all float32 on the CPU).
TOL_SPLIT_CONTEXT = 1e-5    # one-shot vs append-only context: same math, different concat order
TOL_COMPONENT = 1e-6        # our RoPE / attention vs the transformers / torch implementations
MIN_GREEDY_MARGIN = 1e-4    # greedy top1-top2 logit gap below which a stream is a near-tie risk

TAPS = [1, 4, 6]
MAX_NEW = 40
PROMPT_LENS = (12, 17)


# ---------------------------------------------------------------------------------------------
# Tiny target (only used when the shared target fixture is not committed yet)
# ---------------------------------------------------------------------------------------------

def build_tiny_target(path: str, seed: int = 1234):
    """Random tiny Qwen3.5 (8 layers, GDN x3 + full attention, every 4th), all parameters
    randomized, rope_theta 1e7, H_v != H_k: the recipe of DESIGN.md §6."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(8)],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):       # gated norm: weight multiplies directly
                p.copy_(torch.rand(p.shape, generator=g) * 0.6 + 0.7)
            elif name.endswith("norm.weight"):                  # Qwen3.5 (1 + w) norms
                p.copy_(torch.rand(p.shape, generator=g) * 0.6 - 0.3)
            elif name.endswith("A_log") or name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_target(path: str):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


# ---------------------------------------------------------------------------------------------
# Drafter variants
# ---------------------------------------------------------------------------------------------

def base_config(arch, H, V, n_target_layers, layer_types, **extra):
    cfg = {
        "architectures": [arch],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": 64,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "layer_types": layer_types,
        "max_position_embeddings": 4096,
        "num_target_layers": n_target_layers,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "vocab_size": V,
        "dtype": "float32",
    }
    cfg.update(extra)
    return cfg


def variant_configs(H, V, n_target_layers):
    mask = V - 6            # inside the vocabulary, like Qwen's <|MASK|> inside the padded table
    dflash_sub = lambda B, **kw: dict({"block_size": B, "target_layer_ids": TAPS, "mask_token_id": mask}, **kw)
    return {
        # sliding layer => causal + window 5, full layer => bidirectional (no is_causal key);
        # pre-transformers-5 rope layout (rope_theta at the top level).
        "dflash_b4_mixed": base_config(
            R.ARCH_DFLASH, H, V, n_target_layers, ["sliding_attention", "full_attention"],
            sliding_window=5, use_sliding_window=True, rope_theta=1e7, rope_scaling=None,
            block_size=4, dflash_config=dflash_sub(4)),
        # explicit is_causal=false: both layers bidirectional, the sliding one with a two-sided
        # window of 6; YaRN (factor 4, original 64) in the transformers-5 rope_parameters layout;
        # input_embedding_scale 1.25.
        "dflash_b8_yarn_bidir": base_config(
            R.ARCH_DFLASH, H, V, n_target_layers, ["full_attention", "sliding_attention"],
            sliding_window=6, use_sliding_window=True, is_causal=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0},
            dflash_config=dflash_sub(8, input_embedding_scale=1.25)),
        # DFlash2 as shipped: is_causal=false over sliding layers (window 8), conv 2/16, selector
        # rank 16 / top-8; Muse-Glimmer-style output_multiplier + final_logit_softcapping.
        "dflash2_b8": base_config(
            R.ARCH_DFLASH2, H, V, n_target_layers, ["sliding_attention", "sliding_attention"],
            sliding_window=8, use_sliding_window=True, is_causal=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7},
            dflash_config=dflash_sub(8, conv_kernel_size=2, conv_group_size=16, selector_rank=16,
                                     selector_top_k=8, output_multiplier=0.5, final_logit_softcapping=2.0)),
        # DSpark (DeepSpec Qwen3DSparkModel: flat top-level fields, own embed/lm_head copies),
        # shifted layout, Markov r16 + confidence head fed [h ; W1[prev]].
        "dspark_b4_markov_conf": base_config(
            R.ARCH_DSPARK, H, V, n_target_layers, ["full_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7},
            block_size=4, target_layer_ids=TAPS, mask_token_id=mask, num_anchors=512,
            markov_rank=16, markov_head_type="vanilla", enable_confidence_head=True,
            confidence_head_with_markov=True),
        # the two variants below start random and are then distilled for a few hundred steps so
        # that their speculative runs accept drafts (random drafters accept ~nothing).
        "dflash_b4_trained": None,
        "dspark_b4_trained": None,
        # DSpark with the confidence head on h only (confidence_head_with_markov=false).
        "dspark_b8_conf_hidden": base_config(
            R.ARCH_DSPARK, H, V, n_target_layers, ["full_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7},
            block_size=8, target_layer_ids=TAPS, mask_token_id=mask, num_anchors=512,
            markov_rank=16, markov_head_type="vanilla", enable_confidence_head=True,
            confidence_head_with_markov=False),
    }


TRAIN_STEPS = 600
TRAIN_ANCHORS = 8        # anchors per optimizer step


def train_drafter(model: R.Drafter, target: R.TargetRunner, prompts, greedy, seed: int, log_name: str):
    """Distil a random drafter toward the target's greedy streams of the fixture prompts
    themselves (deliberate over-fitting: the point is that the fixture's speculative runs accept
    drafts, a > 0 exercising the multi-row commit and context-append paths; random drafters
    accept ~nothing). Deterministic: seeded, one thread."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for prompt, (cont, _) in zip(prompts, greedy):
        toks = list(prompt) + list(cont)
        _, taps = target.forward(toks)
        data.append((toks, taps))
    embed = model.embed_table(target.embed_weight).detach()
    head = model.head_weight(target.lm_head_weight).detach()
    frozen = {"embed_tokens.weight", "lm_head.weight"}
    params = [p for n, p in model.named_parameters() if n not in frozen]
    opt = torch.optim.Adam(params, lr=3e-3)
    B = model.dc.block_size
    model.train()
    for step in range(TRAIN_STEPS):
        opt.zero_grad()
        loss = 0.0
        for _ in range(TRAIN_ANCHORS):
            si = int(torch.randint(0, len(data), (1,), generator=g))
            toks, taps = data[si]
            a = int(torch.randint(2, len(toks) - B - 1, (1,), generator=g))  # a+B <= len-1
            loss = loss + R.block_loss(model, taps, toks, a, B, embed, head)
        loss = loss / TRAIN_ANCHORS
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == TRAIN_STEPS - 1:
            print(f"  train {log_name} step {step} loss {float(loss.detach()):.4f}", flush=True)
    model.eval()


def randomize_drafter(model: R.Drafter, target: R.TargetRunner, seed: int):
    """Every parameter random (norm weights too); DSpark's embed/lm_head copy the target's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.6 + 0.7)
            elif name.endswith("base_kernel"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                p[:, 0, :] += 1.0                      # around the identity init, not at it
            elif name.endswith("_codebook"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name == "markov_head.markov_w1.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "confidence_head.proj.bias":
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name == "embed_tokens.weight":
                p.copy_(target.embed_weight)
            elif name == "lm_head.weight":
                p.copy_(target.lm_head_weight)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


# ---------------------------------------------------------------------------------------------
# Self-checks of the reference itself
# ---------------------------------------------------------------------------------------------

class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def ok(self, cond: bool, what: str):
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"CHECK FAILED: {what}", flush=True)


def check_rope_against_transformers(checks: Checks, cfg: dict):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
    dc = R.DrafterConfig.from_dict(cfg)
    hf_cfg = Qwen3Config(hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
                         num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                         max_position_embeddings=cfg["max_position_embeddings"],
                         rope_parameters=copy.deepcopy(cfg.get("rope_parameters"))
                         or {"rope_type": "default", "rope_theta": cfg["rope_theta"]})
    emb = Qwen3RotaryEmbedding(hf_cfg)
    pos = torch.arange(0, 300)
    x = torch.zeros(1, 1, dtype=torch.float32)
    cos, sin = emb(x, pos[None])
    inv, scale = R.rope_inv_freq(dc.rope, dc.head_dim)
    freqs = pos.float()[:, None] * inv[None]
    e = torch.cat([freqs, freqs], -1)
    d = max((cos[0] - e.cos() * scale).abs().max().item(), (sin[0] - e.sin() * scale).abs().max().item())
    checks.ok(d < TOL_COMPONENT, f"rope {dc.rope.rope_type} vs transformers: max diff {d}")


def check_attention_against_sdpa(checks: Checks, model: R.Drafter):
    g = torch.Generator().manual_seed(7)
    layer = model.layers[0].self_attn
    B, n = 5, 9
    u = torch.randn(B, model.dc.hidden_size, generator=g)
    c = torch.randn(n, model.dc.hidden_size, generator=g)
    ctx_pos = torch.arange(n)
    blk_pos = torch.arange(n, n + B)
    with torch.no_grad():
        kc, vc = layer.context_kv(c, ctx_pos, model.inv_freq, model.rope_scale)
        ours = layer(u, blk_pos, kc, vc, ctx_pos, model.inv_freq, model.rope_scale)
        q = R.apply_rope(layer.q_norm(layer.q_proj(u).view(B, layer.nh, layer.hd)), blk_pos, model.inv_freq, model.rope_scale)
        kb = R.apply_rope(layer.k_norm(layer.k_proj(u).view(B, layer.nkv, layer.hd)), blk_pos, model.inv_freq, model.rope_scale)
        vb = layer.v_proj(u).view(B, layer.nkv, layer.hd)
        k = torch.cat([kc, kb]).transpose(0, 1)
        v = torch.cat([vc, vb]).transpose(0, 1)
        mask = R.attention_visible(blk_pos, torch.cat([ctx_pos, blk_pos]), layer.causal, layer.window)
        ref = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None],
                                             enable_gqa=True)[0].transpose(0, 1).reshape(B, -1)
        ref = layer.o_proj(ref)
    d = (ours - ref).abs().max().item()
    checks.ok(d < TOL_COMPONENT * 10, f"attention vs SDPA: max diff {d}")


def check_dflash2_identity(checks: Checks, model: R.Drafter, target: R.TargetRunner, ctx, start, anchor):
    """A DFlash2 at the identity init (base tap0 = 1, others 0, projection 0; successor codebook
    0) must equal its DFlash backbone, and its selector path must equal the argmax path."""
    m2 = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m2.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()
                conv.base_kernel[:, 0, :] = 1.0
                conv.kernel_projection.weight.zero_()
        m2.candidate_selector.successor_codebook.zero_()
    cfg1 = copy.deepcopy(model.dc.raw)
    cfg1["architectures"] = [R.ARCH_DFLASH]
    m1 = R.Drafter(R.DrafterConfig.from_dict(cfg1))
    sd = {k: v for k, v in m2.state_dict().items() if k in m1.state_dict()}
    m1.load_state_dict(sd)
    B = model.dc.block_size
    with torch.no_grad():
        h2 = m2.draft_block(R.DraftContextCache(2), ctx, start, anchor, B, target.embed_weight)
        h1 = m1.draft_block(R.DraftContextCache(2), ctx, start, anchor, B, target.embed_weight)
        lg = m2.logits(h2, target.lm_head_weight)
        path = R.selector_walk(m2, lg[1:], h2[1:], anchor).tokens
    d = (h1 - h2).abs().max().item()
    checks.ok(d < TOL_SPLIT_CONTEXT, f"dflash2 identity init == dflash backbone: max diff {d}")
    checks.ok(path == [int(t) for t in torch.argmax(lg[1:], -1)], "dflash2 zero successor codebook => argmax path")


# ---------------------------------------------------------------------------------------------
# Reference outputs
# ---------------------------------------------------------------------------------------------

def uniforms(n, seed):
    """Fixed uniforms for the sampled walks, kept away from 0 and 1."""
    g = torch.Generator().manual_seed(seed)
    return [round(float(x), 6) for x in (torch.rand(n, generator=g) * 0.98 + 0.01)]


def margin_to_boundary(q: torch.Tensor, u: float) -> float:
    c = torch.cumsum(q.double(), 0)
    return float((c - u).abs().min())


def fixed_context_cases(name, model, target, prompts, tensors, checks):
    """Case 'oneshot': all prompt rows fed at once, block at start = P.
    Case 'split': rows 0..s-1 with the block at start = s (anchor = prompt[s]), then rows
    s..P-1 appended with the block at start = P. The second call must equal 'oneshot'."""
    dc = model.dc
    B = dc.block_size
    prompt = prompts[0]
    P = len(prompt)
    logits_p, taps = target.forward(prompt)
    anchor = int(torch.argmax(logits_p[-1]))
    embed = model.embed_table(target.embed_weight)
    head = model.head_weight(target.lm_head_weight)
    cases = []
    with torch.no_grad():
        hidden = model.draft_block(R.DraftContextCache(dc.num_layers), taps, P, anchor, B, embed)
        logits = model.logits(hidden, head)
    tensors["oneshot.ctx_features"] = taps
    tensors["oneshot.block_hidden"] = hidden
    tensors["oneshot.logits"] = logits
    case = {"name": "oneshot", "prompt": prompt, "start": P, "anchor": anchor, "block_size": B,
            "calls": [{"ctx_rows": [0, P], "start": P, "anchor": anchor, "prefix": "oneshot"}]}
    rows = model.proposal_rows(B)
    h, lg = hidden[rows], logits[rows]
    heads = {}
    with torch.no_grad():
        if dc.is_dflash2:
            sr = R.selector_walk(model, lg, h, anchor)
            tensors["oneshot.selector.hproj"] = model.candidate_selector.hidden_projection(h)
            tensors["oneshot.selector.cand_ids"] = sr.cand_ids.to(torch.int32)
            tensors["oneshot.selector.cand_logits"] = sr.cand_logits
            tensors["oneshot.selector.scores"] = sr.scores
            tensors["oneshot.selector.path"] = torch.tensor(sr.tokens, dtype=torch.int32)
            heads["selector_path"] = sr.tokens
            heads["selector_chosen_index"] = sr.chosen
            heads["argmax_path"] = [int(t) for t in torch.argmax(lg, -1)]
            T = 0.8
            us = uniforms(lg.shape[0], 99)
            ss = R.selector_walk(model, lg, h, anchor, temperature=T, uniforms=us)
            tensors["oneshot.selector_sampled.q"] = ss.q
            tensors["oneshot.selector_sampled.scores"] = ss.scores
            tensors["oneshot.selector_sampled.path"] = torch.tensor(ss.tokens, dtype=torch.int32)
            heads["selector_sampled"] = {"temperature": T, "uniforms": us, "path": ss.tokens,
                                         "chosen_index": ss.chosen,
                                         "min_cdf_gap": min(margin_to_boundary(ss.q[i], us[i]) for i in range(len(us)))}
            check_dflash2_identity(checks, model, target, taps, P, anchor)
        if dc.is_dspark:
            mr = R.markov_chain(model, lg, anchor)
            tensors["oneshot.markov.corrected"] = mr.corrected
            tensors["oneshot.markov.path"] = torch.tensor(mr.tokens, dtype=torch.int32)
            heads["markov_path"] = mr.tokens
            heads["argmax_path"] = [int(t) for t in torch.argmax(lg, -1)]
            cl = R.confidence_logits(model, h, mr.prev_tokens)
            tensors["oneshot.confidence_logits"] = cl
            tensors["oneshot.confidence"] = torch.sigmoid(cl)
            heads["confidence"] = [round(float(x), 6) for x in torch.sigmoid(cl)]
            heads["confident_prefix"] = {str(t): R.confident_prefix_length(cl, t) for t in (0.0, 0.3, 0.5, 0.7)}
            T = 0.7
            us = uniforms(lg.shape[0], 98)
            ms = R.markov_chain(model, lg, anchor, temperature=T, uniforms=us)
            tensors["oneshot.markov_sampled.q"] = ms.q
            tensors["oneshot.markov_sampled.path"] = torch.tensor(ms.tokens, dtype=torch.int32)
            cls = R.confidence_logits(model, h, ms.prev_tokens)
            tensors["oneshot.markov_sampled.confidence_logits"] = cls
            heads["markov_sampled"] = {"temperature": T, "uniforms": us, "path": ms.tokens,
                                       "min_cdf_gap": min(margin_to_boundary(ms.q[i], us[i]) for i in range(len(us)))}
        if not dc.is_dflash2 and not dc.is_dspark:
            heads["argmax_path"] = [int(t) for t in torch.argmax(lg, -1)]
    case["heads"] = heads
    cases.append(case)

    # split context
    s = P // 2 + 1
    with torch.no_grad():
        cache = R.DraftContextCache(dc.num_layers)
        h_a = model.draft_block(cache, taps[:s], s, prompt[s], B, embed)
        h_b = model.draft_block(cache, taps[s:], P, anchor, B, embed)
        tensors["split.call0.logits"] = model.logits(h_a, head)
        tensors["split.call1.logits"] = model.logits(h_b, head)
    d = (h_b - hidden).abs().max().item()
    checks.ok(d < TOL_SPLIT_CONTEXT, f"{name}: split context == one-shot: max diff {d}")
    cases.append({"name": "split", "prompt": prompt, "block_size": B, "calls": [
        {"ctx_rows": [0, s], "start": s, "anchor": prompt[s], "prefix": "split.call0"},
        {"ctx_rows": [s, P], "start": P, "anchor": anchor, "prefix": "split.call1"}]})
    return cases


def spec_runs(name, model, target, prompts, greedy, checks, thresholds):
    runs = []
    B = model.dc.block_size
    for pi, prompt in enumerate(prompts):
        for bs in sorted({2, B, 2 * B}):
            for thr in thresholds if bs == B else [0.0]:
                toks, rounds = R.spec_generate(target, model, prompt, MAX_NEW, bs, conf_threshold=thr)
                same = toks == greedy[pi][0]
                checks.ok(same, f"{name}: spec stream == greedy (prompt {pi}, block {bs}, thr {thr})")
                acc = [r.accepted for r in rounds]
                runs.append({
                    "prompt_index": pi, "block_size": bs, "proposer": R.default_proposer(model),
                    "conf_threshold": thr, "max_new": MAX_NEW, "tokens": toks,
                    "rounds": len(rounds),
                    "accepted": acc,
                    "committed": [r.committed for r in rounds],
                    "n_proposals": [len(r.proposals) for r in rounds],
                    "proposals": [r.proposals for r in rounds],
                    "ctx_rows_fed": [r.n_ctx_fed for r in rounds],
                    "mean_accepted": round(sum(acc) / len(acc), 4),
                    "tau": round(sum(r.committed for r in rounds) / len(rounds), 4),
                })
                print(f"  {name} prompt {pi} block {bs} thr {thr}: rounds {len(rounds)} "
                      f"accept hist {hist(acc)} tau {runs[-1]['tau']}", flush=True)
    return runs


def hist(xs):
    h = {}
    for x in xs:
        h[x] = h.get(x, 0) + 1
    return dict(sorted(h.items()))


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def write_or_compare(path, data: bytes, check_only: bool, diffs: list):
    if check_only:
        if not os.path.exists(path) or open(path, "rb").read() != data:
            diffs.append(path)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def st_bytes(tensors: dict) -> bytes:
    from safetensors.torch import save
    return save({k: v.detach().contiguous() for k, v in sorted(tensors.items())}, metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed files")
    ap.add_argument("--target", default=None,
                    help="HF target dir (default: tests/fixtures/drafter/target, built here if missing; "
                         "pass tests/fixtures/target/dense_a/hf_f32 to use the shared target fixture)")
    args = ap.parse_args()
    torch.set_num_threads(1)            # deterministic reductions
    checks = Checks()
    diffs: list[str] = []

    target_dir = os.path.abspath(args.target) if args.target else OWN_TARGET
    if target_dir == OWN_TARGET and not os.path.exists(os.path.join(OWN_TARGET, "config.json")):
        if args.check:
            sys.exit(f"--check: {OWN_TARGET} missing")
        build_tiny_target(OWN_TARGET)
    hf = load_target(target_dir)
    tcfg = hf.config
    H, V, NL = tcfg.hidden_size, tcfg.vocab_size, tcfg.num_hidden_layers
    target = R.TargetRunner(hf, TAPS)
    print(f"target {target_dir}: hidden {H} vocab {V} layers {NL}", flush=True)

    g = torch.Generator().manual_seed(4242)
    prompts = [[int(t) for t in torch.randint(0, V - 8, (n,), generator=g)] for n in PROMPT_LENS]
    greedy = [R.greedy_generate(target, p, MAX_NEW) for p in prompts]
    min_margin = min(min(m) for _, m in greedy)
    checks.ok(min_margin > MIN_GREEDY_MARGIN, f"greedy near-tie: min margin {min_margin}")
    common = {
        "target_dir": os.path.relpath(target_dir, ROOT), "taps": TAPS, "prompts": prompts,
        "max_new": MAX_NEW, "greedy": [t for t, _ in greedy],
        "greedy_min_margin": [round(min(m), 6) for _, m in greedy],
    }
    write_or_compare(os.path.join(OUT_DIR, "common.json"),
                     (json.dumps(common, indent=1) + "\n").encode(), args.check, diffs)

    cfgs = variant_configs(H, V, NL)
    cfgs["dflash_b4_trained"] = copy.deepcopy(cfgs["dflash_b4_mixed"])
    cfgs["dspark_b4_trained"] = copy.deepcopy(cfgs["dspark_b4_markov_conf"])
    check_rope_against_transformers(checks, cfgs["dflash_b8_yarn_bidir"])
    check_rope_against_transformers(checks, cfgs["dflash2_b8"])
    summary = {}
    for vi, (name, cfg) in enumerate(cfgs.items()):
        dc = R.DrafterConfig.from_dict(cfg)
        model = R.Drafter(dc)
        randomize_drafter(model, target, 1000 + vi)
        model.eval()
        if name.endswith("_trained"):
            train_drafter(model, target, prompts, greedy, 2000 + vi, name)
        check_attention_against_sdpa(checks, model)
        vdir = os.path.join(OUT_DIR, name)
        # checkpoint
        from safetensors.torch import save
        sd = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
        write_or_compare(os.path.join(vdir, "config.json"),
                         (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode(), args.check, diffs)
        write_or_compare(os.path.join(vdir, "model.safetensors"),
                         save(dict(sorted(sd.items())), metadata={"format": "pt"}), args.check, diffs)
        # round trip through the loader
        if not args.check:
            m_loaded = R.load_drafter(vdir)
            same = all(torch.equal(m_loaded.state_dict()[k], v) for k, v in sd.items())
            checks.ok(same, f"{name}: save/load round trip")
        tensors: dict[str, torch.Tensor] = {}
        cases = fixed_context_cases(name, model, target, prompts, tensors, checks)
        thresholds = [0.0, 0.5] if dc.is_dspark else [0.0]
        runs = spec_runs(name, model, target, prompts, greedy, checks, thresholds)
        ref = {
            "variant": name, "architecture": dc.arch,
            "layout": "shifted (proposals from slots 0..B-1)" if dc.sample_from_anchor
                      else "z-lab (proposals from slots 1..B-1)",
            "block_size": dc.block_size, "layer_causal": dc.layer_causal,
            "sliding_window": dc.sliding_window, "rope_attention_scale": model.rope_scale,
            "cases": cases, "runs": runs,
        }
        write_or_compare(os.path.join(vdir, "reference.json"),
                         (json.dumps(ref, indent=1) + "\n").encode(), args.check, diffs)
        write_or_compare(os.path.join(vdir, "reference.safetensors"), st_bytes(tensors), args.check, diffs)
        summary[name] = {f"p{r['prompt_index']}_b{r['block_size']}_t{r['conf_threshold']}":
                         {"rounds": r["rounds"], "accept_hist": hist(r["accepted"]), "tau": r["tau"]}
                         for r in runs}

    print(json.dumps(summary, indent=1))
    if diffs:
        print("files differ from the committed fixtures:\n  " + "\n  ".join(os.path.relpath(d, ROOT) for d in diffs))
    print(f"{checks.passed} passed, {len(checks.failed) + len(diffs)} failed")
    sys.exit(1 if checks.failed or diffs else 0)


if __name__ == "__main__":
    main()
