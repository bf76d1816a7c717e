// ddtree_test.c: DDTree construction against a brute-force enumeration of all prefixes (random
// depths, widths and budgets 1..64), structural invariants, chain pre-seed, and the walk against a
// per-path reference.
#include "spec/ddtree.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 12345;
static double uniform(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 53);
}

// Random candidates with distinct, sorted log-probs per depth.
static void random_cands(ds_ddtree_cands *c, int L, int k) {
    c->depth = L;
    c->k = k;
    for (int d = 0; d < L; d++) {
        double v = -0.01 - uniform();
        for (int j = 0; j < k; j++) {
            c->tok[d][j] = (int32_t)(100 * d + j);
            c->logp[d][j] = (float)v;
            v -= 0.05 + 2.0 * uniform();
        }
    }
}

// All prefixes (rank tuples) with their scores, by enumeration.
typedef struct prefix {
    float score;
    int depth;
    int ranks[8];
} prefix;

static int enumerate(const ds_ddtree_cands *c, prefix *out, int cap) {
    int n = 0;
    int ranks[8] = {0};
    // iterate over all tuples of every depth
    for (int depth = 1; depth <= c->depth; depth++) {
        int total = 1;
        for (int d = 0; d < depth; d++) total *= c->k;
        for (int code = 0; code < total && n < cap; code++) {
            int x = code;
            float s = 0.0f;
            for (int d = 0; d < depth; d++) {
                ranks[d] = x % c->k;
                x /= c->k;
                s += c->logp[d][ranks[d]];
            }
            out[n].score = s;
            out[n].depth = depth;
            memcpy(out[n].ranks, ranks, sizeof(ranks));
            n++;
        }
    }
    return n;
}

static int cmp_prefix(const void *a, const void *b) {
    float x = ((const prefix *)a)->score, y = ((const prefix *)b)->score;
    return x > y ? -1 : x < y;
}

static void test_build_matches_bruteforce(void **state) {
    (void)state;
    static prefix all[20000];
    for (int trial = 0; trial < 200; trial++) {
        int L = 1 + (int)(uniform() * 5), k = 1 + (int)(uniform() * 4);
        int budget = 1 + (int)(uniform() * 64);
        ds_ddtree_cands c;
        random_cands(&c, L, k);
        int n = enumerate(&c, all, (int)DS_ARRAY_LEN(all));
        qsort(all, (size_t)n, sizeof(prefix), cmp_prefix);
        ds_ddtree t;
        ds_ddtree_build(&t, &c, 7, budget, false);
        int want = budget < n ? budget : n;
        assert_int_equal(t.n_nodes, want + 1);
        assert_int_equal(t.token[0], 7);
        assert_int_equal(t.parent[0], -1);
        for (int64_t i = 1; i < t.n_nodes; i++) {
            assert_true(t.parent[i] >= 0 && t.parent[i] < i); // parents first
            assert_int_equal(t.depth[i], t.depth[t.parent[i]] + 1);
            // the i-th popped node has the i-th best score (distinct scores by construction)
            assert_true(fabsf(t.score[i] - all[i - 1].score) < 1e-4f);
        }
    }
}

static void test_chain_seed(void **state) {
    (void)state;
    ds_ddtree_cands c;
    random_cands(&c, 6, 3);
    ds_ddtree t;
    ds_ddtree_build(&t, &c, 1, 10, true);
    for (int d = 1; d <= 6; d++) { // nodes 1..6 are the top-1 chain
        assert_int_equal(t.token[d], c.tok[d - 1][0]);
        assert_int_equal(t.parent[d], d - 1);
    }
    assert_int_equal(t.n_nodes, 11);
    for (int64_t i = 1; i < t.n_nodes; i++) assert_true(t.parent[i] < i);
    ds_ddtree_build(&t, &c, 1, 3, true); // budget smaller than the chain
    assert_int_equal(t.n_nodes, 4);
    assert_int_equal(t.depth[3], 3);
}

// The walk equals the longest root path whose tokens follow the target's choices.
static void test_walk(void **state) {
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        ds_ddtree_cands c;
        random_cands(&c, 1 + (int)(uniform() * 6), 1 + (int)(uniform() * 4));
        ds_ddtree t;
        ds_ddtree_build(&t, &c, 3, 1 + (int)(uniform() * 40), false);
        int32_t target[DS_DDTREE_MAX_NODES + 1];
        for (int64_t i = 0; i < t.n_nodes; i++) { // target picks a child's token half the time
            int32_t child = -1;
            for (int64_t j = i + 1; j < t.n_nodes; j++) {
                if (t.parent[j] == i && uniform() < 0.6) child = (int32_t)j;
            }
            target[i] = child >= 0 ? t.token[child] : 99999;
        }
        int32_t path[DS_DDTREE_MAX_NODES + 1], bonus;
        int64_t n;
        ds_ddtree_walk(&t, target, path, &n, &bonus);
        assert_int_equal(path[0], 0);
        for (int64_t i = 1; i < n; i++) {
            assert_int_equal(t.parent[path[i]], path[i - 1]);
            assert_int_equal(t.token[path[i]], target[path[i - 1]]);
        }
        assert_int_equal(bonus, target[path[n - 1]]);
        for (int64_t j = 1; j < t.n_nodes; j++) { // no child of the last node matches the bonus
            assert_false(t.parent[j] == path[n - 1] && t.token[j] == bonus);
        }
    }
}

static void test_cands_from_logits(void **state) {
    (void)state;
    float logits[2][6] = {{0, 3, 1, 3, -1, 2}, {5, 4, 3, 2, 1, 0}};
    ds_ddtree_cands c;
    ds_ddtree_cands_from_logits(&c, &logits[0][0], 2, 6, 3);
    assert_int_equal(c.tok[0][0], 1); // tie 3 vs 3: lower id first
    assert_int_equal(c.tok[0][1], 3);
    assert_int_equal(c.tok[0][2], 5);
    assert_int_equal(c.tok[1][0], 0);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[1][i]);
    assert_true(fabs(c.logp[1][0] - (5.0 - log(z))) < 1e-5);
}

// Conditional candidates: a fn that ignores the parent gives the same tree as the marginal builder;
// a parent-dependent fn gives the best-first order of the conditional prefix scores.
static const ds_ddtree_cands *g_c;
static int marginal_fn(void *ctx, int depth, int32_t parent, int k, int32_t *ids, float *logp) {
    (void)ctx, (void)parent;
    int n = DS_MIN(k, g_c->k);
    for (int j = 0; j < n; j++) {
        ids[j] = g_c->tok[depth - 1][j];
        logp[j] = g_c->logp[depth - 1][j];
    }
    return n;
}

// Children depend on the parent token: rotate the ranks by parent % n.
static int cond_fn(void *ctx, int depth, int32_t parent, int k, int32_t *ids, float *logp) {
    (void)ctx;
    int n = DS_MIN(k, g_c->k), rot = (int)(parent % n);
    for (int j = 0; j < n; j++) {
        ids[j] = g_c->tok[depth - 1][(j + rot) % n];
        logp[j] = g_c->logp[depth - 1][j] - 0.01f * (float)rot;
    }
    return n;
}

static void test_build_cond(void **state) {
    (void)state;
    static ds_ddtree_node_cands nc;
    for (int trial = 0; trial < 100; trial++) {
        int L = 1 + (int)(uniform() * 5), k = 1 + (int)(uniform() * 4);
        int budget = 1 + (int)(uniform() * 40);
        ds_ddtree_cands c;
        random_cands(&c, L, k);
        g_c = &c;
        ds_ddtree a, b;
        bool seed = trial % 2;
        ds_ddtree_build(&a, &c, 5, budget, seed);
        ds_ddtree_build_cond(&b, &nc, marginal_fn, NULL, L, k, 5, budget, seed);
        assert_int_equal(a.n_nodes, b.n_nodes);
        for (int64_t i = 0; i < a.n_nodes; i++) {
            assert_int_equal(a.token[i], b.token[i]);
            assert_int_equal(a.parent[i], b.parent[i]);
            assert_true(fabsf(a.score[i] - b.score[i]) < 1e-5f);
        }
        ds_ddtree_build_cond(&b, &nc, cond_fn, NULL, L, k, 5, budget, false);
        for (int64_t i = 1; i < b.n_nodes; i++) { // scores non-increasing in pop order
            assert_true(b.parent[i] < i);
            assert_true(b.score[i] <= b.score[i - 1] + 1e-6f || b.parent[i] == i - 1 ||
                        b.score[i] <= b.score[b.parent[i]]);
            // each node's score = parent's + its conditional log-prob
            int32_t par = b.parent[i];
            int32_t ids[DS_DDTREE_MAX_K];
            float lp[DS_DDTREE_MAX_K];
            int n = cond_fn(NULL, b.depth[i], b.token[par], k, ids, lp);
            bool found = false;
            for (int j = 0; j < n; j++) {
                if (ids[j] == b.token[i]) {
                    found = fabsf(b.score[par] + lp[j] - b.score[i]) < 1e-5f;
                }
            }
            assert_true(found);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_matches_bruteforce),
        cmocka_unit_test(test_chain_seed),
        cmocka_unit_test(test_walk),
        cmocka_unit_test(test_cands_from_logits),
        cmocka_unit_test(test_build_cond),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
