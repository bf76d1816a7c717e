// draft_synth.c: random-weight drafter GGUF writer (see draft_synth.h): the anchor
// `qwen35-dflash-draft` keys and tensor names (anchor-lucebox.md §3.1, plus dspec's
// `dflash.causal` / `dflash.sample_from_anchor`), shapes of the published drafters
// (drafters-and-verification.md §1.1, §3.3, §8). Calls model/ (ds_synth_preset), gguf/, dtype/.
#include "draft/draft_synth.h"

#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "qwen35-dflash-draft"

// ---- names and presets ----------------------------------------------------------------------------

static const char *const k_kind_names[] = {"dflash", "dflash2", "dspark"};

bool ds_draft_synth_kind_from_name(const char *name, ds_draft_kind *out) {
    for (int i = 0; name && i < (int)DS_ARRAY_LEN(k_kind_names); i++) {
        if (!strcmp(name, k_kind_names[i])) {
            *out = (ds_draft_kind)i;
            return true;
        }
    }
    return false;
}

const char *ds_draft_synth_kind_name(ds_draft_kind kind) {
    return (unsigned)kind < DS_ARRAY_LEN(k_kind_names) ? k_kind_names[kind] : "?";
}

// The reference layer picker (drafters-and-verification.md §1.1): n evenly spaced integers from
// 1 to N-3, i.e. round(1 + i (N-4) / (n-1)). Targets too shallow for 5 distinct taps (< 8
// layers) get min(5, N-1) taps spread over 0 .. N-2 instead (test sizes only).
static void pick_taps(int n_target, ds_draft_synth_params *p) {
    int n = 5;
    if (n_target >= n + 3) {
        for (int i = 0; i < n; i++) {
            p->target_layer_ids[i] = (int)lround(1.0 + (double)i * (n_target - 4) / (n - 1));
        }
    } else {
        n = DS_MAX(1, DS_MIN(n, n_target - 1));
        for (int i = 0; i < n; i++) {
            p->target_layer_ids[i] = n > 1 ? (int)lround((double)i * (n_target - 2) / (n - 1)) : 0;
        }
    }
    p->n_taps = n;
}

// Drafter shapes for a target of these sizes; `published` ("27b", "9b", "35b-a3b" or NULL) picks
// the published drafter's geometry.
static bool shape(ds_draft_synth_params *p, ds_draft_kind kind, int64_t n_vocab, int64_t n_embd,
                  int n_layer, int64_t n_ff, int64_t head_dim, const char *published) {
    if ((unsigned)kind >= DS_ARRAY_LEN(k_kind_names) || n_vocab < 2 || n_embd < 1 ||
        n_layer < 1 || head_dim < 2) {
        return false;
    }
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->n_vocab = n_vocab;
    p->n_embd = n_embd;
    p->n_layer = 5;
    p->head_dim = DS_MIN((int64_t)128, head_dim & ~(int64_t)1);
    p->n_head = (int)DS_MAX((int64_t)1, n_embd / p->head_dim);
    p->n_head_kv = p->n_head % 4 == 0 ? p->n_head / 4 : p->n_head % 2 == 0 ? p->n_head / 2 : 1;
    p->n_ff = n_ff > 0 ? n_ff : 3 * n_embd;
    p->block_size = 16;
    p->mask_token_id = n_vocab >= 248320 ? 248070 : (int32_t)(n_vocab - 1);
    p->rope_base = 1e7f;
    p->eps = 1e-6f;
    p->n_ctx_train = 4096;
    p->wtype = DS_TYPE_Q8_0;
    p->file_type = -1;
    p->seed = 1;
    // published shapes (drafters-and-verification.md §3.3, §8)
    bool all_full = false; // DFlash: every layer full attention, bidirectional
    if (published && !strcmp(published, "27b")) {
        p->n_head = 32, p->n_head_kv = 8, p->head_dim = 128, p->n_ff = 17408;
    } else if (published && !strcmp(published, "9b")) {
        p->n_head = 32, p->n_head_kv = 8, p->head_dim = 128, p->n_ff = 12288;
        all_full = true; // z-lab Qwen3.5-9B-DFlash (vLLM comment)
    } else if (published && !strcmp(published, "35b-a3b")) {
        p->n_layer = 8, p->n_head = 32, p->n_head_kv = 4, p->head_dim = 128, p->n_ff = 6144;
        all_full = true;
    }
    pick_taps(n_layer, p);
    for (int il = 0; il < p->n_layer; il++) {
        switch (kind) {
        case DS_DRAFT_DFLASH: // Qwen3.6-27B DFlash: 4 x sliding(2048) + 1 full; sliding causal
            p->swa[il] = !all_full && il + 1 < p->n_layer;
            p->causal[il] = p->swa[il];
            break;
        case DS_DRAFT_DFLASH2: // Qwen3.8-27B DFlash 2: 5 x sliding(2048), is_causal false
            p->swa[il] = true;
            p->causal[il] = false;
            break;
        case DS_DRAFT_DSPARK: // DeepSpec / RadixArk: full attention, non-causal in-block
            p->swa[il] = false;
            p->causal[il] = false;
            break;
        }
    }
    p->sliding_window = 2048;
    if (kind == DS_DRAFT_DFLASH2) {
        p->conv_kernel = 2, p->conv_group = 16, p->selector_rank = 256, p->selector_top_k = 16;
        while (p->conv_group > 1 && n_embd % p->conv_group) {
            p->conv_group /= 2;
        }
    }
    if (kind == DS_DRAFT_DSPARK) {
        p->markov_rank = 256, p->confidence = true, p->confidence_with_markov = true;
    }
    return true;
}

bool ds_draft_synth_preset(const char *target, ds_draft_kind kind, ds_draft_synth_params *p) {
    ds_synth_params t;
    if (!target || !ds_synth_preset(target, &t)) {
        return false;
    }
    return shape(p, kind, t.n_vocab, t.n_embd, t.n_layer, t.n_ff, t.head_dim, target);
}

bool ds_draft_synth_for_target(const ds_model_hparams *t, ds_draft_kind kind,
                               ds_draft_synth_params *p) {
    const char *published = NULL;
    if (t->n_vocab >= 248320 && t->n_embd == 5120 && t->n_layer == 64) {
        published = "27b";
    } else if (t->n_vocab >= 248320 && t->n_embd == 4096 && t->n_layer == 32) {
        published = "9b";
    } else if (t->n_vocab >= 248320 && t->n_embd == 2048 && t->n_layer == 40 &&
               t->arch == DS_ARCH_QWEN35MOE) {
        published = "35b-a3b";
    }
    int64_t n_ff = t->arch == DS_ARCH_QWEN35 ? t->n_ff : 0;
    return shape(p, kind, t->n_vocab, t->n_embd, t->n_layer, n_ff, t->head_dim, published);
}

// ---- validation -----------------------------------------------------------------------------------

#define BAD(...) ds_err_set(err, DSPEC_ERR_INVALID, __VA_ARGS__)

static dspec_status check_params(const ds_draft_synth_params *p, dspec_err *err) {
    if ((unsigned)p->kind >= DS_ARRAY_LEN(k_kind_names)) {
        return BAD("draft synth: kind %d is not dflash / dflash2 / dspark", (int)p->kind);
    }
    if (p->n_vocab < 2 || p->n_vocab > INT32_MAX || p->n_embd < 1 || p->n_embd > (1 << 20)) {
        return BAD("draft synth: n_vocab %" PRId64 " / n_embd %" PRId64 " out of range", p->n_vocab,
                   p->n_embd);
    }
    if (p->n_layer < 1 || p->n_layer > DS_DRAFT_SYNTH_MAX_LAYERS) {
        return BAD("draft synth: n_layer %d outside 1..%d", p->n_layer,
                   DS_DRAFT_SYNTH_MAX_LAYERS);
    }
    if (p->n_head < 1 || p->n_head > 4096 || p->n_head_kv < 1 || p->n_head % p->n_head_kv) {
        return BAD("draft synth: n_head %d / n_head_kv %d: need n_head a positive multiple of "
                   "n_head_kv", p->n_head, p->n_head_kv);
    }
    if (p->head_dim < 2 || p->head_dim % 2 || p->head_dim > 1024) {
        return BAD("draft synth: head_dim %" PRId64 " must be even in 2..1024", p->head_dim);
    }
    if (p->n_ff < 1 || p->n_ff > (1 << 22)) {
        return BAD("draft synth: n_ff %" PRId64 " out of range", p->n_ff);
    }
    if (p->block_size < 2 || p->block_size > DS_DRAFT_MAX_BLOCK / 2) {
        return BAD("draft synth: block_size %d outside 2..%d", p->block_size,
                   DS_DRAFT_MAX_BLOCK / 2);
    }
    if (p->n_taps < 1 || p->n_taps > DS_MODEL_MAX_TAPS) {
        return BAD("draft synth: n_taps %d outside 1..%d", p->n_taps, DS_MODEL_MAX_TAPS);
    }
    for (int i = 0; i < p->n_taps; i++) {
        if (p->target_layer_ids[i] < 0 || (i && p->target_layer_ids[i] <= p->target_layer_ids[i - 1])) {
            return BAD("draft synth: target_layer_ids[%d] = %d: must be increasing and >= 0", i,
                       p->target_layer_ids[i]);
        }
    }
    if (p->mask_token_id < 0 || p->mask_token_id >= p->n_vocab) {
        return BAD("draft synth: mask_token_id %d outside the vocabulary", (int)p->mask_token_id);
    }
    if (!(p->eps > 0.0f) || !isfinite(p->eps) || !(p->rope_base > 1.0f) || !isfinite(p->rope_base)) {
        return BAD("draft synth: eps must be > 0 and rope_base > 1 (both finite)");
    }
    if (p->sliding_window < 0 || p->sliding_window > INT32_MAX || p->n_ctx_train < 1 ||
        p->n_ctx_train > INT32_MAX) {
        return BAD("draft synth: sliding_window / n_ctx_train out of range");
    }
    if (p->kind == DS_DRAFT_DFLASH2) {
        if (p->conv_kernel < 1 || p->conv_kernel > 8) {
            return BAD("draft synth: conv_kernel %d outside 1..8", p->conv_kernel);
        }
        if (p->conv_group < 1 || p->n_embd % p->conv_group) {
            return BAD("draft synth: conv_group %" PRId64 " does not divide n_embd %" PRId64,
                       p->conv_group, p->n_embd);
        }
        if (p->selector_rank < 1 || p->selector_rank > 65536 || p->selector_top_k < 1 ||
            p->selector_top_k > DS_DRAFT_MAX_TOPK || p->selector_top_k > p->n_vocab) {
            return BAD("draft synth: selector_rank %" PRId64 " / selector_top_k %d out of range "
                       "(top-k 1..%d)", p->selector_rank, p->selector_top_k, DS_DRAFT_MAX_TOPK);
        }
    }
    if (p->kind == DS_DRAFT_DSPARK) {
        if (p->markov_rank < 0 || p->markov_rank > 65536) {
            return BAD("draft synth: markov_rank %" PRId64 " out of range", p->markov_rank);
        }
        if (p->confidence_with_markov && (!p->confidence || p->markov_rank == 0)) {
            return BAD("draft synth: confidence_with_markov needs the confidence head and "
                       "markov_rank > 0");
        }
    }
    if (p->pool_rows < 0) {
        return BAD("draft synth: pool_rows %" PRId64 " < 0", p->pool_rows);
    }
    return DSPEC_OK;
}

// ---- tensor list ----------------------------------------------------------------------------------

// How a tensor's values are drawn.
typedef enum fill {
    FILL_LINEAR,    // N(0, 1) / sqrt(ne0) * scale
    FILL_NORM,      // 1 + N(0, 0.1^2)
    FILL_CONV_BASE, // rows s*K + o: (o == 0) + N(0, 0.05^2)
    FILL_TABLE,     // N(0, 1) * scale
    FILL_CONST,     // scale
} fill;

typedef struct tdesc {
    char name[64];
    ds_type type;
    int n_dims;
    int64_t ne[2];
    fill how;
    float scale;
    int conv_k;    // FILL_CONV_BASE: taps per side
    bool keep_f32; // norms, conv bases, the confidence head: f32 whatever the mix
} tdesc;

typedef struct tlist {
    tdesc *t;
    int n, cap;
    bool oom;
} tlist;

static tdesc *add(tlist *l, ds_type type, fill how, float scale, int64_t ne0, int64_t ne1,
                  int n_dims, const char *fmt, int il) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        tdesc *n = realloc(l->t, (size_t)cap * sizeof(tdesc));
        if (!n) {
            l->oom = true;
            return NULL;
        }
        l->t = n;
        l->cap = cap;
    }
    tdesc *d = &l->t[l->n++];
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), fmt, il);
    d->type = type;
    d->how = how;
    d->scale = scale;
    d->ne[0] = ne0, d->ne[1] = ne1;
    d->n_dims = n_dims;
    d->keep_f32 = how == FILL_NORM || how == FILL_CONV_BASE || how == FILL_CONST;
    return d;
}

static void build_list(const ds_draft_synth_params *p, tlist *l) {
    const ds_type W = p->wtype, F32 = DS_TYPE_F32;
    const int64_t H = p->n_embd, hd = p->head_dim, V = p->n_vocab;
    const int64_t q_dim = p->n_head * hd, kv_dim = p->n_head_kv * hd;
    const float resid = 0.5f / sqrtf((float)p->n_layer); // residual-branch outputs start small
    add(l, W, FILL_LINEAR, 1.0f, (int64_t)p->n_taps * H, H, 2, "dflash.fc.weight", 0);
    add(l, F32, FILL_NORM, 1.0f, H, 1, 1, "dflash.hidden_norm.weight", 0);
    add(l, F32, FILL_NORM, 1.0f, H, 1, 1, "output_norm.weight", 0);
    for (int il = 0; il < p->n_layer; il++) {
        add(l, F32, FILL_NORM, 1.0f, H, 1, 1, "blk.%d.attn_norm.weight", il);
        add(l, F32, FILL_NORM, 1.0f, H, 1, 1, "blk.%d.ffn_norm.weight", il);
        add(l, W, FILL_LINEAR, 1.0f, H, q_dim, 2, "blk.%d.attn_q.weight", il);
        add(l, W, FILL_LINEAR, 1.0f, H, kv_dim, 2, "blk.%d.attn_k.weight", il);
        add(l, W, FILL_LINEAR, 1.0f, H, kv_dim, 2, "blk.%d.attn_v.weight", il);
        add(l, W, FILL_LINEAR, resid, q_dim, H, 2, "blk.%d.attn_output.weight", il);
        add(l, F32, FILL_NORM, 1.0f, hd, 1, 1, "blk.%d.attn_q_norm.weight", il);
        add(l, F32, FILL_NORM, 1.0f, hd, 1, 1, "blk.%d.attn_k_norm.weight", il);
        add(l, W, FILL_LINEAR, 1.0f, H, p->n_ff, 2, "blk.%d.ffn_gate.weight", il);
        add(l, W, FILL_LINEAR, 1.0f, H, p->n_ff, 2, "blk.%d.ffn_up.weight", il);
        add(l, W, FILL_LINEAR, resid, p->n_ff, H, 2, "blk.%d.ffn_down.weight", il);
        if (p->kind == DS_DRAFT_DFLASH2) {
            // base [2 sides x K taps, H]; projection H -> 2 K groups, dynamic taps of ~0.1
            const int64_t K = p->conv_kernel, proj = 2 * K * (H / p->conv_group);
            static const char *const names[2][2] = {
                {"blk.%d.attn_conv.base", "blk.%d.attn_conv.proj.weight"},
                {"blk.%d.ffn_conv.base", "blk.%d.ffn_conv.proj.weight"}};
            for (int s = 0; s < 2; s++) {
                tdesc *b = add(l, F32, FILL_CONV_BASE, 0.05f, H, 2 * K, 2, names[s][0], il);
                if (b) {
                    b->conv_k = (int)K;
                }
                add(l, W, FILL_LINEAR, 0.1f, H, proj, 2, names[s][1], il);
            }
        }
    }
    if (p->kind == DS_DRAFT_DFLASH2) {
        add(l, W, FILL_LINEAR, 1.0f, H, p->selector_rank, 2, "dflash.selector.hproj.weight", 0);
        add(l, W, FILL_TABLE, 0.25f, p->selector_rank, V, 2, "dflash.selector.pred_cb", 0);
        add(l, W, FILL_TABLE, 0.25f, p->selector_rank, V, 2, "dflash.selector.succ_cb", 0);
    }
    if (p->kind == DS_DRAFT_DSPARK && p->markov_rank > 0) {
        add(l, W, FILL_TABLE, 0.25f, p->markov_rank, V, 2, "dflash.dspark.markov.w1", 0);
        add(l, W, FILL_TABLE, 0.25f, p->markov_rank, V, 2, "dflash.dspark.markov.w2", 0);
    }
    if (p->kind == DS_DRAFT_DSPARK && p->confidence) {
        const int64_t D = H + (p->confidence_with_markov ? p->markov_rank : 0);
        tdesc *cw = add(l, F32, FILL_LINEAR, 1.0f, D, 1, 2, "dflash.dspark.confidence.weight", 0);
        if (cw) {
            cw->keep_f32 = true;
        }
        add(l, F32, FILL_CONST, 1.0f, 1, 1, 1, "dflash.dspark.confidence.bias", 0);
    }
}

// ---- keys -----------------------------------------------------------------------------------------

static void set_kv(ds_gguf_writer *w, const ds_draft_synth_params *p) {
    char k[128];
#define K(s) (snprintf(k, sizeof(k), ARCH "." s), k)
    static const char *const pretty[] = {"DFlash", "DFlash 2", "DSpark"};
    char name[96];
    snprintf(name, sizeof(name), "dspec synthetic %s drafter %" PRId64 "h-%dL",
             pretty[p->kind], p->n_embd, p->n_layer);
    ds_gguf_writer_set_str(w, "general.architecture", ARCH);
    ds_gguf_writer_set_str(w, "general.type", "model");
    ds_gguf_writer_set_str(w, "general.name", name);
    if (p->file_type >= 0) {
        ds_gguf_writer_set_u32(w, "general.file_type", (uint32_t)p->file_type);
    }
    ds_gguf_writer_set_u32(w, K("context_length"), (uint32_t)p->n_ctx_train);
    ds_gguf_writer_set_u32(w, K("embedding_length"), (uint32_t)p->n_embd);
    ds_gguf_writer_set_u32(w, K("block_count"), (uint32_t)p->n_layer);
    ds_gguf_writer_set_u32(w, K("feed_forward_length"), (uint32_t)p->n_ff);
    ds_gguf_writer_set_u32(w, K("attention.head_count"), (uint32_t)p->n_head);
    ds_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    ds_gguf_writer_set_u32(w, K("attention.key_length"), (uint32_t)p->head_dim);
    ds_gguf_writer_set_u32(w, K("attention.value_length"), (uint32_t)p->head_dim);
    ds_gguf_writer_set_u32(w, K("vocab_size"), (uint32_t)p->n_vocab);
    ds_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), p->eps);
    ds_gguf_writer_set_f32(w, K("rope.freq_base"), p->rope_base);
    bool any_swa = false;
    for (int il = 0; il < p->n_layer; il++) {
        any_swa |= p->swa[il];
    }
    if (any_swa && p->sliding_window > 0) {
        ds_gguf_writer_set_u32(w, K("attention.sliding_window"), (uint32_t)p->sliding_window);
        ds_gguf_writer_set_arr(w, K("attention.sliding_window_pattern"), DS_GGUF_BOOL, p->swa,
                               (uint64_t)p->n_layer);
    }
    ds_gguf_writer_set_arr(w, K("dflash.causal"), DS_GGUF_BOOL, p->causal, (uint64_t)p->n_layer);
    ds_gguf_writer_set_u32(w, K("dflash.n_target_layers"), (uint32_t)p->n_taps);
    ds_gguf_writer_set_u32(w, K("dflash.block_size"), (uint32_t)p->block_size);
    ds_gguf_writer_set_u32(w, K("dflash.mask_token_id"), (uint32_t)p->mask_token_id);
    int32_t taps[DS_MODEL_MAX_TAPS];
    for (int i = 0; i < p->n_taps; i++) {
        taps[i] = p->target_layer_ids[i];
    }
    ds_gguf_writer_set_arr(w, K("dflash.target_layer_ids"), DS_GGUF_INT32, taps,
                           (uint64_t)p->n_taps);
    ds_gguf_writer_set_bool(w, K("dflash.sample_from_anchor"), p->kind == DS_DRAFT_DSPARK);
    if (p->kind == DS_DRAFT_DFLASH2) {
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_kernel_size"), (uint32_t)p->conv_kernel);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_group_size"), (uint32_t)p->conv_group);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_rank"), (uint32_t)p->selector_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_top_k"), (uint32_t)p->selector_top_k);
    }
    if (p->kind == DS_DRAFT_DSPARK) {
        ds_gguf_writer_set_bool(w, K("dflash.dspark.enabled"), true);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.markov_rank"), (uint32_t)p->markov_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.vocab_size"), (uint32_t)p->n_vocab);
        ds_gguf_writer_set_bool(w, K("dflash.dspark.confidence.enabled"), p->confidence);
        if (p->confidence) {
            int64_t D = p->n_embd + (p->confidence_with_markov ? p->markov_rank : 0);
            ds_gguf_writer_set_u32(w, K("dflash.dspark.confidence_dim"), (uint32_t)D);
        }
    }
#undef K
}

// ---- values ---------------------------------------------------------------------------------------

// Row `row` of tensor d into out[0 .. ne0).
static void draw_row(ds_rng *r, const tdesc *d, int64_t row, float *out) {
    const int64_t n = d->ne[0];
    const float lin = d->scale / sqrtf((float)n);
    for (int64_t c = 0; c < n; c++) {
        switch (d->how) {
        case FILL_LINEAR: out[c] = lin * ds_rng_normal(r); break;
        case FILL_NORM: out[c] = 1.0f + 0.1f * ds_rng_normal(r); break;
        case FILL_CONV_BASE:
            out[c] = (row % d->conv_k == 0 ? 1.0f : 0.0f) + d->scale * ds_rng_normal(r);
            break;
        case FILL_TABLE: out[c] = d->scale * ds_rng_normal(r); break;
        case FILL_CONST: out[c] = d->scale; break;
        }
    }
}

// A pool of quantized random rows shared by the tensors of one (row length, fill, scale, type).
typedef struct pool {
    int64_t ne0;
    fill how;
    float scale;
    ds_type type;
    uint8_t *q;
} pool;

enum { MAX_POOLS = 24, BATCH = 64 };

static dspec_status get_pool(pool *pools, int *n_pools, const tdesc *d, int64_t n_rows, ds_rng *r,
                             float *row, const uint8_t **out, dspec_err *err) {
    *out = NULL;
    for (int i = 0; i < *n_pools; i++) {
        pool *pl = &pools[i];
        if (pl->ne0 == d->ne[0] && pl->how == d->how && pl->scale == d->scale &&
            pl->type == d->type) {
            *out = pl->q;
            return DSPEC_OK;
        }
    }
    if (*n_pools == MAX_POOLS) {
        return DSPEC_OK; // fresh rows
    }
    size_t rb = ds_type_row_size(d->type, d->ne[0]);
    uint8_t *q = malloc(rb * (size_t)n_rows);
    if (!q) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "draft synth: out of memory (row pool)");
    }
    for (int64_t k = 0; k < n_rows; k++) {
        draw_row(r, d, k, row);
        dspec_status st = ds_quantize_row(d->type, q + (size_t)k * rb, row, d->ne[0], err);
        if (st != DSPEC_OK) {
            free(q);
            return st;
        }
    }
    pools[*n_pools] = (pool){.ne0 = d->ne[0], .how = d->how, .scale = d->scale,
                             .type = d->type, .q = q};
    (*n_pools)++;
    *out = q;
    return DSPEC_OK;
}

// ---- writer ---------------------------------------------------------------------------------------

static dspec_status write_data(ds_gguf_writer *w, const ds_draft_synth_params *p, const tlist *l,
                               int64_t max_row, dspec_err *err) {
    float *row = malloc((size_t)max_row * sizeof(float));
    uint8_t *batch = malloc(ds_type_row_size(DS_TYPE_F32, max_row) * BATCH + 64);
    pool pools[MAX_POOLS];
    int n_pools = 0;
    dspec_status st = DSPEC_OK;
    if (!row || !batch) {
        st = ds_err_set(err, DSPEC_ERR_NOMEM, "draft synth: out of memory");
    }
    ds_rng r = {.s = p->seed * 0x2545f4914f6cdd1dull + 0x5eed};
    double total = 0.0, done = 0.0;
    for (int i = 0; i < l->n; i++) {
        total += (double)l->t[i].ne[1];
    }
    for (int i = 0; i < l->n && st == DSPEC_OK; i++) {
        const tdesc *d = &l->t[i];
        const int64_t rows = d->ne[1], ne0 = d->ne[0];
        const size_t rb = ds_type_row_size(d->type, ne0);
        const uint8_t *pl = NULL;
        if (p->pool_rows > 0 && rows > p->pool_rows &&
            (d->how == FILL_LINEAR || d->how == FILL_TABLE)) {
            st = get_pool(pools, &n_pools, d, p->pool_rows, &r, row, &pl, err);
        }
        for (int64_t rr = 0; rr < rows && st == DSPEC_OK;) {
            int64_t nb = DS_MIN((int64_t)BATCH, rows - rr);
            for (int64_t b = 0; b < nb && st == DSPEC_OK; b++) {
                uint8_t *dst = batch + (size_t)b * rb;
                if (pl) {
                    memcpy(dst, pl + (size_t)(ds_rng_next(&r) % (uint64_t)p->pool_rows) * rb, rb);
                } else {
                    draw_row(&r, d, rr + b, row);
                    st = ds_quantize_row(d->type, dst, row, ne0, err);
                }
            }
            if (st == DSPEC_OK) {
                st = ds_gguf_writer_write_tensor_data(w, i, batch, rb * (size_t)nb, err);
            }
            rr += nb;
            if (p->progress && (rr & 1023) < BATCH) {
                p->progress(p->progress_ctx, (done + (double)rr) / total);
            }
        }
        done += (double)rows;
    }
    for (int i = 0; i < n_pools; i++) {
        free(pools[i].q);
    }
    free(row);
    free(batch);
    if (st == DSPEC_OK && p->progress) {
        p->progress(p->progress_ctx, 1.0);
    }
    return st;
}

dspec_status ds_draft_synth_write(const char *path, const ds_draft_synth_params *p,
                                  dspec_err *err) {
    if (!path || !path[0] || !p) {
        return BAD("draft synth: an output path and parameters are required");
    }
    dspec_status st = check_params(p, err);
    if (st != DSPEC_OK) {
        return st;
    }
    tlist l = {0};
    build_list(p, &l);
    if (l.oom) {
        free(l.t);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "draft synth: out of memory");
    }
    ds_gguf_writer *w = NULL;
    bool begun = false;
    int64_t max_row = 1;
    for (int i = 0; i < l.n && st == DSPEC_OK; i++) {
        tdesc *d = &l.t[i];
        if (p->type_of && !d->keep_f32) {
            const int64_t ne4[4] = {d->ne[0], d->ne[1], 1, 1};
            d->type = p->type_of(p->type_ctx, d->name, d->n_dims, ne4, d->type);
        }
        const ds_type_traits *tt = ds_type_traits_get(d->type);
        if (!tt || !tt->from_float || !tt->to_float || d->ne[0] % tt->block_elems != 0) {
            st = BAD("draft synth: tensor %s (row of %" PRId64 "): type %s cannot be written "
                     "here", d->name, d->ne[0], ds_type_name(d->type));
        }
        max_row = DS_MAX(max_row, d->ne[0]);
    }
    if (st == DSPEC_OK) {
        st = ds_gguf_writer_new(&w, err);
    }
    if (st == DSPEC_OK) {
        set_kv(w, p);
        for (int i = 0; i < l.n && st == DSPEC_OK; i++) {
            st = ds_gguf_writer_add_tensor(w, l.t[i].name, l.t[i].type, l.t[i].n_dims, l.t[i].ne,
                                           err);
        }
    }
    if (st == DSPEC_OK) {
        st = ds_gguf_writer_begin(w, path, err);
        begun = st == DSPEC_OK;
    }
    if (st == DSPEC_OK) {
        st = write_data(w, p, &l, max_row, err);
    }
    if (st == DSPEC_OK) {
        st = ds_gguf_writer_finish(w, err);
    }
    ds_gguf_writer_free(w);
    free(l.t);
    if (st != DSPEC_OK && begun) {
        remove(path);
    }
    return st;
}
