// cmd_tokenize.c: `dspec tokenize -m FILE.gguf [-p TEXT | -f FILE | --batch]`: text -> token ids
// with the GGUF's tokenizer (and back, with --detok), a JSON-lines batch mode for the oracle test
// (tests/oracle/test_tokenizer.py) and an encode-speed measurement. Calls gguf/, text/.
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "text/text.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec tokenize -m FILE.gguf [options] (-p TEXT | -f FILE | --batch)\n\n"
            "Tokenizes text with the GGUF's tokenizer (llama.cpp-compatible) and prints the ids.\n\n"
            "  -m, --model FILE.gguf\n"
            "                 model or vocab-only GGUF\n"
            "  -p TEXT        text to tokenize\n"
            "  -f FILE        file to tokenize (raw bytes)\n"
            "  --special      parse special tokens (<|im_start|>, ...) in the text\n"
            "  --ids-only     print only the ids, as [1, 2, 3] (not with --detok, --batch)\n"
            "  --detok        print decode(encode(text)) instead of ids (special text included)\n"
            "  --bench N      encode N times and print bytes, tokens and MB/s on stderr (not\n"
            "                 with --batch)\n"
            "  --batch        read JSON lines from stdin: a string, or {\"text\": S} or\n"
            "                 {\"hex\": H} with optional \"special\": bool; write one line each:\n"
            "                 {\"ids\": [...]} (+ \"detok\" and \"stream\" as hex with --detok:\n"
            "                 the decoded bytes, and the streaming detokenizer's UTF-8 output)\n");
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dspec tokenize: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) {
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        fprintf(stderr, "dspec tokenize: %s: read failed\n", path);
        return NULL;
    }
    *len = n;
    return buf;
}

static void put_hex(FILE *o, const char *s, size_t n) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        putc(hx[(uint8_t)s[i] >> 4], o);
        putc(hx[(uint8_t)s[i] & 15], o);
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// Decoded bytes and streamed text of ids, written as hex JSON fields.
static int put_detok(const ds_tok *tok, ds_tok_stream *st, const int32_t *ids, int64_t n,
                     FILE *o) {
    size_t cap = (size_t)n * ds_tok_max_piece_len(tok) + 1, m;
    char *buf = malloc(cap);
    dspec_err err;
    if (!buf || ds_tok_decode(tok, ids, n, true, buf, cap, &m, &err)) {
        free(buf);
        fprintf(stderr, "dspec tokenize: decode failed\n");
        return 1;
    }
    fputs(", \"detok\": \"", o);
    put_hex(o, buf, m);
    fputs("\", \"stream\": \"", o);
    free(buf);
    ds_str out;
    for (int64_t i = 0; i < n; i++) {
        ds_tok_stream_push(st, ids[i], &out, &err);
        put_hex(o, out.ptr, out.len);
    }
    ds_tok_stream_flush(st, &out);
    put_hex(o, out.ptr, out.len);
    putc('"', o);
    return 0;
}

// Parses one batch line into raw bytes (*text, owned) and the special flag.
static int parse_line(const char *line, char **text, size_t *len, bool *special) {
    json_error_t je;
    json_t *j = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j) {
        fprintf(stderr, "dspec tokenize: batch line: %s\n", je.text);
        return 1;
    }
    const json_t *t = json_is_string(j) ? j : json_object_get(j, "text");
    const json_t *h = json_object_get(j, "hex");
    const json_t *sp = json_object_get(j, "special");
    if (json_is_boolean(sp)) {
        *special = json_is_true(sp);
    }
    int rc = 0;
    if (json_is_string(t)) {
        *len = json_string_length(t);
        *text = malloc(*len + 1);
        if (*text) {
            memcpy(*text, json_string_value(t), *len);
        }
    } else if (json_is_string(h) && json_string_length(h) % 2 == 0) {
        const char *hs = json_string_value(h);
        *len = json_string_length(h) / 2;
        *text = malloc(*len + 1);
        for (size_t i = 0; *text && i < *len; i++) {
            int a = hexval(hs[2 * i]), b = hexval(hs[2 * i + 1]);
            if (a < 0 || b < 0) {
                fprintf(stderr, "dspec tokenize: batch line: \"hex\" has a non-hex digit at "
                        "%zu\n", 2 * i + (a < 0 ? 0 : 1));
                rc = 1;
                break;
            }
            (*text)[i] = (char)(a << 4 | b);
        }
    } else {
        fprintf(stderr, "dspec tokenize: batch line needs a string, \"text\" or \"hex\"\n");
        rc = 1;
    }
    json_decref(j);
    if (rc == 0 && !*text) {
        fprintf(stderr, "dspec tokenize: no memory\n");
        rc = 1;
    }
    return rc;
}

static int run_batch(const ds_tok *tok, bool special_default, bool detok) {
    ds_tok_stream *st = NULL;
    dspec_err err;
    if (detok && ds_tok_stream_new(&st, tok, true, &err)) {
        fprintf(stderr, "dspec tokenize: %s\n", err.msg);
        return 1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int rc = 0;
    while (rc == 0 && (got = getline(&line, &line_cap, stdin)) > 0) {
        if (got == 1 && line[0] == '\n') {
            continue;
        }
        char *text = NULL;
        size_t len = 0;
        bool special = special_default;
        int32_t *ids = NULL;
        int64_t n = 0;
        rc = parse_line(line, &text, &len, &special);
        if (rc == 0 && ds_tok_encode_alloc(tok, text, len, special, &ids, &n, &err)) {
            fprintf(stderr, "dspec tokenize: %s\n", err.msg);
            rc = 1;
        }
        if (rc == 0) {
            fputs("{\"ids\": [", stdout);
            for (int64_t i = 0; i < n; i++) {
                printf(i ? ", %d" : "%d", (int)ids[i]);
            }
            putchar(']');
            if (detok) {
                rc = put_detok(tok, st, ids, n, stdout);
            }
            fputs("}\n", stdout);
        }
        free(text);
        free(ids);
    }
    free(line);
    ds_tok_stream_free(st);
    return rc;
}

static int run_one(const ds_tok *tok, const char *text, size_t len, bool special, bool ids_only,
                   bool detok, int bench) {
    int32_t *ids = NULL;
    int64_t n = 0;
    dspec_err err;
    double t0 = ds_time_now();
    for (int r = 0; r < (bench > 0 ? bench : 1); r++) {
        free(ids);
        if (ds_tok_encode_alloc(tok, text, len, special, &ids, &n, &err)) {
            fprintf(stderr, "dspec tokenize: %s\n", err.msg);
            return 1;
        }
    }
    double dt = ds_time_now() - t0;
    if (bench > 0) {
        fprintf(stderr, "tokenize: %zu bytes -> %" PRId64 " tokens, %d runs, %.2f MB/s\n", len, n,
                bench, dt > 0 ? (double)len * bench / dt / 1e6 : 0.0);
    }
    if (detok) {
        size_t cap = (size_t)n * ds_tok_max_piece_len(tok) + 1, m;
        char *buf = malloc(cap);
        if (!buf || ds_tok_decode(tok, ids, n, true, buf, cap, &m, &err)) {
            free(buf);
            free(ids);
            fprintf(stderr, "dspec tokenize: decode failed\n");
            return 1;
        }
        fwrite(buf, 1, m, stdout);
        free(buf);
    } else if (ids_only) {
        putchar('[');
        for (int64_t i = 0; i < n; i++) {
            printf(i ? ", %d" : "%d", (int)ids[i]);
        }
        puts("]");
    } else {
        for (int64_t i = 0; i < n; i++) {
            ds_str p = ds_tok_piece(tok, ids[i], true);
            printf("%6d -> '%.*s'\n", (int)ids[i], (int)p.len, p.ptr);
        }
    }
    free(ids);
    return 0;
}

int ds_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool special = false, ids_only = false, detok = false, batch = false;
    int bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        int64_t bn;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) {
            model = argv[++i];
        } else if (!strcmp(a, "-p") && has_val) {
            prompt = argv[++i];
        } else if (!strcmp(a, "-f") && has_val) {
            file = argv[++i];
        } else if (!strcmp(a, "--bench") && has_val && ds_cli_int(argv[i + 1], 1, 1 << 24, &bn)) {
            bench = (int)bn, i++;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else if (!strcmp(a, "--ids-only")) {
            ids_only = true;
        } else if (!strcmp(a, "--detok")) {
            detok = true;
        } else if (!strcmp(a, "--batch")) {
            batch = true;
        } else {
            const char *v = has_val ? argv[i + 1] : NULL;
            fprintf(stderr, "dspec tokenize: unknown option, missing or bad value: '%s%s%s'\n\n",
                    a, v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
    }
    if (!model || (batch + (prompt != NULL) + (file != NULL)) != 1) {
        fprintf(stderr, "dspec tokenize: need -m and exactly one of -p, -f, --batch\n\n");
        usage(stderr);
        return 2;
    }
    // (each was once ignored: --detok printed text whatever --ids-only asked, --batch wrote
    // its JSON lines without timing or ids-only output)
    if (ids_only && (detok || batch)) {
        fprintf(stderr, "dspec tokenize: --ids-only does not go with %s\n",
                detok ? "--detok (it prints text, not ids)" : "--batch (it writes JSON lines)");
        return 2;
    }
    if (bench > 0 && batch) {
        fprintf(stderr, "dspec tokenize: --bench does not go with --batch (it times -p / -f)\n");
        return 2;
    }
    dspec_err err;
    ds_gguf *g = NULL;
    ds_tok *tok = NULL;
    if (ds_gguf_open(&g, model, &err) || ds_tok_load_gguf(&tok, g, &err)) {
        fprintf(stderr, "dspec tokenize: %s\n", err.msg);
        ds_gguf_close(g);
        return 1;
    }
    ds_gguf_close(g);
    int rc;
    if (batch) {
        rc = run_batch(tok, special, detok);
    } else if (prompt) {
        rc = run_one(tok, prompt, strlen(prompt), special, ids_only, detok, bench);
    } else {
        size_t len = 0;
        char *text = read_file(file, &len);
        rc = text ? run_one(tok, text, len, special, ids_only, detok, bench) : 1;
        free(text);
    }
    ds_tok_free(tok);
    return rc;
}
