// convert_test.c: unit tests of the converter's pure functions (convert.h): the grouped -> tiled
// V-head map, the type-mix rules against the counts of llama.cpp's Qwen3.5-27B quant snapshot,
// fallbacks, the 8-expert and tied-embedding rules, and config.json parsing (nested vs flat,
// transformers-5 vs legacy rope, errors naming the field).
#include "convert/convert.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

// ---- V-head map --------------------------------------------------------------------------------

static void test_vhead_map(void **state) {
    (void)state;
    // h_k = 2, h_v = 6 (r = 3): GGUF head g = m*h_k + k holds HF head k*r + m.
    static const int64_t want[6] = {0, 3, 1, 4, 2, 5};
    for (int g = 0; g < 6; g++) {
        assert_int_equal(ds_convert_vhead_src(g, 2, 6), want[g]);
    }
    // identity when h_k == h_v, and a bijection whose key head is g mod h_k in general
    for (int g = 0; g < 16; g++) {
        assert_int_equal(ds_convert_vhead_src(g, 16, 16), g);
    }
    const int64_t hk = 16, hv = 48, r = hv / hk;
    bool seen[48] = {false};
    for (int64_t g = 0; g < hv; g++) {
        int64_t j = ds_convert_vhead_src(g, hk, hv);
        assert_true(j >= 0 && j < hv && !seen[j]);
        seen[j] = true;
        assert_int_equal(j / r, g % hk); // HF grouped key head of j == tiled key head of g
    }
}

// ---- mix rules ---------------------------------------------------------------------------------

typedef struct counts {
    int attn_v_q6, attn_v_q5, attn_v_other, qkv_q6, qkv_q5, qkv_other;
    int down_q6, down_q5, down_other;
    ds_type output, token_embd, attn_q, ssm_out, conv, norm, gate_inp;
} counts;

// Walks a Qwen3.5-27B-shaped dense file (64 layers, full attention every 4th, n_embd 5120) in
// llama.cpp loader order, as convert.c does.
static counts run_27b(ds_convert_ftype ft, bool tied, int n_gqa) {
    ds_convert_mix m = {.ftype = ft, .n_layer_all = 64, .n_attn_wv = 64, .n_gqa = n_gqa,
                        .tied = tied};
    counts c = {0};
    int64_t ne[4] = {5120, 248320, 1, 1};
    if (!tied) {
        c.output = ds_convert_mix_type(&m, "output.weight", 2, ne);
    }
    int64_t nv[4] = {5120, 1, 1, 1};
    c.norm = ds_convert_mix_type(&m, "output_norm.weight", 1, nv);
    c.token_embd = ds_convert_mix_type(&m, "token_embd.weight", 2, ne);
    char name[64];
    for (int il = 0; il < 64; il++) {
        bool full = (il + 1) % 4 == 0;
        int64_t w[4] = {5120, 6144, 1, 1};
        if (full) {
            snprintf(name, sizeof(name), "blk.%d.attn_q.weight", il);
            c.attn_q = ds_convert_mix_type(&m, name, 2, (int64_t[4]){5120, 12288, 1, 1});
            snprintf(name, sizeof(name), "blk.%d.attn_v.weight", il);
            ds_type t = ds_convert_mix_type(&m, name, 2, (int64_t[4]){5120, 1024, 1, 1});
            c.attn_v_q6 += t == DS_TYPE_Q6_K;
            c.attn_v_q5 += t == DS_TYPE_Q5_K;
            c.attn_v_other += t != DS_TYPE_Q6_K && t != DS_TYPE_Q5_K;
        } else {
            snprintf(name, sizeof(name), "blk.%d.attn_qkv.weight", il);
            ds_type t = ds_convert_mix_type(&m, name, 2, (int64_t[4]){5120, 10240, 1, 1});
            c.qkv_q6 += t == DS_TYPE_Q6_K;
            c.qkv_q5 += t == DS_TYPE_Q5_K;
            c.qkv_other += t != DS_TYPE_Q6_K && t != DS_TYPE_Q5_K;
            snprintf(name, sizeof(name), "blk.%d.ssm_conv1d.weight", il);
            c.conv = ds_convert_mix_type(&m, name, 2, (int64_t[4]){4, 10240, 1, 1});
            snprintf(name, sizeof(name), "blk.%d.ssm_out.weight", il);
            c.ssm_out = ds_convert_mix_type(&m, name, 2, w);
        }
        snprintf(name, sizeof(name), "blk.%d.ffn_down.weight", il);
        ds_type t = ds_convert_mix_type(&m, name, 2, (int64_t[4]){17408, 5120, 1, 1});
        c.down_q6 += t == DS_TYPE_Q6_K;
        c.down_q5 += t == DS_TYPE_Q5_K;
        c.down_other += t != DS_TYPE_Q6_K && t != DS_TYPE_Q5_K;
    }
    assert_int_equal(m.n_fallback, 0);
    return c;
}

static void test_mix_q4_k_m_27b(void **state) {
    (void)state;
    // target-qwen35.md §3.9 (tests/snapshots/qwen3.6-27b.schema): attn_v q6_K on 8 of 16,
    // attn_qkv on 24 of 48, ffn_down on 32 of 64, output q6_K, the rest q4_K.
    counts c = run_27b(DS_FTYPE_MOSTLY_Q4_K_M, false, 6);
    assert_int_equal(c.attn_v_q6, 8);
    assert_int_equal(c.qkv_q6, 24);
    assert_int_equal(c.down_q6, 32);
    assert_int_equal(c.attn_v_q6 + c.attn_v_other, 16);
    assert_int_equal(c.output, DS_TYPE_Q6_K);
    assert_int_equal(c.token_embd, DS_TYPE_Q4_K);
    assert_int_equal(c.attn_q, DS_TYPE_Q4_K);
    assert_int_equal(c.ssm_out, DS_TYPE_Q4_K);
    assert_int_equal(c.conv, DS_TYPE_F32);
    assert_int_equal(c.norm, DS_TYPE_F32);
    // Q5_K_M: same pattern over q5_K
    c = run_27b(DS_FTYPE_MOSTLY_Q5_K_M, false, 6);
    assert_int_equal(c.attn_v_q6 + c.qkv_q6, 32);
    assert_int_equal(c.down_q6, 32);
    assert_int_equal(c.attn_q, DS_TYPE_Q5_K);
}

static void test_mix_iq4_xs_27b(void **state) {
    (void)state;
    // §3.9: attn_qkv (48) and attn_v (16) q5_K, 8 ffn_down q5_K, output q6_K
    counts c = run_27b(DS_FTYPE_MOSTLY_IQ4_XS, false, 6);
    assert_int_equal(c.qkv_q5, 48);
    assert_int_equal(c.attn_v_q5, 16);
    assert_int_equal(c.down_q5, 8);
    assert_int_equal(c.output, DS_TYPE_Q6_K);
    assert_int_equal(c.attn_q, DS_TYPE_IQ4_XS);
    // with n_gqa < 4 the attn_v bump does not apply
    c = run_27b(DS_FTYPE_MOSTLY_IQ4_XS, false, 2);
    assert_int_equal(c.qkv_q5 + c.attn_v_q5, 0);
}

static void test_mix_other_types(void **state) {
    (void)state;
    counts c = run_27b(DS_FTYPE_MOSTLY_Q6_K, true, 6);
    assert_int_equal(c.token_embd, DS_TYPE_Q6_K); // tied: embedding is the LM head
    assert_int_equal(c.down_q6, 64);
    c = run_27b(DS_FTYPE_MOSTLY_Q4_K_M, true, 6);
    assert_int_equal(c.token_embd, DS_TYPE_Q6_K);
    c = run_27b(DS_FTYPE_MOSTLY_Q8_0, false, 6);
    assert_int_equal(c.output, DS_TYPE_Q8_0);
    assert_int_equal(c.token_embd, DS_TYPE_Q8_0);
    assert_int_equal(c.attn_v_other, 16);
    c = run_27b(DS_FTYPE_MOSTLY_BF16, false, 6);
    assert_int_equal(c.attn_q, DS_TYPE_BF16);
    assert_int_equal(c.conv, DS_TYPE_F32);

    // converter F32 rules: 1-D, non-.weight, routers
    ds_convert_mix m = {.ftype = DS_FTYPE_MOSTLY_F16, .n_layer_all = 4, .n_attn_wv = 4};
    int64_t one[4] = {256, 1, 1, 1};
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ssm_a", 1, one), DS_TYPE_F32);
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ssm_dt.bias", 1, one), DS_TYPE_F32);
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ffn_gate_inp_shexp.weight", 2, one),
                     DS_TYPE_F32);
    int64_t gi[4] = {256, 8, 1, 1};
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ffn_gate_inp.weight", 2, gi), DS_TYPE_F32);
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ssm_beta.weight", 2, gi), DS_TYPE_F16);
    assert_int_equal(ds_convert_mix_type(&m, "blk.4.nextn.enorm.weight", 1, one), DS_TYPE_F32);
    assert_int_equal(ds_convert_mix_type(&m, "blk.4.nextn.eh_proj.weight", 2,
                                         (int64_t[4]){512, 256, 1, 1}),
                     DS_TYPE_F16);
}

static void test_mix_fallbacks(void **state) {
    (void)state;
    ds_convert_mix m = {.ftype = DS_FTYPE_MOSTLY_Q4_K_M, .n_layer_all = 8, .n_attn_wv = 8,
                        .n_gqa = 2};
    int64_t ne64[4] = {64, 64, 1, 1}, ne48[4] = {48, 64, 1, 1};
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.attn_gate.weight", 2, ne64), DS_TYPE_Q5_0);
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.attn_gate.weight", 2, ne48), DS_TYPE_F16);
    // layer 0 uses more bits: q6_K -> q8_0 fallback
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.attn_qkv.weight", 2, ne64), DS_TYPE_Q8_0);
    assert_int_equal(ds_convert_mix_type(&m, "output.weight", 2, ne64), DS_TYPE_Q8_0);
    m.ftype = DS_FTYPE_MOSTLY_Q5_K_M;
    assert_int_equal(ds_convert_mix_type(&m, "blk.1.ssm_out.weight", 2, ne64), DS_TYPE_Q5_1);
    m.ftype = DS_FTYPE_MOSTLY_IQ4_XS;
    assert_int_equal(ds_convert_mix_type(&m, "blk.1.ssm_out.weight", 2, ne64), DS_TYPE_IQ4_NL);
    m.ftype = DS_FTYPE_MOSTLY_Q8_0;
    assert_int_equal(ds_convert_mix_type(&m, "blk.1.ssm_out.weight", 2, ne48), DS_TYPE_F16);
    assert_int_equal(ds_convert_mix_type(&m, "blk.1.ssm_out.weight", 2, ne64), DS_TYPE_Q8_0);
    assert_true(m.n_fallback >= 6);
}

static void test_mix_eight_experts(void **state) {
    (void)state;
    // llama-quant.cpp: with exactly 8 experts attn_v and attn_k become q8_0, attn_output q5_K
    ds_convert_mix m = {.ftype = DS_FTYPE_MOSTLY_Q4_K_M, .n_layer_all = 8, .n_attn_wv = 8,
                        .n_gqa = 2, .n_expert = 8};
    int64_t ne[4] = {256, 256, 1, 1}, ex[4] = {256, 256, 8, 1};
    assert_int_equal(ds_convert_mix_type(&m, "blk.3.attn_v.weight", 2, ne), DS_TYPE_Q8_0);
    assert_int_equal(ds_convert_mix_type(&m, "blk.3.attn_k.weight", 2, ne), DS_TYPE_Q8_0);
    assert_int_equal(ds_convert_mix_type(&m, "blk.3.attn_output.weight", 2, ne), DS_TYPE_Q5_K);
    // MoE ffn_down: layer taken from the name; use_more_bits(i, 8) holds for i in {0, 3, 6, 7}
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ffn_down_exps.weight", 3, ex), DS_TYPE_Q6_K);
    assert_int_equal(ds_convert_mix_type(&m, "blk.3.ffn_down_exps.weight", 3, ex), DS_TYPE_Q6_K);
    assert_int_equal(ds_convert_mix_type(&m, "blk.4.ffn_down_exps.weight", 3, ex), DS_TYPE_Q4_K);
    assert_int_equal(ds_convert_mix_type(&m, "blk.0.ffn_down_shexp.weight", 2, ne), DS_TYPE_Q6_K);
    m.n_expert = 4;
    assert_int_equal(ds_convert_mix_type(&m, "blk.3.attn_k.weight", 2, ne), DS_TYPE_Q4_K);
    static const bool more8[8] = {true, false, false, true, false, false, true, true};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(ds_convert_use_more_bits(i, 8), more8[i]);
    }
}

static void test_ftype_names(void **state) {
    (void)state;
    ds_convert_ftype ft;
    assert_true(ds_convert_ftype_from_name("Q4_K_M", &ft));
    assert_int_equal(ft, 15);
    assert_true(ds_convert_ftype_from_name("bf16", &ft));
    assert_int_equal(ft, 32);
    assert_true(ds_convert_ftype_from_name("iq4_xs", &ft));
    assert_int_equal(ft, 30);
    assert_false(ds_convert_ftype_from_name("q3_k_s", &ft));
    assert_string_equal(ds_convert_ftype_name(DS_FTYPE_MOSTLY_Q8_0), "q8_0");
}

// ---- config parsing ----------------------------------------------------------------------------

#define DENSE_FIELDS                                                                               \
    "\"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 8,"                          \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"                    \
    "\"intermediate_size\": 96, \"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-6,"        \
    "\"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16,"   \
    "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 6, \"mtp_num_hidden_layers\": 1,"    \
    "\"tie_word_embeddings\": false"

static const char k_flat[] =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", " DENSE_FIELDS
    ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7,"
    " \"partial_rotary_factor\": 0.25, \"mrope_section\": [2, 1, 1]}}";

static const char k_nested[] =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"tie_word_embeddings\": true, \"vision_config\": {\"depth\": 2},"
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS
    ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000,"
    " \"partial_rotary_factor\": 0.25, \"mrope_section\": [2, 1, 1]}}}";

static void test_config_nested_equals_flat(void **state) {
    (void)state;
    ds_convert_qwen35_hparams a, b;
    dspec_err err = {0};
    assert_int_equal(ds_convert_qwen35_parse_config(k_flat, "flat", &a, &err), DSPEC_OK);
    assert_int_equal(ds_convert_qwen35_parse_config(k_nested, "nested", &b, &err), DSPEC_OK);
    assert_false(a.moe);
    assert_string_equal(a.arch, "qwen35");
    assert_int_equal(a.n_embd, 64);
    assert_int_equal(a.ssm_h_v, 6);
    assert_int_equal(a.n_mtp, 1);
    assert_int_equal(a.full_attn_interval, 4);
    assert_true(a.rope_theta == 1e7 && a.partial_rotary == 0.25);
    assert_int_equal(a.rope_sections[0], 2);
    assert_int_equal(a.rope_sections[3], 0);
    // text_config wins over the top level (tie_word_embeddings false inside)
    assert_false(b.tie_word_embeddings);
    b.tie_word_embeddings = a.tie_word_embeddings;
    memcpy(b.model_type, a.model_type, sizeof(a.model_type));
    assert_memory_equal(&a, &b, sizeof(a));
    assert_true(ds_convert_qwen35_full_attn(&a, 3) && !ds_convert_qwen35_full_attn(&a, 4));
}

static void test_config_legacy_rope(void **state) {
    (void)state;
    static const char cfg[] =
        "{\"model_type\": \"qwen3_5_moe_text\", " DENSE_FIELDS ", \"num_experts\": 8,"
        " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
        " \"shared_expert_intermediate_size\": 32, \"rope_theta\": 5e6,"
        " \"partial_rotary_factor\": 0.5, \"full_attention_interval\": 2,"
        " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0,"
        " \"original_max_position_embeddings\": 32768}}";
    ds_convert_qwen35_hparams hp;
    dspec_err err = {0};
    assert_int_equal(ds_convert_qwen35_parse_config(cfg, "legacy", &hp, &err), DSPEC_OK);
    assert_true(hp.moe);
    assert_string_equal(hp.arch, "qwen35moe");
    assert_true(hp.rope_theta == 5e6 && hp.partial_rotary == 0.5);
    assert_string_equal(hp.rope_type, "yarn");
    assert_true(hp.rope_factor == 4.0);
    assert_int_equal(hp.rope_orig_ctx, 32768);
    assert_int_equal(hp.rope_sections[0], 11); // default [11, 11, 10, 0]
    assert_false(hp.has_mrope_section);
    assert_int_equal(hp.full_attn_interval, 2);
    assert_int_equal(hp.n_expert, 8);
}

static void expect_error(const char *cfg, dspec_status code, const char *needle) {
    ds_convert_qwen35_hparams hp;
    dspec_err err = {0};
    assert_int_equal(ds_convert_qwen35_parse_config(cfg, "cfg.json", &hp, &err), code);
    if (!strstr(err.msg, needle)) {
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
    }
}

static void test_config_errors(void **state) {
    (void)state;
    expect_error("{\"model_type\": \"llama\"}", DSPEC_ERR_UNSUPPORTED, "\"llama\"");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"]}", DSPEC_ERR_UNSUPPORTED,
                 "LlamaForCausalLM");
    expect_error("{\"model_type\": \"qwen3_5\", \"architectures\": "
                 "[\"Qwen3_5MoeForCausalLM\"]}", DSPEC_ERR_FORMAT, "disagrees");
    expect_error("{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 5}", DSPEC_ERR_FORMAT,
                 "\"hidden_size\"");
    expect_error("{\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS "}", DSPEC_ERR_FORMAT,
                 "rope_theta");
    expect_error("{\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS ", \"rope_theta\": \"x\"}",
                 DSPEC_ERR_FORMAT, "\"rope_theta\" must be a number");
    expect_error("{\"model_type\": \"qwen3_5_moe_text\", " DENSE_FIELDS ", \"rope_theta\": 1}",
                 DSPEC_ERR_FORMAT, "\"num_experts\"");
    expect_error("{\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS ", \"rope_theta\": 1,"
                 " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\","
                 " \"full_attention\", \"linear_attention\", \"linear_attention\","
                 " \"linear_attention\", \"full_attention\"]}",
                 DSPEC_ERR_UNSUPPORTED, "layer_types[5]");
    expect_error("{\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS ", \"rope_theta\": 1,"
                 " \"rope_parameters\": {\"rope_type\": \"longrope\", \"rope_theta\": 1}}",
                 DSPEC_ERR_UNSUPPORTED, "longrope");
    expect_error("{\"model_type\": \"qwen3_5_text\", " DENSE_FIELDS ", \"rope_theta\": 1,"
                 " \"linear_value_head_dim\": 32}", DSPEC_ERR_FORMAT, "duplicate");
    expect_error("not json", DSPEC_ERR_FORMAT, "invalid JSON");
    expect_error("[1, 2]", DSPEC_ERR_FORMAT, "not a JSON object");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vhead_map),
        cmocka_unit_test(test_mix_q4_k_m_27b),
        cmocka_unit_test(test_mix_iq4_xs_27b),
        cmocka_unit_test(test_mix_other_types),
        cmocka_unit_test(test_mix_fallbacks),
        cmocka_unit_test(test_mix_eight_experts),
        cmocka_unit_test(test_ftype_names),
        cmocka_unit_test(test_config_nested_equals_flat),
        cmocka_unit_test(test_config_legacy_rope),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
