#!/usr/bin/env python3
"""make_quant_fixtures.py: writes tests/fixtures/quant/, the oracle data of src/dtype/.

For each type it writes (raw little-endian binaries, no headers):
  input.f32           4096 test floats (8 segments of 512 with different distributions)
  <t>.q               the reference quantization of input.f32 to type <t>
  <t>.deq             gguf-py's dequantization of <t>.q (float32)
  <t>.rand.q          random blocks (random bytes, finite random scales)
  <t>.rand.deq        gguf-py's dequantization of <t>.rand.q
  q8_0act.q           input.f32 quantized like llama.cpp's x86 CPU backend quantizes Q8_0
                      activations (numpy re-statement: d = amax/127, q = rint(x*127/amax))

Who makes <t>.q: gguf-py's gguf.quants.quantize for f16, bf16, q8_0, q4_0; llama.cpp's reference
quantizers for q4_K, q5_K, q6_K, iq4_nl, iq4_xs, q8_K (gguf-py cannot quantize those). For the
latter, pass --ggml-src DIR (a ggml or llama.cpp/ggml checkout): the script compiles its
src/ggml-quants.c into a temporary shared library (with four stub symbols it does not use) and
calls quantize_row_{q4_K,q5_K,q6_K,q8_K}_ref and quantize_iq4_{nl,xs} (no importance matrix, as
llama-quantize runs them). Where both can quantize (q8_0, q4_0) the script checks they agree.
Without --ggml-src the llama.cpp-made files are left as they are.

Usage: /opt/refvenv/bin/python tools/reference/make_quant_fixtures.py [--ggml-src DIR] [--out DIR]
The C test src/dtype/quant_fixture_test.c and tests/oracle/test_quants.py read these files.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, quants

N = 4096
SEED = 20260901

# name -> (gguf type, who quantizes: 'gguf' or the ggml function name)
TYPES = {
    "f16": (T.F16, "gguf"),
    "bf16": (T.BF16, "gguf"),
    "q8_0": (T.Q8_0, "gguf"),
    "q4_0": (T.Q4_0, "gguf"),
    "q4_K": (T.Q4_K, "quantize_row_q4_K_ref"),
    "q5_K": (T.Q5_K, "quantize_row_q5_K_ref"),
    "q6_K": (T.Q6_K, "quantize_row_q6_K_ref"),
    "iq4_nl": (T.IQ4_NL, "quantize_iq4_nl"),
    "iq4_xs": (T.IQ4_XS, "quantize_iq4_xs"),
    "q8_K": (T.Q8_K, "quantize_row_q8_K_ref"),
}
GGML_REF_FOR_GGUF = {"q8_0": "quantize_row_q8_0_ref", "q4_0": "quantize_row_q4_0_ref"}

# Offsets of the fp16 scale fields in each block (set to finite values in the random blocks).
FP16_FIELDS = {"q8_0": [0], "q4_0": [0], "q4_K": [0, 2], "q5_K": [0, 2], "q6_K": [208],
               "iq4_nl": [0], "iq4_xs": [0]}

SHIM = r"""
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(int t, int64_t n) { (void)t; (void)n; abort(); }
const char *ggml_type_name(int t) { (void)t; return "?"; }
size_t ggml_type_size(int t) { (void)t; abort(); }
"""


def make_input(rng):
    seg = N // 8
    parts = [
        rng.standard_normal(seg),                          # N(0, 1)
        rng.standard_normal(seg) * 1e-3,                    # small
        rng.standard_normal(seg) * 300.0,                   # large
        rng.uniform(-1.0, 1.0, seg),                        # uniform
        rng.uniform(0.0, 2.0, seg),                         # one-signed (K-quant mins)
        rng.standard_t(2.0, seg),                           # heavy tails / outliers
        np.concatenate([np.zeros(64), np.full(64, 0.375), rng.standard_normal(seg - 128)]),
        rng.standard_normal(seg) * 1e-30,                   # tiny (scales underflow fp16)
    ]
    return np.concatenate(parts).astype(np.float32)


def build_ggml(src_dir, tmp):
    root = src_dir
    if not os.path.exists(os.path.join(root, "src", "ggml-quants.c")):
        root = os.path.join(src_dir, "ggml")
    inc = [os.path.join(root, "include"), os.path.join(root, "src")]
    shim = os.path.join(tmp, "shim.c")
    with open(shim, "w") as f:
        f.write(SHIM)
    lib = os.path.join(tmp, "libggmlquants.so")
    cmd = ["cc", "-O2", "-DNDEBUG", "-std=gnu11", "-fPIC", "-shared", "-o", lib,
           os.path.join(root, "src", "ggml-quants.c"), shim, "-lm"] + [f"-I{d}" for d in inc]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(lib)


def ggml_quantize(lib, fn, x, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    out = np.zeros(len(x) // block * size, np.uint8)
    P = ctypes.c_void_p
    f = getattr(lib, fn)
    if fn.startswith("quantize_row_"):
        f(x.ctypes.data_as(P), out.ctypes.data_as(P), ctypes.c_int64(len(x)))
    else:
        f(x.ctypes.data_as(P), out.ctypes.data_as(P), ctypes.c_int64(1), ctypes.c_int64(len(x)), None)
    if qtype == T.Q8_K:  # ggml leaves the bsums of an all-zero block unwritten: define them as 0
        blocks = out.reshape(-1, size)
        zero = blocks[:, :4].copy().view(np.float32)[:, 0] == 0
        blocks[zero, 4 + 256:] = 0
    return out


def random_blocks(rng, name, qtype, nblocks):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        scale = (rng.uniform(-2.0, 2.0, nblocks) * 10.0 ** rng.integers(-4, 2, nblocks))
        raw[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(-1)


def q8_0_act(x):
    """llama.cpp x86 CPU Q8_0 activation quantizer, re-stated in numpy."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((b * idv[:, None]).astype(np.float32)), -128, 127).astype(np.int8)
    out = np.zeros((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ggml-src", help="ggml source tree, for the K-quant / IQ4 reference bytes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                  "fixtures", "quant"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    x = make_input(rng)
    x.tofile(os.path.join(args.out, "input.f32"))
    q8_0_act(x).tofile(os.path.join(args.out, "q8_0act.q"))

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_ggml(args.ggml_src, tmp) if args.ggml_src else None
        for name, (qtype, who) in TYPES.items():
            path = os.path.join(args.out, name)
            if who == "gguf":
                q = np.asarray(quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
                if lib is not None and name in GGML_REF_FOR_GGUF:
                    g = ggml_quantize(lib, GGML_REF_FOR_GGUF[name], x, qtype)
                    if not np.array_equal(g, q):
                        sys.exit(f"{name}: gguf-py and ggml's reference quantizer disagree")
            elif lib is not None:
                q = ggml_quantize(lib, who, x, qtype)
            elif os.path.exists(path + ".q"):
                print(f"{name}: keeping {path}.q (no --ggml-src)")
                q = np.fromfile(path + ".q", np.uint8)
            else:
                sys.exit(f"{name}: needs --ggml-src")
            q.tofile(path + ".q")
            if qtype == T.Q8_K:  # gguf-py has no Q8_K: d * q
                blocks = q.reshape(-1, 292)
                d = blocks[:, :4].copy().view(np.float32)
                deq = (d * blocks[:, 4:260].copy().view(np.int8).astype(np.float32)).reshape(-1)
            else:
                deq = np.asarray(quants.dequantize(q, qtype), np.float32).reshape(-1)
            deq.tofile(path + ".deq")
            if name in FP16_FIELDS:
                block = GGML_QUANT_SIZES[qtype][0]
                r = random_blocks(rng, name, qtype, 2048 // block)
                r.tofile(path + ".rand.q")
                np.asarray(quants.dequantize(r, qtype), np.float32).reshape(-1).tofile(path + ".rand.deq")
            print(f"{name}: {len(q)} bytes ({who})")


if __name__ == "__main__":
    main()
