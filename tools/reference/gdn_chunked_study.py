#!/usr/bin/env python3
"""Numerical study: the gated delta rule over a prompt in chunks (WY form) against the row-by-row
recurrence, with the chunk's matrix products at f64, f32, tf32, f16, bf16 and split-tf32 precision.

Question it answered: which tensor-core precision the chunked prefill kernel for the DeltaNet
layers (src/backend/cuda/gated_delta_chunk.cu: tf32; split tf32 until session 41) can use and
stay close to the CPU's f32 recurrence (test_gated_delta_prefill).

The recurrence (per head; S is d_v x d_k, as gated_delta.cu and the CPU backend run it):
    a_t = exp(g_t);  u_t = beta_t (v_t - a_t S_{t-1} k_t);  S_t = a_t S_{t-1} + u_t k_t^T;
    o_t = S_t q_t
Chunked, with gamma_t = prod_{s<=t} a_s inside a chunk of C rows and S0 its incoming state:
    u_t = beta_t (v_t - gamma_t S0 k_t - sum_{s<t} (gamma_t / gamma_s) (k_t . k_s) u_s)
      =>  U = (I + diag(beta) A)^-1 diag(beta) (V - diag(gamma) K S0^T),
          A_ts = (gamma_t / gamma_s) k_t . k_s for s < t (strictly lower)
    O   = diag(gamma) Q S0^T + (M o (Q K^T)) U,    M_ts = gamma_t / gamma_s for s <= t
    S_C = gamma_C S0 + U^T diag(gamma_C / gamma) K
Every matrix product of those lines is a tensor-core candidate; the triangular solve is C x C.

Usage: python3 tools/reference/gdn_chunked_study.py [--rows 8192] [--chunk 32] [--seed 1]
(numpy only; ~10 s). Prints relative L2 errors of O and of the final state against the f64
recurrence: random keys with two gate regimes, and "learned" keys (48 directions the state keeps
meeting, values a fixed linear map of the key: the delta rule's correction v - S k is then a small
difference of large terms) with three, down to decays of ~1e-5 a row.
"""
import argparse

import numpy as np


def rnd_tf32(x):
    """Rounds float32 values to tf32 (10 explicit mantissa bits), nearest, ties away from zero
    (cvt.rna.tf32.f32, what the kernel runs)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x1000) & 0xFFFFE000
    return b.astype(np.uint32).view(np.float32)


def rnd_bf16(x):
    """Rounds float32 values to bf16 (7 explicit mantissa bits), nearest even."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def rnd_f16(x):
    """Rounds float32 values to IEEE half (10 explicit mantissa bits, 5 exponent bits), nearest
    even; a value past the half range raises (the kernel would compute an infinity)."""
    h = np.asarray(x, dtype=np.float32).astype(np.float16)
    if not np.all(np.isfinite(h)):
        raise OverflowError("an operand past the f16 range")
    return h.astype(np.float32)


def mm(a, b, mode):
    """a @ b as a tensor-core kernel would: inputs rounded per mode, f32 accumulation (emulated
    in f64, which only makes the accumulation more exact than the hardware's)."""
    if mode == "f64":
        return a @ b
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    if mode == "f32":
        return (a32.astype(np.float64) @ b32.astype(np.float64)).astype(np.float32)
    if mode in ("tf32", "bf16", "f16"):
        r = {"tf32": rnd_tf32, "bf16": rnd_bf16, "f16": rnd_f16}[mode]
        return (r(a32).astype(np.float64) @ r(b32).astype(np.float64)).astype(np.float32)
    if mode == "3xtf32":  # hi * hi + hi * lo + lo * hi
        ah, bh = rnd_tf32(a32), rnd_tf32(b32)
        al, bl = rnd_tf32(a32 - ah), rnd_tf32(b32 - bh)
        f = lambda x: x.astype(np.float64)
        return (f(ah) @ f(bh) + f(ah) @ f(bl) + f(al) @ f(bh)).astype(np.float32)
    raise ValueError(mode)


def recurrent(q, k, v, beta, g, s0):
    """The row-by-row recurrence in f64 (the reference)."""
    s = s0.astype(np.float64).copy()
    out = np.zeros((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        a = np.exp(g[t])
        u = beta[t] * (v[t] - a * (s @ k[t]))
        s = a * s + np.outer(u, k[t])
        out[t] = s @ q[t]
    return out, s


def chunked(q, k, v, beta, g, s0, c, mode):
    """The WY chunked form; products per mode, everything else in f32 (f64 for mode f64)."""
    ft = np.float64 if mode == "f64" else np.float32
    n = q.shape[0]
    s = s0.astype(ft).copy()
    out = np.zeros((n, v.shape[1]), dtype=ft)
    for c0 in range(0, n, c):
        Q, K, V = q[c0:c0 + c].astype(ft), k[c0:c0 + c].astype(ft), v[c0:c0 + c].astype(ft)
        B = beta[c0:c0 + c].astype(ft)
        G = np.cumsum(g[c0:c0 + c].astype(np.float64)).astype(ft)  # log gamma
        m = len(G)
        D = np.exp(G[:, None] - G[None, :]).astype(ft)  # gamma_t / gamma_s
        low = np.tril(np.ones((m, m), dtype=bool), -1)
        A = np.where(low, D * mm(K, K.T, mode), 0).astype(ft)
        rhs = (B[:, None] * (V - np.exp(G)[:, None].astype(ft) * mm(K, s.T, mode))).astype(ft)
        U = np.zeros_like(rhs)  # forward substitution of (I + diag(B) A) U = rhs
        for t in range(m):
            U[t] = rhs[t] - B[t] * (A[t, :t] @ U[:t]) if t else rhs[t]
        P = np.where(np.tril(np.ones((m, m), dtype=bool)), D * mm(Q, K.T, mode), 0).astype(ft)
        out[c0:c0 + c] = np.exp(G)[:, None].astype(ft) * mm(Q, s.T, mode) + mm(P, U, mode)
        w = np.exp(G[-1] - G).astype(ft)
        s = (np.exp(G[-1]).astype(ft) * s + mm(U.T, w[:, None] * K, mode)).astype(ft)
    return out, s


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def report(name, q, k, v, beta, g, s0, chunk):
    ro, rs = recurrent(q, k, v, beta, g, s0)
    print(f"{name}, {q.shape[0]} rows, chunks of {chunk}, d_k {k.shape[1]}, d_v {v.shape[1]}:")
    for mode in ("f64", "f32", "3xtf32", "tf32", "f16", "bf16"):
        co, cs = chunked(q, k, v, beta, g, s0, chunk, mode)
        print(f"  {mode:7s} out rel L2 {rel_l2(co, ro):.2e}   final state {rel_l2(cs, rs):.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n, dk, dv = args.rows, args.dk, args.dv
    q = rng.uniform(-1, 1, (n, dk))
    k = rng.uniform(-1, 1, (n, dk))
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)  # the kernels' q scale
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.uniform(-1, 1, (n, dv))
    beta = 0.5 + 0.5 * rng.uniform(0, 1, n)
    s0 = rng.uniform(-0.5, 0.5, (dv, dk))
    regimes = {  # the CUDA test's gates, and a long-memory head (A ~ 0.003)
        "random keys, g in [-0.6, -0.3]": -0.3 * (1 + rng.uniform(0, 1, n)),
        "random keys, g in [-0.004, -0.002]": -0.002 * (1 + rng.uniform(0, 1, n)),
    }
    for name, g in regimes.items():
        report(name, q, k, v, beta, g, s0, args.chunk)
    dirs = rng.normal(size=(48, dk))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    k = dirs[rng.integers(0, 48, n)] + 0.05 * rng.normal(size=(n, dk))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = k @ rng.normal(size=(dv, dk)).T + 0.01 * rng.normal(size=(n, dv))
    q = dirs[rng.integers(0, 48, n)] + 0.05 * rng.normal(size=(n, dk))
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)
    beta = 0.9 + 0.1 * rng.uniform(0, 1, n)
    for name, g in {"learned keys, g in [-0.6, -0.3]": -0.3 * (1 + rng.uniform(0, 1, n)),
                    "learned keys, g in [-0.004, -0.002]": -0.002 * (1 + rng.uniform(0, 1, n)),
                    "learned keys, g = -1e-5": np.full(n, -1e-5)}.items():
        report(name, q, k, v, beta, g, np.zeros((dv, dk)), args.chunk)


if __name__ == "__main__":
    main()
