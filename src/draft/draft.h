// draft.h: block-diffusion drafters (DFlash, DFlash 2, DSpark): config and weights from the
// anchor engine's `qwen35-dflash-draft` GGUF, llama.cpp's `dflash` GGUF or an HF directory; a
// per-sequence drafter context (K/V of the committed target features, appended only); one forward
// per block producing per-slot logits and the proposer's choices (argmax, DSpark Markov chain,
// DFlash 2 selector path). Calls model/ (the target's embedding table and lm_head), backend/,
// gguf/. Called by spec/. Spec: drafters-and-verification.md §0-4, §9; anchor-lucebox.md §3.
//
// Usage:
//     ds_drafter *d;  ds_drafter_load(&d, "draft.gguf", target_model, &err);
//     const ds_draft_config *c = ds_drafter_config(d);        // taps, block size, layout, heads
//     ds_draft_ctx *ctx; ds_draft_ctx_new(&ctx, d, n_ctx, &err);
//     ds_draft_ctx_append(ctx, feats, n_rows, &err);   // taps of newly committed target rows
//     ds_draft_out out; ds_draft_out_init(&out, d, &err);
//     ds_draft_block(ctx, anchor, n_slots, DS_PROPOSE_AUTO, &out, &err);
//     // out.tokens[0..out.n_tokens): proposals for positions start+1, start+2, ...
//     ds_draft_out_deinit(&out); ds_draft_ctx_free(ctx); ds_drafter_free(d);
//
// Rules: a ds_drafter is immutable and shareable; it borrows the target model (which must outlive
// it). A ds_draft_ctx belongs to one sequence and thread. Features are host f32 arrays laid out
// (row, tap, n_embd) in the order of config.target_layer_ids — exactly what ds_batch.taps gives.
// Every config field is validated at load against the target; a bad file is refused with
// DSPEC_ERR_FORMAT naming the field.
#pragma once

#include "model/model.h"

#define DS_DRAFT_MAX_BLOCK 64
#define DS_DRAFT_MAX_TOPK 16

typedef enum ds_draft_kind {
    DS_DRAFT_DFLASH = 0,  // DFlash (z-lab)
    DS_DRAFT_DFLASH2 = 1, // DFlash 2: dynamic convs + candidate selector
    DS_DRAFT_DSPARK = 2,  // DSpark: Markov head + confidence head
} ds_draft_kind;

typedef enum ds_propose {
    DS_PROPOSE_AUTO = 0,     // best available: selector > markov > argmax
    DS_PROPOSE_ARGMAX = 1,   // per-slot argmax of the drafter logits
    DS_PROPOSE_MARKOV = 2,   // DSpark Markov-corrected greedy chain
    DS_PROPOSE_SELECTOR = 3, // DFlash 2 selector path
} ds_propose;

typedef struct ds_draft_config {
    ds_draft_kind kind;
    int block_size;            // B of the checkpoint (slots incl. the anchor)
    bool shifted;              // DSpark layout: every slot proposes (sample_from_anchor)
    int n_taps;
    int target_layer_ids[16];  // 0-based target layers whose outputs are tapped
    int32_t mask_token_id;
    int n_layer;
    bool has_markov, has_confidence, has_selector;
    int selector_top_k;
    float confidence_threshold; // 0 = gate off
} ds_draft_config;

typedef struct ds_drafter ds_drafter;
typedef struct ds_draft_ctx ds_draft_ctx;

// Result of one block: proposals for positions start+1 .. start+n_tokens.
typedef struct ds_draft_out {
    int64_t n_tokens;
    int32_t tokens[DS_DRAFT_MAX_BLOCK];
    float confidence[DS_DRAFT_MAX_BLOCK]; // DSpark per proposal (1 when no confidence head)
    float *logits;         // [DS_DRAFT_MAX_BLOCK * n_vocab]: drafter logits per proposal slot
    int64_t n_vocab;
} ds_draft_out;

dspec_status ds_drafter_load(ds_drafter **out, const char *path, const ds_model *target,
                             dspec_err *err);
void ds_drafter_free(ds_drafter *d);
const ds_draft_config *ds_drafter_config(const ds_drafter *d);

dspec_status ds_draft_ctx_new(ds_draft_ctx **out, const ds_drafter *d, int64_t n_ctx,
                              dspec_err *err);
void ds_draft_ctx_free(ds_draft_ctx *c);
void ds_draft_ctx_reset(ds_draft_ctx *c);
int64_t ds_draft_ctx_len(const ds_draft_ctx *c);
// Appends the features of n newly committed target rows (positions len .. len+n-1).
dspec_status ds_draft_ctx_append(ds_draft_ctx *c, const float *feats, int64_t n, dspec_err *err);

dspec_status ds_draft_out_init(ds_draft_out *o, const ds_drafter *d, dspec_err *err);
void ds_draft_out_deinit(ds_draft_out *o);
// Drafts one block from `anchor` at position ds_draft_ctx_len(c) with n_slots block slots
// (2 .. 2 * block_size) and fills `out`.
dspec_status ds_draft_block(ds_draft_ctx *c, int32_t anchor, int n_slots, ds_propose how,
                            ds_draft_out *out, dspec_err *err);
