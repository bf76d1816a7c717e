#!/usr/bin/env python3
"""make_tokenizer_corpus.py: the tokenizer test corpus (tests/fixtures/tokenizer/corpus.jsonl).

A few thousand strings that stress a byte-level BPE with the Qwen pre-tokenizers: English prose,
code, JSON/HTML, CJK, Thai, Arabic, Devanagari, Cyrillic, emoji (ZWJ, flags, skin tones),
combining marks (NFC and decomposed), whitespace runs (spaces, tabs, CR/LF, NBSP, U+0085, U+2028),
digits, contractions in all cases, special-token text (whole, partial, nested, adjacent) and
control characters. Deterministic: fixed seed, hand-written pools, random code points drawn only
from characters assigned in Unicode 14.0 (the version of this Python's unicodedata and of PCRE2
10.42); then hand-picked letters, marks and digits of Unicode 15-18 in context (the
pre-tokenizer's classes extend PCRE2's by src/text/unicode_delta.h to match the reference).

Usage: make_tokenizer_corpus.py [OUT.jsonl]   (default: tests/fixtures/tokenizer/corpus.jsonl)
Each line is one JSON string. The test (tests/oracle/test_tokenizer.py) reads the committed file.
"""
import json
import random
import sys
import unicodedata
from pathlib import Path

SEED = 20260513
N_RANDOM = 3200

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you doing today?",
    "I'm sure they'll say it's fine, but we'd better check. You've been warned; don't worry.",
    "I'M SURE THEY'LL SAY IT'S FINE. WE'D, YOU'VE, DON'T, 'RE, 'Ll, 'lL, 'D, 'm",
    "Transformers are a type of neural network architecture.",
    "In 2026, speculative decoding reached 3.4x speed-ups on consumer GPUs.",
    "Price: $1,234.56 (approx. 1.2k USD) -- 50% off!!! ...really?",
    "e-mail: someone@example.com, URL: https://example.org/a/b?c=d&e=f#g",
    "Mr. O'Neil's dog's bone; the dogs' bones. rock 'n' roll",
    "She said, \u201cIt\u2019s over\u2014finally.\u201d \u2026 and left \u2013 quietly.",
]
CODE = [
    "def f(x):\n    return x * 2\n\n\nprint(f(21))\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const x = {a: 1, 'b': [2, 3], \"c\": null};  // comment\n",
    '{"name": "dspec", "version": "0.1.0", "tags": ["llm", "gguf"], "n": 12345}',
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "    if x:\n        pass\n    else:\n        raise ValueError('bad')\n",
    "x=1;y=2;z=x+y\r\nprint(z)\r\n",
    "fn main() { let v: Vec<u8> = vec![0xff, 0x10]; println!(\"{:?}\", v); }",
    "$ ls -la | grep '\\.py$' > out.txt && echo done",
    "a\u00a0b  c\t\td   \n\n\n  e",
]
MULTI = [
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u662f2026\u5e748\u670813\u65e5 \U0001f389",
    "\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u4e16\u754c\u3002",
    "\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e1c\u0e21\u0e0a\u0e37\u0e48\u0e2d\u0e2d\u0e40\u0e25\u0e47\u0e01\u0e0b\u0e4c",
    "\u0e01\u0e32\u0e23\u0e40\u0e23\u0e35\u0e22\u0e19\u0e23\u0e39\u0e49\u0e02\u0e2d\u0e07\u0e40\u0e04\u0e23\u0e37\u0e48\u0e2d\u0e07",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0627\u0644\u0633\u0651\u064e\u0644\u0627\u0645\u064f \u0639\u064e\u0644\u064e\u064a\u0652\u0643\u064f\u0645\u0652",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, \u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u, Vi\u1ec7t Nam",
]
EMOJI = [
    "\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family, \U0001f44d\U0001f3fd thumbs, \U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5 flags",
    "\u2764\ufe0f\u2764\u2b50\ufe0f\U0001f600\U0001f603\U0001f604",
]
COMBINING = [
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",          # decomposed (not NFC)
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9",                # composed
    "e\u0301\u0302\u0303\u0304 a\u030a o\u0308\u0304",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo",
    "\u0915\u093f \u0915\u0940 \u0915\u0941 \u0915\u094d\u0937",
    "\u1100\u1161\u11a8 \uac01",                            # Hangul jamo vs syllable
    "x\u20d7 \u2460\u2461 \u00bd \u2153 \u00b2\u00b3 \u2168",  # enclosing mark, other numbers
]
WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n", " \n", "\n ", "  \n  \n", "\t \t\t \t\n",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "a" + " " * 40 + "b", "x\u00a0\u00a0y", "p\u0085q", "l\u2028m\u2029n", "u\u3000v",
    "w\u200bx\ufeffy", "\u180e", " \u0085 ", "\r", "\r\r\n\n\r", " " * 300, "\t" * 17 + "z",
    "\x00\x01\x02\x1b[31m\x7f", "\x1c\x1d\x1e\x1f", "\x0b\x0c",
]
DIGITS = [
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3",
    "1234567890", "0.000001", "1e-10", "-42", "\u0661\u0662\u0663 \u096a\u096b \uff11\uff12",
    "v1.2.3-rc4", "2026-05-13T12:34:56Z", "+1 (555) 010-9999",
]
SPECIAL_TEXT = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\n{\"temp\": 21}\n</tool_response>",
    "<|im_start|><|im_start|>", "<|im_sta", "rt|>", "<|im_start", "<<|im_end|>>", "<think><think>x",
    "text<|endoftext|>more", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|box_start|>(1,2)<|box_end|>",
    "<tts_pad><tts_text_bos>", "<|audio_start|>x<|audio_end|>", "< think >", "<THINK>",
    "<|object_ref_start|>the dog<|object_ref_end|>", "<|repo_name|>a/b<|file_sep|>x.py",
    "<|im_start|>system\n# Tools\n<tools>{}</tools><|im_end|>",
]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE",
                "'VE", "'M", "'LL", "'D", "'x", "''", "'", "'\u017f", "'\u212a", "it's", "IT'S"]

# Unicode blocks to draw random code points from (each assigned in Unicode 14).
BLOCKS = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
          (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff),
          (0x1780, 0x17ff), (0x1e00, 0x1eff), (0x2000, 0x206f), (0x20a0, 0x20ff),
          (0x2100, 0x22ff), (0x2460, 0x24ff), (0x2500, 0x27bf), (0x3000, 0x30ff),
          (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xfe00, 0xfe0f), (0xff00, 0xffef),
          (0x1d400, 0x1d7ff), (0x1f300, 0x1faff), (0x20000, 0x2a6df)]


def _random_char(rng):
    while True:
        lo, hi = rng.choice(BLOCKS)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def _random_string(rng, pools):
    parts = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.55:
            parts.append(rng.choice(rng.choice(pools)))
        elif kind < 0.75:
            parts.append("".join(_random_char(rng) for _ in range(rng.randint(1, 12))))
        elif kind < 0.85:
            parts.append(rng.choice(WHITESPACE))
        elif kind < 0.92:
            parts.append(rng.choice(CONTRACTIONS))
        else:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
    text = "".join(rng.choice(["", " ", "\n", ""]) + p for p in parts)
    if rng.random() < 0.3 and len(text) > 4:  # cut at a random point (mid-word, mid-token text)
        text = text[: rng.randint(1, len(text) - 1)]
    return text


# Letters, marks and digits of Unicode 15-16 (PCRE2 10.42 has Unicode 14 tables; the
# pre-tokenizer adds these from src/text/unicode_delta.h), a few of Unicode 17-18 that the
# reference does not classify either, and their contexts: a contraction after them, '_X', digits,
# a space or punctuation before them, Latin around them.
NEWER_CHARS = [0x31350, 0x31351, 0x323AF, 0x2EBF0, 0x2EE5D, 0x11F04, 0x11F05, 0x11F00, 0x11F50,
               0x1E4D0, 0x1E4D1, 0x1E4EC, 0x1E4F0, 0x1D2C0, 0x1D2C1, 0x10D4A, 0x10D40, 0x13460,
               0x13C31, 0xA7CB, 0xA7CD, 0x1C89, 0x0CF3, 0x0897, 0x11380, 0x113B8, 0x11BC0,
               0x11BF0, 0x105C0, 0x16100, 0x16130, 0x16D40, 0x16D70, 0x1E5D0, 0x1E5F1, 0x0558,
               0x1ACF, 0x11DE0]


def newer_strings(seed):
    rng = random.Random(seed + 1)
    out = ["Kaktovik \U0001D2C0\U0001D2C1 2", "\U00031350's", "\U00013c31_X",
           "\U00031350\U00031351 abc"]
    for cp in NEWER_CHARS:
        c = chr(cp)
        out += [c, c + c + c, c + "'s", c + "_X", c + "123", " " + c + "x", "(" + c + ")",
                "a" + c + "b", "1" + c]
    for _ in range(64):
        out.append("".join(rng.choice([chr(rng.choice(NEWER_CHARS)), rng.choice(CONTRACTIONS),
                                       " ", "x", "7", ".", "\n", "\u4e00"])
                           for _ in range(rng.randint(2, 10))))
    return out


def make_corpus(seed=SEED, n_random=N_RANDOM):
    pools = [PROSE, CODE, MULTI, EMOJI, COMBINING, WHITESPACE, DIGITS, SPECIAL_TEXT]
    out = [s for pool in pools for s in pool] + CONTRACTIONS
    out += [unicodedata.normalize("NFD", s) for s in MULTI + COMBINING]
    out += [a + b for a in CONTRACTIONS[:8] for b in ("", " x", "abc", "\n")]
    rng = random.Random(seed)
    out += [_random_string(rng, pools) for _ in range(n_random)]
    out += newer_strings(seed)
    seen, uniq = set(), []
    for s in out:
        if s and s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def main():
    root = Path(__file__).resolve().parents[2]
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests/fixtures/tokenizer/corpus.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    with open(out, "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"{out}: {len(corpus)} strings, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
