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

// Largest width, rank, vocabulary, window or context a drafter file may declare: products of two
// or three of them stay far inside int64 (a file's 2^63 - 1 once overflowed them).
#define DS_DRAFT_MAX_DIM ((int64_t)1 << 30)

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
    float confidence_threshold; // 0 = gate off (default; per context: ds_draft_ctx_set_threshold)
    // Verify width (rows incl. the anchor) the checkpoint was trained for: block_size for the
    // z-lab layout (B-1 proposals), block_size + 1 for the shifted layout (B proposals).
    int verify_width;
    int max_slots;             // largest n_slots ds_draft_block accepts (2 * verify_width, capped)
    const char *format;        // "qwen35-dflash-draft", "dflash" (llama.cpp) or "hf"
} ds_draft_config;

typedef struct ds_drafter ds_drafter;
typedef struct ds_draft_ctx ds_draft_ctx;

// Result of one block: proposals for positions start+1 .. start+n_tokens.
typedef struct ds_draft_out {
    int64_t n_tokens;
    int32_t tokens[DS_DRAFT_MAX_BLOCK];
    float confidence[DS_DRAFT_MAX_BLOCK]; // DSpark per proposal (1 when no confidence head)
    // Drafter logits per proposal slot (after output_multiplier / softcap, before any Markov
    // bias): [DS_DRAFT_MAX_BLOCK * n_vocab] host floats, or NULL (then not written; the spec
    // loop passes a zeroed struct).
    float *logits;
    int64_t n_vocab;
    // Proposal slots the drafter computed (>= n_tokens; a confidence gate may cut n_tokens).
    int64_t n_proposed;
    // DFlash 2 selector: per proposal slot the top-K candidate ids (descending logit, ties by
    // ascending id) and their scores along the walked path; n_cand = K (0 for other proposers).
    int n_cand;
    int32_t cand_ids[DS_DRAFT_MAX_BLOCK][DS_DRAFT_MAX_TOPK];
    float cand_scores[DS_DRAFT_MAX_BLOCK][DS_DRAFT_MAX_TOPK];
    // (in) want_dev: the caller can take the tokens from backend memory. The argmax proposer and
    // the DSpark Markov chain without a confidence cut (threshold 0: its confidences are then not
    // computed, left at 1), on a backend with read_async, leave them there (tokens_dev, int32
    // [n_tokens], valid until the next block) and queue their copy into tokens[], which is
    // complete only after the backend's read_wait(tokens_ticket): a verify reading tokens_dev is
    // queued before they reach the host. Otherwise tokens_dev = NULL, tokens_ticket = -1 and
    // tokens[] is written.
    bool want_dev;
    const int32_t *tokens_dev;
    int tokens_ticket;
} ds_draft_out;

// What a drafter borrows from its target: the backend, the token embedding table (block inputs)
// and the lm_head (draft logits), plus the sizes fields are validated against. Views into the
// target's memory; the target must outlive every drafter loaded with it.
typedef struct ds_draft_target {
    ds_backend *be;
    ds_tensor token_embd;   // {n_embd, n_vocab}
    ds_tensor output;       // {n_embd, n_vocab} (= token_embd for tied models)
    int64_t n_vocab, n_embd;
    int n_layer;            // target trunk layers (tap ids must be < n_layer)
} ds_draft_target;

// Fills t from a loaded target model (token_embd.weight, output.weight or the tied embedding).
// Weights must be in host memory (CPU backend) until model/ exposes its device tensors.
dspec_status ds_draft_target_from_model(ds_draft_target *t, const ds_model *m, dspec_err *err);

// Loads a drafter: `path` is a GGUF (general.architecture `qwen35-dflash-draft` / `dflash-draft`
// (the anchor engine's layout, anchor-lucebox.md §3.1) or `dflash` (llama.cpp: tap ids stored +1,
// its own tensor names)) or an HF directory (config.json with DFlashDraftModel /
// DFlash2DraftModel / Qwen3DSparkModel + model.safetensors). Every field is validated against the
// target (vocab, hidden, taps < n_layer, block size >= 2, group size | hidden, top-k <=
// DS_DRAFT_MAX_TOPK, ranks > 0, mask id < vocab, head dims, every tensor shape and type);
// DSPEC_ERR_FORMAT names the field or tensor. DSpark checkpoints' own embed_tokens / lm_head
// copies are ignored: the target's are used (as the anchor does).
dspec_status ds_drafter_load(ds_drafter **out, const char *path, const ds_model *target,
                             dspec_err *err);
// Same, with an explicit target description (tests, or targets not loaded through model/).
dspec_status ds_drafter_load_target(ds_drafter **out, const char *path, const ds_draft_target *t,
                                    dspec_err *err);
void ds_drafter_free(ds_drafter *d);
const ds_draft_config *ds_drafter_config(const ds_drafter *d);

dspec_status ds_draft_ctx_new(ds_draft_ctx **out, const ds_drafter *d, int64_t n_ctx,
                              dspec_err *err);
void ds_draft_ctx_free(ds_draft_ctx *c);
void ds_draft_ctx_reset(ds_draft_ctx *c);
// DSpark static confidence gate (DeepSpec eval): keep proposals before the first one whose
// confidence is < threshold; 0 (default: the config's value) = keep all.
void ds_draft_ctx_set_threshold(ds_draft_ctx *c, float threshold);
int64_t ds_draft_ctx_len(const ds_draft_ctx *c);
// Appends the features of n newly committed target rows (positions len .. len+n-1): feats
// [n * n_taps * n_embd] in host memory, or (_dev) in the drafter's backend memory, read in place.
dspec_status ds_draft_ctx_append(ds_draft_ctx *c, const float *feats, int64_t n, dspec_err *err);
dspec_status ds_draft_ctx_append_dev(ds_draft_ctx *c, const float *feats, int64_t n,
                                     dspec_err *err);

dspec_status ds_draft_out_init(ds_draft_out *o, const ds_drafter *d, dspec_err *err);

// After ds_draft_block: candidates for proposal slot `slot` (0-based) conditioned on the previous
// token `prev` — DFlash 2 selector scores, DSpark Markov-corrected logits, or the raw logits —
// as up to k (ids, log-probs) sorted by descending log-prob, log-softmax normalized so cumulative
// scores compare across slots (DDTree candidate sources, drafters-and-verification.md §5).
// Valid until the next ds_draft_block on the context. Returns the count.
int ds_draft_cond_cands(ds_draft_ctx *c, int64_t slot, int32_t prev, int k, int32_t *ids,
                        float *logp);
// After ds_draft_block: for each of the first n proposal slots (n <= the block's proposals) its
// k (1 <= k <= min(n_vocab, DS_TOPK_MAX)) most probable tokens under the slot's raw logits, by
// descending logit (ties by ascending id), and their logits (logp: their log-softmax values),
// into ids[p * k + j] and vals[p * k + j]: the DDTree candidates of unconditional sources (logp),
// what a sampler needs of the slot (ds_sample_dist_top). Computed where the logits are (the
// backend's topk and logsumexp ops: a device backend copies n * k ids and values and n floats
// back, not n * n_vocab logits); the CPU backend gives ds_ddtree_cands_from_logits' bits.
void ds_draft_topk(ds_draft_ctx *c, int64_t n, int k, bool logp, int32_t *ids, float *vals);
void ds_draft_out_deinit(ds_draft_out *o);
// Drafts one block from `anchor` (the token at position start = ds_draft_ctx_len(c), committed
// but not yet run through the target) and fills `out` with at most n_slots - 1 proposals for
// positions start+1, start+2, ...; n_slots is the verify width incl. the anchor, 2 .. max_slots.
//   z-lab layout (DFlash, DFlash 2): the block is [anchor, mask x (n_slots-1)] at positions
//     start .. start+n_slots-1 and slots 1.. propose: n_slots - 1 proposals.
//   shifted layout (DSpark): the block is [anchor, mask x (n_slots-2)] (gamma = n_slots - 1
//     slots) and every slot j proposes position start+j+1: gamma proposals, so the verify batch
//     [anchor, proposals] again has n_slots rows. The checkpoint's trained width B maps to
//     n_slots = B + 1 (config.verify_width).
// `how`: AUTO = selector (DFlash 2) > Markov chain (DSpark with a Markov head) > argmax; asking
// for a head the drafter lacks is DSPEC_ERR_INVALID. Greedy ties pick the smallest token id.
dspec_status ds_draft_block(ds_draft_ctx *c, int32_t anchor, int n_slots, ds_propose how,
                            ds_draft_out *out, dspec_err *err);
