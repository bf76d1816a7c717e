#!/usr/bin/env python3
"""test_quants.py: re-checks tests/fixtures/quant/ against the installed gguf-py.

The C test quant_fixture_test compares our quantizers and dequantizers bitwise with these files;
this test closes the loop by checking, with the gguf-py of the CI venv, that
  - gguf-py's quantize of input.f32 gives the committed bytes (f16, bf16, q8_0, q4_0),
  - gguf-py's dequantize of every committed .q file gives the committed .deq floats,
  - the committed Q8_0 activation bytes follow llama.cpp's x86 rule (d = amax/127 in fp16,
    q = round-half-even(x * 127/amax)).
So a fixture edited by hand, or a gguf-py that changed meaning, fails here.
Run: python tests/oracle/test_quants.py [--dspec BIN --build DIR] (both ignored: no C needed).
"""
import argparse
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures", "quant")
TYPES = {"f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_K": T.Q4_K,
         "q5_K": T.Q5_K, "q6_K": T.Q6_K, "iq4_nl": T.IQ4_NL, "iq4_xs": T.IQ4_XS}
GGUF_QUANTIZES = ("f16", "bf16", "q8_0", "q4_0")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def load(name, dtype):
    return np.fromfile(os.path.join(FIX, name), dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec")
    ap.add_argument("--build")
    ap.parse_args()
    x = load("input.f32", np.float32)
    check("input size", x.size == 4096, f"{x.size}")
    for name, qt in TYPES.items():
        q = load(f"{name}.q", np.uint8)
        if name in GGUF_QUANTIZES:
            mine = np.asarray(quants.quantize(x, qt)).view(np.uint8).reshape(-1)
            check(f"{name} quantize == fixture", np.array_equal(mine, q),
                  f"{int((mine != q).sum())} bytes differ")
        for stem in (name, f"{name}.rand"):
            if not os.path.exists(os.path.join(FIX, f"{stem}.q")):
                continue
            qq = load(f"{stem}.q", np.uint8)
            want = load(f"{stem}.deq", np.float32)
            got = np.asarray(quants.dequantize(qq, qt), np.float32).reshape(-1)
            same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
            check(f"{stem} dequantize == fixture", same)
    # Q8_0 activation rule, re-derived.
    act = load("q8_0act.q", np.uint8).reshape(-1, 34)
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = act[:, :2].copy().view(np.float16).reshape(-1)
    check("q8_0act scales", np.array_equal(d, (amax / np.float32(127)).astype(np.float16)))
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((b * idv[:, None]).astype(np.float32)).astype(np.int8)
    check("q8_0act values", np.array_equal(act[:, 2:].view(np.int8), q))
    # Q8_K (llama.cpp bytes): d * q reproduces the fixture's dequantization; bsums are sums of 16.
    q8k = load("q8_K.q", np.uint8).reshape(-1, 292)
    qs = q8k[:, 4:260].copy().view(np.int8).astype(np.int32)
    bs = q8k[:, 260:].copy().view(np.int16).astype(np.int32)
    check("q8_K bsums", np.array_equal(qs.reshape(-1, 16, 16).sum(axis=2), bs))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
