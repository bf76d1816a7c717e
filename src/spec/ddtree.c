// ddtree.c: DDTree (ddtree.h): best-first tree construction with a binary max-heap over
// (parent, depth, rank) tuples, and the greedy walk. Spec: drafters-and-verification.md §5.
#include "spec/ddtree.h"

#include <math.h>
#include <string.h>

void ds_ddtree_cands_from_logits(ds_ddtree_cands *c, const float *logits, int L, int64_t n_vocab,
                                 int k) {
    DS_ASSERT(L >= 0 && L <= DS_DDTREE_MAX_DEPTH && k >= 1 && k <= DS_DDTREE_MAX_K);
    k = (int)DS_MIN((int64_t)k, n_vocab);
    c->depth = L;
    c->k = k;
    for (int d = 0; d < L; d++) { // (the order of the backends' topk and logsumexp ops)
        const float *x = logits + (int64_t)d * n_vocab;
        const float lse = ds_logsumexp_f32(x, n_vocab);
        ds_topk_f32(x, n_vocab, k, c->tok[d], c->logp[d]);
        for (int j = 0; j < k; j++) c->logp[d][j] -= lse;
    }
}

typedef struct heap_item {
    float score;
    int32_t parent; // tree node index of the parent
    int16_t depth;  // 1-based depth of the candidate
    int16_t rank;   // rank among the depth's candidates
} heap_item;

typedef struct heap {
    heap_item a[2 * DS_DDTREE_MAX_NODES + 4];
    int n;
} heap;

static bool before(const heap_item *x, const heap_item *y) { // max-heap; ties: shallower, lower rank
    if (x->score != y->score) return x->score > y->score;
    if (x->depth != y->depth) return x->depth < y->depth;
    return x->rank < y->rank;
}

static void heap_push(heap *h, heap_item it) {
    DS_ASSERT(h->n < (int)DS_ARRAY_LEN(h->a));
    int i = h->n++;
    while (i > 0 && before(&it, &h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = it;
}

static heap_item heap_pop(heap *h) {
    heap_item top = h->a[0], last = h->a[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->a[c + 1], &h->a[c])) c++;
        if (!before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    h->a[i] = last;
    return top;
}

static int32_t add_node(ds_ddtree *t, int32_t parent, int depth, int32_t tok, float score) {
    int64_t i = t->n_nodes++;
    t->token[i] = tok;
    t->parent[i] = parent;
    t->depth[i] = depth;
    t->score[i] = score;
    return (int32_t)i;
}

void ds_ddtree_build(ds_ddtree *t, const ds_ddtree_cands *c, int32_t anchor, int budget,
                     bool chain_seed) {
    DS_ASSERT(budget >= 0 && budget <= DS_DDTREE_MAX_NODES);
    t->n_nodes = 0;
    add_node(t, -1, 0, anchor, 0.0f);
    if (c->depth == 0 || budget == 0) return;
    _Static_assert(DS_DDTREE_MAX_NODES < 32768, "heap fields");
    heap h = {.n = 0};
    // optional top-1 chain pre-seed: the greedy chain is always in the tree
    int32_t chain_end = 0;
    float chain_score = 0.0f;
    int seeded = 0;
    if (chain_seed) {
        for (int d = 1; d <= c->depth && seeded < budget; d++, seeded++) {
            chain_score += c->logp[d - 1][0];
            chain_end = add_node(t, chain_end, d, c->tok[d - 1][0], chain_score);
            if (c->k > 1) { // the chain node's next sibling competes normally
                float s = t->score[t->parent[chain_end]] + c->logp[d - 1][1];
                heap_push(&h, (heap_item){s, t->parent[chain_end], (int16_t)d, 1});
            }
        }
        if (chain_end > 0 && t->depth[chain_end] < c->depth) {
            int d = t->depth[chain_end] + 1;
            heap_push(&h, (heap_item){chain_score + c->logp[d - 1][0], chain_end, (int16_t)d, 0});
        }
    } else {
        heap_push(&h, (heap_item){c->logp[0][0], 0, 1, 0});
    }
    for (int popped = seeded; popped < budget && h.n > 0; popped++) {
        heap_item it = heap_pop(&h);
        int d = it.depth, r = it.rank;
        int32_t node = add_node(t, it.parent, d, c->tok[d - 1][r], it.score);
        if (r + 1 < c->k) { // next sibling
            float s = it.score - c->logp[d - 1][r] + c->logp[d - 1][r + 1];
            heap_push(&h, (heap_item){s, it.parent, (int16_t)d, (int16_t)(r + 1)});
        }
        if (d < c->depth) { // first child
            heap_push(&h, (heap_item){it.score + c->logp[d][0], node, (int16_t)(d + 1), 0});
        }
    }
}

// Computes node i's child candidates (once) if it can have children.
static void node_cands(ds_ddtree *t, ds_ddtree_node_cands *nc, int64_t i, ds_ddtree_cand_fn fn,
                       void *ctx, int L, int k) {
    nc->n[i] = t->depth[i] < L ? fn(ctx, t->depth[i] + 1, t->token[i], k, nc->tok[i], nc->logp[i])
                               : 0;
}

void ds_ddtree_build_cond(ds_ddtree *t, ds_ddtree_node_cands *nc, ds_ddtree_cand_fn fn, void *ctx,
                          int L, int k, int32_t anchor, int budget, bool chain_seed) {
    DS_ASSERT(budget >= 0 && budget <= DS_DDTREE_MAX_NODES && k >= 1 && k <= DS_DDTREE_MAX_K);
    DS_ASSERT(L >= 0 && L <= DS_DDTREE_MAX_DEPTH);
    t->n_nodes = 0;
    add_node(t, -1, 0, anchor, 0.0f);
    node_cands(t, nc, 0, fn, ctx, L, k);
    heap h = {.n = 0};
    int popped = 0;
    int32_t cur = 0;
    if (chain_seed) { // the conditional greedy chain first; its siblings compete normally
        while (popped < budget && nc->n[cur] > 0) {
            int32_t node = add_node(t, cur, t->depth[cur] + 1, nc->tok[cur][0],
                                    t->score[cur] + nc->logp[cur][0]);
            if (nc->n[cur] > 1) {
                heap_push(&h, (heap_item){t->score[cur] + nc->logp[cur][1], cur,
                                          (int16_t)t->depth[node], 1});
            }
            node_cands(t, nc, node, fn, ctx, L, k);
            cur = node;
            popped++;
        }
    }
    if (nc->n[cur] > 0 && popped < budget) { // first child of the chain's end (or of the root)
        heap_push(&h, (heap_item){t->score[cur] + nc->logp[cur][0], cur,
                                  (int16_t)(t->depth[cur] + 1), 0});
    }
    for (; popped < budget && h.n > 0; popped++) {
        heap_item it = heap_pop(&h);
        int32_t par = it.parent;
        int r = it.rank;
        int32_t node = add_node(t, par, it.depth, nc->tok[par][r], it.score);
        if (r + 1 < nc->n[par]) {
            heap_push(&h, (heap_item){t->score[par] + nc->logp[par][r + 1], par, it.depth,
                                      (int16_t)(r + 1)});
        }
        node_cands(t, nc, node, fn, ctx, L, k);
        if (nc->n[node] > 0) {
            heap_push(&h, (heap_item){it.score + nc->logp[node][0], node,
                                      (int16_t)(it.depth + 1), 0});
        }
    }
}

void ds_ddtree_walk(const ds_ddtree *t, const int32_t *target, int32_t *path, int64_t *n_path,
                    int32_t *bonus) {
    int32_t cur = 0;
    int64_t n = 0;
    path[n++] = 0;
    for (;;) {
        int32_t want = target[cur], next = -1;
        for (int64_t i = cur + 1; i < t->n_nodes; i++) {
            if (t->parent[i] == cur && t->token[i] == want) {
                next = (int32_t)i;
                break;
            }
        }
        if (next < 0) {
            *bonus = want;
            break;
        }
        path[n++] = next;
        cur = next;
    }
    *n_path = n;
}
