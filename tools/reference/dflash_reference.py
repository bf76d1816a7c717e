"""PyTorch reference for the block-diffusion drafters: DFlash, DFlash 2 and DSpark.

This is the readable oracle the C engine's `draft/` and `spec/` layers are tested against
(spec: /work/shared/spec/drafters-and-verification.md §0-§4, §9; anchor-lucebox.md §3-§4).
It runs on the CPU in float32, one sequence at a time (no batch dimension), and is written to
be read top to bottom. It is also meant as the starting point for training tiny drafters, so
every weight is an nn.Parameter whose state_dict() name equals the tensor name used by the
published checkpoints:

  DFlash / DFlash2 (z-lab):  fc.weight, hidden_norm.weight, norm.weight,
      layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight,
      layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
      layers.{i}.mlp.{gate,up,down}_proj.weight
  DFlash2 adds: layers.{i}.attention_conv.base_kernel [2,K,H],
      layers.{i}.attention_conv.kernel_projection.weight [2*K*G,H], layers.{i}.mlp_conv.* (same),
      candidate_selector.hidden_projection.weight [r,H], candidate_selector.predecessor_codebook
      [V,r], candidate_selector.successor_codebook [V,r]   (the codebooks have no ".weight")
  DSpark (DeepSpec Qwen3DSparkModel) adds: embed_tokens.weight [V,H], lm_head.weight [V,H]
      (frozen copies of the target's), markov_head.markov_w1.weight [V,r] (an Embedding),
      markov_head.markov_w2.weight [V,r] (a Linear r->V), confidence_head.proj.weight [1,D],
      confidence_head.proj.bias [1], D = H (+ r when confidence_head_with_markov).

Conventions used everywhere below:
  * H = hidden size (= the target's), V = vocab (= the target's), B = block size (slots fed to
    the drafter, anchor included), n_t = len(target_layer_ids).
  * Tap ids are 0-based decoder-layer indices; the tap is the OUTPUT of that layer (the residual
    stream before the next layer), i.e. transformers' hidden_states[l + 1] for l < N - 1. The last
    entry of transformers' hidden_states is AFTER the final norm, so taps are captured with forward
    hooks, never read from that tuple.
  * Slot layouts (spec §0): z-lab DFlash/DFlash2 ("mask filling") propose from slots 1..B-1, slot
    j predicting position start + j; DSpark/DeepSpec ("shifted", sample_from_anchor) propose from
    slots 0..B-1, slot j predicting position start + j + 1.
  * Greedy ties: argmax returns the smallest index (torch.argmax's documented first-max rule).
    The selector's candidate list is sorted by descending logit, ties by ascending token id.
  * Sampling is done by inverse CDF with caller-supplied uniforms u in [0,1): the chosen index is
    the first k with cumsum(q)[k] > u (cumsum in float64 over the float32 q), else the last.

Main entry points:
  DrafterConfig.from_dict(cfg)           parse + validate a checkpoint config.json
  Drafter(cfg); load_drafter(dir)        the model; save_drafter(model, dir) writes HF layout
  DraftContextCache                      per-layer context K/V (committed positions < start)
  Drafter.draft_block(...)               one drafter forward over the block (appends context)
  Drafter.logits(hidden, lm_head)        shared-target-head logits (+ multiplier, softcap)
  selector_walk / markov_chain / confidence_logits / confident_prefix_length   heads
  TargetRunner                           a transformers target with tap capture
  greedy_generate / spec_generate        plain greedy and the greedy speculative loop
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

ARCH_DFLASH = "DFlashDraftModel"
ARCH_DFLASH2 = "DFlash2DraftModel"
ARCH_DSPARK = "Qwen3DSparkModel"
KNOWN_ARCHS = (ARCH_DFLASH, ARCH_DFLASH2, ARCH_DSPARK)


class DrafterConfigError(ValueError):
    """A drafter config.json is malformed; the message names the field."""


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

def _lookup(cfg: dict, name: str, default=None):
    """z-lab rule: a key inside dflash_config wins, then the top-level key, then the default."""
    sub = cfg.get("dflash_config") or {}
    if name in sub:
        return sub[name]
    return cfg.get(name, default)


def _require_int(cfg: dict, name: str, lo: int = 1) -> int:
    v = _lookup(cfg, name)
    if v is None:
        raise DrafterConfigError(f"config: missing field '{name}'")
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise DrafterConfigError(f"config: field '{name}' must be an integer >= {lo}, got {v!r}")
    return v


@dataclass
class RopeConfig:
    """The drafter's own RoPE: full head_dim, NEOX (rotate-half) pairing (spec §1.5)."""

    theta: float
    rope_type: str = "default"          # "default" or "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @staticmethod
    def from_config(cfg: dict) -> "RopeConfig":
        # transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...}; older checkpoints
        # write rope_theta at the top level plus an optional rope_scaling {type|rope_type, ...}.
        params = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or {}
        merged = dict(scaling)
        merged.update(params)
        theta = merged.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            raise DrafterConfigError("config: missing rope theta (rope_parameters.rope_theta or rope_theta)")
        theta = float(theta)
        if not theta > 1.0:
            raise DrafterConfigError(f"config: rope theta must be > 1, got {theta}")
        rtype = merged.get("rope_type", merged.get("type", "default")) or "default"
        if rtype not in ("default", "yarn"):
            raise DrafterConfigError(f"config: unsupported rope_type '{rtype}' (default, yarn)")
        rc = RopeConfig(theta=theta, rope_type=rtype)
        if rtype == "yarn":
            if "factor" not in merged:
                raise DrafterConfigError("config: yarn rope needs 'factor'")
            if "original_max_position_embeddings" not in merged:
                raise DrafterConfigError("config: yarn rope needs 'original_max_position_embeddings'")
            rc.factor = float(merged["factor"])
            rc.original_max_position_embeddings = int(merged["original_max_position_embeddings"])
            rc.beta_fast = float(merged.get("beta_fast") or 32.0)
            rc.beta_slow = float(merged.get("beta_slow") or 1.0)
            rc.attention_factor = merged.get("attention_factor")
            rc.mscale = merged.get("mscale")
            rc.mscale_all_dim = merged.get("mscale_all_dim")
            rc.truncate = bool(merged.get("truncate", True))
        return rc


@dataclass
class DrafterConfig:
    arch: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    layer_types: list[str]
    sliding_window: int | None
    layer_causal: list[bool]             # resolved per layer (spec §1.4)
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    sample_from_anchor: bool             # True = shifted (DSpark) layout
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # DFlash2
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    # DSpark
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    raw: dict = field(default_factory=dict)

    @property
    def is_dflash2(self) -> bool:
        return self.arch == ARCH_DFLASH2

    @property
    def is_dspark(self) -> bool:
        return self.arch == ARCH_DSPARK

    @staticmethod
    def from_dict(cfg: dict) -> "DrafterConfig":
        archs = cfg.get("architectures") or []
        if len(archs) != 1 or archs[0] not in KNOWN_ARCHS:
            raise DrafterConfigError(f"config: architectures must be one of {KNOWN_ARCHS}, got {archs!r}")
        arch = archs[0]
        if cfg.get("attention_bias", False):
            raise DrafterConfigError("config: attention_bias=true is not supported by this reference")
        H = _require_int(cfg, "hidden_size")
        nh = _require_int(cfg, "num_attention_heads")
        nkv = _require_int(cfg, "num_key_value_heads")
        if nh % nkv:
            raise DrafterConfigError(f"config: num_attention_heads {nh} not a multiple of num_key_value_heads {nkv}")
        hd = _lookup(cfg, "head_dim") or H // nh
        if hd % 2:
            raise DrafterConfigError(f"config: head_dim must be even for rotate-half RoPE, got {hd}")
        L = _require_int(cfg, "num_hidden_layers")
        layer_types = cfg.get("layer_types") or ["full_attention"] * L
        if len(layer_types) != L or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
            raise DrafterConfigError(f"config: layer_types must list {L} of full_attention/sliding_attention")
        sw = cfg.get("sliding_window")
        if any(t == "sliding_attention" for t in layer_types):
            if not isinstance(sw, int) or sw < 1:
                raise DrafterConfigError(f"config: sliding_window must be a positive integer, got {sw!r}")
        # Causality per layer (spec §1.4 / §9.2): explicit is_causal > dflash_config.causal >
        # (sliding => causal, full => bidirectional). DSpark (DeepSpec) runs every layer
        # bidirectionally (it passes is_causal=False at inference) and applies no window mask.
        is_causal = cfg.get("is_causal")
        sub_causal = (cfg.get("dflash_config") or {}).get("causal")
        if arch == ARCH_DSPARK:
            layer_causal = [False] * L
            sw_eff = None
        else:
            if is_causal is not None:
                layer_causal = [bool(is_causal)] * L
            elif sub_causal is not None:
                layer_causal = [bool(sub_causal)] * L
            else:
                layer_causal = [t == "sliding_attention" for t in layer_types]
            sw_eff = sw
        block_size = _require_int(cfg, "block_size", 1)
        tli = _lookup(cfg, "target_layer_ids")
        if not isinstance(tli, list) or not tli or any(isinstance(x, bool) or not isinstance(x, int) for x in tli):
            raise DrafterConfigError("config: target_layer_ids must be a non-empty list of integers")
        if any(b <= a for a, b in zip(tli, tli[1:])) or tli[0] < 0:
            raise DrafterConfigError(f"config: target_layer_ids must be increasing and >= 0, got {tli}")
        V = _require_int(cfg, "vocab_size")
        mask = _lookup(cfg, "mask_token_id")
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < V:
            raise DrafterConfigError(f"config: mask_token_id must be in [0, vocab_size={V}), got {mask!r}")
        softcap = _lookup(cfg, "final_logit_softcapping")
        dc = DrafterConfig(
            arch=arch, hidden_size=H, intermediate_size=_require_int(cfg, "intermediate_size"),
            num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=int(hd), vocab_size=V,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope=RopeConfig.from_config(cfg),
            layer_types=list(layer_types), sliding_window=sw_eff, layer_causal=layer_causal,
            block_size=block_size, target_layer_ids=list(tli), mask_token_id=mask,
            sample_from_anchor=bool(_lookup(cfg, "sample_from_anchor", arch == ARCH_DSPARK)),
            input_embedding_scale=float(_lookup(cfg, "input_embedding_scale", 1.0)),
            output_multiplier=float(_lookup(cfg, "output_multiplier", 1.0)),
            final_logit_softcapping=(float(softcap) if softcap is not None and float(softcap) > 0 else None),
            raw=cfg,
        )
        if arch == ARCH_DFLASH2:
            if dc.sample_from_anchor:
                raise DrafterConfigError("config: DFlash2 requires sample_from_anchor = false")
            dc.conv_kernel_size = _require_int(cfg, "conv_kernel_size")
            dc.conv_group_size = _require_int(cfg, "conv_group_size")
            if H % dc.conv_group_size:
                raise DrafterConfigError(f"config: conv_group_size {dc.conv_group_size} does not divide hidden_size {H}")
            dc.selector_rank = _require_int(cfg, "selector_rank")
            dc.selector_top_k = _require_int(cfg, "selector_top_k")
            if dc.selector_top_k > V:
                raise DrafterConfigError(f"config: selector_top_k {dc.selector_top_k} > vocab_size {V}")
        if arch == ARCH_DSPARK:
            dc.markov_rank = _require_int(cfg, "markov_rank", 0)
            if dc.markov_rank > 0:
                dc.markov_head_type = str(_lookup(cfg, "markov_head_type", "vanilla")).lower()
                if dc.markov_head_type != "vanilla":
                    raise DrafterConfigError(
                        f"config: markov_head_type '{dc.markov_head_type}' not supported (vanilla only)")
            dc.enable_confidence_head = bool(_lookup(cfg, "enable_confidence_head", False))
            dc.confidence_head_with_markov = bool(_lookup(cfg, "confidence_head_with_markov", False)) \
                and dc.enable_confidence_head
            if dc.confidence_head_with_markov and dc.markov_rank == 0:
                raise DrafterConfigError("config: confidence_head_with_markov needs markov_rank > 0")
        return dc


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: x * rsqrt(mean(x^2) + eps) * weight (weight multiplies directly, no +1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_inv_freq(rc: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] and the cos/sin scale (YaRN's attention factor).

    default: inv_freq[i] = theta^(-2i/d).
    yarn (same formulas as transformers' _compute_yarn_parameters): blend the extrapolated
    theta^(-2i/d) and interpolated theta^(-2i/d)/factor with a linear ramp over the pair index i
    between the correction dims low/high (floor/ceil when truncate), and scale cos and sin by
    attention_factor (default 0.1*ln(factor)+1).
    """
    d = head_dim
    pos_freqs = rc.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    extrap = 1.0 / pos_freqs
    if rc.rope_type == "default":
        return extrap, 1.0
    factor = rc.factor

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = rc.attention_factor
    if att is None:
        if rc.mscale and rc.mscale_all_dim:
            att = get_mscale(factor, rc.mscale) / get_mscale(factor, rc.mscale_all_dim)
        else:
            att = get_mscale(factor)

    def corr_dim(n_rot):
        return (d * math.log(rc.original_max_position_embeddings / (n_rot * 2 * math.pi))) / (2 * math.log(rc.theta))

    low, high = corr_dim(rc.beta_fast), corr_dim(rc.beta_slow)
    if rc.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrap_factor = 1 - ramp
    interp = 1.0 / (factor * pos_freqs)
    inv_freq = interp * (1 - extrap_factor) + extrap * extrap_factor
    return inv_freq, float(att)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    """NEOX rotate-half RoPE over the full head_dim. x: [T, heads, d], pos: [T] absolute positions."""
    freqs = pos.to(torch.float32)[:, None] * inv_freq[None, :]          # [T, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)                              # [T, d]
    cos = (emb.cos() * scale)[:, None, :]
    sin = (emb.sin() * scale)[:, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attention_visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """[Tq, Tk] bool: which keys a block query sees (spec §1.4).

    Keys are all cached context positions < start plus every block slot. causal: key <= query.
    sliding window W: query - key < W, and for a bidirectional layer also key - query < W.
    """
    qp = q_pos[:, None]
    kp = k_pos[None, :]
    vis = torch.ones(qp.shape[0], kp.shape[1], dtype=torch.bool)
    if causal:
        vis &= kp <= qp
    if window is not None:
        vis &= (qp - kp) < window
        if not causal:
            vis &= (kp - qp) < window
    return vis


class GroupedDynamicCausalConv(nn.Module):
    """DFlash2 two-stage grouped dynamic causal conv (spec §3.1), block-local and stateless.

    base_kernel [2 (stage: 0 prepare / 1 finish), K (tap), H]; kernel_projection: H -> 2*K*G
    (G = H / group_size), computed once from the NORMED sublayer input and viewed as
    [T, 2, K, G]. For a stage s: out[t, c] = sum_o (base[s,o,c] + dyn[t,s,o,c//group]) * z[t-o, c],
    z[t-o] = 0 when t-o < 0 (taps never reach the context or an earlier round).
    """

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.group_size = group_size
        # identity at initialization (spec §3.1): tap 0 passes the input through, no dynamic part
        base = torch.zeros(2, kernel_size, hidden)
        base[:, 0, :] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * (hidden // group_size), bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def _convolve(self, z: torch.Tensor, dyn: torch.Tensor, stage: int) -> torch.Tensor:
        T, H = z.shape
        out = torch.zeros_like(z)
        for o in range(self.kernel_size):
            shifted = torch.zeros_like(z)
            shifted[o:] = z[: T - o]
            per_channel = dyn[:, o, :].repeat_interleave(self.group_size, dim=1)   # [T, H]
            out = out + self.base_kernel[stage, o][None, :] * shifted + per_channel * shifted
        return out

    def prepare(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u: normed sublayer input [T, H] -> (stage-0 conv of u, dynamic taps for stage 1)."""
        dyn = self.kernel_projection(u).view(u.shape[0], 2, self.kernel_size, -1)
        return self._convolve(u, dyn[:, 0], 0), dyn[:, 1]

    def finish(self, y: torch.Tensor, dyn1: torch.Tensor) -> torch.Tensor:
        """y: sublayer output [T, H] -> stage-1 conv with the taps from prepare()."""
        return self._convolve(y, dyn1, 1)


# ---------------------------------------------------------------------------------------------
# Drafter layers
# ---------------------------------------------------------------------------------------------

class DraftContextCache:
    """Per drafter layer: K (after k_norm and RoPE at the context position) and V of the fused
    context features, for every committed position < start, appended in order. Block K/V are
    never stored (spec §1.7, §9.4)."""

    def __init__(self, num_layers: int):
        self.k = [None] * num_layers   # [n, kv_heads, d]
        self.v = [None] * num_layers
        self.pos = torch.zeros(0, dtype=torch.long)

    @property
    def length(self) -> int:
        return int(self.pos.shape[0])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.k[layer] = k if self.k[layer] is None else torch.cat([self.k[layer], k], 0)
        self.v[layer] = v if self.v[layer] is None else torch.cat([self.v[layer], v], 0)


class DraftAttention(nn.Module):
    def __init__(self, dc: DrafterConfig, layer_idx: int):
        super().__init__()
        H, nh, nkv, hd = dc.hidden_size, dc.num_heads, dc.num_kv_heads, dc.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, dc.rms_norm_eps)
        self.k_norm = RMSNorm(hd, dc.rms_norm_eps)
        self.causal = dc.layer_causal[layer_idx]
        self.window = dc.sliding_window if dc.layer_types[layer_idx] == "sliding_attention" else None

    def context_kv(self, c: torch.Tensor, pos: torch.Tensor, inv_freq, scale):
        """KV injection: project fused context rows c [n, H] with this layer's own K/V."""
        k = self.k_norm(self.k_proj(c).view(c.shape[0], self.nkv, self.hd))
        v = self.v_proj(c).view(c.shape[0], self.nkv, self.hd)
        return apply_rope(k, pos, inv_freq, scale), v

    def forward(self, u, blk_pos, ctx_k, ctx_v, ctx_pos, inv_freq, scale):
        """u: block rows [B, H] (normed, conv-prepared); ctx_*: cached context for this layer."""
        B = u.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(u).view(B, self.nh, self.hd)), blk_pos, inv_freq, scale)
        kb = apply_rope(self.k_norm(self.k_proj(u).view(B, self.nkv, self.hd)), blk_pos, inv_freq, scale)
        vb = self.v_proj(u).view(B, self.nkv, self.hd)
        if ctx_k is not None:
            k, v, kpos = torch.cat([ctx_k, kb], 0), torch.cat([ctx_v, vb], 0), torch.cat([ctx_pos, blk_pos])
        else:
            k, v, kpos = kb, vb, blk_pos
        rep = self.nh // self.nkv                                   # q head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.hd)
        vis = attention_visible(blk_pos, kpos, self.causal, self.window)
        scores = scores.masked_fill(~vis[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("hqk,khd->qhd", probs, v).reshape(B, self.nh * self.hd)
        return self.o_proj(out)


class DraftMLP(nn.Module):
    def __init__(self, H: int, I: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Qwen3 pre-norm decoder layer with KV injection; DFlash2 wraps attention and MLP in convs."""

    def __init__(self, dc: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DraftAttention(dc, layer_idx)
        self.mlp = DraftMLP(dc.hidden_size, dc.intermediate_size)
        self.input_layernorm = RMSNorm(dc.hidden_size, dc.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(dc.hidden_size, dc.rms_norm_eps)
        if dc.is_dflash2:
            self.attention_conv = GroupedDynamicCausalConv(dc.hidden_size, dc.conv_kernel_size, dc.conv_group_size)
            self.mlp_conv = GroupedDynamicCausalConv(dc.hidden_size, dc.conv_kernel_size, dc.conv_group_size)
        else:
            self.attention_conv = None
            self.mlp_conv = None

    def forward(self, x, blk_pos, ctx_k, ctx_v, ctx_pos, inv_freq, scale):
        u = self.input_layernorm(x)
        if self.attention_conv is not None:
            u, dyn = self.attention_conv.prepare(u)
        a = self.self_attn(u, blk_pos, ctx_k, ctx_v, ctx_pos, inv_freq, scale)
        if self.attention_conv is not None:
            a = self.attention_conv.finish(a, dyn)
        x = x + a
        u = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            u, dyn = self.mlp_conv.prepare(u)
        m = self.mlp(u)
        if self.mlp_conv is not None:
            m = self.mlp_conv.finish(m, dyn)
        return x + m


class CandidateSelector(nn.Module):
    """DFlash2 low-rank bigram selector parameters (spec §3.2)."""

    def __init__(self, dc: DrafterConfig):
        super().__init__()
        r = dc.selector_rank
        self.top_k = dc.selector_top_k
        self.hidden_projection = nn.Linear(dc.hidden_size, r, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(dc.vocab_size, r))
        self.successor_codebook = nn.Parameter(torch.zeros(dc.vocab_size, r))


class MarkovHead(nn.Module):
    """DSpark vanilla low-rank Markov head: bias(prev) = W2 . W1[prev] (spec §4.2)."""

    def __init__(self, V: int, r: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = nn.Linear(r, V, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)


class Drafter(nn.Module):
    """DFlash / DFlash2 / DSpark drafter backbone plus heads."""

    def __init__(self, dc: DrafterConfig):
        super().__init__()
        self.dc = dc
        H = dc.hidden_size
        self.fc = nn.Linear(len(dc.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, dc.rms_norm_eps)
        self.layers = nn.ModuleList([DraftLayer(dc, i) for i in range(dc.num_layers)])
        self.norm = RMSNorm(H, dc.rms_norm_eps)
        self.candidate_selector = CandidateSelector(dc) if dc.is_dflash2 else None
        self.markov_head = None
        self.confidence_head = None
        if dc.is_dspark:
            self.embed_tokens = nn.Embedding(dc.vocab_size, H)
            self.lm_head = nn.Linear(H, dc.vocab_size, bias=False)
            self.markov_head = MarkovHead(dc.vocab_size, dc.markov_rank) if dc.markov_rank > 0 else None
            if dc.enable_confidence_head:
                self.confidence_head = ConfidenceHead(H + (dc.markov_rank if dc.confidence_head_with_markov else 0))
            else:
                self.confidence_head = None
        inv_freq, scale = rope_inv_freq(dc.rope, dc.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scale = scale

    # -- backbone ---------------------------------------------------------------------------

    def fuse_context(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [n, n_t*H] (tap outputs concatenated in target_layer_ids order) -> c [n, H]."""
        return self.hidden_norm(self.fc(feats))

    def block_embeddings(self, anchor: int, block_size: int, embed_weight: torch.Tensor) -> torch.Tensor:
        """[anchor, mask x (B-1)] embedded with the TARGET's raw table, times input_embedding_scale."""
        ids = torch.tensor([anchor] + [self.dc.mask_token_id] * (block_size - 1), dtype=torch.long)
        return F.embedding(ids, embed_weight) * self.dc.input_embedding_scale

    def draft_block(self, cache: DraftContextCache, new_feats: torch.Tensor, start: int,
                    anchor: int, block_size: int, embed_weight: torch.Tensor) -> torch.Tensor:
        """One drafter forward. new_feats [n, n_t*H] are the committed rows at positions
        cache.length .. start-1 (the caller feeds exactly the rows not yet in the cache). They are
        fused, projected per layer and appended to the cache; then the block [anchor, mask..] at
        positions start..start+B-1 attends over cache + block. Returns final-normed block hidden
        [B, H]. Block K/V are not cached."""
        n_new = new_feats.shape[0]
        if cache.length + n_new != start:
            raise ValueError(f"draft_block: context covers {cache.length}+{n_new} positions, start={start}")
        ctx_pos_new = torch.arange(cache.length, start, dtype=torch.long)
        if n_new > 0:
            c = self.fuse_context(new_feats)
            for i, layer in enumerate(self.layers):
                k, v = layer.self_attn.context_kv(c, ctx_pos_new, self.inv_freq, self.rope_scale)
                cache.append(i, k, v)
            cache.pos = torch.cat([cache.pos, ctx_pos_new])
        blk_pos = torch.arange(start, start + block_size, dtype=torch.long)
        x = self.block_embeddings(anchor, block_size, embed_weight)
        for i, layer in enumerate(self.layers):
            x = layer(x, blk_pos, cache.k[i], cache.v[i], cache.pos, self.inv_freq, self.rope_scale)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Draft logits from the shared target head: (h @ W^T) * output_multiplier, then the
        optional softcap c*tanh(l/c)."""
        out = hidden @ lm_head_weight.t() * self.dc.output_multiplier
        if self.dc.final_logit_softcapping is not None:
            cap = self.dc.final_logit_softcapping
            out = torch.tanh(out / cap) * cap
        return out

    def embed_table(self, target_embed: torch.Tensor) -> torch.Tensor:
        """Block-input embedding table: DSpark (DeepSpec) uses its own embed_tokens copy of the
        target's table; DFlash/DFlash2 ship none and use the target's."""
        return self.embed_tokens.weight if self.dc.is_dspark else target_embed

    def head_weight(self, target_head: torch.Tensor) -> torch.Tensor:
        """Output head: DSpark's own lm_head copy, else the shared target lm_head."""
        return self.lm_head.weight if self.dc.is_dspark else target_head

    def proposal_rows(self, block_size: int) -> slice:
        """Block slots that carry proposals: 1..B-1 (z-lab) or 0..B-1 (shifted / DSpark)."""
        return slice(0, block_size) if self.dc.sample_from_anchor else slice(1, block_size)


# ---------------------------------------------------------------------------------------------
# Heads: selector walk (DFlash2), Markov chain and confidence (DSpark)
# ---------------------------------------------------------------------------------------------

def inverse_cdf(q: torch.Tensor, u: float) -> int:
    """First index k with cumsum(q)[k] > u (cumsum in float64), else the last index."""
    c = torch.cumsum(q.double(), 0)
    hits = (c > u).nonzero()
    return int(hits[0, 0]) if hits.numel() else int(q.shape[0] - 1)


def sorted_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: top-k values and ids, sorted by descending value, ties by ascending id."""
    vals, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return vals[..., :k], ids[..., :k]


@dataclass
class SelectorResult:
    tokens: list[int]             # chosen path d_1..d_n
    cand_ids: torch.Tensor        # [n, K] int64, sorted candidate ids per proposal slot
    cand_logits: torch.Tensor     # [n, K] unary scores U_p (raw draft logits of the candidates)
    scores: torch.Tensor          # [n, K] full scores along the walked path
    chosen: list[int]             # index into the candidate list per slot
    q: torch.Tensor | None        # [n, K] softmax(scores / T) when T > 0


def selector_walk(model: Drafter, logits: torch.Tensor, hidden: torch.Tensor, anchor: int,
                  temperature: float = 0.0, uniforms: list[float] | None = None) -> SelectorResult:
    """DFlash2 candidate selector over the proposal slots (spec §3.2).

    logits/hidden: [n, V] / [n, H] of the proposal slots (z-lab slots 1..B-1), logits already
    through output_multiplier/softcap. score_p(prev -> c) = U_p[c] + <A[prev] * (P h_p), Bc[c]>
    for c among the top-K of logits_p. Greedy: argmax score (first max in candidate order).
    T > 0: q_p = softmax(score / T) over the K candidates, sampled by inverse CDF with u_p.
    """
    sel = model.candidate_selector
    A, Bc = sel.predecessor_codebook, sel.successor_codebook
    vals, ids = sorted_top_k(logits, sel.top_k)
    g = sel.hidden_projection(hidden)
    prev = anchor
    tokens, chosen, score_rows, q_rows = [], [], [], []
    for p in range(logits.shape[0]):
        s = vals[p] + (Bc[ids[p]] @ (A[prev] * g[p]))
        if temperature > 0:
            q = torch.softmax(s / temperature, dim=-1)
            k = inverse_cdf(q, uniforms[p])
            q_rows.append(q)
        else:
            k = int(torch.argmax(s))
        prev = int(ids[p, k])
        tokens.append(prev)
        chosen.append(k)
        score_rows.append(s)
    return SelectorResult(tokens, ids, vals, torch.stack(score_rows) if score_rows else vals,
                          chosen, torch.stack(q_rows) if q_rows else None)


@dataclass
class MarkovResult:
    tokens: list[int]             # x_1..x_n
    corrected: torch.Tensor       # [n, V] z_k = U_k + W2 W1[x_{k-1}]
    prev_tokens: list[int]        # x_0..x_{n-1} (x_0 = anchor)
    q: torch.Tensor | None        # [n, V] softmax(z / T) when T > 0


def markov_chain(model: Drafter, base_logits: torch.Tensor, anchor: int,
                 temperature: float = 0.0, uniforms: list[float] | None = None) -> MarkovResult:
    """DSpark sequential correction, left to right from the anchor (spec §4.2). base_logits:
    [n, V] of the proposal slots (shifted layout: slots 0..B-1). Without a Markov head it is the
    plain per-slot argmax / sample."""
    mh = model.markov_head
    prev = anchor
    toks, rows, prevs, qs = [], [], [], []
    for k in range(base_logits.shape[0]):
        z = base_logits[k]
        if mh is not None:
            z = z + mh.markov_w2(mh.markov_w1.weight[prev])
        if temperature > 0:
            q = torch.softmax(z / temperature, dim=-1)
            x = inverse_cdf(q, uniforms[k])
            qs.append(q)
        else:
            x = int(torch.argmax(z))
        prevs.append(prev)
        toks.append(x)
        rows.append(z)
        prev = x
    return MarkovResult(toks, torch.stack(rows), prevs, torch.stack(qs) if qs else None)


def confidence_logits(model: Drafter, hidden: torch.Tensor, prev_tokens: list[int]) -> torch.Tensor | None:
    """DSpark confidence head: raw logit per proposal slot, c_k = sigmoid(logit). Input is the
    final-normed slot hidden h_k, concatenated with W1[x_{k-1}] when confidence_head_with_markov
    (x_0 = anchor, then the Markov-chained proposals)."""
    ch = model.confidence_head
    if ch is None:
        return None
    feats = hidden
    if model.dc.confidence_head_with_markov:
        feats = torch.cat([hidden, model.markov_head.markov_w1.weight[torch.tensor(prev_tokens)]], dim=-1)
    return ch.proj(feats)[:, 0]


def confident_prefix_length(conf_logits: torch.Tensor | None, threshold: float) -> int:
    """Static threshold truncation (DeepSpec eval): keep slots before the first k with
    sigmoid(logit_k) < threshold; threshold <= 0 keeps all. 0 means verify the anchor only."""
    if conf_logits is None or threshold <= 0.0:
        return int(conf_logits.shape[0]) if conf_logits is not None else -1
    below = (torch.sigmoid(conf_logits) < threshold).nonzero()
    return int(below[0, 0]) if below.numel() else int(conf_logits.shape[0])


# ---------------------------------------------------------------------------------------------
# Checkpoint I/O (HF layout: config.json + model.safetensors)
# ---------------------------------------------------------------------------------------------

def load_drafter(path: str) -> Drafter:
    from safetensors.torch import load_file
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    dc = DrafterConfig.from_dict(cfg)
    model = Drafter(dc)
    sd = load_file(os.path.join(path, "model.safetensors"))
    want = model.state_dict()
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise DrafterConfigError(f"{path}: tensors missing {missing[:5]} unexpected {extra[:5]}")
    for k, v in sd.items():
        if tuple(v.shape) != tuple(want[k].shape):
            raise DrafterConfigError(f"{path}: tensor {k} has shape {tuple(v.shape)}, expected {tuple(want[k].shape)}")
    model.load_state_dict({k: v.float() for k, v in sd.items()})
    return model.eval()


def save_drafter(model: Drafter, path: str):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model.dc.raw, f, indent=2, sort_keys=True)
        f.write("\n")
    sd = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


# ---------------------------------------------------------------------------------------------
# Target with tap capture, greedy decoding and the greedy speculative loop
# ---------------------------------------------------------------------------------------------

class TargetRunner:
    """Wraps a transformers causal LM (Qwen3_5ForCausalLM). forward(tokens) recomputes the whole
    sequence from scratch (no cache): the simplest way to make "roll back to the committed
    prefix" exact, since nothing but the committed tokens is ever kept between calls."""

    def __init__(self, hf_model, tap_ids: list[int]):
        self.model = hf_model.eval()
        self.tap_ids = list(tap_ids)
        self._caps: dict[int, torch.Tensor] = {}
        layers = self.model.model.layers
        for l in self.tap_ids:
            if not 0 <= l < len(layers):
                raise ValueError(f"tap layer {l} outside the target's {len(layers)} layers")
        self._hooks = [layers[l].register_forward_hook(self._hook(l)) for l in self.tap_ids]
        self.embed_weight = self.model.get_input_embeddings().weight.detach()
        self.lm_head_weight = self.model.lm_head.weight.detach()
        self.forward_calls = 0

    def _hook(self, l):
        def fn(mod, inp, out):
            self._caps[l] = (out[0] if isinstance(out, tuple) else out).detach()
        return fn

    @torch.no_grad()
    def forward(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> logits [T, V] f32, taps [T, n_t*H] (tap outputs concatenated in tap order)."""
        self.forward_calls += 1
        ids = torch.tensor([tokens], dtype=torch.long)
        out = self.model(input_ids=ids, use_cache=False)
        taps = torch.cat([self._caps[l][0] for l in self.tap_ids], dim=-1)
        return out.logits[0].float(), taps.float()


def greedy_generate(target: TargetRunner, prompt: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding; token t+1 = argmax of logits at t from a full forward over 0..t.
    Also returns the top-1 minus top-2 logit margin of every emitted token (near-tie audit)."""
    toks = list(prompt)
    margins = []
    for _ in range(max_new):
        logits, _ = target.forward(toks)
        top2 = torch.topk(logits[-1], 2).values
        margins.append(float(top2[0] - top2[1]))
        toks.append(int(torch.argmax(logits[-1])))
    return toks[len(prompt):], margins


@dataclass
class SpecRound:
    start: int                    # position of the anchor b
    anchor: int
    proposals: list[int]          # drafted tokens d (len = n)
    n_ctx_fed: int                # context rows appended to the draft cache this round
    accepted: int                 # a = longest agreeing prefix
    bonus: int
    committed: int                # tokens emitted this round after the max_new clamp (<= a+1)


def propose(model: Drafter, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, block_size: int,
            proposer: str, conf_threshold: float = 0.0) -> list[int]:
    """Proposals for one round from the block outputs (greedy)."""
    rows = model.proposal_rows(block_size)
    h, l = hidden[rows], logits[rows]
    if proposer == "argmax":
        return [int(t) for t in torch.argmax(l, dim=-1)]
    if proposer == "selector":
        return selector_walk(model, l, h, anchor).tokens
    if proposer == "markov":
        mr = markov_chain(model, l, anchor)
        keep = len(mr.tokens)
        if conf_threshold > 0 and model.confidence_head is not None:
            keep = confident_prefix_length(confidence_logits(model, h, mr.prev_tokens), conf_threshold)
        return mr.tokens[:keep]
    raise ValueError(f"unknown proposer {proposer}")


def default_proposer(model: Drafter) -> str:
    if model.dc.is_dflash2:
        return "selector"
    if model.dc.is_dspark:
        return "markov"
    return "argmax"


@torch.no_grad()
def spec_generate(target: TargetRunner, model: Drafter, prompt: list[int], max_new: int,
                  block_size: int, proposer: str | None = None, conf_threshold: float = 0.0):
    """Greedy speculative decoding (spec §2.1, DeepSpec loop for the shifted layout).

    prefill -> b = argmax at P-1, start = P, draft context pending = taps of rows 0..P-1
    loop: draft (append pending rows, block [b, mask..] at start..start+B-1; always the full B)
          -> proposals d_1..d_n -> verify [b, d_1..d_n] at start..start+n -> y_j = argmax row j
          -> a = longest prefix with d_{j+1} == y_j -> commit d_1..d_a and the bonus y_a
          -> pending = taps of rows start..start+a (a+1 rows) -> b = y_a, start += a+1.
    The output is truncated to max_new tokens (the last round's commit is clamped, the draft and
    verify are not shortened). Returns (tokens, rounds).
    """
    proposer = proposer or default_proposer(model)
    logits, taps = target.forward(prompt)
    b = int(torch.argmax(logits[-1]))
    out = list(prompt) + [b]
    start = len(prompt)
    pending = taps
    cache = DraftContextCache(model.dc.num_layers)
    rounds: list[SpecRound] = []
    while len(out) - len(prompt) < max_new:
        hidden = model.draft_block(cache, pending, start, b, block_size, model.embed_table(target.embed_weight))
        dlogits = model.logits(hidden, model.head_weight(target.lm_head_weight))
        d = propose(model, hidden, dlogits, b, block_size, proposer, conf_threshold)
        verify = [b] + d
        vlogits, vtaps = target.forward(out[:start] + verify)
        y = [int(t) for t in torch.argmax(vlogits[start:start + len(verify)], dim=-1)]
        a = 0
        while a < len(d) and d[a] == y[a]:
            a += 1
        bonus = y[a]
        new = d[:a] + [bonus]
        remaining = max_new - (len(out) - len(prompt))
        rounds.append(SpecRound(start, b, d, int(pending.shape[0]), a, bonus, min(len(new), remaining)))
        out += new
        pending = vtaps[start:start + a + 1]
        b = bonus
        start += a + 1
    return out[len(prompt):len(prompt) + max_new], rounds


# ---------------------------------------------------------------------------------------------
# Training (teacher-forced block loss; the starting point for training tiny drafters)
# ---------------------------------------------------------------------------------------------

def block_loss(model: Drafter, feats: torch.Tensor, tokens: list[int], anchor_pos: int,
               block_size: int, embed: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of one anchor block against the target's own continuation.

    feats [T, n_t*H] are the target taps of the whole sequence `tokens`; the block at anchor
    position a sees the context rows 0..a-1 (as at inference: context < start). z-lab layout:
    slot j (1..B-1) predicts tokens[a+j]; shifted layout: slot j (0..B-1) predicts tokens[a+j+1],
    and a DSpark Markov head is teacher-forced with the true previous token (DeepSpec training).
    The DFlash paper's position decay w_k = exp(-(k-1)/gamma) is left out (uniform weights).
    """
    a = anchor_pos
    hidden = model.draft_block(DraftContextCache(model.dc.num_layers), feats[:a], a, tokens[a], block_size, embed)
    rows = model.proposal_rows(block_size)
    logits = model.logits(hidden[rows], head)
    labels = torch.tensor(tokens[a + 1:a + 1 + logits.shape[0]], dtype=torch.long)
    if model.dc.is_dspark and model.markov_head is not None:
        prev = torch.tensor(tokens[a:a + logits.shape[0]], dtype=torch.long)
        logits = logits + model.markov_head.markov_w2(model.markov_head.markov_w1(prev))
    return F.cross_entropy(logits, labels)
