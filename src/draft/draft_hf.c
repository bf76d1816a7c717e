// draft_hf.c: reads an HF drafter directory (config.json with `dflash_config`, model.safetensors)
// into ds_draft_hp plus a tensor lookup mapping the anchor's canonical names to the checkpoint's
// (z-lab DFlash / DFlash 2, DeepSpec DSpark and its aliases). config.json goes through the shared
// parser (draft_config.c). Calls gguf/ (safetensors). Called by draft_load.c.
// Spec: drafters-and-verification.md §1.1, §1.4, §3.3, §4.5; anchor-lucebox.md §3.2.
#include "draft/draft_impl.h"

#include "draft/draft_config.h"

#include <stdio.h>
#include <string.h>

// ---- tensor names -----------------------------------------------------------------------------------

// Canonical suffix -> HF suffix for per-layer tensors (blk.N.<a> -> layers.N.<b>).
static const struct {
    const char *canon, *hf;
} k_layer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"attn_conv.base", "attention_conv.base_kernel"},
    {"attn_conv.proj.weight", "attention_conv.kernel_projection.weight"},
    {"ffn_conv.base", "mlp_conv.base_kernel"},
    {"ffn_conv.proj.weight", "mlp_conv.kernel_projection.weight"},
};

// Canonical global name -> HF names (first found wins).
static const struct {
    const char *canon;
    const char *hf[4];
} k_global[] = {
    {"dflash.fc.weight", {"fc.weight"}},
    {"dflash.hidden_norm.weight", {"hidden_norm.weight"}},
    {"output_norm.weight", {"norm.weight"}},
    {"dflash.selector.hproj.weight", {"candidate_selector.hidden_projection.weight"}},
    {"dflash.selector.pred_cb",
     {"candidate_selector.predecessor_codebook", "candidate_selector.predecessor_codebook.weight"}},
    {"dflash.selector.succ_cb",
     {"candidate_selector.successor_codebook", "candidate_selector.successor_codebook.weight"}},
    {"dflash.dspark.markov.w1",
     {"markov_head.markov_w1.weight", "dspark_markov_head.markov_w1.weight",
      "mtp.2.markov_head.markov_w1.weight"}},
    {"dflash.dspark.markov.w2",
     {"markov_head.markov_w2.weight", "dspark_markov_head.markov_w2.weight",
      "mtp.2.markov_head.markov_w2.weight"}},
    {"dflash.dspark.confidence.weight",
     {"confidence_head.proj.weight", "dspark_confidence_head.weight",
      "mtp.2.confidence_head.proj.weight"}},
    {"dflash.dspark.confidence.bias",
     {"confidence_head.proj.bias", "dspark_confidence_head.bias",
      "mtp.2.confidence_head.proj.bias"}},
};

static const ds_st_tensor *st_find2(const ds_st *st, const char *name) {
    const ds_st_tensor *t = ds_st_find(st, name);
    if (!t) {
        char nm[200];
        snprintf(nm, sizeof(nm), "model.%s", name);
        t = ds_st_find(st, nm);
    }
    return t;
}

// HF tensor for a canonical name (the converter's plan in convert_dflash.c uses the same names).
static const ds_st_tensor *hf_tensor(const ds_st *st, const char *canon) {
    int il;
    char rest[96];
    if (sscanf(canon, "blk.%d.%95s", &il, rest) == 2) {
        for (size_t i = 0; i < DS_ARRAY_LEN(k_layer); i++) {
            if (strcmp(rest, k_layer[i].canon) == 0) {
                char nm[160];
                snprintf(nm, sizeof(nm), "layers.%d.%s", il, k_layer[i].hf);
                return st_find2(st, nm);
            }
        }
        return NULL;
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(k_global); i++) {
        if (strcmp(canon, k_global[i].canon) != 0) {
            continue;
        }
        for (int j = 0; j < 4 && k_global[i].hf[j]; j++) {
            const ds_st_tensor *t = st_find2(st, k_global[i].hf[j]);
            if (t) {
                return t;
            }
        }
    }
    return NULL;
}

static ds_draft_src hf_lookup(const void *ctx, const char *canon) {
    const ds_st_tensor *t = hf_tensor(ctx, canon);
    ds_draft_src s = {0};
    if (!t || t->n_dims > 4) {
        return s;
    }
    s.found = true;
    s.type = t->dtype == DS_ST_F32 ? DS_TYPE_F32 : t->dtype == DS_ST_F16 ? DS_TYPE_F16
                                                                          : DS_TYPE_BF16;
    s.n_dims = t->n_dims ? t->n_dims : 1;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = i < t->n_dims ? t->shape[t->n_dims - 1 - i] : 1;
    }
    s.data = t->data;
    s.file_name = t->name;
    return s;
}

// ---- config.json -----------------------------------------------------------------------------------

_Static_assert(DS_DRAFT_HF_MAX_LAYERS == DS_DRAFT_MAX_LAYERS, "per-layer arrays differ in size");

// The parsed config as loader hyperparameters (validated against the target later).
static void hp_from_config(ds_draft_hp *hp, const ds_draft_hf_config *c) {
    *hp = (ds_draft_hp){
        .kind = c->kind, .n_embd = c->n_embd, .n_ff = c->n_ff, .n_vocab = c->n_vocab,
        .head_dim = c->head_dim, .n_layer = c->n_layer, .n_head = c->n_head,
        .n_head_kv = c->n_head_kv, .eps = (float)c->eps, .rope_theta = c->rope_theta,
        .yarn = c->yarn, .yarn_factor = c->yarn_factor, .yarn_beta_fast = c->yarn_beta_fast,
        .yarn_beta_slow = c->yarn_beta_slow, .yarn_attn_factor = c->yarn_attn_factor,
        .yarn_orig_ctx = c->yarn_orig_ctx, .block_size = c->block_size, .shifted = c->shifted,
        .n_taps = c->n_taps, .mask_id = c->mask_id, .input_scale = (float)c->input_scale,
        .output_mult = (float)c->output_mult, .softcap = (float)c->softcap, .conv_k = c->conv_k,
        .conv_group = c->conv_group, .sel_rank = c->sel_rank, .sel_top_k = c->sel_top_k,
        .markov_rank = c->markov_rank, .has_conf = c->has_conf,
        .conf_with_markov = c->conf_with_markov};
    for (int il = 0; il < c->n_layer; il++) {
        hp->causal[il] = c->causal[il];
        hp->window[il] = c->sliding[il] ? c->window : 0;
    }
    memcpy(hp->taps, c->taps, sizeof(hp->taps));
}

dspec_status ds_draft_read_hf(ds_drafter *d, const char *dir, ds_draft_lookup_fn *fn,
                              const void **fn_ctx, dspec_err *err) {
    ds_draft_hf_config c;
    dspec_status st = ds_draft_hf_config_load(&c, dir, err);
    if (st != DSPEC_OK) {
        return st;
    }
    hp_from_config(&d->hp, &c);
    if ((st = ds_st_open(&d->st, dir, err)) != DSPEC_OK) {
        return st;
    }
    d->cfg.format = "hf";
    *fn = hf_lookup;
    *fn_ctx = d->st;
    return DSPEC_OK;
}
