// draft_synth_test.c: synthetic drafters (ds_draft_synth_*): the published shapes of the presets,
// then for each kind (DFlash, DFlash 2, DSpark) and several types: a tiny drafter written to the
// build dir, loaded by the real loader against a tiny synthetic target (ds_synth_write), one
// target prefill with taps feeding the draft context, one draft block on the CPU backend:
// proposals, logits, selector candidates and confidences of the right counts, in range and
// finite. Bad parameters are refused naming the field (no file left behind); a drafter that does
// not fit the target (vocabulary, taps) is refused by the loader.
#include "draft/draft_synth.h"

#include "draft/draft_impl.h"

#include "gguf/gguf.h"
#include "gguf/gguf_rewrite_test.h"
#include "model/synth.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define TARGET_PATH DSPEC_BINARY_DIR "/draft_synth_test_target.gguf"

typedef struct world {
    ds_backend *be;
    ds_model *m;
    int64_t V, H;
} world;

static world W;

static int setup(void **state) {
    (void)state;
    dspec_err err = {0};
    ds_synth_params tp = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_Q8_0, 11);
    if (ds_synth_write(TARGET_PATH, &tp, &err) != DSPEC_OK ||
        ds_backend_cpu_new(&W.be, 2, &err) != DSPEC_OK ||
        ds_model_load(&W.m, TARGET_PATH, W.be, &err) != DSPEC_OK) {
        print_error("setup: %s\n", err.msg);
        return -1;
    }
    W.V = ds_model_hparams_get(W.m)->n_vocab;
    W.H = ds_model_hparams_get(W.m)->n_embd;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ds_model_free(W.m);
    ds_backend_free(W.be);
    unlink(TARGET_PATH);
    return 0;
}

static bool file_exists(const char *path) {
    return access(path, F_OK) == 0;
}

// ---- presets --------------------------------------------------------------------------------------

static void test_presets_published(void **state) {
    (void)state;
    static const int taps27[] = {1, 16, 31, 46, 61};
    for (int k = 0; k < 3; k++) {
        ds_draft_synth_params p;
        assert_true(ds_draft_synth_preset("27b", (ds_draft_kind)k, &p));
        assert_int_equal(p.kind, k);
        assert_int_equal(p.n_vocab, 248320);
        assert_int_equal(p.n_embd, 5120);
        assert_int_equal(p.n_layer, 5);
        assert_int_equal(p.n_head, 32);
        assert_int_equal(p.n_head_kv, 8);
        assert_int_equal(p.head_dim, 128);
        assert_int_equal(p.n_ff, 17408);
        assert_int_equal(p.block_size, 16);
        assert_int_equal(p.mask_token_id, 248070);
        assert_int_equal(p.n_taps, 5);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(p.target_layer_ids[i], taps27[i]);
        }
        assert_true(p.rope_base == 1e7f);
        assert_int_equal(p.wtype, DS_TYPE_Q8_0);
    }
    ds_draft_synth_params p;
    assert_true(ds_draft_synth_preset("27b", DS_DRAFT_DFLASH, &p)); // 4 x SWA causal + 1 full
    assert_int_equal(p.sliding_window, 2048);
    for (int il = 0; il < 5; il++) {
        assert_int_equal(p.swa[il], il < 4);
        assert_int_equal(p.causal[il], il < 4);
    }
    assert_true(ds_draft_synth_preset("27b", DS_DRAFT_DFLASH2, &p));
    assert_int_equal(p.conv_kernel, 2);
    assert_int_equal(p.conv_group, 16);
    assert_int_equal(p.selector_rank, 256);
    assert_int_equal(p.selector_top_k, 16);
    for (int il = 0; il < 5; il++) {
        assert_true(p.swa[il] && !p.causal[il]);
    }
    assert_true(ds_draft_synth_preset("27b", DS_DRAFT_DSPARK, &p));
    assert_int_equal(p.markov_rank, 256);
    assert_true(p.confidence && p.confidence_with_markov);
    for (int il = 0; il < 5; il++) {
        assert_true(!p.swa[il] && !p.causal[il]);
    }
    assert_true(ds_draft_synth_preset("9b", DS_DRAFT_DFLASH, &p));
    assert_int_equal(p.n_embd, 4096);
    assert_int_equal(p.target_layer_ids[4], 29);
    assert_false(p.swa[0] || p.causal[0]);
    assert_true(ds_draft_synth_preset("35b-a3b", DS_DRAFT_DFLASH, &p));
    assert_int_equal(p.n_layer, 8);
    assert_int_equal(p.n_embd, 2048);
    assert_int_equal(p.n_head_kv, 4);
    assert_int_equal(p.target_layer_ids[1], 10);
    assert_int_equal(p.target_layer_ids[4], 37);
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH, &p));
    assert_int_equal(p.n_taps, 3);
    assert_int_equal(p.target_layer_ids[2], 2);
    assert_int_equal(p.mask_token_id, 511);
    assert_false(ds_draft_synth_preset("28b", DS_DRAFT_DFLASH, &p));
    assert_false(ds_draft_synth_preset("27b", (ds_draft_kind)7, &p));
    // from a loaded target's sizes: the same as the matching preset
    ds_draft_synth_params q;
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH2, &p));
    assert_true(ds_draft_synth_for_target(ds_model_hparams_get(W.m), DS_DRAFT_DFLASH2, &q));
    assert_memory_equal(&p, &q, sizeof(p));
    ds_model_hparams h27 = {.arch = DS_ARCH_QWEN35, .n_vocab = 248320, .n_embd = 5120,
                            .n_layer = 64, .n_ff = 17408, .head_dim = 256};
    assert_true(ds_draft_synth_preset("27b", DS_DRAFT_DSPARK, &p));
    assert_true(ds_draft_synth_for_target(&h27, DS_DRAFT_DSPARK, &q));
    assert_memory_equal(&p, &q, sizeof(p));
    h27.n_embd = 5000; // not a published shape: generic geometry, conv group dividing 5000
    assert_true(ds_draft_synth_for_target(&h27, DS_DRAFT_DFLASH2, &q));
    assert_int_equal(q.n_head, 39);
    assert_int_equal(q.conv_group, 8);
    assert_int_equal(q.target_layer_ids[4], 61);
    ds_draft_kind k;
    assert_true(ds_draft_synth_kind_from_name("dflash2", &k) && k == DS_DRAFT_DFLASH2);
    assert_true(ds_draft_synth_kind_from_name("dspark", &k) && k == DS_DRAFT_DSPARK);
    assert_false(ds_draft_synth_kind_from_name("eagle3", &k));
    assert_string_equal(ds_draft_synth_kind_name(DS_DRAFT_DFLASH), "dflash");
}

// ---- write, load, draft ---------------------------------------------------------------------------

// A quant mix for the tests: Q4_K matrices, Q6_K for ffn_down (llama-quantize's more-bits rule).
static ds_type mix_q4k(void *ctx, const char *name, int n_dims, const int64_t ne[4], ds_type def) {
    (void)ctx, (void)n_dims, (void)def;
    int *n_calls = ctx;
    (*n_calls)++;
    if (ne[0] % 256 != 0) {
        return DS_TYPE_Q8_0;
    }
    return strstr(name, "ffn_down") ? DS_TYPE_Q6_K : DS_TYPE_Q4_K;
}

static bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return false;
        }
    }
    return true;
}

// Writes a tiny drafter of `kind`, loads it against the tiny target, drafts two blocks.
static void roundtrip(ds_draft_kind kind, ds_type wtype, bool mix, int block) {
    char path[512];
    snprintf(path, sizeof(path), DSPEC_BINARY_DIR "/draft_synth_test_%s_%d_%d.gguf",
             ds_draft_synth_kind_name(kind), (int)wtype, (int)mix);
    ds_draft_synth_params p;
    assert_true(ds_draft_synth_preset("tiny", kind, &p));
    assert_int_equal(p.n_vocab, W.V);
    assert_int_equal(p.n_embd, W.H);
    p.wtype = wtype;
    p.block_size = block;
    p.seed = 3 + (uint64_t)kind;
    p.pool_rows = kind == DS_DRAFT_DSPARK ? 64 : 0; // the pooled path on the vocab tables
    int n_calls = 0;
    if (mix) {
        p.type_of = mix_q4k;
        p.type_ctx = &n_calls;
    }
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    if (mix) {
        assert_true(n_calls > 5 * 7);
    }

    ds_drafter *d = NULL;
    dspec_status st = ds_drafter_load(&d, path, W.m, &err);
    if (st != DSPEC_OK) {
        fail_msg("load %s: %s", path, err.msg);
    }
    const ds_draft_config *c = ds_drafter_config(d);
    assert_int_equal(c->kind, kind);
    assert_int_equal(c->block_size, block);
    assert_int_equal(c->n_layer, 5);
    assert_int_equal(c->n_taps, p.n_taps);
    for (int i = 0; i < c->n_taps; i++) {
        assert_int_equal(c->target_layer_ids[i], p.target_layer_ids[i]);
    }
    assert_int_equal(c->mask_token_id, p.mask_token_id);
    assert_int_equal(c->shifted, kind == DS_DRAFT_DSPARK);
    assert_int_equal(c->has_selector, kind == DS_DRAFT_DFLASH2);
    assert_int_equal(c->has_markov, kind == DS_DRAFT_DSPARK);
    assert_int_equal(c->has_confidence, kind == DS_DRAFT_DSPARK);
    assert_int_equal(c->verify_width, kind == DS_DRAFT_DSPARK ? block + 1 : block);

    // target prefill with the drafter's taps
    enum { N = 8 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) {
        toks[i] = (int32_t)((37 * i + 5) % W.V);
    }
    ds_state *ts = NULL;
    ds_state_params sp = {.n_ctx = 64, .n_verify = 40};
    assert_int_equal(ds_state_new(&ts, W.m, &sp, &err), DSPEC_OK);
    const int64_t F = (int64_t)c->n_taps * W.H;
    float *feats = malloc((size_t)(N * F) * sizeof(float));
    int32_t argmax = -1;
    int32_t last = N - 1;
    assert_non_null(feats);
    ds_batch b = {.n = N, .tokens = toks, .n_logits = 1, .logits_rows = &last, .argmax = &argmax,
                  .n_taps = c->n_taps, .tap_layers = c->target_layer_ids, .taps = feats};
    assert_int_equal(ds_model_forward(W.m, ts, &b, &err), DSPEC_OK);
    assert_true(all_finite(feats, N * F));
    assert_true(argmax >= 0 && argmax < W.V);

    ds_draft_ctx *ctx = NULL;
    assert_int_equal(ds_draft_ctx_new(&ctx, d, 64, &err), DSPEC_OK);
    assert_int_equal(ds_draft_ctx_append(ctx, feats, N, &err), DSPEC_OK);
    assert_int_equal(ds_draft_ctx_len(ctx), N);
    ds_draft_out out;
    assert_int_equal(ds_draft_out_init(&out, d, &err), DSPEC_OK);
    int32_t anchor = argmax;
    for (int round = 0; round < 2; round++) {
        const int n_slots = c->verify_width - round; // full width, then one narrower
        st = ds_draft_block(ctx, anchor, n_slots, DS_PROPOSE_AUTO, &out, &err);
        if (st != DSPEC_OK) {
            fail_msg("draft block: %s", err.msg);
        }
        assert_int_equal(out.n_tokens, n_slots - 1);
        assert_true(out.n_proposed >= out.n_tokens);
        assert_int_equal(out.n_vocab, W.V);
        assert_true(all_finite(out.logits, out.n_proposed * W.V));
        for (int64_t j = 0; j < out.n_proposed; j++) { // logits are not degenerate
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t v = 0; v < W.V; v++) {
                lo = fminf(lo, out.logits[j * W.V + v]);
                hi = fmaxf(hi, out.logits[j * W.V + v]);
            }
            assert_true(hi - lo > 1e-3f);
        }
        for (int64_t j = 0; j < out.n_tokens; j++) {
            assert_true(out.tokens[j] >= 0 && out.tokens[j] < W.V);
            if (kind == DS_DRAFT_DSPARK) {
                assert_true(out.confidence[j] > 0.0f && out.confidence[j] < 1.0f);
            }
        }
        if (kind == DS_DRAFT_DFLASH2) {
            assert_int_equal(out.n_cand, 16);
            for (int64_t j = 0; j < out.n_tokens; j++) {
                bool found = false;
                for (int k = 0; k < out.n_cand; k++) {
                    assert_true(out.cand_ids[j][k] >= 0 && out.cand_ids[j][k] < W.V);
                    assert_true(isfinite(out.cand_scores[j][k]));
                    found |= out.cand_ids[j][k] == out.tokens[j];
                }
                assert_true(found); // the walked path picks among the candidates
            }
        } else {
            assert_int_equal(out.n_cand, 0);
        }
        // commit the anchor and the first proposal: two more context rows
        assert_int_equal(ds_draft_ctx_append(ctx, feats, 2, &err), DSPEC_OK);
        assert_int_equal(ds_draft_ctx_len(ctx), N + 2 * (round + 1));
        anchor = out.tokens[0];
    }
    ds_draft_out_deinit(&out);
    ds_draft_ctx_free(ctx);
    ds_state_free(ts);
    free(feats);
    ds_drafter_free(d);
    unlink(path);
}

static void test_dflash_q8_0(void **state) {
    (void)state;
    roundtrip(DS_DRAFT_DFLASH, DS_TYPE_Q8_0, false, 16);
}

static void test_dflash2_q8_0(void **state) {
    (void)state;
    roundtrip(DS_DRAFT_DFLASH2, DS_TYPE_Q8_0, false, 16);
}

static void test_dspark_q8_0(void **state) {
    (void)state;
    roundtrip(DS_DRAFT_DSPARK, DS_TYPE_Q8_0, false, 16);
}

// A DSpark drafter without the Markov term (markov_rank 0): the Markov proposer is then every
// slot's own argmax (one batched argmax), checked against the block's host logits.
static void test_dspark_no_markov(void **state) {
    (void)state;
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_dspark_r0.gguf";
    ds_draft_synth_params p;
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DSPARK, &p));
    p.markov_rank = 0, p.confidence_with_markov = false, p.wtype = DS_TYPE_F32;
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    ds_drafter *d = NULL;
    assert_int_equal(ds_drafter_load(&d, path, W.m, &err), DSPEC_OK);
    const ds_draft_config *c = ds_drafter_config(d);
    assert_false(c->has_markov);
    enum { N = 6 };
    const int64_t F = (int64_t)c->n_taps * W.H;
    float *feats = calloc((size_t)(N * F), sizeof(float));
    assert_non_null(feats);
    for (int64_t i = 0; i < N * F; i++) feats[i] = sinf(0.37f * (float)i);
    ds_draft_ctx *ctx = NULL;
    assert_int_equal(ds_draft_ctx_new(&ctx, d, 32, &err), DSPEC_OK);
    assert_int_equal(ds_draft_ctx_append(ctx, feats, N, &err), DSPEC_OK);
    ds_draft_out out;
    assert_int_equal(ds_draft_out_init(&out, d, &err), DSPEC_OK);
    assert_int_equal(ds_draft_block(ctx, 5, c->verify_width, DS_PROPOSE_MARKOV, &out, &err),
                     DSPEC_OK);
    assert_true(out.n_proposed >= 2);
    for (int64_t j = 0; j < out.n_proposed; j++) {
        const float *row = out.logits + j * W.V;
        int32_t best = 0;
        for (int32_t v = 1; v < W.V; v++) best = row[v] > row[best] ? v : best;
        assert_int_equal(out.tokens[j], best);
    }
    ds_draft_out_deinit(&out);
    ds_draft_ctx_free(ctx);
    ds_drafter_free(d);
    free(feats);
    unlink(path);
}

static void set_u32_1(ds_gguf_writer *w, const char *key) {
    assert_int_equal(ds_gguf_writer_set_u32(w, key, 1), DSPEC_OK);
}

// An optional drafter key stored with a wrong type is an error naming it (such keys once read
// as their default: a bool sample_from_anchor stored as an integer silently became false).
static void test_mistyped_key(void **state) {
    (void)state;
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_mistyped_src.gguf";
    const char *path2 = DSPEC_BINARY_DIR "/draft_synth_test_mistyped.gguf";
    ds_draft_synth_params p;
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DSPARK, &p));
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    const char *key = "qwen35-dflash-draft.dflash.sample_from_anchor";
    ds_gguf *g;
    assert_int_equal(ds_gguf_open(&g, path, &err), DSPEC_OK);
    assert_true(ds_gguf_find_key(g, key) >= 0); // (a key the file has, retyped)
    ds_gguf_close(g);
    assert_int_equal(ds_gguf_rewrite(path, path2, set_u32_1, key, false, &err), DSPEC_OK);
    ds_drafter *d = NULL;
    assert_int_equal(ds_drafter_load(&d, path2, W.m, &err), DSPEC_ERR_FORMAT);
    assert_null(d);
    if (!strstr(err.msg, key)) fail_msg("%s", err.msg);
    unlink(path);
    unlink(path2);
}

static void set_i64_max(ds_gguf_writer *w, const char *key) {
    assert_int_equal(ds_gguf_writer_set_i64(w, key, INT64_MAX), DSPEC_OK);
}

// Widths and ranks of 2^63 - 1 are refused naming the key (they once overflowed the loader's
// sums and products of the shapes: undefined behaviour, found by fuzzing under UBSan).
static void test_huge_dims(void **state) {
    (void)state;
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_huge_src.gguf";
    const char *path2 = DSPEC_BINARY_DIR "/draft_synth_test_huge.gguf";
    const struct {
        ds_draft_kind kind;
        const char *key, *msg;
    } cases[] = {
        {DS_DRAFT_DSPARK, "embedding_length", "embedding_length"},
        {DS_DRAFT_DSPARK, "dflash.dspark.markov_rank", "markov_rank"},
        {DS_DRAFT_DFLASH, "feed_forward_length", "feed_forward_length"},
        {DS_DRAFT_DFLASH2, "dflash.dflash2.selector_rank", "selector_rank"},
        {DS_DRAFT_DFLASH, "attention.sliding_window", "sliding_window"},
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        ds_draft_synth_params p;
        assert_true(ds_draft_synth_preset("tiny", cases[i].kind, &p));
        dspec_err err = {0};
        assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
        char key[160];
        snprintf(key, sizeof(key), "qwen35-dflash-draft.%s", cases[i].key);
        assert_int_equal(ds_gguf_rewrite(path, path2, set_i64_max, key, false, &err), DSPEC_OK);
        ds_drafter *d = NULL;
        assert_int_equal(ds_drafter_load(&d, path2, W.m, &err), DSPEC_ERR_FORMAT);
        assert_null(d);
        if (!strstr(err.msg, cases[i].msg)) fail_msg("%s: %s", key, err.msg);
    }
    unlink(path);
    unlink(path2);
}

// A drafter file whose general.alignment is 1, with a 2-byte tensor first (weights at addresses
// that are not multiples of 4): the host backend reads every weight from a DS_WEIGHT_ALIGN-
// aligned copy and drafts the same logits, bitwise, as from the aligned file.
static void test_misaligned_file(void **state) {
    (void)state;
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_align_src.gguf";
    const char *path2 = DSPEC_BINARY_DIR "/draft_synth_test_align1.gguf";
    ds_draft_synth_params p;
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH2, &p));
    p.wtype = DS_TYPE_Q8_0;
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_rewrite(path, path2, NULL, NULL, true, &err), DSPEC_OK);
    ds_drafter *d[2] = {NULL, NULL};
    assert_int_equal(ds_drafter_load(&d[0], path, W.m, &err), DSPEC_OK);
    assert_int_equal(ds_drafter_load(&d[1], path2, W.m, &err), DSPEC_OK);
    const ds_tensor *ts[] = {&d[1]->fc, &d[1]->hidden_norm, &d[1]->layers[0].attn_norm,
                             &d[1]->layers[0].attn_q, &d[1]->layers[4].ffn_down,
                             &d[1]->sel_pred};
    for (size_t i = 0; i < DS_ARRAY_LEN(ts); i++) {
        assert_non_null(ts[i]->data);
        assert_int_equal((uintptr_t)ts[i]->data % DS_WEIGHT_ALIGN, 0);
    }
    const ds_draft_config *c = ds_drafter_config(d[0]);
    const int64_t F = (int64_t)c->n_taps * W.H, N = 6;
    float *feats = malloc((size_t)(N * F) * sizeof(float));
    assert_non_null(feats);
    for (int64_t i = 0; i < N * F; i++) feats[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    float *logits[2];
    int64_t n_logits = 0;
    for (int k = 0; k < 2; k++) {
        ds_draft_ctx *ctx = NULL;
        assert_int_equal(ds_draft_ctx_new(&ctx, d[k], 64, &err), DSPEC_OK);
        assert_int_equal(ds_draft_ctx_append(ctx, feats, N, &err), DSPEC_OK);
        ds_draft_out out;
        assert_int_equal(ds_draft_out_init(&out, d[k], &err), DSPEC_OK);
        assert_int_equal(ds_draft_block(ctx, 7, c->verify_width, DS_PROPOSE_AUTO, &out, &err),
                         DSPEC_OK);
        n_logits = out.n_proposed * W.V;
        logits[k] = malloc((size_t)n_logits * sizeof(float));
        assert_non_null(logits[k]);
        memcpy(logits[k], out.logits, (size_t)n_logits * sizeof(float));
        ds_draft_out_deinit(&out);
        ds_draft_ctx_free(ctx);
    }
    assert_memory_equal(logits[0], logits[1], (size_t)n_logits * sizeof(float));
    free(logits[0]);
    free(logits[1]);
    free(feats);
    ds_drafter_free(d[0]);
    ds_drafter_free(d[1]);
    unlink(path);
    unlink(path2);
}

static void test_other_types(void **state) {
    (void)state;
    roundtrip(DS_DRAFT_DFLASH2, DS_TYPE_BF16, false, 8);
    roundtrip(DS_DRAFT_DSPARK, DS_TYPE_F16, false, 7);
    roundtrip(DS_DRAFT_DFLASH2, DS_TYPE_Q4_K, true, 16); // q4_k_m-like mix through type_of
    roundtrip(DS_DRAFT_DSPARK, DS_TYPE_Q4_K, true, 4);
}

// ---- refusals -------------------------------------------------------------------------------------

static void expect_bad(const ds_draft_synth_params *p, const char *needle) {
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_bad.gguf";
    unlink(path);
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(path, p, &err), DSPEC_ERR_INVALID);
    if (!strstr(err.msg, needle)) {
        fail_msg("error '%s' does not name '%s'", err.msg, needle);
    }
    assert_false(file_exists(path));
}

static ds_type all_q4k(void *ctx, const char *name, int n_dims, const int64_t ne[4], ds_type def) {
    (void)ctx, (void)name, (void)n_dims, (void)ne, (void)def;
    return DS_TYPE_Q4_K;
}

static void test_bad_params(void **state) {
    (void)state;
    ds_draft_synth_params base, p;
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH2, &base));
    p = base, p.n_layer = 0;
    expect_bad(&p, "n_layer");
    p = base, p.n_layer = 65;
    expect_bad(&p, "n_layer");
    p = base, p.n_head_kv = 3;
    expect_bad(&p, "n_head_kv");
    p = base, p.head_dim = 63;
    expect_bad(&p, "head_dim");
    p = base, p.block_size = 1;
    expect_bad(&p, "block_size");
    p = base, p.target_layer_ids[1] = p.target_layer_ids[0];
    expect_bad(&p, "target_layer_ids[1]");
    p = base, p.mask_token_id = (int32_t)p.n_vocab;
    expect_bad(&p, "mask_token_id");
    p = base, p.conv_group = 100;
    expect_bad(&p, "conv_group");
    p = base, p.selector_top_k = 17;
    expect_bad(&p, "selector_top_k");
    p = base, p.eps = NAN;
    expect_bad(&p, "eps");
    p = base, p.kind = (ds_draft_kind)9;
    expect_bad(&p, "kind");
    p = base, p.n_embd = 96; // rows of 96 (or 288 for fc) cannot be Q4_K
    p.type_of = all_q4k;
    expect_bad(&p, "type q4_K");
    p = base, p.wtype = DS_TYPE_COUNT;
    expect_bad(&p, "cannot be written");
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DSPARK, &p));
    p.markov_rank = 0;
    expect_bad(&p, "confidence_with_markov");
    dspec_err err = {0};
    assert_int_equal(ds_draft_synth_write(NULL, &base, &err), DSPEC_ERR_INVALID);
}

static void test_mismatched_target(void **state) {
    (void)state;
    const char *path = DSPEC_BINARY_DIR "/draft_synth_test_mismatch.gguf";
    ds_draft_synth_params p;
    ds_drafter *d = NULL;
    dspec_err err = {0};
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH, &p));
    p.n_vocab = 1024; // another target's vocabulary
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    assert_int_equal(ds_drafter_load(&d, path, W.m, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "vocab_size"));
    assert_true(ds_draft_synth_preset("tiny", DS_DRAFT_DFLASH, &p));
    p.target_layer_ids[2] = 4; // the tiny target has layers 0..3
    assert_int_equal(ds_draft_synth_write(path, &p, &err), DSPEC_OK);
    assert_int_equal(ds_drafter_load(&d, path, W.m, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "target_layer_ids[2]"));
    assert_null(d);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_published), cmocka_unit_test(test_dflash_q8_0),
        cmocka_unit_test(test_dflash2_q8_0),      cmocka_unit_test(test_dspark_q8_0),
        cmocka_unit_test(test_other_types),       cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_mismatched_target), cmocka_unit_test(test_dspark_no_markov),
        cmocka_unit_test(test_mistyped_key),
        cmocka_unit_test(test_huge_dims),      cmocka_unit_test(test_misaligned_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
