// text.h: the text layer: byte-level BPE tokenizer (Qwen3.5 `qwen35` and Qwen2/3 `qwen2`
// pre-tokenizers), streaming detokenizer and UTF-8 helpers. (Chat templates: chat.h.)
// Calls core/, gguf/ (vocab keys), PCRE2 (pre-tokenizer regex). Called by engine/, server/, cli/.
// Spec: target-qwen35.md §4, performance-and-ecosystem.md B3 (test vectors).
//
// Usage:
//     ds_tok *tok;
//     if (ds_tok_load_gguf(&tok, g, &err)) return err.code;     // g: an open ds_gguf
//     int32_t *ids = malloc(len * sizeof *ids);                  // n_ids <= len, always
//     int64_t n;
//     ds_tok_encode(tok, text, len, true, ids, len, &n, &err);   // true: parse <|im_start|> etc.
//     ds_tok_stream *s; ds_tok_stream_new(&s, tok, false, &err);
//     for (...) { ds_str out; ds_tok_stream_push(s, id, &out); fwrite(out.ptr, 1, out.len, f); }
//     ds_tok_stream_free(s); ds_tok_free(tok);
//
// Rules: a ds_tok is immutable after creation and may be shared by threads (encode allocates its
// own scratch). A ds_tok_stream belongs to one thread. Vocabulary data is validated once when
// the tokenizer is built; bad data gives DSPEC_ERR_FORMAT naming the key and index. Any byte
// string encodes (invalid UTF-8 included) and decodes back to the same bytes.
//
// Behaviour matches llama.cpp's `llama_tokenize` on the same GGUF (LLAMA_VOCAB_TYPE_BPE):
//   * special-token partitioning first: all CONTROL/USER_DEFINED/UNKNOWN tokens, longest text
//     first (ties: lower id first); CONTROL/UNKNOWN only when parse_special, USER_DEFINED
//     (`<think>`, `<tool_call>`, ...) always;
//   * each remaining fragment is split by the pre-tokenizer regex (PCRE2, UTF+UCP, JIT), mapped
//     to GPT-2 byte-level symbols and merged by merge rank (lowest first, leftmost on ties);
//   * no Unicode normalization: HF tokenizer.json for Qwen declares an NFC normalizer, but
//     llama.cpp's BPE path applies none, and neither do we. Callers wanting HF parity on non-NFC
//     input must normalize first.
//   * Differences from llama.cpp, on invalid UTF-8 only: llama.cpp turns each invalid byte into
//     U+FFFD (bytes are lost); we keep each maximal run of invalid bytes as its own pre-token
//     and byte-encode it, so decode(encode(s)) == s for every byte string.
#pragma once

#include "core/core.h"
#include "gguf/gguf.h"

// Token types as written in `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
typedef enum ds_tok_type {
    DS_TOK_TYPE_UNDEFINED = 0,
    DS_TOK_TYPE_NORMAL = 1,
    DS_TOK_TYPE_UNKNOWN = 2,
    DS_TOK_TYPE_CONTROL = 3,
    DS_TOK_TYPE_USER_DEFINED = 4,
    DS_TOK_TYPE_UNUSED = 5,
    DS_TOK_TYPE_BYTE = 6,
} ds_tok_type;

// Pre-tokenizers (`tokenizer.ggml.pre`).
typedef enum ds_tok_pre {
    DS_TOK_PRE_QWEN35 = 0, // "qwen35": letter runs absorb combining marks \p{M}
    DS_TOK_PRE_QWEN2 = 1,  // "qwen2": Qwen2/2.5/3 vocabularies
} ds_tok_pre;

typedef struct ds_tok ds_tok;

// Well-known token ids, -1 when absent. eos/bos/pad come from the GGUF keys; the rest are found
// by their text (llama.cpp does the same for EOT and FIM tokens).
typedef struct ds_tok_special {
    int32_t bos, eos, pad, unk;
    int32_t eot;                        // <|im_end|> (end of turn)
    int32_t im_start;                   // <|im_start|>
    int32_t endoftext;                  // <|endoftext|>
    int32_t think, think_end;           // <think>, </think>
    int32_t tool_call, tool_call_end;   // <tool_call>, </tool_call>
    int32_t tool_resp, tool_resp_end;   // <tool_response>, </tool_response>
    int32_t fim_pre, fim_mid, fim_suf, fim_pad, fim_rep, fim_sep;
    bool add_bos;                       // tokenizer.ggml.add_bos_token (false for Qwen)
} ds_tok_special;

// ---- construction ------------------------------------------------------------------------------

// Builds a tokenizer from an open GGUF: `tokenizer.ggml.model` must be "gpt2" and
// `tokenizer.ggml.pre` "qwen35" or "qwen2" (others: DSPEC_ERR_UNSUPPORTED naming it); reads
// tokens, token_type (optional, default NORMAL), merges, bos/eos/padding/unknown ids and
// add_bos_token. Copies what it needs: the ds_gguf may be closed afterwards.
dspec_status ds_tok_load_gguf(ds_tok **out, const ds_gguf *g, dspec_err *err);

// An in-memory vocabulary, laid out as the GGUF keys are (for tests and converters).
typedef struct ds_tok_vocab_desc {
    int64_t n_tokens;
    const ds_str *tokens;  // [n_tokens] token text as stored (byte-level encoded for NORMAL)
    const int32_t *types;  // [n_tokens] ds_tok_type values, or NULL for all NORMAL
    int64_t n_merges;
    const ds_str *merges;  // [n_merges] "left right", rank = index
    ds_tok_pre pre;
    int32_t bos_id, eos_id, pad_id, unk_id; // -1 = none
    bool add_bos;
} ds_tok_vocab_desc;

// Builds a tokenizer from a description; copies everything. Fails with DSPEC_ERR_FORMAT on:
// empty or duplicate token text, a type out of range, a malformed merge, a merge whose parts or
// result are not tokens, a byte (0..255) with no single-byte token, or a special id out of range.
dspec_status ds_tok_new(ds_tok **out, const ds_tok_vocab_desc *desc, dspec_err *err);

void ds_tok_free(ds_tok *tok);

// ---- queries -----------------------------------------------------------------------------------

int64_t ds_tok_n_tokens(const ds_tok *tok);
ds_tok_pre ds_tok_pre_type(const ds_tok *tok);
const ds_tok_special *ds_tok_specials(const ds_tok *tok);
// Type of a token; DS_TOK_TYPE_UNDEFINED when id is out of range.
ds_tok_type ds_tok_token_type(const ds_tok *tok, int32_t id);
// Token text as stored in the vocabulary (byte-level encoded for NORMAL tokens: " the" is "Ġthe").
// View valid until ds_tok_free; empty when id is out of range.
ds_str ds_tok_token_text(const ds_tok *tok, int32_t id);
// The bytes a token decodes to (llama.cpp token_to_piece): NORMAL tokens byte-decoded,
// USER_DEFINED as their text, CONTROL/UNKNOWN as their text only when `special`, UNUSED and
// out-of-range ids empty. View valid until ds_tok_free.
ds_str ds_tok_piece(const ds_tok *tok, int32_t id, bool special);
// Id of the token whose stored text is exactly `text`, or -1.
int32_t ds_tok_find(const ds_tok *tok, const char *text, size_t len);
// End of generation: eos, eot, <|endoftext|> and the FIM pad/repo/file-separator tokens.
bool ds_tok_is_eog(const ds_tok *tok, int32_t id);
// Longest ds_tok_piece in bytes (sizes decode buffers).
size_t ds_tok_max_piece_len(const ds_tok *tok);

// ---- encode / decode ---------------------------------------------------------------------------

// Tokenizes text[0..len) (any bytes) into ids[0..*n_out). At most `len` ids are produced, so
// cap >= len always suffices. No BOS is added (callers check specials->add_bos). If cap is too
// small: DSPEC_ERR_INVALID, *n_out = the count needed, ids[0..cap) filled with a prefix.
// Thread-safe. DSPEC_ERR_NOMEM when scratch allocation fails.
dspec_status ds_tok_encode(const ds_tok *tok, const char *text, size_t len, bool parse_special,
                           int32_t *ids, int64_t cap, int64_t *n_out, dspec_err *err);

// As ds_tok_encode, but allocates *ids (free() it; NULL when *n_out is 0).
dspec_status ds_tok_encode_alloc(const ds_tok *tok, const char *text, size_t len,
                                 bool parse_special, int32_t **ids, int64_t *n_out,
                                 dspec_err *err);

// As ds_tok_encode_alloc with parse_special, except that CONTROL / UNKNOWN tokens are parsed
// only where their text starts at one of the byte offsets ctl_at[0..n_ctl) (ascending; NULL =
// none): elsewhere their text is tokenized as text (HF's split_special_tokens for that stretch).
// USER_DEFINED tokens are parsed everywhere. For a chat rendering with ds_chat_tags: the
// template's turn markers are control tokens, the same text inside a message is not.
dspec_status ds_tok_encode_tagged(const ds_tok *tok, const char *text, size_t len,
                                  const int64_t *ctl_at, int64_t n_ctl, int32_t **ids,
                                  int64_t *n_out, dspec_err *err);

// Concatenates ds_tok_piece(id, special) of ids[0..n) into out[0..cap) (raw bytes, not
// NUL-terminated); *n_out gets the byte count. Too-small cap: DSPEC_ERR_INVALID with *n_out set
// to the bytes needed. Ids out of range: DSPEC_ERR_INVALID naming the index.
dspec_status ds_tok_decode(const ds_tok *tok, const int32_t *ids, int64_t n, bool special,
                           char *out, size_t cap, size_t *n_out, dspec_err *err);

// ---- streaming detokenizer ---------------------------------------------------------------------
//
// Turns generated ids into text as they come. Emits only complete, valid UTF-8: bytes of a
// character split across tokens are held until the character is complete; bytes that cannot
// start or continue a valid sequence are replaced by U+FFFD (one per maximal ill-formed subpart,
// as Python's bytes.decode(errors="replace") does). Concatenated output of push + flush equals
// that decode of the concatenated pieces.

typedef struct ds_tok_stream ds_tok_stream;

// `special`: render CONTROL tokens (<|im_end|>) as text (see ds_tok_piece).
dspec_status ds_tok_stream_new(ds_tok_stream **out, const ds_tok *tok, bool special,
                               dspec_err *err);
void ds_tok_stream_free(ds_tok_stream *s);
// Appends one token; *out views the newly completed text (possibly empty), valid until the next
// call on s. An out-of-range id: DSPEC_ERR_INVALID, nothing emitted.
dspec_status ds_tok_stream_push(ds_tok_stream *s, int32_t id, ds_str *out, dspec_err *err);
// Ends the stream: an unfinished sequence at the end becomes U+FFFD. *out valid until the next
// call. The stream is then empty and may be reused.
void ds_tok_stream_flush(ds_tok_stream *s, ds_str *out);
// Drops held bytes without emitting them.
void ds_tok_stream_reset(ds_tok_stream *s);

// ---- UTF-8 helpers -----------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence at s[0..n) (1..4; strict: no overlongs, surrogates or
// code points > U+10FFFF), or 0 when s starts with an ill-formed sequence. If the bytes so far
// are a valid but truncated prefix (n too short), returns -(bytes present).
int ds_utf8_seq_len(const uint8_t *s, size_t n);
// For s[0..n) starting with an ill-formed sequence (ds_utf8_seq_len == 0): the length of its
// maximal ill-formed subpart (>= 1), the bytes one U+FFFD replaces (Unicode §3.9, "U+FFFD
// substitution of maximal subparts").
int ds_utf8_bad_len(const uint8_t *s, size_t n);
// Number of leading bytes of s[0..n) that form valid UTF-8 (stops at the first ill-formed or
// truncated sequence).
size_t ds_utf8_valid_prefix(const uint8_t *s, size_t n);
// Decodes the well-formed sequence at s (ds_utf8_seq_len(s, n) > 0 required).
uint32_t ds_utf8_decode(const uint8_t *s, int seq_len);
// Encodes code point cp (<= 0x10FFFF) into out[0..4); returns the length.
int ds_utf8_encode(uint32_t cp, uint8_t out[4]);
