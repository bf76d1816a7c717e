// ddtree.h: DDTree construction (best-first over per-depth top-K log-probabilities under a node
// budget) and the greedy walk of a verified tree. Calls core/. Called by spec/loop.c.
// Spec: drafters-and-verification.md §5.1-5.2.
#pragma once

#include "core/core.h"

#define DS_DDTREE_MAX_NODES 512
#define DS_DDTREE_MAX_DEPTH 64
#define DS_DDTREE_MAX_K 64

// A draft tree. Row 0 is the root (the anchor); nodes 1..n_nodes-1 are drafted tokens, in pop order
// (every parent precedes its children). parent[0] = -1; depth[0] = 0.
typedef struct ds_ddtree {
    int64_t n_nodes;                       // including the root
    int32_t token[DS_DDTREE_MAX_NODES + 1];
    int32_t parent[DS_DDTREE_MAX_NODES + 1];
    int32_t depth[DS_DDTREE_MAX_NODES + 1];
    float score[DS_DDTREE_MAX_NODES + 1];  // cumulative log-prob of the node's prefix
} ds_ddtree;

// Per-depth candidates: for depth d (1-based) the top-K tokens by log-prob, descending.
typedef struct ds_ddtree_cands {
    int depth;                                   // number of depths L
    int k;                                       // candidates per depth
    int32_t tok[DS_DDTREE_MAX_DEPTH][DS_DDTREE_MAX_K];
    float logp[DS_DDTREE_MAX_DEPTH][DS_DDTREE_MAX_K];
} ds_ddtree_cands;

// Fills candidates from raw logits [L][n_vocab] (log-softmax per depth, top-k per depth).
void ds_ddtree_cands_from_logits(ds_ddtree_cands *c, const float *logits, int L, int64_t n_vocab,
                                 int k);

// Builds the budget most probable prefixes (best-first, prefix-closed) under the product of
// per-depth marginals; the root token is `anchor`. budget = drafted nodes (excluding the root),
// 1..DS_DDTREE_MAX_NODES. With `chain_seed`, the top-1 chain is inserted first.
void ds_ddtree_build(ds_ddtree *t, const ds_ddtree_cands *c, int32_t anchor, int budget,
                     bool chain_seed);

// Candidates for the children of a node at `depth` (1-based depth of the children) whose token is
// `parent_token`: up to k (ids, log-probs) sorted by descending log-prob; returns the count.
typedef int (*ds_ddtree_cand_fn)(void *ctx, int depth, int32_t parent_token, int k, int32_t *ids,
                                 float *logp);

// Per-node candidate storage for ds_ddtree_build_cond (caller-owned, reused across steps).
typedef struct ds_ddtree_node_cands {
    int n[DS_DDTREE_MAX_NODES + 1];
    int32_t tok[DS_DDTREE_MAX_NODES + 1][DS_DDTREE_MAX_K];
    float logp[DS_DDTREE_MAX_NODES + 1][DS_DDTREE_MAX_K];
} ds_ddtree_node_cands;

// Best-first tree where each node's children come from fn conditioned on the node's own token
// (DSpark Markov-corrected or DFlash 2 selector scores along each branch's actual parent,
// normalized per position so cumulative scores compare across depths). L = depths available.
void ds_ddtree_build_cond(ds_ddtree *t, ds_ddtree_node_cands *nc, ds_ddtree_cand_fn fn, void *ctx,
                          int L, int k, int32_t anchor, int budget, bool chain_seed);

// Greedy walk: target[i] is the target's choice after node i. Starting at the root, follows the
// child whose token equals the target's choice. path[0..*n_path) gets the accepted node indices
// starting with the root (so *n_path - 1 drafted tokens were accepted); *bonus the target's
// choice at the last accepted node.
void ds_ddtree_walk(const ds_ddtree *t, const int32_t *target, int32_t *path, int64_t *n_path,
                    int32_t *bonus);
