"""tm_text.py: corpus loading, BPE tokenizer training/export and tokenization for the tiny-model
pipeline (tools/tinymodel/pipeline.py). Needs only `tokenizers` and numpy (no torch).

Tokenizer: byte-level BPE trained with HF `tokenizers` on a sample of the training split, with the
Qwen3.5 normalizer (NFC), pre-tokenizer (Split on the qwen35 regex, then ByteLevel without its own
regex) and decoder. The Qwen3.5 added tokens (+ <|MASK|>) follow the BPE ids, as in Qwen. Files:
tokenizer.json, tokenizer_config.json (with CHAT_TEMPLATE), both loadable by transformers and by
`dspec convert`.

Token data (data stage), per domain d in code / prose / chat and split s in train / heldout:
  {d}.{s}.npy      uint16 token stream; every document is followed by <|endoftext|>
  chat.{s}.starts.npy  int64 offsets of the first answer token of every conversation (the token
                   after the generation prompt); prompts and answers are tokenized separately,
                   as the engine does at inference
  eval_prompts.json  {domain: [[ids], ...]} spec-decoding prompts from held-out documents: the
                   first eval_prompt_len tokens of code / prose documents, the rendered
                   system+user turns with the (non-thinking) generation prompt for chat
"""
from __future__ import annotations

import json
import lzma
import os
import random

import numpy as np

import tm_common as C

DOMAINS = ("code", "prose", "chat")


def load_rows(data_dir: str, domain: str, split: str) -> list[dict]:
    path = os.path.join(data_dir, f"{domain}.{split}.jsonl.xz")
    if not os.path.exists(path):
        raise SystemExit(f"missing corpus file {path} (make it with tools/tinymodel/make_corpus.py)")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def chat_parts(messages: list[dict]) -> tuple[str, str]:
    """(prompt text up to and including the non-thinking generation prompt, answer + <|im_end|>\\n).
    prompt + answer == render_chat(messages) for a conversation that ends with one assistant
    turn."""
    prompt = C.render_chat(messages[:-1], add_generation_prompt=True, enable_thinking=False)
    full = C.render_chat(messages)
    if not full.startswith(prompt):
        raise ValueError("chat rendering: prompt is not a prefix of the conversation")
    return prompt, full[len(prompt):]


def doc_texts(rows: list[dict], domain: str) -> list[str]:
    if domain == "chat":
        return [C.render_chat(r["messages"]) for r in rows]
    return [r["text"] for r in rows]


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

def train_tokenizer(data_dir: str, out_dir: str, vocab_size: int, sample_bytes: int, seed: int) -> dict:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    rng = random.Random(seed)
    texts = []
    for d in DOMAINS:
        rows = load_rows(data_dir, d, "train")
        rng.shuffle(rows)
        budget = sample_bytes * (0.2 if d == "chat" else 0.4)
        n = 0
        for t in doc_texts(rows, d):
            if n >= budget:
                break
            # the chat markup's special tokens are added tokens, never merged: drop them here
            for sp, _ in C.ADDED_TOKENS:
                t = t.replace(sp, "\n")
            texts.append(t)
            n += len(t.encode())
    rng.shuffle(texts)
    n_bpe = vocab_size - len(C.ADDED_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(C.RE_QWEN35), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer, length=len(texts))
    tj = json.loads(tok.to_str())
    base = len(tj["model"]["vocab"])
    if base > n_bpe:
        raise RuntimeError(f"BPE trainer returned {base} tokens, asked for {n_bpe}")
    added = [{"id": base + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": sp} for i, (t, sp) in enumerate(C.ADDED_TOKENS)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj["added_tokens"] = added
    tj["normalizer"] = {"type": "NFC"}
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": C.RE_QWEN35}, "behavior": "Isolated", "invert": False}, bl]}
    tj["post_processor"] = bl
    tj["decoder"] = bl
    m = tj["model"]
    m.update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": C.IM_END,
          "pad_token": C.EOT, "mask_token": C.MASK, "unk_token": None, "errors": "replace",
          "model_max_length": 4096, "clean_up_tokenization_spaces": False, "split_special_tokens": False,
          "tokenizer_class": "Qwen2Tokenizer", "chat_template": C.CHAT_TEMPLATE,
          "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return {"bpe_tokens": base, "added": len(added), "vocab_used": base + len(added),
            "train_docs": len(texts), "train_bytes": sum(len(t.encode()) for t in texts)}


def load_tokenizer(tok_dir: str):
    """-> (tokenizers.Tokenizer, {special text: id})"""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    special = {t: tok.token_to_id(t) for t, _ in C.ADDED_TOKENS}
    if any(v is None for v in special.values()):
        raise SystemExit(f"{tok_dir}/tokenizer.json lacks some Qwen3.5 added tokens")
    return tok, special


def token_bytes(tok, vocab_size: int) -> np.ndarray:
    """UTF-8 byte length of every token id (added tokens: their text), for bits-per-byte. A
    byte-level BPE token spells one character per byte."""
    out = np.zeros(vocab_size, dtype=np.int64)
    added = {a for a, _ in C.ADDED_TOKENS}
    for i in range(min(vocab_size, tok.get_vocab_size())):
        t = tok.id_to_token(i)
        if t is not None:
            out[i] = len(t.encode()) if t in added else len(t)
    return out


# ---------------------------------------------------------------------------------------------
# Token data
# ---------------------------------------------------------------------------------------------

def _encode_all(tok, texts: list[str]) -> list[list[int]]:
    out = []
    step = 2048
    for i in range(0, len(texts), step):
        out += [e.ids for e in tok.encode_batch(texts[i:i + step], add_special_tokens=False)]
    return out


def build_token_data(data_dir: str, tok_dir: str, out_dir: str, sizes: C.Sizes, seed: int) -> dict:
    tok, special = load_tokenizer(tok_dir)
    eot = special[C.EOT]
    os.makedirs(out_dir, exist_ok=True)
    summary = {}
    rng = random.Random(seed)
    prompts = {}
    for d in DOMAINS:
        for split in ("train", "heldout"):
            rows = load_rows(data_dir, d, split)
            nbytes = 0
            if d == "chat":
                parts = [chat_parts(r["messages"]) for r in rows]
                enc_p = _encode_all(tok, [p for p, _ in parts])
                enc_a = _encode_all(tok, [a for _, a in parts])
                stream, starts = [], []
                for ip, ia in zip(enc_p, enc_a):
                    stream += ip
                    starts.append(len(stream))
                    stream += ia
                    stream.append(eot)
                nbytes = sum(len(p.encode()) + len(a.encode()) for p, a in parts)
                np.save(os.path.join(out_dir, f"chat.{split}.starts.npy"), np.asarray(starts, dtype=np.int64))
                if split == "heldout":
                    idx = list(range(len(rows)))
                    rng.shuffle(idx)
                    prompts[d] = [enc_p[i] for i in idx if len(enc_p[i]) <= sizes.chat_prompt_max
                                  ][:sizes.eval_prompts]
            else:
                texts = [r["text"] for r in rows]
                enc = _encode_all(tok, texts)
                stream = []
                for ids in enc:
                    stream += ids
                    stream.append(eot)
                nbytes = sum(len(t.encode()) for t in texts)
                if split == "heldout":
                    idx = list(range(len(rows)))
                    rng.shuffle(idx)
                    prompts[d] = [enc[i][:sizes.eval_prompt_len] for i in idx
                                  if len(enc[i]) >= sizes.eval_prompt_len + 8][:sizes.eval_prompts]
            arr = np.asarray(stream, dtype=np.uint16)
            if arr.size and int(arr.max()) >= sizes.vocab_size:
                raise RuntimeError("token id outside the vocabulary")
            np.save(os.path.join(out_dir, f"{d}.{split}.npy"), arr)
            summary[f"{d}.{split}"] = {"docs": len(rows), "tokens": int(arr.size), "bytes": nbytes,
                                       "bytes_per_token": round(nbytes / max(1, arr.size), 3)}
    for d in DOMAINS:
        if len(prompts.get(d, [])) < sizes.eval_prompts:
            raise RuntimeError(f"only {len(prompts.get(d, []))} held-out {d} prompts, need {sizes.eval_prompts}")
    with open(os.path.join(out_dir, "eval_prompts.json"), "w") as f:
        json.dump(prompts, f)
    return summary
