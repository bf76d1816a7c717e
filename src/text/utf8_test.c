// utf8_test.c: strict UTF-8 sequence lengths, maximal ill-formed subparts, encode/decode.
#include "text/text.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#define U(s) ((const uint8_t *)(s))

static void test_seq_len(void **state) {
    (void)state;
    assert_int_equal(ds_utf8_seq_len(U("a"), 1), 1);
    assert_int_equal(ds_utf8_seq_len(U("\xc3\xa9"), 2), 2);
    assert_int_equal(ds_utf8_seq_len(U("\xe4\xba\xba"), 3), 3);
    assert_int_equal(ds_utf8_seq_len(U("\xf0\x9f\x8e\x89"), 4), 4);
    assert_int_equal(ds_utf8_seq_len(U("\xc0\xaf"), 2), 0);     // overlong lead
    assert_int_equal(ds_utf8_seq_len(U("\xe0\x80\xaf"), 3), 0); // overlong 3-byte
    assert_int_equal(ds_utf8_seq_len(U("\xed\xa0\x80"), 3), 0); // surrogate
    assert_int_equal(ds_utf8_seq_len(U("\xf4\x90\x80\x80"), 4), 0); // > U+10FFFF
    assert_int_equal(ds_utf8_seq_len(U("\xff"), 1), 0);
    assert_int_equal(ds_utf8_seq_len(U("\x80"), 1), 0);
    assert_int_equal(ds_utf8_seq_len(U("\xe4\xba"), 2), -2); // truncated but valid so far
    assert_int_equal(ds_utf8_seq_len(U("\xf0"), 1), -1);
    assert_int_equal(ds_utf8_seq_len(U(""), 0), 0);
}

static void test_bad_len(void **state) {
    (void)state;
    // Maximal subparts as in Unicode Table 3-8 / Python's errors="replace".
    assert_int_equal(ds_utf8_bad_len(U("\xe4\xba" "a"), 3), 2);
    assert_int_equal(ds_utf8_bad_len(U("\xf0\x9f\x8e" "a"), 4), 3);
    assert_int_equal(ds_utf8_bad_len(U("\xed\xa0\x80"), 3), 1);
    assert_int_equal(ds_utf8_bad_len(U("\xc0\xaf"), 2), 1);
    assert_int_equal(ds_utf8_bad_len(U("\x80\x80"), 2), 1);
}

static void test_valid_prefix(void **state) {
    (void)state;
    const char *s = "hello, world! long ascii run here \xe4\xba\xba\xe5\xb7\xa5 x\xff tail";
    size_t n = strlen(s);
    size_t v = ds_utf8_valid_prefix(U(s), n);
    assert_int_equal(v, (size_t)(strchr(s, '\xff') - s));
    assert_int_equal(ds_utf8_valid_prefix(U("abc\xe4\xba"), 5), 3);
    assert_int_equal(ds_utf8_valid_prefix(U("abcdefghijklmnop"), 16), 16);
}

static void test_encode_decode(void **state) {
    (void)state;
    const uint32_t cps[] = {0, 0x41, 0x7f, 0x80, 0x7ff, 0x800, 0xfffd, 0x10000, 0x1f389, 0x10ffff};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        uint8_t b[4];
        int n = ds_utf8_encode(cps[i], b);
        assert_int_equal(ds_utf8_seq_len(b, (size_t)n), n);
        assert_int_equal(ds_utf8_decode(b, n), cps[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seq_len),
        cmocka_unit_test(test_bad_len),
        cmocka_unit_test(test_valid_prefix),
        cmocka_unit_test(test_encode_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
