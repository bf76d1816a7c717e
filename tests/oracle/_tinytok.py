"""Small deterministic byte-level BPE tokenizer with the Qwen chat special tokens, written as an
HF tokenizer.json (+ tokenizer_config.json) next to a fixture checkpoint so that `dspec convert`
embeds it in the GGUF. Shared by the oracle tests (test_run.py, test_server.py)."""
import json
import os

QWEN35_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
                r"[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def byte_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_tokenizer(d, vocab_size):
    bu = byte_unicode()
    vocab = {bu[b]: i for i, b in enumerate(sorted(bu))}
    merges = []
    words = ["def", "return", "self", "import", "the", "and", "print", "hello", "world", "for",
             "in", "if", "else", "class", "value", "data", "list", "name"]
    n_added = len(SPECIALS) + len(USER_DEFINED)
    for w in words:  # left-to-right merges building each word with and without a leading space
        for prefix in ("", bu[ord(" ")]):
            cur = prefix + w[0] if prefix else w[0]
            for ch in (w[1:] if prefix else w[1:]):
                pair = (cur, ch)
                if (cur + ch) not in vocab and len(vocab) < vocab_size - n_added:
                    if cur not in vocab:
                        merges.append((prefix, w[0]))
                        vocab[cur] = len(vocab)
                    merges.append(pair)
                    vocab[cur + ch] = len(vocab)
                cur = cur + ch
    added = []
    for i, t in enumerate(SPECIALS + USER_DEFINED):
        added.append({"id": vocab_size - n_added + i, "content": t, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False,
                      "special": t in SPECIALS})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"), ensure_ascii=False)
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
               "model_max_length": 1024}, open(os.path.join(d, "tokenizer_config.json"), "w"))
