// chat_impl.h: private helpers shared by the chat files (not part of the text layer's API):
// Python-compatible JSON/str formatting (what the Jinja template's tojson and `string` produce)
// and Python str.strip() semantics on UTF-8. Only src/text/chat*.c include this.
#pragma once

#include "text/chat.h"

#include <jansson.h>

// A borrowed byte range.
typedef struct ds_chat_sv {
    const char *p;
    size_t n;
} ds_chat_sv;

// Appends a NUL-terminated string.
dspec_status ds_chat_buf_puts(ds_chat_buf *b, const char *s, dspec_err *err);

// Appends json.dumps(v, ensure_ascii=False) as Python writes it: separators ", " and ": ", keys in
// insertion order, floats as repr(), control characters escaped (\n, \t, …, \u001f), non-ASCII raw.
dspec_status ds_chat_py_json(ds_chat_buf *b, const json_t *v, dspec_err *err);

// Appends Python str(v) of a JSON value as Jinja's `string` filter writes it: strings raw,
// true/false/null as True/False/None, floats as repr(), objects/arrays as json.dumps.
dspec_status ds_chat_py_str(ds_chat_buf *b, const json_t *v, dspec_err *err);

// Numbers that jansson cannot hold and Python's json.loads reads (chat_pyload.c): an integer past
// 64 bits (lit: its digits) or a real past the double range (lit: "inf" or "-inf"), each standing
// in the parsed tree as the integer key[i].
typedef struct ds_chat_pynums {
    int n;
    int64_t *key;
    char **lit;
} ds_chat_pynums;

// json.loads(text) as Python reads it (see ds_chat_pynums; a key given twice keeps its first place
// and its last value). NULL on an error, described in *je; free nums with ds_chat_pynums_free
// either way.
json_t *ds_chat_py_loads(const char *text, ds_chat_pynums *nums, json_error_t *je);
void ds_chat_pynums_free(ds_chat_pynums *nums);
// The literal the integer v stands for, NULL if none (nums may be NULL).
const char *ds_chat_pynums_find(const ds_chat_pynums *nums, int64_t v);

// ds_chat_py_json / ds_chat_py_str of a tree from ds_chat_py_loads: its numbers as Python writes
// them (json.dumps: Infinity; str(): inf; integers: all their digits).
dspec_status ds_chat_py_json_n(ds_chat_buf *b, const json_t *v, const ds_chat_pynums *nums,
                               dspec_err *err);
dspec_status ds_chat_py_str_n(ds_chat_buf *b, const json_t *v, const ds_chat_pynums *nums,
                              dspec_err *err);

// Writes repr(x) of a finite double (shortest round-trip digits, Python's fixed/exponent rule) into
// out (at least 32 bytes). Returns the length.
size_t ds_chat_py_repr_double(char out[32], double x);

// Python str.strip() / lstrip('\n') / rstrip('\n') on a UTF-8 range (Unicode whitespace as
// str.isspace defines it).
ds_chat_sv ds_chat_py_strip(ds_chat_sv s);
ds_chat_sv ds_chat_lstrip_nl(ds_chat_sv s);
ds_chat_sv ds_chat_rstrip_nl(ds_chat_sv s);

// First / last occurrence of a NUL-terminated needle in s; NULL if absent.
const char *ds_chat_find(ds_chat_sv s, const char *needle);
const char *ds_chat_rfind(ds_chat_sv s, const char *needle);
