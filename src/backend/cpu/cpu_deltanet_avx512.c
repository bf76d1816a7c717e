// cpu_deltanet_avx512.c: the gated delta rule of a chain of rows (a prompt chunk, a verify chain)
// for one head in AVX-512, bit for bit cpu_deltanet.c's gdn_row applied row after row, which
// cpu_deltanet_test.c checks. Called by cpu_deltanet.c for chains (not trees) of at least
// DS_CPU_GDN_CHAIN_MIN rows when ds_cpu_max_level() >= 2, d_k is a multiple of 8 and d_v of 16.
// Only AVX-512F float operations (and AVX2 for the transposes): level 2 does not imply the VNNI
// or DQ instructions the file's build flags would allow.
//
// Why: gdn_row's AVX2 form puts 8 value rows of the state in the lanes and transposes 8 x 8
// blocks twice per row (its dot products run along the key index, in the scalar order); in a
// prompt it was ~7.7 us per (head, row) on the 0.8B shapes, a quarter of the prefill. Here the
// state is transposed once per call into key-major order (St[i][j] = S[j][i]), so that 16 value
// columns are one vector at every key index and both dot products are vertical adds in key order;
// and the chain runs column block by column block (at most 64 columns: 32 KB of a 128-key state),
// every row of the chain over one block before the next, so the block stays in L1 across the
// rows. Per element the scalar operations in the scalar order: r = S * decay, u += r * k,
// delta = beta * (v - u), S' = r + k * delta, o += S' * q (r is recomputed in the second pass
// instead of stored: the same bits).
//   bytes: the state once per call (dk * dv * 4, in and out) + n * (2 dk + dv) * 4
//   flops: n * dk * dv * 7
#include "backend/cpu/cpu_x86.h"

// G vectors (16 G value columns from j0) of every row of the chain.
static inline __attribute__((always_inline)) void chain_block(const int G, float *St,
                                                              const ds_cpu_gdn_chain *c,
                                                              int64_t j0) {
    const int64_t dk = c->dk, dv = c->dv;
    for (int64_t t = 0; t < c->n; t++) {
        const float *q = c->q + t * dk, *k = c->k + t * dk;
        const __m512 dec = _mm512_set1_ps(c->decay[t]);
        __m512 u[4], delta[4], acc[4];
        for (int g = 0; g < G; g++) {
            u[g] = _mm512_setzero_ps();
        }
        for (int64_t i = 0; i < dk; i++) { // u += (S * decay) . k
            const float *row = St + i * dv + j0;
            const __m512 ki = _mm512_set1_ps(k[i]);
            for (int g = 0; g < G; g++) {
                const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * g), dec);
                u[g] = _mm512_add_ps(u[g], _mm512_mul_ps(r, ki));
            }
        }
        const float *v = c->v + t * c->v_stride + j0;
        const __m512 beta = _mm512_set1_ps(c->beta[t]);
        for (int g = 0; g < G; g++) { // delta = beta * (v - u)
            delta[g] = _mm512_mul_ps(beta, _mm512_sub_ps(_mm512_loadu_ps(v + 16 * g), u[g]));
            acc[g] = _mm512_setzero_ps();
        }
        for (int64_t i = 0; i < dk; i++) { // S = S * decay + k * delta; o += S . q
            float *row = St + i * dv + j0;
            const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
            for (int g = 0; g < G; g++) {
                const __m512 r = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(row + 16 * g), dec),
                                               _mm512_mul_ps(ki, delta[g]));
                _mm512_storeu_ps(row + 16 * g, r);
                acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(r, qi));
            }
        }
        float *o = c->out + t * c->out_stride + j0;
        for (int g = 0; g < G; g++) {
            _mm512_storeu_ps(o + 16 * g, acc[g]);
        }
    }
}

void ds_cpu_gdn_chain_avx512(const ds_cpu_gdn_chain *c) {
    DS_ASSERT(c->dk % 8 == 0 && c->dv % 16 == 0);
    ds_transpose_groups(c->s_in, c->dv, c->dk, c->dv, c->st); // (S: dv rows of dk -> St)
    int64_t j0 = 0;
    for (; j0 + 64 <= c->dv; j0 += 64) {
        chain_block(4, c->st, c, j0);
    }
    for (; j0 < c->dv; j0 += 16) {
        chain_block(1, c->st, c, j0);
    }
    if (c->s_out) {
        ds_transpose_groups(c->st, c->dk, c->dv, c->dk, c->s_out);
    }
}
