// qwen35_load.c: reads qwen35 / qwen35moe hyperparameters and weights from a llama.cpp GGUF and
// validates every tensor's shape and type (target-qwen35.md §3.1-3.2, §7). Refuses inconsistent
// files naming the key or tensor. Calls gguf/, backend/. Called by model users via model.h.
#include "model/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *arch_name(ds_arch a) {
    return a == DS_ARCH_QWEN35MOE ? "qwen35moe" : "qwen35";
}

// Per-layer integer key: a scalar, or an array with one element per layer (llama-model-saver).
static dspec_status layer_int(const ds_gguf *g, const char *key, int il, bool required,
                              int64_t def, int64_t *out, dspec_err *err) {
    int64_t i = ds_gguf_find_key(g, key);
    if (i < 0) {
        if (required) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing key %s", ds_gguf_path(g), key);
        }
        *out = def;
        return DSPEC_OK;
    }
    if (ds_gguf_kv_type(g, i) == DS_GGUF_ARRAY) {
        int64_t vals[DS_MODEL_MAX_LAYERS];
        size_t n = 0;
        dspec_status st = ds_gguf_get_int_arr(g, key, vals, DS_ARRAY_LEN(vals), &n, err);
        if (st != DSPEC_OK) {
            return st;
        }
        if ((size_t)il >= n) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s has %zu elements, need layer %d",
                              ds_gguf_path(g), key, n, il);
        }
        *out = vals[il];
        return DSPEC_OK;
    }
    return ds_gguf_get_int(g, key, out, err);
}

#define KEY(buf, fmt) (snprintf(buf, sizeof(buf), "%s." fmt, an), buf)

dspec_status ds_qwen35_read_hparams(ds_model_hparams *hp, const ds_gguf *g, dspec_err *err) {
    memset(hp, 0, sizeof(*hp));
    ds_str arch;
    dspec_status st = ds_gguf_get_str(g, "general.architecture", &arch, err);
    if (st != DSPEC_OK) {
        return st;
    }
    if (arch.len == 6 && !memcmp(arch.ptr, "qwen35", 6)) {
        hp->arch = DS_ARCH_QWEN35;
    } else if (arch.len == 9 && !memcmp(arch.ptr, "qwen35moe", 9)) {
        hp->arch = DS_ARCH_QWEN35MOE;
    } else {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                          "%s: architecture '%.*s' is not supported (expected qwen35 or qwen35moe)",
                          ds_gguf_path(g), (int)DS_MIN(arch.len, 64), arch.ptr);
    }
    const char *an = arch_name(hp->arch);
    char k[128];
    int64_t v;
    // every count and size below must fit an int (a u64 2^32 + 2 once loaded as 2)
#define IN_RANGE(fmt)                                                                              \
    do {                                                                                           \
        if (v < 0 || v > INT32_MAX) {                                                              \
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s = %" PRId64 " out of range",      \
                              ds_gguf_path(g), KEY(k, fmt), v);                                    \
        }                                                                                          \
    } while (0)
#define GET(dst, fmt)                                                                              \
    do {                                                                                           \
        if ((st = ds_gguf_get_int(g, KEY(k, fmt), &v, err)) != DSPEC_OK) return st;               \
        IN_RANGE(fmt);                                                                             \
        (dst) = v;                                                                                 \
    } while (0)
#define OPT(dst, fmt, def)                                                                         \
    do {                                                                                           \
        if ((st = ds_gguf_opt_int(g, KEY(k, fmt), (def), &v, err)) != DSPEC_OK) return st;        \
        IN_RANGE(fmt);                                                                             \
        (dst) = v;                                                                                 \
    } while (0)
    int64_t block_count;
    GET(block_count, "block_count");
    OPT(hp->n_nextn, "nextn_predict_layers", 0);
    if (block_count <= 0 || hp->n_nextn < 0 || hp->n_nextn >= block_count ||
        block_count - hp->n_nextn > DS_MODEL_MAX_LAYERS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "%s: block_count %" PRId64 " / nextn_predict_layers %d out of range "
                          "(at most %d trunk layers)",
                          ds_gguf_path(g), block_count, hp->n_nextn, DS_MODEL_MAX_LAYERS);
    }
    hp->n_layer = (int)(block_count - hp->n_nextn);
    GET(hp->n_embd, "embedding_length");
    OPT(hp->n_ctx_train, "context_length", 0);
    int64_t kl, vl;
    GET(kl, "attention.key_length");
    OPT(vl, "attention.value_length", kl);
    if (kl != vl) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: attention.key_length %" PRId64
                          " != value_length %" PRId64, ds_gguf_path(g), kl, vl);
    }
    hp->head_dim = kl;
    GET(hp->n_rot, "rope.dimension_count");
    double f;
    if ((st = ds_gguf_get_float(g, KEY(k, "attention.layer_norm_rms_epsilon"), &f, err))) {
        return st;
    }
    hp->eps = (float)f;
    if (!(hp->eps > 0.0f) || !isfinite(hp->eps)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: attention.layer_norm_rms_epsilon %g must "
                          "be finite and > 0", ds_gguf_path(g), f);
    }
    if ((st = ds_gguf_opt_float(g, KEY(k, "rope.freq_base"), 10000.0, &f, err))) return st;
    hp->rope_base = (float)f;
    if (!(hp->rope_base > 0.0f) || !isfinite(hp->rope_base)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: rope.freq_base %g must be finite and > 0",
                          ds_gguf_path(g), f);
    }
    // the target runs plain NEOX RoPE: a file asking for scaled positions is refused rather than
    // run unscaled (its logits would be silently wrong past position 0)
    int64_t rs = ds_gguf_find_key(g, KEY(k, "rope.scaling.type"));
    if (rs >= 0) {
        ds_str t;
        if ((st = ds_gguf_get_str(g, k, &t, err))) return st;
        if (!(t.len == 4 && !memcmp(t.ptr, "none", 4))) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: rope scaling '%.*s' is not "
                              "supported for the target model (only plain RoPE)",
                              ds_gguf_path(g), (int)DS_MIN(t.len, 32), t.ptr);
        }
    }
    GET(hp->d_conv, "ssm.conv_kernel");
    GET(hp->d_state, "ssm.state_size");
    GET(hp->n_k_heads, "ssm.group_count");
    GET(hp->n_v_heads, "ssm.time_step_rank");
    GET(hp->d_inner, "ssm.inner_size");
    int64_t interval;
    OPT(interval, "full_attention_interval", 4);
    if (hp->n_embd <= 0 || hp->head_dim <= 0 || hp->d_state <= 0 || hp->n_k_heads <= 0 ||
        hp->n_v_heads <= 0 || hp->d_conv < 1 || hp->d_conv > 16 || interval <= 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: non-positive or out-of-range dimension "
                          "(n_embd, key_length, ssm.*, full_attention_interval)", ds_gguf_path(g));
    }
    if (hp->n_v_heads % hp->n_k_heads != 0 || hp->d_inner != hp->n_v_heads * hp->d_state) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "%s: ssm.time_step_rank %d must be a multiple of ssm.group_count %d and "
                          "ssm.inner_size %" PRId64 " must equal time_step_rank * state_size",
                          ds_gguf_path(g), hp->n_v_heads, hp->n_k_heads, hp->d_inner);
    }
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: rope.dimension_count %d invalid for head "
                          "dim %" PRId64, ds_gguf_path(g), hp->n_rot, hp->head_dim);
    }
    hp->conv_dim = 2 * hp->n_k_heads * hp->d_state + hp->d_inner;
    // recurrent layers: explicit flags override the interval rule
    int64_t rl = ds_gguf_find_key(g, KEY(k, "attention.recurrent_layers"));
    for (int il = 0; il < hp->n_layer; il++) {
        if (rl >= 0) {
            int64_t flag;
            if ((st = layer_int(g, k, il, true, 0, &flag, err)) != DSPEC_OK) return st;
            hp->recurrent[il] = flag != 0;
        } else {
            hp->recurrent[il] = (il + 1) % interval != 0;
        }
    }
    // attention head counts (scalar or per layer; take the attention layers' value)
    hp->n_head = hp->n_head_kv = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->recurrent[il]) continue;
        int64_t nh, nkv;
        if ((st = layer_int(g, KEY(k, "attention.head_count"), il, true, 0, &nh, err))) return st;
        if ((st = layer_int(g, KEY(k, "attention.head_count_kv"), il, false, nh, &nkv, err))) {
            return st;
        }
        if (hp->n_head && (nh != hp->n_head || nkv != hp->n_head_kv)) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: attention head counts differ "
                              "between attention layers", ds_gguf_path(g));
        }
        hp->n_head = (int)nh;
        hp->n_head_kv = (int)nkv;
    }
    if (hp->n_head > 0 && (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: head_count %d not a multiple of "
                          "head_count_kv %d", ds_gguf_path(g), hp->n_head, hp->n_head_kv);
    }
    if (hp->arch == DS_ARCH_QWEN35MOE) {
        OPT(hp->n_expert, "expert_count", 0);
        OPT(hp->n_expert_used, "expert_used_count", 0);
        OPT(hp->n_ff_exp, "expert_feed_forward_length", 0);
        // the shared expert's width: the key, else its tensors' (llama.cpp requires them; a
        // missing key once dropped the shared expert without a word)
        const ds_gguf_tensor *sh = ds_gguf_find_tensor(g, "blk.0.ffn_up_shexp.weight");
        OPT(hp->n_ff_shexp, "expert_shared_feed_forward_length", sh ? sh->ne[1] : 0);
        if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
            hp->n_ff_exp <= 0 || hp->n_expert > 4096) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: invalid MoE keys: expert_count %d, "
                              "expert_used_count %d, expert_feed_forward_length %" PRId64,
                              ds_gguf_path(g), hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
        }
    } else {
        int64_t nff;
        if ((st = layer_int(g, KEY(k, "feed_forward_length"), 0, true, 0, &nff, err))) return st;
        hp->n_ff = nff;
    }
#undef GET
#undef OPT
#undef IN_RANGE
    return DSPEC_OK;
}

// ---- tensors ---------------------------------------------------------------------------------------

typedef struct loader {
    ds_model *m;
    const ds_gguf *g;
    dspec_err *err;
    int n_realigned; // tensors a host backend reads from an aligned copy, and their bytes
    size_t bytes_realigned;
} loader;

enum { W_MATMUL = 1, W_F32 = 2, W_OPTIONAL = 4, W_TABLE = 8 };

// Copies n bytes of the mapping at host into backend memory: backends that cannot read the host
// mapping, and weights a host backend would read misaligned (a file whose general.alignment is
// below DS_WEIGHT_ALIGN). A tensor used twice (tied lm_head) is copied once.
static dspec_status upload(loader *ld, const void *host, size_t n, const char *name, void **out) {
    ds_model *m = ld->m;
    ds_backend *be = m->be;
    for (int i = 0; i < m->n_device_buffers; i++) {
        if (m->host_of_buffer[i] == host) {
            *out = m->device_buffers[i];
            return DSPEC_OK;
        }
    }
    if (m->n_device_buffers % 64 == 0) {
        size_t cap = (size_t)m->n_device_buffers + 64;
        void **nb = realloc(m->device_buffers, cap * sizeof(void *));
        if (nb) m->device_buffers = nb;
        const void **nh = realloc(m->host_of_buffer, cap * sizeof(void *));
        if (nh) m->host_of_buffer = nh;
        if (!nb || !nh) return ds_err_set(ld->err, DSPEC_ERR_NOMEM, "model: out of memory");
    }
    void *d = be->ops.alloc(be, n);
    if (!d) {
        return ds_err_set(ld->err, DSPEC_ERR_NOMEM, "%s: tensor %s: cannot allocate %zu bytes "
                          "on %s", ds_gguf_path(ld->g), name, n, be->name);
    }
    be->ops.write(be, d, host, n);
    m->host_of_buffer[m->n_device_buffers] = host;
    m->device_buffers[m->n_device_buffers++] = d;
    if (be->weights_in_host_memory) {
        ld->n_realigned++;
        ld->bytes_realigned += n;
    }
    *out = d;
    return DSPEC_OK;
}

// Whether a host backend may read these bytes of the mapping in place.
static bool in_place(const loader *ld, const void *host) {
    return ld->m->be->weights_in_host_memory && (uintptr_t)host % DS_WEIGHT_ALIGN == 0;
}

static void shape_str(char *buf, size_t cap, const int64_t *ne) {
    int nd = 4;
    while (nd > 1 && ne[nd - 1] == 1) nd--;
    int off = snprintf(buf, cap, "{");
    for (int i = 0; i < nd; i++) {
        off += snprintf(buf + off, cap - (size_t)off, "%s%" PRId64, i ? ", " : "", ne[i]);
    }
    snprintf(buf + off, cap - (size_t)off, "}");
}

static dspec_status weight(loader *ld, ds_weight *w, const char *name, int flags, int64_t ne0,
                           int64_t ne1, int64_t ne2) {
    memset(w, 0, sizeof(*w));
    const ds_gguf_tensor *t = ds_gguf_find_tensor(ld->g, name);
    if (!t) {
        if (flags & W_OPTIONAL) return DSPEC_OK;
        return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: missing tensor %s",
                          ds_gguf_path(ld->g), name);
    }
    int64_t want[4] = {ne0, ne1, ne2, 1};
    if (memcmp(t->ne, want, sizeof(want)) != 0) {
        char a[96], b[96];
        shape_str(a, sizeof(a), want);
        shape_str(b, sizeof(b), t->ne);
        return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: tensor %s: shape %s, expected %s",
                          ds_gguf_path(ld->g), name, b, a);
    }
    const ds_type_traits *tt = ds_type_traits_get(t->type);
    if ((flags & W_F32) && t->type != DS_TYPE_F32) {
        return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: tensor %s: type %s, expected f32",
                          ds_gguf_path(ld->g), name, ds_type_name(t->type));
    }
    if ((flags & W_MATMUL) && (!tt || !tt->vec_dot)) {
        return ds_err_set(ld->err, DSPEC_ERR_UNSUPPORTED, "%s: tensor %s: type %s has no CPU "
                          "matmul kernel", ds_gguf_path(ld->g), name, ds_type_name(t->type));
    }
    if ((flags & W_MATMUL) && !ds_be_supports(ld->m->be, DS_BE_CAP_MATMUL, t->type, t->ne[0])) {
        return ds_err_set(ld->err, DSPEC_ERR_UNSUPPORTED, "%s: tensor %s: type %s with rows of %"
                          PRId64 " is not supported by the %s backend", ds_gguf_path(ld->g), name,
                          ds_type_name(t->type), t->ne[0], ld->m->be->name);
    }
    if ((flags & W_TABLE) && (!tt || !tt->to_float)) {
        return ds_err_set(ld->err, DSPEC_ERR_UNSUPPORTED, "%s: tensor %s: type %s cannot be "
                          "dequantized", ds_gguf_path(ld->g), name, ds_type_name(t->type));
    }
    w->t = (ds_tensor){.data = (void *)t->data, .type = t->type};
    memcpy(w->t.ne, t->ne, sizeof(w->t.ne));
    memcpy(w->t.nb, t->nb, sizeof(w->t.nb));
    ld->m->weight_bytes += t->nbytes;
    if (flags & W_MATMUL) { // (expert tensors: n_expert_used of their ne2 experts per token)
        const int64_t used = ne2 > 1 ? DS_MAX(ld->m->hp.n_expert_used, 1) : 1;
        ld->m->matmul_flops += 2.0 * (double)ne0 * (double)ne1 * (double)used;
    }
    if (!in_place(ld, t->data)) {
        dspec_status st = upload(ld, t->data, t->nbytes, t->name, &w->t.data);
        if (st != DSPEC_OK) return st;
    }
    // optional per-tensor scale: "<base>.scale" where name = "<base>.weight"
    size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ".weight")) {
        char sname[256];
        snprintf(sname, sizeof(sname), "%.*s.scale", (int)(len - 7), name);
        const ds_gguf_tensor *s = ds_gguf_find_tensor(ld->g, sname);
        if (s) {
            int64_t n_s = s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3];
            if (s->type != DS_TYPE_F32 || (n_s != 1 && n_s != ne2)) {
                return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: tensor %s: expected f32 {1} or "
                                  "{%" PRId64 "}", ds_gguf_path(ld->g), sname, ne2);
            }
            if (!ld->m->be->weights_in_host_memory) {
                return ds_err_set(ld->err, DSPEC_ERR_UNSUPPORTED, "%s: tensor %s: per-tensor "
                                  "scales are not supported on the %s backend yet",
                                  ds_gguf_path(ld->g), sname, ld->m->be->name);
            }
            w->scale = s->data;
            w->n_scale = n_s;
            if (!in_place(ld, s->data)) {
                void *c;
                dspec_status st = upload(ld, s->data, s->nbytes, s->name, &c);
                if (st != DSPEC_OK) return st;
                w->scale = c;
            }
        }
    }
    return DSPEC_OK;
}

#define W(dst, fl, a, b, c, ...)                                                                  \
    do {                                                                                           \
        snprintf(name, sizeof(name), __VA_ARGS__);                                                 \
        if ((st = weight(ld, dst, name, fl, a, b, c)) != DSPEC_OK) return st;                      \
    } while (0)

static dspec_status load_layer(loader *ld, int il) {
    const ds_model_hparams *hp = &ld->m->hp;
    ds_layer *L = &ld->m->layers[il];
    char name[160];
    dspec_status st;
    int64_t E = hp->n_embd, hd = hp->head_dim;
    L->recurrent = hp->recurrent[il];
    W(&L->attn_norm, W_F32, E, 1, 1, "blk.%d.attn_norm.weight", il);
    W(&L->post_attention_norm, W_F32, E, 1, 1, "blk.%d.post_attention_norm.weight", il);
    if (L->recurrent) {
        W(&L->attn_qkv, W_MATMUL, E, hp->conv_dim, 1, "blk.%d.attn_qkv.weight", il);
        W(&L->attn_gate, W_MATMUL, E, hp->d_inner, 1, "blk.%d.attn_gate.weight", il);
        W(&L->ssm_beta, W_MATMUL, E, hp->n_v_heads, 1, "blk.%d.ssm_beta.weight", il);
        W(&L->ssm_alpha, W_MATMUL, E, hp->n_v_heads, 1, "blk.%d.ssm_alpha.weight", il);
        W(&L->ssm_conv1d, W_F32, hp->d_conv, hp->conv_dim, 1, "blk.%d.ssm_conv1d.weight", il);
        W(&L->ssm_dt_bias, W_F32, hp->n_v_heads, 1, 1, "blk.%d.ssm_dt.bias", il);
        W(&L->ssm_a, W_F32, hp->n_v_heads, 1, 1, "blk.%d.ssm_a", il);
        W(&L->ssm_norm, W_F32, hp->d_state, 1, 1, "blk.%d.ssm_norm.weight", il);
        W(&L->ssm_out, W_MATMUL, hp->d_inner, E, 1, "blk.%d.ssm_out.weight", il);
    } else {
        int64_t nq = (int64_t)hp->n_head * hd, nkv = (int64_t)hp->n_head_kv * hd;
        W(&L->attn_q, W_MATMUL, E, 2 * nq, 1, "blk.%d.attn_q.weight", il);
        W(&L->attn_k, W_MATMUL, E, nkv, 1, "blk.%d.attn_k.weight", il);
        W(&L->attn_v, W_MATMUL, E, nkv, 1, "blk.%d.attn_v.weight", il);
        W(&L->attn_output, W_MATMUL, nq, E, 1, "blk.%d.attn_output.weight", il);
        W(&L->attn_q_norm, W_F32, hd, 1, 1, "blk.%d.attn_q_norm.weight", il);
        W(&L->attn_k_norm, W_F32, hd, 1, 1, "blk.%d.attn_k_norm.weight", il);
    }
    if (hp->arch == DS_ARCH_QWEN35) {
        W(&L->ffn_gate, W_MATMUL, E, hp->n_ff, 1, "blk.%d.ffn_gate.weight", il);
        W(&L->ffn_up, W_MATMUL, E, hp->n_ff, 1, "blk.%d.ffn_up.weight", il);
        W(&L->ffn_down, W_MATMUL, hp->n_ff, E, 1, "blk.%d.ffn_down.weight", il);
        return DSPEC_OK;
    }
    int64_t F = hp->n_ff_exp, NE = hp->n_expert;
    W(&L->ffn_gate_inp, W_F32 | W_MATMUL, E, NE, 1, "blk.%d.ffn_gate_inp.weight", il);
    W(&L->ffn_gate_up_exps, W_MATMUL | W_OPTIONAL, E, 2 * F, NE, "blk.%d.ffn_gate_up_exps.weight",
      il);
    if (!L->ffn_gate_up_exps.t.data) {
        W(&L->ffn_gate_exps, W_MATMUL, E, F, NE, "blk.%d.ffn_gate_exps.weight", il);
        W(&L->ffn_up_exps, W_MATMUL, E, F, NE, "blk.%d.ffn_up_exps.weight", il);
    }
    W(&L->ffn_down_exps, W_MATMUL, F, E, NE, "blk.%d.ffn_down_exps.weight", il);
    if (hp->n_ff_shexp > 0) {
        int64_t S = hp->n_ff_shexp;
        W(&L->ffn_gate_inp_shexp, W_F32 | W_MATMUL, E, 1, 1, "blk.%d.ffn_gate_inp_shexp.weight",
          il);
        W(&L->ffn_gate_shexp, W_MATMUL, E, S, 1, "blk.%d.ffn_gate_shexp.weight", il);
        W(&L->ffn_up_shexp, W_MATMUL, E, S, 1, "blk.%d.ffn_up_shexp.weight", il);
        W(&L->ffn_down_shexp, W_MATMUL, S, E, 1, "blk.%d.ffn_down_shexp.weight", il);
    }
    return DSPEC_OK;
}

static dspec_status load_tensors(loader *ld) {
    ds_model *m = ld->m;
    const ds_gguf_tensor *te = ds_gguf_find_tensor(ld->g, "token_embd.weight");
    if (!te) {
        return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: missing tensor token_embd.weight",
                          ds_gguf_path(ld->g));
    }
    m->hp.n_vocab = te->ne[1];
    char name[160];
    dspec_status st;
    int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    W(&m->token_embd, W_TABLE, E, V, 1, "token_embd.weight");
    W(&m->output_norm, W_F32, E, 1, 1, "output_norm.weight");
    W(&m->output, W_MATMUL | W_OPTIONAL, E, V, 1, "output.weight");
    m->hp.tied_output = m->output.t.data == NULL;
    if (m->hp.tied_output) {
        W(&m->output, W_MATMUL, E, V, 1, "token_embd.weight");
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        if ((st = load_layer(ld, il)) != DSPEC_OK) return st;
    }
    // layer tensors past block_count: a file whose count was cut would load and run its first
    // layers only (llama.cpp refuses it too: "wrong number of tensors")
    const int64_t n_blk = (int64_t)m->hp.n_layer + m->hp.n_nextn;
    for (int64_t i = 0; i < ds_gguf_n_tensors(ld->g); i++) {
        const char *tn = ds_gguf_tensor_at(ld->g, i)->name;
        long long b;
        int at = 0;
        if (sscanf(tn, "blk.%lld.%n", &b, &at) == 1 && at > 0 && (b < 0 || b >= n_blk)) {
            return ds_err_set(ld->err, DSPEC_ERR_FORMAT, "%s: tensor %s is past the model's %"
                              PRId64 " layers (block_count; a cut or mislabelled file)",
                              ds_gguf_path(ld->g), tn, n_blk);
        }
    }
    return DSPEC_OK;
}
#undef W

dspec_status ds_model_load_gguf(ds_model **out, const ds_gguf *g, ds_backend *be,
                                dspec_err *err) {
    *out = NULL;
    ds_model *m = calloc(1, sizeof(*m));
    if (!m) return ds_err_set(err, DSPEC_ERR_NOMEM, "model: out of memory");
    m->be = be;
    m->gguf = g;
    dspec_status st = ds_qwen35_read_hparams(&m->hp, g, err);
    if (st == DSPEC_OK && !ds_be_supports(be, DS_BE_CAP_GDN, m->hp.d_state, m->hp.d_state)) {
        st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: DeltaNet head dim %" PRId64 " (ssm.state_"
                        "size) is not supported by the %s backend", ds_gguf_path(g), m->hp.d_state,
                        be->name);
    }
    if (st == DSPEC_OK && m->hp.n_head > 0 &&
        !ds_be_supports(be, DS_BE_CAP_ATTN, m->hp.head_dim, m->hp.n_head / m->hp.n_head_kv)) {
        st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: attention head dim %" PRId64 " with %d "
                        "query heads per kv head is not supported by the %s backend",
                        ds_gguf_path(g), m->hp.head_dim, m->hp.n_head / m->hp.n_head_kv, be->name);
    }
    if (st == DSPEC_OK) {
        m->layers = calloc((size_t)m->hp.n_layer, sizeof(ds_layer));
        if (!m->layers) st = ds_err_set(err, DSPEC_ERR_NOMEM, "model: out of memory");
    }
    if (st == DSPEC_OK) {
        loader ld = {.m = m, .g = g, .err = err};
        st = load_tensors(&ld);
        if (st == DSPEC_OK && ld.n_realigned) {
            ds_log(DS_LOG_INFO, "model: %d tensors of %s not %d-byte aligned in the file "
                   "(general.alignment %zu): read from aligned copies (%.1f MiB)",
                   ld.n_realigned, ds_gguf_path(g), DS_WEIGHT_ALIGN, ds_gguf_alignment(g),
                   (double)ld.bytes_realigned / (1 << 20));
        }
    }
    if (st != DSPEC_OK) {
        ds_model_free(m);
        return st;
    }
    // bytes per token: everything except the unused embedding rows (one row is read)
    const ds_gguf_tensor *te = ds_gguf_find_tensor(g, "token_embd.weight");
    m->weight_bytes -= te->nbytes;
    // matmul FLOPs per token: without the LM head, which runs only for rows that want logits
    m->matmul_flops -= 2.0 * (double)m->hp.n_embd * (double)m->hp.n_vocab;
    *out = m;
    return DSPEC_OK;
}

dspec_status ds_model_load(ds_model **out, const char *path, ds_backend *be, dspec_err *err) {
    *out = NULL;
    ds_gguf *g;
    dspec_status st = ds_gguf_open(&g, path, err);
    if (st != DSPEC_OK) return st;
    st = ds_model_load_gguf(out, g, be, err);
    if (st != DSPEC_OK) {
        ds_gguf_close(g);
        return st;
    }
    (*out)->owned_gguf = g;
    return DSPEC_OK;
}

void ds_model_free(ds_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_device_buffers; i++) m->be->ops.free(m->be, m->device_buffers[i]);
    free(m->device_buffers);
    free(m->host_of_buffer);
    free(m->layers);
    ds_gguf_close(m->owned_gguf);
    free(m);
}

const ds_model_hparams *ds_model_hparams_get(const ds_model *m) {
    return &m->hp;
}
const ds_gguf *ds_model_gguf(const ds_model *m) {
    return m->gguf;
}
ds_backend *ds_model_backend(const ds_model *m) {
    return m->be;
}
const ds_tensor *ds_model_token_embd(const ds_model *m) {
    return &m->token_embd.t;
}
const ds_tensor *ds_model_output(const ds_model *m) {
    return &m->output.t;
}
size_t ds_model_weight_bytes(const ds_model *m) {
    return m->weight_bytes;
}

double ds_model_matmul_flops(const ds_model *m) {
    return m->matmul_flops;
}

static void push_weight(const ds_weight *w, const ds_tensor **out, int cap, int *n) {
    if (!w->t.data) return;
    if (*n < cap) out[*n] = &w->t;
    (*n)++;
}

int ds_model_matmul_weights(const ds_model *m, const ds_tensor **out, int cap) {
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const ds_layer *L = &m->layers[il];
        const ds_weight *w[] = {&L->attn_qkv, &L->attn_gate, &L->ssm_beta, &L->ssm_alpha,
                                &L->ssm_out, &L->attn_q, &L->attn_k, &L->attn_v,
                                &L->attn_output, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                                &L->ffn_gate_inp_shexp, &L->ffn_gate_shexp, &L->ffn_up_shexp,
                                &L->ffn_down_shexp, &L->ffn_gate_inp};
        for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) push_weight(w[i], out, cap, &n);
    }
    push_weight(&m->output, out, cap, &n);
    return n;
}
