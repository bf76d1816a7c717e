#!/usr/bin/env python3
# tests/oracle/test_convert.py: `dspec convert` against an independent numpy re-statement of
# llama.cpp's converter layout (target-qwen35.md §3.1-§3.3, §3.5, §3.9, llama-quant.cpp).
#
# For every committed tiny checkpoint (tests/fixtures/target/*/hf_f32 and hf_bf16, made by
# transformers) and for synthetic checkpoints built here with numpy (n_embd 256 so the k-quants
# apply without fallbacks; VLM-style nested config with model.language_model. names, vision
# tensors, MTP tensors, a sharded index, bf16; an 8-expert MoE with per-expert tensors), it runs
# `dspec convert --type T` for every T and checks, with gguf-py's GGUFReader:
#   * the exact tensor set: names, ne, ggml types (types from an independent Python version of
#     the converter/llama-quantize rules), and no extra tensors;
#   * the metadata: every key of §3.1 with its GGUF value type and value, and no extra keys;
#   * the data: F32 bit-exact against the transforms done here in numpy (tiled V reorder via an
#     axis swap, cross-checked with the §3.5 index formula; norms +1; -exp(A_log); conv squeeze;
#     q/gate interleave untouched; expert split/stack), F16/BF16 bit-exact after numpy rounding,
#     quantized tensors dequantized by gguf.quants within a per-type tolerance;
#   * tied models have no output.weight; --no-mtp drops blk.N and nextn_predict_layers;
#   * error cases exit non-zero with a message naming the problem and leave no output file.
# Runs with numpy + gguf only (the CI venv): safetensors are read and written here by hand.
# Prints "N passed, M failed" and exits non-zero on any failure.

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType as QT
from gguf.quants import dequantize

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "target")

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"]
FTYPE_NUM = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18,
             "iq4_xs": 30, "bf16": 32}
BASE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_k_m": QT.Q4_K,
        "q5_k_m": QT.Q5_K, "q6_k": QT.Q6_K, "iq4_xs": QT.IQ4_XS}
BLOCK = {QT.F32: 1, QT.F16: 1, QT.BF16: 1, QT.Q8_0: 32, QT.Q5_0: 32, QT.Q5_1: 32, QT.IQ4_NL: 32,
         QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256, QT.IQ4_XS: 256}
# Relative RMS error of a dequantized tensor vs its f32 source. Bounds are ~2x the typical error
# of each format on Gaussian data (q8_0 ~0.4%, q6_k ~1%, q5 ~2.5%, 4-bit ~5-6%).
REL_RMS_TOL = {QT.Q8_0: 0.01, QT.Q6_K: 0.02, QT.Q5_K: 0.05, QT.Q5_0: 0.06, QT.Q5_1: 0.05,
               QT.Q4_K: 0.10, QT.IQ4_XS: 0.10, QT.IQ4_NL: 0.10}


# ---------------------------------------------------------------------------------------------
# safetensors, by hand (8-byte header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------------------------

def st_read_file(path):
    with open(path, "rb") as f:
        buf = f.read()
    (hlen,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name}: dtype {dt}")
        out[name] = (arr.reshape(info["shape"]).astype(np.float32), dt)
    return out


def st_read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
        out = {}
        for f in files:
            out.update(st_read_file(os.path.join(d, f)))
        return out
    return st_read_file(os.path.join(d, "model.safetensors"))


def st_write_file(path, tensors):
    """tensors: name -> (float32 array, dtype 'F32' | 'BF16' | 'F16')."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr, dt = tensors[name]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if dt == "F32":
            raw = arr.astype("<f4").tobytes()
        elif dt == "F16":
            raw = arr.astype("<f2").tobytes()
        elif dt == "BF16":
            raw = (arr.view(np.uint32) >> 16).astype("<u2").tobytes()  # values are bf16-exact
        else:
            raise ValueError(dt)
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_write_sharded(d, tensors, n_shards):
    names = sorted(tensors)
    weight_map = {}
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::n_shards]}
        st_write_file(os.path.join(d, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# ---------------------------------------------------------------------------------------------
# expected layout (written from the spec, independent of the C code)
# ---------------------------------------------------------------------------------------------

class HP:
    def __init__(self, cfg):
        m = dict(cfg)
        if isinstance(cfg.get("text_config"), dict):
            m.update(cfg["text_config"])
        mt = m.get("model_type", "")
        self.moe = "moe" in mt or "Moe" in (cfg.get("architectures") or [""])[0]
        self.arch = "qwen35moe" if self.moe else "qwen35"
        self.n_vocab, self.n_embd = m["vocab_size"], m["hidden_size"]
        self.n_layer = m["num_hidden_layers"]
        self.n_head, self.n_head_kv, self.hd = (m["num_attention_heads"],
                                                m["num_key_value_heads"], m["head_dim"])
        self.n_ff = m.get("intermediate_size")
        self.n_ctx, self.eps = m["max_position_embeddings"], m["rms_norm_eps"]
        rp = m.get("rope_parameters") or m.get("rope_scaling") or {}
        self.theta = rp.get("rope_theta", m.get("rope_theta"))
        self.prf = m.get("partial_rotary_factor", rp.get("partial_rotary_factor", 0.25))
        sec = list(rp.get("mrope_section", [11, 11, 10]))
        self.sections = sec + [0] * (4 - len(sec))
        self.d_conv, self.d = m["linear_conv_kernel_dim"], m["linear_key_head_dim"]
        self.hk, self.hv = m["linear_num_key_heads"], m["linear_num_value_heads"]
        self.interval = m.get("full_attention_interval", 4)
        self.n_mtp = m.get("mtp_num_hidden_layers", 0)
        self.tie = m.get("tie_word_embeddings", False)
        if self.moe:
            self.n_exp, self.n_used = m["num_experts"], m["num_experts_per_tok"]
            self.n_ff_exp, self.n_ff_sh = m["moe_intermediate_size"], m["shared_expert_intermediate_size"]

    def full(self, il):
        return (il + 1) % self.interval == 0


def vhead_src(g, hk, hv):
    """target-qwen35.md §3.5: GGUF (tiled) head g holds HF (grouped) head (g mod hk)*r + g//hk."""
    r = hv // hk
    return (g % hk) * r + g // hk


def tile_axis(x, axis, hk, hv, block):
    """Grouped -> tiled along `axis` (hv blocks of `block`): view as (hk, r, block), swap."""
    r = hv // hk
    sh = list(x.shape)
    y = x.reshape(sh[:axis] + [hk, r, block] + sh[axis + 1:])
    y = np.swapaxes(y, axis, axis + 1)
    out = np.ascontiguousarray(y).reshape(sh)
    # cross-check against the §3.5 index formula
    idx = np.concatenate([np.arange(block) + vhead_src(g, hk, hv) * block for g in range(hv)])
    assert np.array_equal(out, np.take(x, idx, axis=axis)), "axis swap != §3.5 formula"
    return out


def canon(name):
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def expected(hp, src, no_mtp):
    """GGUF name -> (torch-order float32 array, converter n_dims, op) for a checkpoint."""
    S, D = {}, {}
    for k, v in src.items():
        if k.startswith(("model.visual.", "visual.")):
            continue
        S[canon(k)], D[canon(k)] = v

    def f16_ops(name, x):
        # convert_hf_to_gguf.py widens only BF16 to F32 before its transforms: for an F16
        # checkpoint `+ 1` and `-exp` happen in F16.
        return x.astype(np.float16).astype(np.float32) if D[name] == "F16" else x

    def plus1(name):
        return f16_ops(name, S[name] + np.float32(1))
    has_mtp = any(k.startswith("mtp.") for k in S)
    n_mtp = hp.n_mtp if (has_mtp and not no_mtp) else 0
    E, d, hk, hv = hp.n_embd, hp.d, hp.hk, hp.hv
    kd = hk * d
    out = {}

    def put(name, arr, n_dims=None, op=None):
        out[name] = (np.ascontiguousarray(arr, dtype=np.float32),
                     arr.ndim if n_dims is None else n_dims, op)

    put("token_embd.weight", S["model.embed_tokens.weight"])
    put("output_norm.weight", plus1("model.norm.weight"), op="+1")
    if "lm_head.weight" in S:
        put("output.weight", S["lm_head.weight"])

    def block(p, il, full):
        put(f"blk.{il}.attn_norm.weight", plus1(p + "input_layernorm.weight"), op="+1")
        put(f"blk.{il}.post_attention_norm.weight",
            plus1(p + "post_attention_layernorm.weight"), op="+1")
        if full:
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                           ("o_proj", "attn_output")):
                put(f"blk.{il}.{gg}.weight", S[p + f"self_attn.{hf}.weight"])
            for hf, gg in (("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                put(f"blk.{il}.{gg}.weight", plus1(p + f"self_attn.{hf}.weight"),
                    op="+1")
        else:
            la = p + "linear_attn."
            qkv = S[la + "in_proj_qkv.weight"]
            put(f"blk.{il}.attn_qkv.weight",
                np.concatenate([qkv[:2 * kd], tile_axis(qkv[2 * kd:], 0, hk, hv, d)]))
            put(f"blk.{il}.attn_gate.weight", tile_axis(S[la + "in_proj_z.weight"], 0, hk, hv, d))
            put(f"blk.{il}.ssm_beta.weight", tile_axis(S[la + "in_proj_b.weight"], 0, hk, hv, 1))
            put(f"blk.{il}.ssm_alpha.weight", tile_axis(S[la + "in_proj_a.weight"], 0, hk, hv, 1))
            conv = S[la + "conv1d.weight"].reshape(-1, hp.d_conv)  # squeeze [C,1,K] -> [C,K]
            put(f"blk.{il}.ssm_conv1d.weight",
                np.concatenate([conv[:2 * kd], tile_axis(conv[2 * kd:], 0, hk, hv, d)]))
            put(f"blk.{il}.ssm_dt.bias", tile_axis(S[la + "dt_bias"], 0, hk, hv, 1))
            put(f"blk.{il}.ssm_a",
                f16_ops(la + "A_log", -np.exp(tile_axis(S[la + "A_log"], 0, hk, hv, 1))), op="-exp")
            put(f"blk.{il}.ssm_norm.weight", S[la + "norm.weight"])  # no +1
            put(f"blk.{il}.ssm_out.weight", tile_axis(S[la + "out_proj.weight"], 1, hk, hv, d))
        mp = p + "mlp."
        if not hp.moe:
            for w, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                put(f"blk.{il}.{gg}.weight", S[mp + f"{w}.weight"])
            return
        put(f"blk.{il}.ffn_gate_inp.weight", S[mp + "gate.weight"])
        put(f"blk.{il}.ffn_gate_inp_shexp.weight", S[mp + "shared_expert_gate.weight"])
        for w, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"),
                      ("down_proj", "ffn_down_shexp")):
            put(f"blk.{il}.{gg}.weight", S[mp + f"shared_expert.{w}.weight"])
        if mp + "experts.gate_up_proj" in S:
            gu, F = S[mp + "experts.gate_up_proj"], hp.n_ff_exp
            put(f"blk.{il}.ffn_gate_exps.weight", gu[:, :F, :])
            put(f"blk.{il}.ffn_up_exps.weight", gu[:, F:, :])
            put(f"blk.{il}.ffn_down_exps.weight", S[mp + "experts.down_proj"])
        else:
            for w, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                          ("down_proj", "ffn_down_exps")):
                put(f"blk.{il}.{gg}.weight",
                    np.stack([S[mp + f"experts.{e}.{w}.weight"] for e in range(hp.n_exp)]))

    for il in range(hp.n_layer):
        block(f"model.layers.{il}.", il, hp.full(il))
    for j in range(n_mtp):
        il = hp.n_layer + j
        block(f"mtp.layers.{j}.", il, True)
        put(f"blk.{il}.nextn.eh_proj.weight", S["mtp.fc.weight"])
        put(f"blk.{il}.nextn.enorm.weight", plus1("mtp.pre_fc_norm_embedding.weight"), op="+1")
        put(f"blk.{il}.nextn.hnorm.weight", plus1("mtp.pre_fc_norm_hidden.weight"), op="+1")
        put(f"blk.{il}.nextn.shared_head_norm.weight", plus1("mtp.norm.weight"), op="+1")
    return out, n_mtp


def expected_kv(hp, tname, n_mtp, name):
    a = hp.arch
    U, F, S = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    kv = {
        "general.architecture": (S, a), "general.type": (S, "model"), "general.name": (S, name),
        "general.alignment": (U, 32), "general.file_type": (U, FTYPE_NUM[tname]),
        "general.quantization_version": (U, 2),
        f"{a}.block_count": (U, hp.n_layer + n_mtp), f"{a}.context_length": (U, hp.n_ctx),
        f"{a}.embedding_length": (U, hp.n_embd),
        f"{a}.attention.head_count": (U, hp.n_head), f"{a}.attention.head_count_kv": (U, hp.n_head_kv),
        f"{a}.rope.dimension_sections": ((GGUFValueType.ARRAY, GGUFValueType.INT32), hp.sections),
        f"{a}.rope.freq_base": (F, hp.theta), f"{a}.attention.layer_norm_rms_epsilon": (F, hp.eps),
        f"{a}.attention.key_length": (U, hp.hd), f"{a}.attention.value_length": (U, hp.hd),
        f"{a}.ssm.conv_kernel": (U, hp.d_conv), f"{a}.ssm.state_size": (U, hp.d),
        f"{a}.ssm.group_count": (U, hp.hk), f"{a}.ssm.time_step_rank": (U, hp.hv),
        f"{a}.ssm.inner_size": (U, hp.d * hp.hv), f"{a}.full_attention_interval": (U, hp.interval),
        f"{a}.rope.dimension_count": (U, int(hp.hd * hp.prf)),
    }
    if hp.n_ff is not None:
        kv[f"{a}.feed_forward_length"] = (U, hp.n_ff)
    if hp.moe:
        kv[f"{a}.expert_count"] = (U, hp.n_exp)
        kv[f"{a}.expert_used_count"] = (U, hp.n_used)
        kv[f"{a}.expert_feed_forward_length"] = (U, hp.n_ff_exp)
        kv[f"{a}.expert_shared_feed_forward_length"] = (U, hp.n_ff_sh)
    if n_mtp:
        kv[f"{a}.nextn_predict_layers"] = (U, n_mtp)
    return kv


# ---- type rules: conversion/base.py outtypes and llama-quant.cpp mixes, restated -------------

def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_types(hp, exp, tname):
    """GGUF name -> expected ggml type, walking tensors in llama.cpp's loader order."""
    def layer(n):
        return int(n.split(".")[1]) if n.startswith("blk.") else -1
    names = sorted(exp, key=lambda n: (layer(n), n))
    n_all = 1 + max(layer(n) for n in names)
    tied = "output.weight" not in exp
    n_gqa, n_exp = hp.n_head // hp.n_head_kv, (hp.n_exp if hp.moe else 0)
    n_wv = sum(1 for n in names if "attn_v.weight" in n or "attn_qkv.weight" in n)
    i_wv = i_down = 0
    base = BASE[tname]
    res = {}
    for n in names:
        arr, n_dims, _ = exp[n]
        ne0 = arr.shape[-1]
        keep_f32 = (n_dims <= 1 or n.endswith("_norm.weight") or not n.endswith(".weight")
                    or n.endswith((".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight",
                                   ".ssm_conv1d.weight")))
        if keep_f32:
            res[n] = QT.F32
            continue
        if tname in ("f32", "f16", "bf16"):
            res[n] = base
            continue
        if tname == "q8_0":
            res[n] = QT.Q8_0 if ne0 % 32 == 0 else QT.F16
            continue
        # ggml_n_dims ignores trailing extents of 1, i.e. leading torch dims of 1
        ggml_dims = arr.ndim - next((k for k, x in enumerate(arr.shape) if x != 1), 0)
        if ggml_dims < 2:
            res[n] = QT.F32
            continue
        t = base
        if n == "output.weight" or (tied and n == "token_embd.weight"):
            t = QT.Q8_0 if ne0 % BLOCK[base] else QT.Q6_K
        elif n == "token_embd.weight":
            pass
        elif "attn_qkv.weight" in n or "attn_v.weight" in n:
            if tname == "iq4_xs" and n_gqa >= 4:
                t = QT.Q5_K
            elif tname in ("q4_k_m", "q5_k_m") and more_bits(i_wv, n_wv):
                t = QT.Q6_K
            if n_exp == 8:
                t = QT.Q8_0
            i_wv += 1
        elif "attn_k.weight" in n:
            t = QT.Q8_0 if n_exp == 8 else t
        elif "ffn_down" in n:
            il = layer(n) if n_exp > 1 else i_down
            if tname == "q4_k_m" and more_bits(il, n_all):
                t = QT.Q6_K
            elif tname == "iq4_xs" and il < n_all // 8:
                t = QT.Q5_K
            elif tname == "q5_k_m" and more_bits(il, n_all):
                t = QT.Q6_K
            i_down += 1
        elif "attn_output.weight" in n and n_exp == 8 and tname in ("q4_k_m", "iq4_xs"):
            t = QT.Q5_K
        if ne0 % BLOCK[t]:
            t = {QT.IQ4_XS: QT.IQ4_NL, QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}.get(t, QT.F16)
            if ne0 % BLOCK[t]:
                t = QT.F16
        res[n] = t
    return res


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, dspec, tmp):
        self.dspec, self.tmp = dspec, tmp
        self.passed, self.failed = 0, 0

    def check(self, what, fn):
        try:
            fn()
            self.passed += 1
        except Exception as e:  # noqa: BLE001 - report and continue
            self.failed += 1
            print(f"FAIL {what}: {e}")
            if os.environ.get("DSPEC_TEST_VERBOSE"):
                traceback.print_exc()

    def convert(self, src, out, *flags):
        return subprocess.run([self.dspec, "convert", src, out, "--quiet", *flags],
                              capture_output=True, text=True)


def field_value(f):
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        return (main, f.types[-1]), [int(x) for x in f.contents()]
    v = f.contents()
    return main, v


def check_kvs(r, want):
    got = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer."):
            continue
        got[k] = field_value(f)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"keys missing {missing} extra {extra}"
    for k, (typ, val) in want.items():
        gt, gv = got[k]
        assert gt == typ, f"{k}: type {gt}, expected {typ}"
        if typ == GGUFValueType.FLOAT32:
            assert np.float32(gv) == np.float32(val), f"{k}: {gv} != {val}"
        else:
            assert gv == val, f"{k}: {gv!r} != {val!r}"


def bf16_round(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return u.astype(np.uint32).view(np.float32)


def check_data(name, t, want, op):
    shape = tuple(int(x) for x in reversed(t.shape))
    got = dequantize(t.data, t.tensor_type).reshape(shape) if t.tensor_type not in (QT.F32,) \
        else np.asarray(t.data, dtype=np.float32).reshape(shape)
    w = want.reshape(shape)
    tt = t.tensor_type
    if tt == QT.F32:
        if op == "-exp":  # numpy exp vs libm expf: allow 1 ulp
            assert np.allclose(got, w, rtol=2.5e-7, atol=0), f"{name}: max diff {np.abs(got - w).max()}"
        else:
            assert np.array_equal(got.view(np.uint32), w.view(np.uint32)), \
                f"{name}: f32 not bit-exact (max diff {np.abs(got - w).max()})"
    elif tt == QT.F16:
        assert np.array_equal(got, w.astype(np.float16).astype(np.float32)), f"{name}: f16 mismatch"
    elif tt == QT.BF16:
        assert np.array_equal(got.view(np.uint32), bf16_round(w).view(np.uint32)), f"{name}: bf16 mismatch"
    else:
        err = np.sqrt(np.mean((got.astype(np.float64) - w) ** 2))
        ref = np.sqrt(np.mean(w.astype(np.float64) ** 2))
        assert err <= REL_RMS_TOL[tt] * ref, \
            f"{name}: {tt.name} rel rms err {err / ref:.4f} > {REL_RMS_TOL[tt]}"


def check_file(path, hp, src, tname, no_mtp, name):
    exp, n_mtp = expected(hp, src, no_mtp)
    types = expected_types(hp, exp, tname)
    r = GGUFReader(path)
    check_kvs(r, expected_kv(hp, tname, n_mtp, name))
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(exp), f"tensors missing {sorted(set(exp) - set(got))[:5]} " \
                                 f"extra {sorted(set(got) - set(exp))[:5]}"
    for n, (arr, n_dims, op) in exp.items():
        t = got[n]
        ne = [int(x) for x in t.shape]
        want_ne = list(reversed(arr.shape))
        assert ne == want_ne, f"{n}: ne {ne}, expected {want_ne}"
        assert t.tensor_type == types[n], f"{n}: type {t.tensor_type.name}, expected {types[n].name}"
        check_data(n, t, arr, op)
    return exp, types


UNQUANTIZABLE_RE = "needs type "


def convert_and_check(ctx, src_dir, tname, no_mtp=False, label=None):
    label = label or f"{os.path.relpath(src_dir, REPO)} --type {tname}{' --no-mtp' if no_mtp else ''}"
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    hp = HP(cfg)
    src = st_read_dir(src_dir)
    out = os.path.join(ctx.tmp, "out.gguf")

    def run():
        if os.path.exists(out):
            os.unlink(out)
        flags = ["--type", tname] + (["--no-mtp"] if no_mtp else [])
        p = ctx.convert(src_dir, out, *flags)
        if p.returncode != 0 and UNQUANTIZABLE_RE in p.stderr:
            # A fallback type dspec cannot quantize to yet (e.g. q5_0 for q4_K rows of 64):
            # the refusal must name a tensor whose expected type is indeed that type.
            exp, _ = expected(hp, src, no_mtp)
            types = expected_types(hp, exp, tname)
            msg = p.stderr.strip().splitlines()[-1]
            tn = msg.split("tensor ")[1].split(" ")[0]
            ty = msg.split(UNQUANTIZABLE_RE)[1].split(" ")[0]
            assert types[tn].name.lower() == ty.lower(), f"refusal names {tn} as {ty}, rule says {types[tn].name}"
            assert not os.path.exists(out), "output left behind after a refusal"
            return
        assert p.returncode == 0, f"exit {p.returncode}: {p.stderr.strip()}"
        check_file(out, hp, src, tname, no_mtp, os.path.basename(os.path.normpath(src_dir)))

    ctx.check(label, run)


# ---------------------------------------------------------------------------------------------
# synthetic checkpoints (numpy only)
# ---------------------------------------------------------------------------------------------

def bf16_exact(rng, shape, scale):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)


def synth(d, *, moe, n_exp=8, nested, mtp, sharded, dtype, per_expert=True, tie=False, seed=1):
    """A random Qwen3.5 checkpoint with n_embd 256 (k-quant friendly)."""
    rng = np.random.default_rng(seed)
    E, L, hd, nh, nkv, hk, hv, dk, K = 256, 8, 64, 4, 1, 2, 4, 64, 4
    V, FF, FE, FS = 384, 512, 256, 256
    text = dict(vocab_size=V, hidden_size=E, num_hidden_layers=L, num_attention_heads=nh,
                num_key_value_heads=nkv, head_dim=hd, max_position_embeddings=4096,
                rms_norm_eps=1e-6, linear_conv_kernel_dim=K, linear_key_head_dim=dk,
                linear_value_head_dim=dk, linear_num_key_heads=hk, linear_num_value_heads=hv,
                full_attention_interval=4, mtp_num_hidden_layers=1 if mtp else 0,
                tie_word_embeddings=tie,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                 "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                 "mrope_interleaved": True})
    if moe:
        text.update(num_experts=n_exp, num_experts_per_tok=2, moe_intermediate_size=FE,
                    shared_expert_intermediate_size=FS, model_type="qwen3_5_moe_text")
    else:
        text.update(intermediate_size=FF, model_type="qwen3_5_text")
    arch = ("Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration") \
        if nested else ("Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM")
    if nested:
        cfg = {"architectures": [arch], "model_type": "qwen3_5_moe" if moe else "qwen3_5",
               "text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": tie}
    else:
        cfg = dict(text, architectures=[arch])
    T = {}
    pre = "model.language_model." if nested else "model."

    def w(name, shape, scale=None):
        T[name] = (bf16_exact(rng, shape, scale if scale is not None else 1 / np.sqrt(shape[-1])),
                   dtype)

    def blk(p, full):
        w(p + "input_layernorm.weight", (E,), 0.3)
        w(p + "post_attention_layernorm.weight", (E,), 0.3)
        if full:
            w(p + "self_attn.q_proj.weight", (2 * nh * hd, E))
            w(p + "self_attn.k_proj.weight", (nkv * hd, E))
            w(p + "self_attn.v_proj.weight", (nkv * hd, E))
            w(p + "self_attn.o_proj.weight", (E, nh * hd))
            w(p + "self_attn.q_norm.weight", (hd,), 0.3)
            w(p + "self_attn.k_norm.weight", (hd,), 0.3)
        else:
            la = p + "linear_attn."
            w(la + "in_proj_qkv.weight", (2 * hk * dk + hv * dk, E))
            w(la + "in_proj_z.weight", (hv * dk, E))
            w(la + "in_proj_b.weight", (hv, E))
            w(la + "in_proj_a.weight", (hv, E))
            w(la + "conv1d.weight", (2 * hk * dk + hv * dk, 1, K), 0.5)
            w(la + "dt_bias", (hv,), 0.7)
            w(la + "A_log", (hv,), 1.0)
            w(la + "norm.weight", (dk,), 0.3)
            w(la + "out_proj.weight", (E, hv * dk))
        mp = p + "mlp."
        if not moe:
            w(mp + "gate_proj.weight", (FF, E))
            w(mp + "up_proj.weight", (FF, E))
            w(mp + "down_proj.weight", (E, FF))
            return
        w(mp + "gate.weight", (n_exp, E))
        w(mp + "shared_expert_gate.weight", (1, E))
        w(mp + "shared_expert.gate_proj.weight", (FS, E))
        w(mp + "shared_expert.up_proj.weight", (FS, E))
        w(mp + "shared_expert.down_proj.weight", (E, FS))
        if per_expert:
            for e in range(n_exp):
                w(mp + f"experts.{e}.gate_proj.weight", (FE, E))
                w(mp + f"experts.{e}.up_proj.weight", (FE, E))
                w(mp + f"experts.{e}.down_proj.weight", (E, FE))
        else:
            w(mp + "experts.gate_up_proj", (n_exp, 2 * FE, E))
            w(mp + "experts.down_proj", (n_exp, E, FE))

    w(pre + "embed_tokens.weight", (V, E), 1.0)
    w(pre + "norm.weight", (E,), 0.3)
    if not tie:
        w("lm_head.weight", (V, E))
    for il in range(L):
        blk(f"{pre}layers.{il}.", (il + 1) % 4 == 0)
    if mtp:
        blk("mtp.layers.0.", True)
        w("mtp.fc.weight", (E, 2 * E))
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            w(f"mtp.{n}.weight", (E,), 0.3)
    if nested:  # vision tower tensors are dropped by the converter
        w("model.visual.blocks.0.attn.qkv.weight", (96, 32))
        w("model.visual.merger.mlp.0.weight", (64, 32))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if sharded:
        st_write_sharded(d, T, 3)
    else:
        st_write_file(os.path.join(d, "model.safetensors"), T)
    return d


# ---------------------------------------------------------------------------------------------
# error cases
# ---------------------------------------------------------------------------------------------

def expect_failure(ctx, label, src_dir, needles, *flags, rc=None):
    out = os.path.join(ctx.tmp, "err.gguf")

    def run():
        if os.path.exists(out):
            os.unlink(out)
        p = ctx.convert(src_dir, out, *flags)
        assert p.returncode != 0, f"expected failure, got exit 0 ({p.stderr.strip()})"
        if rc is not None:
            assert p.returncode == rc, f"exit {p.returncode}, expected {rc}"
        for n in needles:
            assert n in p.stderr, f"message {p.stderr.strip()!r} lacks {n!r}"
        assert not os.path.exists(out), "partial output left behind"
    ctx.check(label, run)


def copy_fixture(src, dst):
    shutil.copytree(src, dst)
    return dst


def clobber_case(ctx, fixture):
    """An output that names one of the input files is refused before anything is read (it once
    truncated the mapped safetensors file and died of a bus error)."""
    d = copy_fixture(fixture, os.path.join(ctx.tmp, "clobber"))
    inputs = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))

    def run():
        target = os.path.join(d, inputs[0])
        before = open(target, "rb").read()
        p = ctx.convert(d, target)
        assert p.returncode == 2, f"exit {p.returncode}: {p.stderr.strip()}"
        assert "is one of the input files" in p.stderr, p.stderr
        assert open(target, "rb").read() == before, "input changed"
        assert not [f for f in os.listdir(d) if ".tmp-" in f], "temporary file left behind"
    ctx.check("output naming an input file is refused", run)


def error_cases(ctx, fixture):
    t = ctx.tmp
    clobber_case(ctx, fixture)
    empty = os.path.join(t, "empty_dir")
    os.makedirs(empty, exist_ok=True)
    expect_failure(ctx, "missing config.json", empty, ["config.json", "cannot open"])

    d = copy_fixture(fixture, os.path.join(t, "bad_type"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["model_type"] = "llama"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_failure(ctx, "bad model_type", d, ["model_type", "\"llama\"", "not supported"])

    d = copy_fixture(fixture, os.path.join(t, "bad_arch"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("model_type")
    cfg["architectures"] = ["LlamaForCausalLM"]
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_failure(ctx, "non-qwen35 architecture", d, ["LlamaForCausalLM", "not supported"])

    d = copy_fixture(fixture, os.path.join(t, "no_field"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("linear_num_value_heads")
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_failure(ctx, "missing config field", d, ["linear_num_value_heads"])

    d = copy_fixture(fixture, os.path.join(t, "truncated"))
    p = os.path.join(d, "model.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 1000)
    expect_failure(ctx, "truncated safetensors", d, ["model.safetensors"])

    d = copy_fixture(fixture, os.path.join(t, "missing_tensor"))
    T = {k: v for k, v in st_read_file(os.path.join(d, "model.safetensors")).items()
         if k != "model.layers.1.linear_attn.in_proj_z.weight"}
    st_write_file(os.path.join(d, "model.safetensors"), {k: (v[0], v[1]) for k, v in T.items()})
    expect_failure(ctx, "missing tensor", d, ["missing tensor", "model.layers.1.linear_attn.in_proj_z.weight"])

    d = copy_fixture(fixture, os.path.join(t, "bad_shape"))
    T = st_read_file(os.path.join(d, "model.safetensors"))
    a, dt = T["model.layers.3.self_attn.k_proj.weight"]
    T["model.layers.3.self_attn.k_proj.weight"] = (a[:-1], dt)
    st_write_file(os.path.join(d, "model.safetensors"), T)
    expect_failure(ctx, "shape mismatch", d, ["model.layers.3.self_attn.k_proj.weight", "expected"])

    d = copy_fixture(fixture, os.path.join(t, "extra_tensor"))
    T = st_read_file(os.path.join(d, "model.safetensors"))
    T["model.layers.8.input_layernorm.weight"] = T["model.norm.weight"]
    st_write_file(os.path.join(d, "model.safetensors"), T)
    expect_failure(ctx, "unexpected tensor", d, ["unexpected tensor", "model.layers.8.input_layernorm.weight"])

    d = copy_fixture(fixture, os.path.join(t, "nan"))
    T = st_read_file(os.path.join(d, "model.safetensors"))
    a, dt = T["model.layers.0.mlp.up_proj.weight"]
    a = a.copy()
    a[1, 2] = np.nan
    T["model.layers.0.mlp.up_proj.weight"] = (a, dt)
    st_write_file(os.path.join(d, "model.safetensors"), T)
    expect_failure(ctx, "NaN refused by the quantizer", d, ["blk.0.ffn_up.weight", "NaN"],
                   "--type", "q8_0")

    expect_failure(ctx, "unknown --type", fixture, ["--type"], "--type", "q3_k_s", rc=2)
    expect_failure(ctx, "--vocab-only without tokenizer.json", fixture, ["tokenizer"], "--vocab-only")


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", default=".")
    ap.add_argument("--fixtures", default=FIXTURES)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="dspec_convert_")
    ctx = Ctx(os.path.abspath(args.dspec), tmp)
    try:
        fixtures = sorted(os.path.join(args.fixtures, n) for n in os.listdir(args.fixtures)
                          if os.path.isdir(os.path.join(args.fixtures, n, "hf_f32")))
        ctx.check("committed fixtures present", lambda: None if fixtures else (_ for _ in ()).throw(
            AssertionError(f"no */hf_f32 under {args.fixtures}")))
        for fx in fixtures:
            for sub in ("hf_f32", "hf_bf16"):
                d = os.path.join(fx, sub)
                if not os.path.isdir(d):
                    continue
                for tname in TYPES:
                    convert_and_check(ctx, d, tname)

        # synthetic: VLM layout, MTP, sharded, bf16, dims that take the k-quants
        vl = synth(os.path.join(tmp, "syn_vl"), moe=False, nested=True, mtp=True, sharded=True,
                   dtype="BF16")
        for tname in TYPES:
            convert_and_check(ctx, vl, tname, label=f"synthetic VLM dense bf16 sharded+MTP --type {tname}")
        convert_and_check(ctx, vl, "q4_k_m", no_mtp=True, label="synthetic VLM dense --no-mtp q4_k_m")
        tied = synth(os.path.join(tmp, "syn_tied"), moe=False, nested=False, mtp=False,
                     sharded=False, dtype="F32", tie=True, seed=2)
        for tname in ("q4_k_m", "iq4_xs", "f16"):
            convert_and_check(ctx, tied, tname, label=f"synthetic tied dense f32 --type {tname}")
        moe8 = synth(os.path.join(tmp, "syn_moe8"), moe=True, n_exp=8, nested=True, mtp=True,
                     sharded=False, dtype="BF16", seed=3)
        for tname in TYPES:
            convert_and_check(ctx, moe8, tname, label=f"synthetic MoE 8 experts per-expert+MTP --type {tname}")
        convert_and_check(ctx, moe8, "q5_k_m", no_mtp=True, label="synthetic MoE --no-mtp q5_k_m")
        moe4 = synth(os.path.join(tmp, "syn_moe4"), moe=True, n_exp=4, nested=False, mtp=False,
                     sharded=True, dtype="F16", per_expert=False, seed=4)
        for tname in ("f32", "q4_k_m", "iq4_xs"):
            convert_and_check(ctx, moe4, tname, label=f"synthetic MoE 4 experts fused f16-source --type {tname}")

        if fixtures:
            error_cases(ctx, os.path.join(fixtures[0], "hf_f32"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{ctx.passed} passed, {ctx.failed} failed")
    return 1 if ctx.failed else 0


if __name__ == "__main__":
    sys.exit(main())
