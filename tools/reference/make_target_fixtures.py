#!/usr/bin/env python3
# tools/reference/make_target_fixtures.py
#
# Generates the Qwen3.5 target-model reference fixtures under tests/fixtures/target/:
# tiny random-weight Qwen3.5 (dense) and Qwen3.5-MoE checkpoints in the real Hugging Face
# format (config.json + model.safetensors written by save_pretrained, f32 and bf16), plus
# float64 reference logits / per-layer hidden states / cached-decode logits computed with
# transformers' own modeling code.
#
# The C engine converts the checkpoints with its own converter and compares its outputs with
# these files in CI (numpy only, no torch). See tests/fixtures/target/README.md (written by
# this script) for formats and shapes, and tools/reference/README.md for how to re-run.
#
# Run (CPU; ~10 s on an idle machine):
#     /opt/refvenv/bin/python tools/reference/make_target_fixtures.py [--out DIR] [--only NAME,...]
#
# Determinism: fixed seeds, 2 torch threads, deterministic file writers. Re-running with the
# same package versions reproduces every file bit for bit (checked by --check-repro, which
# generates twice into temp dirs and compares).
#
# What the script verifies before writing the reference files (exits non-zero on failure):
#   * transformers' forward, forced to true float64 (see hf_float64() below), agrees with an
#     independent numpy float64 implementation written from the project spec target-qwen35.md that
#     works on *GGUF-form* weights (norms +1, ssm_a = -exp(A_log), V heads in tiled order,
#     conv1d squeezed), i.e. exactly what the C engine computes after conversion;
#   * cached decode (prefill 48, then 32 single-token steps) equals the full forward;
#   * the bf16 checkpoint holds exactly the same weights as the f32 one (weights are rounded
#     to bf16-representable values before saving, so both share one reference);
#   * logits are finite and not degenerate; MoE top-k choices are not near ties.

import argparse
import contextlib
import filecmp
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file
from transformers import (
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)
import transformers.models.qwen3_5.modeling_qwen3_5 as hf_dense_mod
import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as hf_moe_mod

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "target")

N_TOKENS = 80          # > 64: the HF chunked DeltaNet path crosses one chunk boundary
N_PREFILL = 48         # decode check: prefill 48 tokens, then decode 48..79 one at a time
TORCH_THREADS = 2

# ------------------------------------------------------------------------------------------
# Configurations
# ------------------------------------------------------------------------------------------

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_act="silu",
    max_position_embeddings=1024,
    full_attention_interval=4,
    mtp_num_hidden_layers=0,
    # rotary dim = head_dim * 0.25 = 8 -> 4 frequency slots, split t/h/w = [2, 1, 1]
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
)

CONFIGS = [
    dict(name="dense_a", seed=3501, moe=False, hk=2, hv=2, tie=False, ffn=64,
         note="H_v == H_k (V reorder is the identity), untied lm_head"),
    dict(name="dense_b", seed=3502, moe=False, hk=2, hv=4, tie=True, ffn=64,
         note="H_v = 2*H_k (tiled V reorder matters), tied embeddings (no lm_head.weight)"),
    dict(name="dense_c", seed=3503, moe=False, hk=2, hv=6, tie=False, ffn=32,
         note="H_v = 3*H_k (non power-of-two ratio), untied"),
    # expert_layout: "per_expert" = transformers 5.23 save_pretrained default
    # (mlp.experts.{i}.{gate,up,down}_proj.weight); "fused" = save_original_format=False
    # (mlp.experts.gate_up_proj [E, 2F, H], mlp.experts.down_proj [E, H, F]).
    dict(name="moe_a", seed=3544, moe=True, hk=2, hv=4, tie=False,
         n_exp=4, top_k=2, moe_ffn=16, shared_ffn=16, expert_layout="per_expert",
         note="MoE 4 experts top-2 + shared expert, H_v = 2*H_k, untied, per-expert tensors"),
    dict(name="moe_b", seed=3535, moe=True, hk=2, hv=2, tie=True,
         n_exp=8, top_k=3, moe_ffn=8, shared_ffn=16, expert_layout="fused",
         note="MoE 8 experts top-3 + shared expert, H_v == H_k, tied, fused expert tensors"),
]


def make_config(spec):
    kw = dict(COMMON)
    kw["rope_parameters"] = dict(COMMON["rope_parameters"])
    n = kw["num_hidden_layers"]
    interval = kw["full_attention_interval"]
    # Official configs carry both full_attention_interval and layer_types; passing layer_types
    # keeps full_attention_interval in the saved config.json as well.
    kw["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                         for i in range(n)]
    kw["linear_num_key_heads"] = spec["hk"]
    kw["linear_num_value_heads"] = spec["hv"]
    kw["tie_word_embeddings"] = spec["tie"]
    if spec["moe"]:
        kw.update(num_experts=spec["n_exp"], num_experts_per_tok=spec["top_k"],
                  moe_intermediate_size=spec["moe_ffn"],
                  shared_expert_intermediate_size=spec["shared_ffn"])
        return Qwen3_5MoeTextConfig(**kw)
    kw["intermediate_size"] = spec["ffn"]
    return Qwen3_5TextConfig(**kw)


# ------------------------------------------------------------------------------------------
# Randomisation: every parameter, distributions keeping activations O(1)
# ------------------------------------------------------------------------------------------

ZERO_CENTRED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                      "q_norm.weight", "k_norm.weight")


def param_distribution(name, shape, spec, cfg):
    """Returns (kind, a, b): 'normal' (mean a, std b) or 'uniform' (low a, high b)."""
    if name == "model.embed_tokens.weight":
        # tied: the same matrix is the lm_head, keep logits O(1) (std ~ 0.35*sqrt(64) ~ 3)
        return ("normal", 0.0, 0.35 if spec["tie"] else 1.0)
    if name == "model.norm.weight" or name.endswith(ZERO_CENTRED_NORMS):
        return ("normal", 0.0, 0.3)          # zero-centred: HF applies (1 + w)
    if name.endswith("linear_attn.norm.weight"):
        return ("normal", 1.0, 0.3)          # plain weight: HF applies w
    if name.endswith("linear_attn.A_log"):
        return ("A_log", 0.0, 0.0)           # spread per head, see below
    if name.endswith("linear_attn.dt_bias"):
        return ("normal", 0.0, 0.7)
    if name.endswith("linear_attn.conv1d.weight"):
        return ("normal", 0.0, 0.5)          # fan_in = kernel 4
    if name.endswith("mlp.experts.gate_up_proj"):
        return ("normal", 0.0, 1.0 / math.sqrt(shape[2]))
    if name.endswith("mlp.experts.down_proj"):
        return ("normal", 0.0, 1.0 / math.sqrt(shape[2]))
    if name.endswith("mlp.gate.weight"):
        return ("normal", 0.0, 2.0 / math.sqrt(shape[1]))  # decisive router (no near ties)
    if name.endswith("mlp.shared_expert_gate.weight"):
        return ("normal", 0.0, 1.5 / math.sqrt(shape[1]))
    if len(shape) == 2 and name.endswith(".weight"):
        return ("normal", 0.0, 1.0 / math.sqrt(shape[1]))  # nn.Linear [out, in]
    raise RuntimeError(f"no distribution rule for parameter {name} {tuple(shape)}")


def randomize(model, spec, cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(params):
        p = params[name]
        kind, a, b = param_distribution(name, tuple(p.shape), spec, cfg)
        with torch.no_grad():
            if kind == "normal":
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) * b + a
            elif kind == "A_log":
                # A = exp(A_log) spread log-uniformly over [0.003, 6] across the heads of a
                # layer (plus jitter), so some heads keep state across the 64-token chunk
                # boundary (g ~ -0.002) and others forget fast (g ~ -5).
                hv = p.shape[0]
                lo, hi = math.log(0.003), math.log(6.0)
                base = torch.linspace(lo, hi, hv, dtype=torch.float64)
                jit = (torch.rand(hv, generator=gen, dtype=torch.float64) - 0.5) * 0.6
                perm = torch.randperm(hv, generator=gen)
                v = (base + jit)[perm]
            else:
                raise AssertionError(kind)
            # round to bf16-representable values: the f32 and bf16 checkpoints then hold
            # identical weights and share one reference
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


# ------------------------------------------------------------------------------------------
# transformers in true float64
# ------------------------------------------------------------------------------------------

class _Float64TorchProxy:
    """Stands in for the `torch` module inside the Qwen3.5 modeling files so that their
    explicit fp32 up-casts (torch.float32 / torch.float) become float64."""

    def __getattr__(self, name):
        if name in ("float32", "float"):
            return torch.float64
        return getattr(torch, name)


@contextlib.contextmanager
def hf_float64():
    """Casting the model with .double() is not enough: the Qwen3.5 modeling code up-casts to
    fp32 explicitly (RMSNorm `x.float()`, gated norm / DeltaNet kernels `.to(torch.float32)`,
    attention and router softmax `dtype=torch.float32/float`), which would silently run those
    parts in fp32. Inside this context those casts produce float64 instead."""
    mods = (hf_dense_mod, hf_moe_mod)
    saved_torch = [m.torch for m in mods]
    saved_float = torch.Tensor.float
    for m in mods:
        m.torch = _Float64TorchProxy()
    torch.Tensor.float = lambda self, *a, **k: self.to(torch.float64)
    try:
        yield
    finally:
        torch.Tensor.float = saved_float
        for m, t in zip(mods, saved_torch):
            m.torch = t


def exact_inv_freq(cfg):
    rp = cfg.rope_parameters
    dim = int(cfg.head_dim * rp["partial_rotary_factor"])
    return 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def load_hf(path, moe, dtype):
    cls = Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM
    kw = dict(attn_implementation="eager")
    if moe:
        kw["experts_implementation"] = "eager"
    model = cls.from_pretrained(path, dtype=torch.float32, **kw)
    model.eval()
    if dtype == torch.float64:
        model = model.double()
        rot = model.model.rotary_emb
        rot.inv_freq = exact_inv_freq(model.config)   # HF computes it in fp32 at init
        rot.original_inv_freq = rot.inv_freq.clone()
    return model


class Capture:
    """Records per-layer hidden states (HF tuple semantics: entry i = input of layer i; entry L
    = output of the last layer BEFORE the final norm), the final-norm output and router logits."""

    def __init__(self, model, moe):
        self.handles = []
        self.hidden = []
        self.router = []
        layers = model.model.layers
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre, with_kwargs=True))
        self.handles.append(layers[-1].register_forward_hook(self._post))
        self.handles.append(model.model.norm.register_forward_hook(self._norm))
        if moe:
            for layer in layers:
                self.handles.append(layer.mlp.gate.register_forward_hook(self._router))
        self.final_norm = None

    def _pre(self, mod, args, kwargs):
        hs = args[0] if args else kwargs["hidden_states"]
        self.hidden.append(hs.detach().clone())

    def _post(self, mod, args, out):
        self.hidden.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    def _norm(self, mod, args, out):
        self.final_norm = out.detach().clone()

    def _router(self, mod, args, out):
        self.router.append(out[0].detach().clone())

    def close(self):
        for h in self.handles:
            h.remove()


def hf_forward(model, ids, moe):
    cap = Capture(model, moe)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False)
    finally:
        cap.close()
    hidden = torch.stack([h[0] for h in cap.hidden])      # [L+1, T, H]
    return dict(logits=out.logits[0], hidden=hidden, final_norm=cap.final_norm[0],
                router=[r for r in cap.router])


def hf_decode(model, ids, n_prefill):
    steps = []
    with torch.no_grad():
        out = model(input_ids=ids[:, :n_prefill], use_cache=True)
        pkv = out.past_key_values
        for t in range(n_prefill, ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            steps.append(out.logits[0, -1])
    return torch.stack(steps)


# ------------------------------------------------------------------------------------------
# Independent numpy float64 forward on GGUF-form weights (spec target-qwen35.md §2 / §3.3)
# ------------------------------------------------------------------------------------------

def gguf_form(sd, cfg, moe):
    """Applies the llama.cpp converter transforms to HF tensors (float64 numpy), returning a
    per-layer dict. V heads go to tiled order: GGUF head g <- HF head (g % Hk) * r + g // Hk."""
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = hv // hk
    perm = np.array([(g % hk) * r + g // hk for g in range(hv)])
    key_dim = hk * dk

    def vblocks_rows(w):     # rows grouped in blocks of dv per v head
        return w.reshape(hv, dv, *w.shape[1:])[perm].reshape(w.shape)

    g = {"token_embd": sd["model.embed_tokens.weight"],
         "output_norm": sd["model.norm.weight"] + 1.0}
    g["output"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        L = {"attn_norm": sd[p + "input_layernorm.weight"] + 1.0,
             "post_attention_norm": sd[p + "post_attention_layernorm.weight"] + 1.0,
             "type": cfg.layer_types[i]}
        if cfg.layer_types[i] == "linear_attention":
            q = p + "linear_attn."
            qkv = sd[q + "in_proj_qkv.weight"].copy()
            qkv[2 * key_dim:] = vblocks_rows(qkv[2 * key_dim:])
            conv = sd[q + "conv1d.weight"][:, 0, :].copy()          # [C,1,K] -> [C,K]
            conv[2 * key_dim:] = vblocks_rows(conv[2 * key_dim:])
            out = sd[q + "out_proj.weight"]                          # [H, value_dim]
            out = out.T.reshape(hv, dv, -1)[perm].reshape(hv * dv, -1).T.copy()
            L.update(attn_qkv=qkv, ssm_conv1d=conv,
                     attn_gate=vblocks_rows(sd[q + "in_proj_z.weight"]),
                     ssm_beta=sd[q + "in_proj_b.weight"][perm],
                     ssm_alpha=sd[q + "in_proj_a.weight"][perm],
                     ssm_a=-np.exp(sd[q + "A_log"])[perm],
                     ssm_dt=sd[q + "dt_bias"][perm],
                     ssm_norm=sd[q + "norm.weight"],                 # NOT shifted
                     ssm_out=out)
        else:
            q = p + "self_attn."
            L.update(attn_q=sd[q + "q_proj.weight"], attn_k=sd[q + "k_proj.weight"],
                     attn_v=sd[q + "v_proj.weight"], attn_output=sd[q + "o_proj.weight"],
                     attn_q_norm=sd[q + "q_norm.weight"] + 1.0,
                     attn_k_norm=sd[q + "k_norm.weight"] + 1.0)
        m = p + "mlp."
        if moe:
            if m + "experts.gate_up_proj" in sd:                     # fused layout
                gu = sd[m + "experts.gate_up_proj"]                  # [E, 2F, H]
                f = gu.shape[1] // 2
                gate, up, down = gu[:, :f], gu[:, f:], sd[m + "experts.down_proj"]
            else:                                                    # per-expert layout
                E = cfg.num_experts
                gate = np.stack([sd[f"{m}experts.{e}.gate_proj.weight"] for e in range(E)])
                up = np.stack([sd[f"{m}experts.{e}.up_proj.weight"] for e in range(E)])
                down = np.stack([sd[f"{m}experts.{e}.down_proj.weight"] for e in range(E)])
            L.update(ffn_gate_inp=sd[m + "gate.weight"],
                     ffn_gate_exps=gate, ffn_up_exps=up,                 # [E, F, H]
                     ffn_down_exps=down,                                 # [E, H, F]
                     ffn_gate_inp_shexp=sd[m + "shared_expert_gate.weight"][0],
                     ffn_gate_shexp=sd[m + "shared_expert.gate_proj.weight"],
                     ffn_up_shexp=sd[m + "shared_expert.up_proj.weight"],
                     ffn_down_shexp=sd[m + "shared_expert.down_proj.weight"])
        else:
            L.update(ffn_gate=sd[m + "gate_proj.weight"], ffn_up=sd[m + "up_proj.weight"],
                     ffn_down=sd[m + "down_proj.weight"])
        layers.append(L)
    g["layers"] = layers
    return g


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def np_deltanet(a, L, cfg):
    T = a.shape[0]
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    K = cfg.linear_conv_kernel_dim
    eps = cfg.rms_norm_eps
    qkv = a @ L["attn_qkv"].T
    z = (a @ L["attn_gate"].T).reshape(T, hv, dv)
    beta = _sigmoid(a @ L["ssm_beta"].T)
    gate = L["ssm_a"] * _softplus(a @ L["ssm_alpha"].T + L["ssm_dt"])
    w = L["ssm_conv1d"]                                   # [C, K], w[:, K-1] = current token
    padded = np.vstack([np.zeros((K - 1, qkv.shape[1]), dtype=qkv.dtype), qkv])
    conv = sum(w[:, k] * padded[k:k + T] for k in range(K))
    x = _silu(conv)
    q = x[:, :hk * dk].reshape(T, hk, dk)
    k = x[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
    v = x[:, 2 * hk * dk:].reshape(T, hv, dv)
    q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
    kidx = np.arange(hv) % hk                              # tiled order: head g uses g % Hk
    S = np.zeros((hv, dk, dv), dtype=a.dtype)
    o = np.zeros((T, hv, dv), dtype=a.dtype)
    for t in range(T):
        kt, qt = k[t, kidx], q[t, kidx]                    # [hv, dk]
        S *= np.exp(gate[t])[:, None, None]
        u = np.einsum("hij,hi->hj", S, kt)
        delta = beta[t][:, None] * (v[t] - u)
        S += kt[:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, qt)
    y = _rms(o, L["ssm_norm"], eps) * _silu(z)
    return y.reshape(T, hv * dv) @ L["ssm_out"].T


def np_rope(x, pos, n_rot, theta):
    half = n_rot // 2
    inv = theta ** (-np.arange(half) * 2.0 / n_rot)
    ang = pos[:, None] * inv[None, :]                       # [T, half]
    c = np.cos(ang)[:, None, :].astype(x.dtype)
    s = np.sin(ang)[:, None, :].astype(x.dtype)
    x = x.copy()
    x1, x2 = x[..., :half].copy(), x[..., half:n_rot].copy()
    x[..., :half] = x1 * c - x2 * s
    x[..., half:n_rot] = x1 * s + x2 * c
    return x


def np_attention(a, L, cfg):
    T = a.shape[0]
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    rp = cfg.rope_parameters
    n_rot = int(hd * rp["partial_rotary_factor"])
    qg = (a @ L["attn_q"].T).reshape(T, nh, 2 * hd)       # per head [query | gate]
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
    q = _rms(q, L["attn_q_norm"], eps)
    k = _rms((a @ L["attn_k"].T).reshape(T, nkv, hd), L["attn_k_norm"], eps)
    v = (a @ L["attn_v"].T).reshape(T, nkv, hd)
    pos = np.arange(T, dtype=np.float64)
    q = np_rope(q, pos, n_rot, rp["rope_theta"])
    k = np_rope(k, pos, n_rot, rp["rope_theta"])
    grp = nh // nkv
    out = np.zeros((T, nh, hd), dtype=a.dtype)
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for h in range(nh):
        sc = q[:, h] @ k[:, h // grp].T / math.sqrt(hd)
        sc[mask] = -np.inf
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        out[:, h] = sc @ v[:, h // grp]
    o = out.reshape(T, nh * hd) * _sigmoid(gate)
    return o @ L["attn_output"].T


def np_ffn(f, L, cfg, moe):
    if not moe:
        return (_silu(f @ L["ffn_gate"].T) * (f @ L["ffn_up"].T)) @ L["ffn_down"].T
    logits = f @ L["ffn_gate_inp"].T                       # [T, E]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    k = cfg.num_experts_per_tok
    out = np.zeros_like(f)
    for t in range(f.shape[0]):
        sel = np.argsort(-p[t], kind="stable")[:k]
        wsel = p[t, sel] / p[t, sel].sum()
        for e, we in zip(sel, wsel):
            h = _silu(L["ffn_gate_exps"][e] @ f[t]) * (L["ffn_up_exps"][e] @ f[t])
            out[t] += we * (L["ffn_down_exps"][e] @ h)
    sh = (_silu(f @ L["ffn_gate_shexp"].T) * (f @ L["ffn_up_shexp"].T)) @ L["ffn_down_shexp"].T
    return out + _sigmoid(f @ L["ffn_gate_inp_shexp"])[:, None] * sh


def np_forward(G, tokens, cfg, moe):
    eps = cfg.rms_norm_eps
    x = G["token_embd"][tokens]
    hidden = [x]
    for L in G["layers"]:
        a = _rms(x, L["attn_norm"], eps)
        if L["type"] == "linear_attention":
            x = x + np_deltanet(a, L, cfg)
        else:
            x = x + np_attention(a, L, cfg)
        x = x + np_ffn(_rms(x, L["post_attention_norm"], eps), L, cfg, moe)
        hidden.append(x)
    fn = _rms(x, G["output_norm"], eps)
    return dict(logits=fn @ G["output"].T, hidden=np.stack(hidden), final_norm=fn)


# ------------------------------------------------------------------------------------------
# Convention table: line numbers in the installed transformers modeling files
# ------------------------------------------------------------------------------------------

def _find_line(path, snippet, after=None):
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    start = 0
    if after is not None:
        start = next(i for i, l in enumerate(lines) if after in l)
    for i in range(start, len(lines)):
        if snippet in lines[i]:
            return i + 1
    raise RuntimeError(f"convention anchor not found in {path}: {snippet!r} (transformers changed?)")


def conventions():
    dpath = hf_dense_mod.__file__
    mpath = hf_moe_mod.__file__
    cpath = os.path.join(os.path.dirname(transformers.__file__), "utils", "output_capturing.py")
    kpath = os.path.join(os.path.dirname(transformers.__file__), "conversion_mapping.py")
    D = lambda s, after=None: _find_line(dpath, s, after)
    M = lambda s, after=None: _find_line(mpath, s, after)
    rows = [
        ("decoder RMSNorm (input/post_attention/final norm, q_norm, k_norm): y = x*rsqrt(mean(x^2)+eps) * (1 + w), computed in fp32",
         f"modeling_qwen3_5.py:{D('output = output * (1.0 + self.weight.float())')}"),
        ("weight init of those norms is 0 (so 1 + w = 1)",
         f"modeling_qwen3_5.py:{D('self.weight = nn.Parameter(torch.zeros(dim))')}"),
        ("DeltaNet gated norm (linear_attn.norm): y = x*rsqrt(mean(x^2)+eps) * w * silu(z), PLAIN w (init 1), per v head over d_v",
         f"modeling_qwen3_5.py:{D('hidden_states = self.weight * hidden_states.to(input_dtype)')}-"
         f"{D('hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))')}"),
        ("conv1d: nn.Conv1d depthwise, weight [conv_dim, 1, K], no bias, padding K-1 then keep the first T outputs (causal; w[:, K-1] hits the current token), then SiLU",
         f"modeling_qwen3_5.py:{D('self.conv1d = nn.Conv1d(')}, {D('padding = weight.shape[-1] - 1')}-"
         f"{D(')[:, :, :seq_len]')}"),
        ("conv channels = [q (H_k*d_k), k (H_k*d_k), v (H_v*d_v)] concatenated in that order, split after the conv",
         f"modeling_qwen3_5.py:{D('query, key, value = torch.split(')}"),
        ("gates: beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias) (log-space decay, <= 0)",
         f"modeling_qwen3_5.py:{D('beta = b.sigmoid()')}-{D('g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)')}"),
        ("q/k L2 norm: x * rsqrt(sum(x^2) + 1e-6) (eps hard-coded 1e-6, not rms_norm_eps), in the kernel (use_qk_l2norm_in_kernel=True)",
         f"modeling_qwen3_5.py:{D('inv_norm = torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)')}, "
         f"{D('query = l2norm(query, dim=-1, eps=1e-6)')}"),
        ("q scaled by 1/sqrt(d_k) after the L2 norm",
         f"modeling_qwen3_5.py:{D('query = query * scaling')} (chunked), "
         f"{D('query = query / (query.shape[-1] ** 0.5)')} (recurrent)"),
        ("V-head sharing: q/k heads repeat_interleave'd (grouped: v head j uses k head j // r)",
         f"modeling_qwen3_5.py:{D('query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)')}"),
        ("recurrence: S *= exp(g); u = S^T k; delta = beta (v - u); S += k delta^T; o = S^T q (state [d_k, d_v])",
         f"modeling_qwen3_5.py:{D('last_recurrent_state = last_recurrent_state * decay_t')}-"
         f"{D('core_attn_out[:, :, i] = (last_recurrent_state * q_t.unsqueeze(-1)).sum(dim=-2)')}"),
        ("chunked prefill (chunk 64, right-padded with zeros) used whenever seq_len > 1 or no cache; recurrent form for cached 1-token decode",
         f"modeling_qwen3_5.py:{D('chunk_size: int = 64')}, {D('if recurrent_state is not None and seq_len == 1:')}"),
        ("attention q_proj output viewed [.., n_head, 2*head_dim] and chunked: per head [query, gate] interleave (query = first head_dim of each 2*head_dim block)",
         f"modeling_qwen3_5.py:{D('self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1')}"),
        ("q_norm/k_norm (zero-centred) BEFORE RoPE; v not normed",
         f"modeling_qwen3_5.py:{D('query_states = self.q_norm(query_states.view(hidden_shape)).transpose(1, 2)')}"),
        ("attention output gate: o * sigmoid(gate) before o_proj; scale head_dim**-0.5; softmax in fp32",
         f"modeling_qwen3_5.py:{D('attn_output = attn_output * torch.sigmoid(gate)')}, {D('self.scaling = self.head_dim**-0.5')}"),
        ("partial rotary: only the first rotary_dim = head_dim*partial_rotary_factor dims rotate; NEOX rotate_half pairing (i, i + rotary_dim/2)",
         f"modeling_qwen3_5.py:{D('q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]')}, {D('def rotate_half(x):')}"),
        ("inv_freq = theta^(-2i/rotary_dim) (computed in fp32 by HF), partial_rotary_factor read from rope_parameters",
         f"modeling_qwen3_5.py:{D('inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))', after='class Qwen3_5TextRotaryEmbedding')}"),
        ("MRoPE: freq slot i takes h position if i%3==1 and i<3*sec[1], w if i%3==2 and i<3*sec[2], else t (always interleaved; mrope_interleaved is not read). For text all rows = p, so it is plain NEOX RoPE",
         f"modeling_qwen3_5.py:{D('def recomposition_frequencies(self, freq):', after='class Qwen3_5TextRotaryEmbedding')}, "
         f"{D('position_ids = position_ids.view(1, 1, -1).expand(4, inputs_embeds.shape[0], -1)')}"),
        ("MoE router: softmax over ALL experts in fp32, top-k of the probabilities, always renormalised (no norm_topk_prob switch)",
         f"modeling_qwen3_5_moe.py:{M('router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)')}-"
         f"{M('router_top_value /= router_top_value.sum(dim=-1, keepdim=True)')}"),
        ("MoE experts: gate_up_proj [E, 2F, H] -> gate = first F rows, up = next F; down_proj [E, H, F]",
         f"modeling_qwen3_5_moe.py:{M('gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)')}"),
        ("shared expert: sigmoid(shared_expert_gate(x)) * shared_expert(x), added to the routed sum",
         f"modeling_qwen3_5_moe.py:{M('shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states_reshaped)) * shared_expert_output')}"),
        ("hidden_states tuple: entry 0 = embeddings, entry i = output of layer i-1, but the LAST entry is overwritten with the post-final-norm state",
         f"utils/output_capturing.py:{_find_line(cpath, 'tie_last_hidden_states (`bool`')}"),
        ("MoE checkpoint format: per-expert mlp.experts.{i}.{gate,up,down}_proj.weight is the 'original' format (merged on load, written back by save_pretrained)",
         f"conversion_mapping.py:{_find_line(kpath, 'mapping[' + chr(34) + 'qwen3_5_moe_text' + chr(34) + '] += mapping[' + chr(34) + 'qwen2_moe' + chr(34) + '].copy()')}, "
         f"{_find_line(kpath, 'target_patterns=' + chr(34) + 'mlp.experts.gate_up_proj' + chr(34), after=chr(34) + 'qwen2_moe' + chr(34) + ': [')}"),
        ("no MTP module in transformers: mtp.* keys are ignored on load",
         f"modeling_qwen3_5.py:{D('_keys_to_ignore_on_load_unexpected = [r' + chr(34) + '^mtp.*' + chr(34) + ', r' + chr(34) + '^model.visual.*' + chr(34) + ']')}"),
    ]
    return rows


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------

def write_f32(path, arr):
    np.ascontiguousarray(np.asarray(arr, dtype="<f4")).tofile(path)


def save_checkpoint(model, out_dir, dtype, fused_experts):
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    m = model.to(dtype)
    m.save_pretrained(out_dir, safe_serialization=True, save_original_format=not fused_experts)
    model.to(torch.float32)
    keep = {"config.json", "model.safetensors"}
    for f in sorted(os.listdir(out_dir)):
        if f not in keep:
            os.remove(os.path.join(out_dir, f))   # generation_config.json: defaults only
    missing = keep - set(os.listdir(out_dir))
    if missing:
        raise RuntimeError(f"save_pretrained did not write {sorted(missing)} in {out_dir}")


def maxdiff(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)))


def count_params(model):
    # unique storage: a tied lm_head is counted once
    seen, n = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


def check(cond, msg):
    if not cond:
        raise RuntimeError("CHECK FAILED: " + msg)


def make_one(spec, out_root, log):
    name = spec["name"]
    cfg = make_config(spec)
    moe = spec["moe"]
    cls = Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM
    torch.manual_seed(spec["seed"])
    model = cls(cfg).float().eval()
    randomize(model, spec, cfg, spec["seed"])
    n_params = count_params(model)

    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    f32_dir, bf16_dir = os.path.join(d, "hf_f32"), os.path.join(d, "hf_bf16")
    fused = spec.get("expert_layout") == "fused"
    save_checkpoint(model, f32_dir, torch.float32, fused)
    save_checkpoint(model, bf16_dir, torch.bfloat16, fused)

    # bf16 checkpoint == f32 checkpoint, bit for bit after bf16 -> f32
    sd32 = load_file(os.path.join(f32_dir, "model.safetensors"))
    sd16 = load_file(os.path.join(bf16_dir, "model.safetensors"))
    check(sorted(sd32) == sorted(sd16), f"{name}: f32/bf16 key sets differ")
    for k in sd32:
        check(sd16[k].dtype == torch.bfloat16, f"{name}: {k} not bf16 in hf_bf16")
        check(torch.equal(sd16[k].float(), sd32[k]), f"{name}: {k} differs between f32 and bf16")
    check(spec["tie"] == ("lm_head.weight" not in sd32), f"{name}: lm_head presence vs tie flag")
    if moe:
        has_fused = "model.layers.0.mlp.experts.gate_up_proj" in sd32
        check(has_fused == fused, f"{name}: expert layout in the file is not {spec['expert_layout']}")

    rng = np.random.Generator(np.random.PCG64(spec["seed"]))
    tokens = rng.integers(0, cfg.vocab_size, size=N_TOKENS).astype(np.int64)
    ids = torch.tensor(tokens[None, :])

    # --- reference: transformers, true float64 -----------------------------------------
    with hf_float64():
        m64 = load_hf(f32_dir, moe, torch.float64)
        ref = hf_forward(m64, ids, moe)
        dec = hf_decode(m64, ids, N_PREFILL)
    logits = ref["logits"].numpy()
    hidden = ref["hidden"].numpy()
    final_norm = ref["final_norm"].numpy()
    decode = dec.numpy()
    L = cfg.num_hidden_layers
    check(hidden.shape == (L + 1, N_TOKENS, cfg.hidden_size), f"{name}: hidden shape {hidden.shape}")
    check(np.isfinite(logits).all() and np.isfinite(hidden).all(), f"{name}: non-finite reference")

    diffs = {}
    diffs["decode_vs_full"] = maxdiff(decode, logits[N_PREFILL:])
    check(diffs["decode_vs_full"] < 1e-9, f"{name}: cached decode differs from full forward")

    # --- independent numpy fp64 on GGUF-form weights --------------------------------------
    sd64 = {k: v.double().numpy() for k, v in sd32.items()}
    npo = np_forward(gguf_form(sd64, cfg, moe), tokens, cfg, moe)
    diffs["numpy_gguf_form_vs_hf64_logits"] = maxdiff(npo["logits"], logits)
    diffs["numpy_gguf_form_vs_hf64_hidden"] = maxdiff(npo["hidden"], hidden)
    diffs["numpy_gguf_form_vs_hf64_final_norm"] = maxdiff(npo["final_norm"], final_norm)
    check(diffs["numpy_gguf_form_vs_hf64_logits"] < 1e-9, f"{name}: numpy GGUF-form forward != HF fp64")
    check(diffs["numpy_gguf_form_vs_hf64_hidden"] < 1e-9, f"{name}: numpy GGUF-form hidden != HF fp64")
    # the same numpy code in float32 (weights and all arithmetic): what a plain-f32 engine using
    # the token-by-token recurrence should roughly reproduce
    sd32np = {k: v.numpy() for k, v in sd32.items()}
    np32 = np_forward(gguf_form(sd32np, cfg, moe), tokens, cfg, moe)
    check(np32["logits"].dtype == np.float32, f"{name}: numpy f32 path promoted to float64")
    diffs["numpy_f32_recurrent_vs_fp64_logits"] = maxdiff(np32["logits"], logits)
    diffs["numpy_f32_recurrent_vs_fp64_hidden"] = maxdiff(np32["hidden"], hidden)

    # --- informational: HF as usually run ----------------------------------------------------
    m_dbl = load_hf(f32_dir, moe, torch.float64)       # .double() only: fp32 casts inside
    diffs["hf_double_cast_only_vs_fp64_logits"] = maxdiff(hf_forward(m_dbl, ids, moe)["logits"], logits)
    m32 = load_hf(f32_dir, moe, torch.float32)
    o32 = hf_forward(m32, ids, moe)
    diffs["hf_fp32_vs_fp64_logits"] = maxdiff(o32["logits"], logits)
    diffs["hf_fp32_vs_fp64_hidden"] = maxdiff(o32["hidden"], hidden)
    m16 = load_hf(bf16_dir, moe, torch.float32)
    diffs["hf_bf16ckpt_in_fp32_vs_f32ckpt_in_fp32_logits"] = maxdiff(hf_forward(m16, ids, moe)["logits"], o32["logits"])
    check(diffs["hf_bf16ckpt_in_fp32_vs_f32ckpt_in_fp32_logits"] == 0.0, f"{name}: bf16 ckpt gives other logits")

    # --- degeneracy / router margins ----------------------------------------------------------
    stats = {
        "logits_std": float(logits.std()),
        "logits_absmax": float(np.abs(logits).max()),
        "hidden_rms_per_entry": [float(np.sqrt(np.mean(h * h))) for h in hidden],
        "argmax_distinct": int(len(set(np.argmax(logits, -1).tolist()))),
    }
    check(0.3 < stats["logits_std"] < 20.0, f"{name}: degenerate logits std {stats['logits_std']}")
    check(stats["argmax_distinct"] > 5, f"{name}: argmax almost constant")
    if moe:
        k = cfg.num_experts_per_tok
        margins = []
        for rl in ref["router"]:                         # [T, E] router logits per MoE layer
            s = np.sort(rl.numpy(), axis=-1)[:, ::-1]
            margins.append(float(np.min(s[:, k - 1] - s[:, k])))
        stats["router_min_topk_margin_logit"] = min(margins)
        check(stats["router_min_topk_margin_logit"] > 1e-3,
              f"{name}: near tie in MoE top-k (margin {stats['router_min_topk_margin_logit']:.2e}); change its seed")

    # --- files --------------------------------------------------------------------------------
    write_f32(os.path.join(d, "logits.f32"), logits)
    write_f32(os.path.join(d, "hidden.f32"), hidden)
    write_f32(os.path.join(d, "final_norm.f32"), final_norm)
    write_f32(os.path.join(d, "decode_logits.f32"), decode)

    summary = {
        "arch": "qwen35moe" if moe else "qwen35",
        "hf_class": cls.__name__,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": L, "layer_types": list(cfg.layer_types),
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rotary_dim": int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]),
        "rope_theta": cfg.rope_parameters["rope_theta"],
        "mrope_section": list(cfg.rope_parameters["mrope_section"]),
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        "conv_dim": 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                    + cfg.linear_num_value_heads * cfg.linear_value_head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "n_params": n_params,
    }
    if moe:
        summary.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                       moe_intermediate_size=cfg.moe_intermediate_size,
                       shared_expert_intermediate_size=cfg.shared_expert_intermediate_size)
    else:
        summary["intermediate_size"] = cfg.intermediate_size

    meta = {
        "name": name,
        "note": spec["note"],
        "seed": spec["seed"],
        "tokens": tokens.tolist(),
        "n_tokens": N_TOKENS,
        "decode": {"n_prefill": N_PREFILL, "n_steps": N_TOKENS - N_PREFILL,
                   "row_s_equals_logits_row": f"{N_PREFILL} + s"},
        "files": {
            "logits.f32": [N_TOKENS, cfg.vocab_size],
            "hidden.f32": [L + 1, N_TOKENS, cfg.hidden_size],
            "final_norm.f32": [N_TOKENS, cfg.hidden_size],
            "decode_logits.f32": [N_TOKENS - N_PREFILL, cfg.vocab_size],
        },
        "config": summary,
        "max_abs_diffs": {k: float("%.3e" % v) for k, v in diffs.items()},
        "stats": {k: (float("%.4g" % v) if isinstance(v, float) else
                      ([float("%.4g" % x) for x in v] if isinstance(v, list) else v))
                  for k, v in stats.items()},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
                     "numpy": np.__version__},
    }
    with open(os.path.join(d, "tokens.json"), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")

    log(f"[{name}] params={n_params}  {spec['note']}")
    for k, v in diffs.items():
        log(f"    max|diff| {k:48s} {v:.3e}")
    log(f"    logits std {stats['logits_std']:.3f}  absmax {stats['logits_absmax']:.2f}  "
        f"distinct argmax {stats['argmax_distinct']}  hidden rms "
        + " ".join("%.2f" % x for x in stats["hidden_rms_per_entry"]))
    if moe:
        log(f"    router min top-k margin (logits) {stats['router_min_topk_margin_logit']:.3e}")
    return meta


README_HEAD = """# Qwen3.5 target-model reference fixtures

Generated by `tools/reference/make_target_fixtures.py` (transformers {tf}, torch {th}, numpy {npv});
do not edit by hand: re-run the script (it rewrites this file too). Re-running reproduces every
file bit for bit.

Each directory is one tiny random-weight model built with transformers' own
`Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`, saved with `save_pretrained`, so key names,
shapes and config.json are exactly what HF writes. **Every** parameter is random (norm weights,
gated-norm weight, A_log, dt_bias, conv1d, router, shared-expert gate, embeddings, lm_head), and
all weights are rounded to bf16-representable values, so `hf_f32` and `hf_bf16` hold identical
weights and share one reference.

## Configurations

| name | class | H_k | H_v | r | conv_dim | FFN | tied | params | note |
|---|---|---|---|---|---|---|---|---|---|
{cfg_rows}

Common: vocab 512, hidden 64, 8 layers with layer_types [lin, lin, lin, full] x 2 (layers 3 and 7
are full attention; `full_attention_interval` 4 is also in config.json), 4 query heads, 2 KV heads,
head_dim 32, partial_rotary_factor 0.25 (rotary_dim 8), rope_theta 1e7, mrope_section [2, 1, 1]
(sums to rotary_dim/2 = 4), d_k = d_v = 16, conv kernel 4, rms_norm_eps 1e-6, no biases, no MTP
(`mtp_num_hidden_layers: 0` in config.json; transformers has no MTP module anyway).
MoE expert tensors: `moe_a` is saved in transformers' default per-expert layout
(`mlp.experts.{{i}}.gate_proj/up_proj/down_proj.weight`), `moe_b` in the fused layout
(`mlp.experts.gate_up_proj` [E, 2F, H] with gate = first F rows, `mlp.experts.down_proj` [E, H, F]);
a converter must accept both. No tokenizer files are included (the models have no real vocabulary).

## Files per configuration

All `.f32` files are raw little-endian IEEE float32, C order (last index fastest), no header.
T = 80 tokens, V = 512, H = 64, L = 8.

| file | shape | content |
|---|---|---|
| `hf_f32/config.json`, `hf_f32/model.safetensors` | | HF checkpoint, float32 tensors |
| `hf_bf16/config.json`, `hf_bf16/model.safetensors` | | same weights as bfloat16 (exact) |
| `tokens.json` | | `tokens` (80 ids, all < 512), config summary, decode setup, measured diffs, stats |
| `logits.f32` | [T, V] | logits of a full forward over all 80 tokens (position 0 first) |
| `hidden.f32` | [L+1, T, H] | entry 0 = token embeddings = input of layer 0; entry i (1..L) = output of decoder layer i-1 (residual stream after its FFN) = input of layer i; entry L = output of the last layer **before** the final norm |
| `final_norm.f32` | [T, H] | final RMSNorm output (what the lm_head multiplies) |
| `decode_logits.f32` | [32, V] | prefill tokens 0..47 with the cache, then feed tokens 48..79 one at a time; row s = logits after consuming token 48+s (equals `logits.f32` row 48+s) |

Note: HF's own `output_hidden_states=True` tuple differs from `hidden.f32` in its LAST entry:
transformers overwrites `hidden_states[L]` with the post-final-norm state (`final_norm.f32` here).
Entries 0..L-1 are identical.

References are computed from the f32 checkpoint with transformers' modeling code forced to
**true float64** (the model cast to double AND the modeling file's internal fp32 up-casts redirected
to float64 — `.double()` alone leaves RMSNorm, the DeltaNet kernels and the softmaxes in fp32),
eager attention, eager experts, positions 0..79, no padding, batch 1. The full forward uses
`use_cache=False` (HF chunked DeltaNet, chunk 64: the 80 tokens cross a chunk boundary); the decode
run uses the HF cache (chunked prefill of 48, then the recurrent 1-token path and conv-state update).

The script cross-checks the HF float64 output against its own independent numpy float64
implementation of the spec (docs: /work/shared/spec/target-qwen35.md §2) that runs on
**GGUF-form weights** (converter transforms of spec §3.3 applied: +1 on zero-centred norms,
`ssm_a = -exp(A_log)`, V heads reordered to tiled order with k-head = g mod H_k, conv1d squeezed,
expert gate/up split) and uses the token-by-token recurrence. Agreement to ~1e-13 confirms that the
spec's conversion rules and forward math match transformers.

## Measured differences (max |diff| over all elements)

| config | decode vs full (fp64) | numpy GGUF-form vs HF fp64 (logits / hidden) | numpy GGUF-form **f32** recurrence vs fp64 (logits / hidden) | HF `.double()` only vs fp64 | HF fp32 vs fp64 (logits / hidden) |
|---|---|---|---|---|---|
{diff_rows}

The "f32 recurrence" column is the same numpy code run entirely in float32 on GGUF-form weights —
roughly what a plain-f32 engine (token-by-token DeltaNet recurrence, f32 accumulation) should see.
The error grows layer by layer (random weights make some DeltaNet heads ill-conditioned), reaching
~2e-4 in the last hidden states. Suggested engine tolerances against these fp64 references with
f32/bf16 weights: logits max|diff| <= 2e-3 (or <= 2e-4 x max|logit|), hidden states max|diff|
<= 1e-3; an engine using f16 activations/KV or quantised weights needs looser, NMSE-style checks.
Reading a file with numpy: `np.fromfile("logits.f32", "<f4").reshape(80, 512)`.

Logit statistics: {stat_rows}

## Conventions in transformers {tf} (file:line in the installed package)

| behaviour | where |
|---|---|
{conv_rows}

## Spec (target-qwen35.md) vs transformers {tf}

{spec_diffs}
"""

SPEC_DIFFS = """The forward math of spec §2 and the converter transforms of §3.3/§3.5 agree with transformers:
the numpy implementation written from the spec (GGUF form, tiled V order, plain norms on +1
weights, `ssm_a = -exp(A_log)`, recurrent delta rule, per-head [query | gate] interleave, NEOX
partial RoPE, MoE softmax -> top-k -> renormalise + sigmoid-gated shared expert) reproduces HF's
float64 logits to ~1e-13 on all configs, including H_v = 2*H_k and 3*H_k. Points where the spec text
is incomplete or could mislead:

1. **config.json layout written by transformers 5.23 `save_pretrained`** (what these fixtures
   contain, and what a converter must accept): `rope_theta`, `partial_rotary_factor`,
   `mrope_section`, `mrope_interleaved` appear ONLY inside `rope_parameters` (no top-level
   `rope_theta` / `partial_rotary_factor`, spec §1.1 says "top level and in rope_parameters").
   `layer_types` is always written; `full_attention_interval` is present here only because the
   script passes both. `num_experts`/`num_experts_per_tok` etc. are top level. The config is flat
   (`model_type` `qwen3_5_text` / `qwen3_5_moe_text`, `architectures` `Qwen3_5ForCausalLM` /
   `Qwen3_5MoeForCausalLM`), tensor names start with `model.` (no `model.language_model.`), and
   there is no `text_config` nesting. A `dtype` key records float32/bfloat16.
2. **Tied checkpoints contain no `lm_head.weight`** in the safetensors (dense_b, moe_b);
   `tie_word_embeddings: true` in config.json. The engine must fall back to `token_embd`.
3. **HF `hidden_states[-1]` is post-final-norm** (`tie_last_hidden_states`), not "input to layer
   L". Spec §6.1 reads DFlash `target_layers` as HF `hidden_states` indices = input of layer L; that
   holds for L < num_hidden_layers only.
4. **`mrope_interleaved` is not read by HF**: the text rotary always interleaves (slot i%3). Only
   relevant for non-text positions; for text all three position rows are equal and MRoPE is plain
   NEOX RoPE on the first rotary_dim dims (spec §2.8 is right about that).
5. **HF computes `inv_freq` and cos/sin in float32** (`position_ids.float() * inv_freq`, then
   `cos()`), so HF-fp32 RoPE angles carry ~1e-7 relative error; the fixtures use exact fp64
   angles.
6. **DeltaNet q/k L2-norm eps is hard-coded 1e-6** in HF (`l2norm(..., eps=1e-6)`), independent
   of `rms_norm_eps`; llama.cpp passes `rms_norm_eps`. Same value in every published config.
7. **HF prefill always uses the chunked form** when there is no cache or seq_len > 1, with chunk 64
   and zero right-padding (spec §2.6 is accurate); the recurrent form is used only for cached
   single-token decode. In exact arithmetic both equal the spec §2.5 recurrence (checked here).
8. **MoE expert tensor layout on disk.** Spec §2.9 item 7 says "HF stores experts fused"
   (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj` [E, H, F]). In transformers 5.23
   the fused tensors are only the *in-memory* layout: `conversion_mapping.py` declares the
   checkpoint ("original") format of `qwen3_5_moe_text` to be per-expert
   (`mlp.experts.{i}.gate_proj.weight` [F, H], `up_proj.weight` [F, H], `down_proj.weight` [H, F]),
   merges them on load and **writes them back per-expert by default** in `save_pretrained`
   (`save_original_format=True`). So real checkpoints may come in either layout; the converter
   must accept both (spec §3.3 item 8 mentions both). `moe_a` is per-expert, `moe_b` fused. Router
   `mlp.gate.weight` [E, H] and shared-expert gate `mlp.shared_expert_gate.weight` [1, H] are the
   same in both.
9. **Config keys the spec lists that transformers neither reads nor writes**: `attn_output_gate`
   (the sigmoid output gate is unconditional in HF), `mamba_ssm_dtype`, `mtp_use_dedicated_embeddings`,
   `output_gate_type`. A converter must not require them. `mtp_num_hidden_layers` is not a
   `Qwen3_5TextConfig` field either; it is kept in config.json only because the script passes it
   (value 0).
10. **MRoPE leftover slots** (non-text only): HF starts from the t positions for every slot and
   overwrites only h slots (i%3==1, i < 3*sec[1]) and w slots (i%3==2, i < 3*sec[2]); any other slot
   keeps t. Spec §2.8 says leftover slots use "the 4th section" (llama.cpp's view). Irrelevant for
   text, where all position rows are equal.
"""


def write_readme(out_root, metas):
    cfg_rows, diff_rows, stat_rows = [], [], []
    for m in metas:
        c = m["config"]
        r = c["linear_num_value_heads"] // c["linear_num_key_heads"]
        if c["arch"] == "qwen35moe":
            ffn = (f"{c['num_experts']} exp top-{c['num_experts_per_tok']}, F={c['moe_intermediate_size']}, "
                   f"shared {c['shared_expert_intermediate_size']}")
        else:
            ffn = f"dense {c['intermediate_size']}"
        cfg_rows.append(f"| `{m['name']}` | `{c['hf_class']}` | {c['linear_num_key_heads']} | "
                        f"{c['linear_num_value_heads']} | {r} | {c['conv_dim']} | {ffn} | "
                        f"{'yes' if c['tie_word_embeddings'] else 'no'} | {c['n_params']} | {m['note']} |")
        d = m["max_abs_diffs"]
        diff_rows.append(f"| `{m['name']}` | {d['decode_vs_full']:.1e} | "
                         f"{d['numpy_gguf_form_vs_hf64_logits']:.1e} / {d['numpy_gguf_form_vs_hf64_hidden']:.1e} | "
                         f"{d['numpy_f32_recurrent_vs_fp64_logits']:.1e} / {d['numpy_f32_recurrent_vs_fp64_hidden']:.1e} | "
                         f"{d['hf_double_cast_only_vs_fp64_logits']:.1e} | "
                         f"{d['hf_fp32_vs_fp64_logits']:.1e} / {d['hf_fp32_vs_fp64_hidden']:.1e} |")
        s = m["stats"]
        stat_rows.append(f"`{m['name']}` std {s['logits_std']}, absmax {s['logits_absmax']}"
                         + (f", min MoE top-k margin {s['router_min_topk_margin_logit']}"
                            if "router_min_topk_margin_logit" in s else ""))
    conv_rows = [f"| {a} | {b} |" for a, b in conventions()]
    v = metas[0]["versions"]
    text = README_HEAD.format(tf=v["transformers"], th=v["torch"], npv=v["numpy"],
                              cfg_rows="\n".join(cfg_rows), diff_rows="\n".join(diff_rows),
                              stat_rows="; ".join(stat_rows) + ".",
                              conv_rows="\n".join(conv_rows), spec_diffs=SPEC_DIFFS)
    with open(os.path.join(out_root, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(text)


def generate(out_root, only, log):
    os.makedirs(out_root, exist_ok=True)
    metas = []
    for spec in CONFIGS:
        if only and spec["name"] not in only:
            continue
        metas.append(make_one(spec, out_root, log))
    if not only:
        write_readme(out_root, metas)
    return metas


def tree_equal(a, b):
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(tree_equal(os.path.join(a, s), os.path.join(b, s)) for s in cmp.common_dirs)


def main():
    ap = argparse.ArgumentParser(description="Generate the Qwen3.5 target reference fixtures.")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default tests/fixtures/target)")
    ap.add_argument("--only", default="", help="comma-separated config names (README not rewritten)")
    ap.add_argument("--conventions", action="store_true", help="print the convention table and exit")
    ap.add_argument("--check-repro", action="store_true",
                    help="generate twice into temp dirs, compare byte for byte, and compare with --out")
    args = ap.parse_args()

    torch.set_num_threads(TORCH_THREADS)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - {c["name"] for c in CONFIGS}
    if unknown:
        ap.error(f"unknown config name(s): {sorted(unknown)}")

    if args.conventions:
        for a, b in conventions():
            print(f"{b:60s} {a}")
        return 0

    if args.check_repro:
        with tempfile.TemporaryDirectory() as t:
            a, b = os.path.join(t, "a"), os.path.join(t, "b")
            generate(a, only, lambda s: None)
            generate(b, only, lambda s: None)
            same = tree_equal(a, b)
            print("two fresh runs identical:", same)
            same_out = tree_equal(a, args.out) if not only else None
            if same_out is not None:
                print(f"fresh run identical to {args.out}:", same_out)
            return 0 if same and same_out is not False else 1

    generate(args.out, only, print)
    print("conventions (transformers %s):" % transformers.__version__)
    for a, b in conventions():
        print(f"  {b:58s} {a}")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
