// draft_heads.h: private to draft/: the proposers that turn one block's logits into tokens:
// the DFlash 2 candidate selector walk and the DSpark Markov chain with its confidence head.
// Spec: drafters-and-verification.md §3.2, §4.2, §4.3.
#pragma once

#include "draft/draft_impl.h"

// Scratch sized at context creation (no allocation per block).
typedef struct ds_draft_heads_scratch {
    void *bufs[12];
    int n_bufs;
    ds_tensor w1row, bias;       // {r, 1}, {V, 1}   (Markov)
    ds_tensor hproj, pred, succ; // {r, n}, {r, 1}, {r, K} (selector)
    ds_tensor pred_all, succ_all;// {r, 1 + n K}, {r, n K} (selector walk: every candidate)
    ds_tensor w1rows;            // {r, n} (Markov: W1 of every slot's previous token)
    ds_tensor chain_ids;         // {1 + n, 1} as int32: the Markov chain's anchor and picks
    ds_tensor sel_ids, sel_vals; // {1 + n K, 1} as int32: the anchor, then every slot's
                                 // candidates; {n K, 1} their logits (the walk in backend memory)
    ds_tensor sel_tok;           // {n, 1} as int32: the walk's tokens (backend memory)
    float *h_row;                // host [V]
    float *h_rows, *h_vals;      // host [V * n], [K * n] (selector walk)
    float *h_pred_all, *h_succ_all; // host [r * (1 + n K)], [r * n K]
    int32_t *h_ids;              // host [1 + n K] (selector: the anchor, then every slot's
                                 // candidates) or [n] (Markov: every slot's previous token)
    float *h_g, *h_pred, *h_succ;// host [r * n], [r], [r * K]
    float *h_hidden;             // host [H * n]
    float *h_w1;                 // host [r * n]
    bool g_ready;                // h_g holds the selector's context gates of the last block
} ds_draft_heads_scratch;

dspec_status ds_draft_heads_scratch_init(ds_draft_heads_scratch *s, const ds_drafter *d,
                                         int64_t max_rows, dspec_err *err);
void ds_draft_heads_scratch_deinit(ds_draft_heads_scratch *s, ds_backend *be);

typedef struct ds_draft_heads_in {
    const ds_drafter *d;
    ds_backend *be;
    ds_draft_heads_scratch *hs;
    ds_tensor *logits;        // {V, n} proposal-slot logits (backend memory; may be modified)
    const ds_tensor *hidden;  // {H, n} final-normed proposal-slot hidden states
    int32_t anchor;
    int64_t n;
    float threshold;          // DSpark confidence gate, 0 = off
} ds_draft_heads_in;

// DFlash 2 greedy selector walk from the anchor: tokens, cand_ids/cand_scores (n_cand = K); or,
// where the caller takes the tokens from backend memory (ds_draft_out.want_dev) and the backend
// has topk_dev and selector_walk, the walk there: tokens_dev and a queued copy of the tokens, no
// candidates (n_cand = 0) and no host round trip.
void ds_draft_selector_walk(const ds_draft_heads_in *in, ds_draft_out *out);
// DSpark greedy Markov chain from the anchor (plain argmax without a Markov head), then the
// confidence head and the static threshold gate.
void ds_draft_markov_chain(const ds_draft_heads_in *in, ds_draft_out *out);

// Candidates of proposal slot p conditioned on the previous token prev, for DDTree expansion:
// DFlash 2: the slot's top-K selector candidates scored unary + <A[prev] * g_p, B[c]>; DSpark:
// top-k of logits_p + W2 W1[prev]; otherwise top-k of logits_p. Log-softmax normalized over the
// scored set, sorted by descending log-prob (ties: lower id). Returns the count (<= k).
int ds_draft_heads_cond(const ds_draft_heads_in *in, int64_t p, int32_t prev, int k, int32_t *ids,
                        float *logp);

// For each row r of x {V, n} (backend memory, contiguous rows, n <= DS_DRAFT_MAX_BLOCK) its k'
// = min(k, V, DS_TOPK_MAX) best entries by descending value (ties: lower id) and their values
// (logp: their log-softmax values), ids[r * k' + j] / vals[r * k' + j]; returns k'. Through the
// backend's topk (and logsumexp) ops where it has them (a device backend copies n k' ids and
// values and n floats back, not the rows; the CPU backend's ops give the host path's bits), else
// each row read into h_row [V] (ds_topk_f32, ds_logsumexp_f32).
int ds_draft_rows_topk(ds_backend *be, const ds_tensor *x, float *h_row, int k, bool logp,
                       int32_t *ids, float *vals);
