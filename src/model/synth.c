// synth.c: random-weight qwen35 / qwen35moe GGUF writer (see synth.h). Calls gguf/, dtype/.
#include "model/synth.h"

#include "gguf/gguf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds_synth_params ds_synth_tiny(ds_arch arch, ds_type wtype, uint64_t seed) {
    ds_synth_params p = {
        .arch = arch, .n_vocab = 512, .n_embd = 256, .n_layer = 4, .interval = 4, .n_head = 4,
        .n_head_kv = 2, .head_dim = 64, .n_rot = 16, .rope_base = 1e7f, .n_ff = 512, .d_conv = 4,
        .d_state = 64, .n_k_heads = 2, .n_v_heads = 4, .n_expert = 4, .n_expert_used = 2,
        .n_ff_exp = 256, .n_ff_shexp = 256, .wtype = wtype, .out_type = DS_TYPE_COUNT,
        .seed = seed};
    return p;
}

bool ds_synth_preset(const char *name, ds_synth_params *p) {
    ds_synth_params t = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_F32, 0);
    // n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, H_v; shared: head_dim 256, n_rot 64,
    // d_state 128, H_k 16, conv 4, interval 4 (target-qwen35.md §1.1).
    static const struct {
        const char *name;
        int64_t n_embd;
        int n_layer, n_head, n_head_kv;
        int64_t n_ff;
        int n_v_heads;
    } dense[] = {
        {"0.8b", 1024, 24, 8, 2, 3584, 16}, {"2b", 2048, 24, 8, 2, 6144, 16},
        {"4b", 2560, 32, 16, 4, 9216, 32},  {"9b", 4096, 32, 16, 4, 12288, 32},
        {"27b", 5120, 64, 24, 4, 17408, 48},
    };
    if (!strcmp(name, "tiny")) {
        *p = t;
        return true;
    }
    if (!strcmp(name, "100m")) {
        t.n_vocab = 32768, t.n_embd = 768, t.n_layer = 12, t.n_head = 6, t.n_head_kv = 2;
        t.head_dim = 128, t.n_rot = 32, t.n_ff = 2304, t.d_state = 64, t.n_k_heads = 6;
        t.n_v_heads = 12;
        *p = t;
        return true;
    }
    t.n_vocab = 248320, t.head_dim = 256, t.n_rot = 64, t.d_state = 128, t.n_k_heads = 16;
    t.d_conv = 4, t.interval = 4, t.rope_base = 1e7f;
    for (size_t i = 0; i < DS_ARRAY_LEN(dense); i++) {
        if (strcmp(name, dense[i].name)) continue;
        t.n_embd = dense[i].n_embd, t.n_layer = dense[i].n_layer, t.n_head = dense[i].n_head;
        t.n_head_kv = dense[i].n_head_kv, t.n_ff = dense[i].n_ff, t.n_v_heads = dense[i].n_v_heads;
        t.tied = dense[i].n_embd <= 2560;
        *p = t;
        return true;
    }
    if (!strcmp(name, "35b-a3b")) {
        t.arch = DS_ARCH_QWEN35MOE, t.n_embd = 2048, t.n_layer = 40, t.n_head = 16;
        t.n_head_kv = 2, t.n_v_heads = 32, t.n_expert = 256, t.n_expert_used = 8;
        t.n_ff_exp = 512, t.n_ff_shexp = 512, t.n_ff = 0;
        *p = t;
        return true;
    }
    return false;
}

// How a tensor's values are drawn.
typedef enum fill { FILL_LINEAR, FILL_NORM, FILL_SSM_A, FILL_DT, FILL_CONV, FILL_PLAIN } fill;

typedef struct tdesc {
    char name[96];
    ds_type type;
    int n_dims;
    int64_t ne[3];
    fill how;
} tdesc;

typedef struct tlist {
    tdesc *t;
    int n, cap;
} tlist;

static void add(tlist *l, ds_type type, fill how, int64_t ne0, int64_t ne1, int64_t ne2,
                const char *fmt, int il) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof(tdesc));
        DS_ASSERT(l->t);
    }
    tdesc *d = &l->t[l->n++];
    snprintf(d->name, sizeof(d->name), fmt, il);
    d->type = type;
    d->how = how;
    d->ne[0] = ne0, d->ne[1] = ne1, d->ne[2] = ne2;
    d->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
}

static void build_list(const ds_synth_params *p, tlist *l) {
    ds_type W = p->wtype, F32 = DS_TYPE_F32;
    int64_t E = p->n_embd, hd = p->head_dim;
    int64_t conv = 2 * p->n_k_heads * p->d_state + p->n_v_heads * p->d_state;
    int64_t din = p->n_v_heads * p->d_state;
    add(l, W, FILL_PLAIN, E, p->n_vocab, 1, "token_embd.weight", 0);
    add(l, F32, FILL_NORM, E, 1, 1, "output_norm.weight", 0);
    if (!p->tied) {
        add(l, p->out_type == DS_TYPE_COUNT ? W : p->out_type, FILL_LINEAR, E, p->n_vocab, 1,
            "output.weight", 0);
    }
    for (int il = 0; il < p->n_layer; il++) {
        add(l, F32, FILL_NORM, E, 1, 1, "blk.%d.attn_norm.weight", il);
        add(l, F32, FILL_NORM, E, 1, 1, "blk.%d.post_attention_norm.weight", il);
        if ((il + 1) % p->interval != 0) {
            add(l, W, FILL_LINEAR, E, conv, 1, "blk.%d.attn_qkv.weight", il);
            add(l, W, FILL_LINEAR, E, din, 1, "blk.%d.attn_gate.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_v_heads, 1, "blk.%d.ssm_beta.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_v_heads, 1, "blk.%d.ssm_alpha.weight", il);
            add(l, F32, FILL_CONV, p->d_conv, conv, 1, "blk.%d.ssm_conv1d.weight", il);
            add(l, F32, FILL_DT, p->n_v_heads, 1, 1, "blk.%d.ssm_dt.bias", il);
            add(l, F32, FILL_SSM_A, p->n_v_heads, 1, 1, "blk.%d.ssm_a", il);
            add(l, F32, FILL_NORM, p->d_state, 1, 1, "blk.%d.ssm_norm.weight", il);
            add(l, W, FILL_LINEAR, din, E, 1, "blk.%d.ssm_out.weight", il);
        } else {
            add(l, W, FILL_LINEAR, E, 2 * p->n_head * hd, 1, "blk.%d.attn_q.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_head_kv * hd, 1, "blk.%d.attn_k.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_head_kv * hd, 1, "blk.%d.attn_v.weight", il);
            add(l, W, FILL_LINEAR, p->n_head * hd, E, 1, "blk.%d.attn_output.weight", il);
            add(l, F32, FILL_NORM, hd, 1, 1, "blk.%d.attn_q_norm.weight", il);
            add(l, F32, FILL_NORM, hd, 1, 1, "blk.%d.attn_k_norm.weight", il);
        }
        if (p->arch == DS_ARCH_QWEN35) {
            add(l, W, FILL_LINEAR, E, p->n_ff, 1, "blk.%d.ffn_gate.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_ff, 1, "blk.%d.ffn_up.weight", il);
            add(l, W, FILL_LINEAR, p->n_ff, E, 1, "blk.%d.ffn_down.weight", il);
            continue;
        }
        int64_t Fe = p->n_ff_exp, NE = p->n_expert;
        add(l, F32, FILL_LINEAR, E, NE, 1, "blk.%d.ffn_gate_inp.weight", il);
        if (p->fused_gate_up) {
            add(l, W, FILL_LINEAR, E, 2 * Fe, NE, "blk.%d.ffn_gate_up_exps.weight", il);
        } else {
            add(l, W, FILL_LINEAR, E, Fe, NE, "blk.%d.ffn_gate_exps.weight", il);
            add(l, W, FILL_LINEAR, E, Fe, NE, "blk.%d.ffn_up_exps.weight", il);
        }
        add(l, W, FILL_LINEAR, Fe, E, NE, "blk.%d.ffn_down_exps.weight", il);
        if (p->n_ff_shexp > 0) {
            add(l, F32, FILL_LINEAR, E, 1, 1, "blk.%d.ffn_gate_inp_shexp.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_ff_shexp, 1, "blk.%d.ffn_gate_shexp.weight", il);
            add(l, W, FILL_LINEAR, E, p->n_ff_shexp, 1, "blk.%d.ffn_up_shexp.weight", il);
            add(l, W, FILL_LINEAR, p->n_ff_shexp, E, 1, "blk.%d.ffn_down_shexp.weight", il);
        }
    }
}

static void set_kv(ds_gguf_writer *w, const ds_synth_params *p) {
    const char *an = p->arch == DS_ARCH_QWEN35MOE ? "qwen35moe" : "qwen35";
    char k[128];
#define K(fmt) (snprintf(k, sizeof(k), "%s." fmt, an), k)
    ds_gguf_writer_set_str(w, "general.architecture", an);
    ds_gguf_writer_set_str(w, "general.name", "dspec synthetic");
    ds_gguf_writer_set_u32(w, K("block_count"), (uint32_t)p->n_layer);
    ds_gguf_writer_set_u32(w, K("context_length"), 262144);
    ds_gguf_writer_set_u32(w, K("embedding_length"), (uint32_t)p->n_embd);
    if (p->arch == DS_ARCH_QWEN35) {
        ds_gguf_writer_set_u32(w, K("feed_forward_length"), (uint32_t)p->n_ff);
    } else {
        ds_gguf_writer_set_u32(w, K("expert_count"), (uint32_t)p->n_expert);
        ds_gguf_writer_set_u32(w, K("expert_used_count"), (uint32_t)p->n_expert_used);
        ds_gguf_writer_set_u32(w, K("expert_feed_forward_length"), (uint32_t)p->n_ff_exp);
        ds_gguf_writer_set_u32(w, K("expert_shared_feed_forward_length"),
                               (uint32_t)p->n_ff_shexp);
    }
    ds_gguf_writer_set_u32(w, K("attention.head_count"), (uint32_t)p->n_head);
    ds_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    ds_gguf_writer_set_u32(w, K("attention.key_length"), (uint32_t)p->head_dim);
    ds_gguf_writer_set_u32(w, K("attention.value_length"), (uint32_t)p->head_dim);
    ds_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-6f);
    ds_gguf_writer_set_f32(w, K("rope.freq_base"), p->rope_base);
    ds_gguf_writer_set_u32(w, K("rope.dimension_count"), (uint32_t)p->n_rot);
    int32_t sections[4] = {p->n_rot / 6 + (p->n_rot / 2 - 3 * (p->n_rot / 6)), p->n_rot / 6,
                           p->n_rot / 6, 0};
    ds_gguf_writer_set_arr(w, K("rope.dimension_sections"), DS_GGUF_INT32, sections, 4);
    ds_gguf_writer_set_u32(w, K("ssm.conv_kernel"), (uint32_t)p->d_conv);
    ds_gguf_writer_set_u32(w, K("ssm.state_size"), (uint32_t)p->d_state);
    ds_gguf_writer_set_u32(w, K("ssm.group_count"), (uint32_t)p->n_k_heads);
    ds_gguf_writer_set_u32(w, K("ssm.time_step_rank"), (uint32_t)p->n_v_heads);
    ds_gguf_writer_set_u32(w, K("ssm.inner_size"), (uint32_t)(p->n_v_heads * p->d_state));
    ds_gguf_writer_set_u32(w, K("full_attention_interval"), (uint32_t)p->interval);
#undef K
}

static float draw(ds_rng *r, fill how, int64_t fan_in) {
    switch (how) {
    case FILL_LINEAR: return ds_rng_normal(r) / sqrtf((float)fan_in);
    case FILL_NORM: return 1.0f + 0.1f * ds_rng_normal(r);
    case FILL_SSM_A: return -expf(logf(0.5f) + ds_rng_uniform(r) * (logf(8.0f) - logf(0.5f)));
    case FILL_DT: return 0.5f * ds_rng_normal(r);
    case FILL_CONV: return 0.5f * ds_rng_normal(r);
    case FILL_PLAIN: return ds_rng_normal(r);
    }
    return 0.0f;
}

// The tokens padded to the model's vocabulary with "[PAD<id>]" tokens (as llama.cpp's converter
// pads Qwen's 248,077 tokens to 248,320), so every id a sampler can draw detokenizes.
static dspec_status pad_tokens(ds_gguf_writer *w, const ds_gguf *g, int64_t k, int64_t n_tok,
                               int64_t n_vocab, dspec_err *err) {
    int64_t kt = ds_gguf_find_key(g, "tokenizer.ggml.token_type");
    const char **strs = malloc((size_t)n_vocab * sizeof(*strs));
    size_t *lens = malloc((size_t)n_vocab * sizeof(*lens));
    int32_t *types = malloc((size_t)n_vocab * sizeof(*types));
    int64_t *t64 = malloc((size_t)n_tok * sizeof(*t64));
    char *pads = malloc((size_t)(n_vocab - n_tok) * 24);
    dspec_status st = strs && lens && types && t64 && pads ? DSPEC_OK
                      : ds_err_set(err, DSPEC_ERR_NOMEM, "synth: out of memory");
    size_t n_types = 0;
    if (st == DSPEC_OK && kt >= 0) {
        st = ds_gguf_get_int_arr(g, "tokenizer.ggml.token_type", t64, (size_t)n_tok, &n_types,
                                 err);
    }
    for (int64_t i = 0; i < n_vocab && st == DSPEC_OK; i++) {
        if (i < n_tok) {
            ds_str t = ds_gguf_kv_arr_str(g, k, (uint64_t)i);
            strs[i] = t.ptr, lens[i] = t.len;
            types[i] = (size_t)i < n_types ? (int32_t)t64[i] : 1;
        } else {
            char *pad = pads + (i - n_tok) * 24;
            lens[i] = (size_t)snprintf(pad, 24, "[PAD%" PRId64 "]", i);
            strs[i] = pad, types[i] = 1;
        }
    }
    if (st == DSPEC_OK) { // (a failure sticks to the writer, which reports it at begin)
        ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, (uint64_t)n_vocab);
        ds_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DS_GGUF_INT32, types,
                               (uint64_t)n_vocab);
    }
    free(strs), free(lens), free(types), free(t64), free(pads);
    return st;
}

// The tokenizer.* keys of another GGUF (its vocabulary must fit in the model's; padded to it).
static dspec_status copy_tokenizer(ds_gguf_writer *w, const ds_synth_params *p, dspec_err *err) {
    ds_gguf *g = NULL;
    dspec_status st = ds_gguf_open(&g, p->tokenizer_from, err);
    if (st != DSPEC_OK) return st;
    int64_t k = ds_gguf_find_key(g, "tokenizer.ggml.tokens");
    uint64_t n_tok = k >= 0 ? ds_gguf_kv_arr_count(g, k) : 0;
    if (k < 0) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "synth: %s has no tokenizer (tokenizer.ggml.tokens)",
                        p->tokenizer_from);
    } else if ((int64_t)n_tok > p->n_vocab) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "synth: the tokenizer of %s has %" PRIu64
                        " tokens, more than the model's vocabulary of %" PRId64,
                        p->tokenizer_from, n_tok, p->n_vocab);
    } else {
        st = ds_gguf_writer_copy_kv_prefix(w, g, "tokenizer.", NULL, err);
        if (st == DSPEC_OK && (int64_t)n_tok < p->n_vocab) {
            st = pad_tokens(w, g, k, (int64_t)n_tok, p->n_vocab, err);
        }
    }
    ds_gguf_close(g);
    return st;
}

dspec_status ds_synth_write(const char *path, const ds_synth_params *p, dspec_err *err) {
    tlist l = {0};
    build_list(p, &l);
    ds_gguf_writer *w = NULL;
    float *row = NULL;
    void *q = NULL;
    dspec_status st = ds_gguf_writer_new(&w, err);
    if (st != DSPEC_OK) goto done;
    set_kv(w, p);
    if (p->tokenizer_from) st = copy_tokenizer(w, p, err);
    int64_t max_row = 0;
    for (int i = 0; i < l.n && st == DSPEC_OK; i++) {
        if (p->type_of) {
            int64_t ne4[4] = {l.t[i].ne[0], l.t[i].ne[1], l.t[i].ne[2], 1};
            l.t[i].type = p->type_of(p->type_ctx, l.t[i].name, l.t[i].n_dims, ne4, l.t[i].type);
        }
        st = ds_gguf_writer_add_tensor(w, l.t[i].name, l.t[i].type, l.t[i].n_dims, l.t[i].ne,
                                       err);
        max_row = DS_MAX(max_row, l.t[i].ne[0]);
    }
    if (st == DSPEC_OK) st = ds_gguf_writer_begin(w, path, err);
    row = malloc((size_t)max_row * sizeof(float));
    q = malloc((size_t)max_row * sizeof(float) + 64);
    if (st == DSPEC_OK && (!row || !q)) st = ds_err_set(err, DSPEC_ERR_NOMEM, "synth: OOM");
    ds_rng r = {.s = p->seed * 0x2545f4914f6cdd1dull + 1};
    double total = 0.0, done_rows = 0.0;
    for (int i = 0; i < l.n; i++) total += (double)(l.t[i].ne[1] * l.t[i].ne[2]);
    // Pools: pool_rows f32 rows per row length (drawn once, so every quant mix of the same seed
    // holds the same underlying weights), quantized once per (row length, type); rows are written
    // in batches of up to 64.
    enum { MAX_POOLS = 16, BATCH = 64 };
    struct { int64_t ne0; fill how; float *f; struct { ds_type t; uint8_t *q; } qv[8]; int nq; } pools[MAX_POOLS];
    int n_pools = 0;
    uint8_t *batch = NULL;
    for (int i = 0; i < l.n && st == DSPEC_OK; i++) {
        const tdesc *d = &l.t[i];
        int64_t rows = d->ne[1] * d->ne[2], ne0 = d->ne[0];
        size_t rb = ds_type_row_size(d->type, ne0);
        // (matmul weights and the embedding table: the tensors with millions of rows)
        bool pooled = p->pool_rows > 0 && rows > p->pool_rows &&
                      (d->how == FILL_LINEAR || d->how == FILL_PLAIN);
        const uint8_t *pool = NULL;
        if (pooled) {
            int pi = 0;
            while (pi < n_pools && (pools[pi].ne0 != ne0 || pools[pi].how != d->how)) pi++;
            if (pi == n_pools && n_pools < MAX_POOLS) { // new row kind: draw its f32 rows
                pools[pi].ne0 = ne0;
                pools[pi].how = d->how;
                pools[pi].nq = 0;
                pools[pi].f = malloc((size_t)(ne0 * p->pool_rows) * sizeof(float));
                if (!pools[pi].f) st = ds_err_set(err, DSPEC_ERR_NOMEM, "synth: OOM");
                for (int64_t k = 0; st == DSPEC_OK && k < ne0 * p->pool_rows; k++) {
                    pools[pi].f[k] = draw(&r, d->how, ne0);
                }
                n_pools++;
            }
            if (pi == n_pools) {
                pooled = false; // more distinct row lengths than pools: draw fresh rows
            } else {
                int qi = 0;
                while (qi < pools[pi].nq && pools[pi].qv[qi].t != d->type) qi++;
                if (qi == pools[pi].nq && qi < 8) {
                    uint8_t *qp = malloc(rb * (size_t)p->pool_rows);
                    if (!qp) st = ds_err_set(err, DSPEC_ERR_NOMEM, "synth: OOM");
                    for (int64_t k = 0; k < p->pool_rows && st == DSPEC_OK; k++) {
                        st = ds_quantize_row(d->type, qp + (size_t)k * rb, pools[pi].f + k * ne0,
                                             ne0, err);
                    }
                    pools[pi].qv[qi].t = d->type;
                    pools[pi].qv[qi].q = qp;
                    pools[pi].nq++;
                }
                if (qi < pools[pi].nq) pool = pools[pi].qv[qi].q;
                pooled = pool != NULL;
            }
        }
        if (pooled && !batch) {
            batch = malloc((size_t)max_row * sizeof(float) * BATCH + 64);
            if (!batch) st = ds_err_set(err, DSPEC_ERR_NOMEM, "synth: OOM");
        }
        for (int64_t rr = 0; rr < rows && st == DSPEC_OK;) {
            if (pooled) { // a batch of rows drawn from the pool, one write
                int64_t nb = DS_MIN((int64_t)BATCH, rows - rr);
                for (int64_t b = 0; b < nb; b++) {
                    memcpy(batch + (size_t)b * rb,
                           pool + (size_t)(ds_rng_next(&r) % (uint64_t)p->pool_rows) * rb, rb);
                }
                st = ds_gguf_writer_write_tensor_data(w, i, batch, rb * (size_t)nb, err);
                rr += nb;
            } else {
                for (int64_t c = 0; c < ne0; c++) row[c] = draw(&r, d->how, ne0);
                st = ds_quantize_row(d->type, q, row, ne0, err);
                if (st == DSPEC_OK) st = ds_gguf_writer_write_tensor_data(w, i, q, rb, err);
                rr++;
            }
            if (p->progress && (rr & 1023) < 64) {
                p->progress(p->progress_ctx, (done_rows + (double)rr) / total);
            }
        }
        done_rows += (double)rows;
    }
    for (int pi = 0; pi < n_pools; pi++) {
        free(pools[pi].f);
        for (int qi = 0; qi < pools[pi].nq; qi++) free(pools[pi].qv[qi].q);
    }
    free(batch);
    if (p->progress && st == DSPEC_OK) p->progress(p->progress_ctx, 1.0);
    if (st == DSPEC_OK) st = ds_gguf_writer_finish(w, err);
done:
    ds_gguf_writer_free(w);
    free(row);
    free(q);
    free(l.t);
    return st;
}
