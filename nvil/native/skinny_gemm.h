/* The products of NVIL's fused step at small batches (Mnih & Gregor 2014, Alg. 1 with the hand-derived gradients of
   nvil/learners/fused.py), where a general GEMM library loses half its speed to packing and blocking made for large
   matrices: an N x K minibatch times a K x M weight with N a few dozen. Included twice by sequential.c, with REAL
   (float, double), NAME(x) (x_f32, x_f64) and the SR_* vector macros of sparse_rows.h; nvil/native/skinny_gemm.py.

       skinny_gemm:  c[r, j] = init[r, j] + alpha sum_t a(r, t) b[t, j]     for the columns j0 <= j < j1
                     (init = bias[j] where init is NULL, 0 where both are; a(r, t) = a[r * a_row + t * a_inner])

   The decoder's forward product is logits = h wt + bias (a = h [N, K], wt [K, M] input-major); its SGD step is
   wt += alpha h' d, in place (init = c = wt, a(k, n) = h[n, k], b = d [N, M]). With AVX-512 each block of 4 rows
   and 6 registers of columns keeps its 24 sums in registers over the inner index (4 broadcasts and 6 loads for 24
   multiply-adds), the last partial register masked; elsewhere plain loops that the compiler vectorises. The sums
   run in index order, another order than a GEMM's: equal up to rounding (tests/test_native_gemm.py). */

#if defined(__AVX512F__)
#define SG_REGS 6

static inline __attribute__((always_inline)) void NAME(skinny_block)(
        const int R, int64_t r0, int64_t inner, int64_t cols, int64_t j, const SR_MASK *mk, const REAL *a,
        int64_t a_row, int64_t a_inner, REAL alpha, const REAL *b, const REAL *bias, const REAL *init, REAL *c) {
    SR_VEC acc[4][SG_REGS];
    for (int r = 0; r < R; r++)
        for (int q = 0; q < SG_REGS; q++)
            acc[r][q] = init ? SR_LOADZ(mk[q], init + (r0 + r) * cols + j + q * SR_LANES)
                      : bias ? SR_LOADZ(mk[q], bias + j + q * SR_LANES) : SR_SET1((REAL)0);
    for (int64_t t = 0; t < inner; t++) {
        SR_VEC s[4];
        for (int r = 0; r < R; r++) s[r] = SR_SET1(alpha * a[(r0 + r) * a_row + t * a_inner]);
        const REAL *bt = b + t * cols + j;
        for (int q = 0; q < SG_REGS; q++) {
            SR_VEC bq = SR_LOADZ(mk[q], bt + q * SR_LANES);
            for (int r = 0; r < R; r++) acc[r][q] = SR_FMA(s[r], bq, acc[r][q]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int q = 0; q < SG_REGS; q++) SR_STORE(c + (r0 + r) * cols + j + q * SR_LANES, mk[q], acc[r][q]);
}

void NAME(skinny_gemm)(int64_t rows, int64_t inner, int64_t cols, int64_t j0, int64_t j1, const REAL *a,
                       int64_t a_row, int64_t a_inner, REAL alpha, const REAL *b, const REAL *bias, const REAL *init,
                       REAL *c) {
    for (int64_t j = j0; j < j1; j += SG_REGS * SR_LANES) {
        SR_MASK mk[SG_REGS];
        for (int q = 0; q < SG_REGS; q++) {  /* full registers, then the partial one, then none */
            int64_t left = j1 - j - (int64_t)q * SR_LANES;
            mk[q] = NAME(lane_mask)(left);
        }
        int64_t r0 = 0;
        for (; r0 + 4 <= rows; r0 += 4)
            NAME(skinny_block)(4, r0, inner, cols, j, mk, a, a_row, a_inner, alpha, b, bias, init, c);
        for (; r0 < rows; r0++)
            NAME(skinny_block)(1, r0, inner, cols, j, mk, a, a_row, a_inner, alpha, b, bias, init, c);
    }
}
#undef SG_REGS

#else /* plain loops, vectorised by the compiler */

void NAME(skinny_gemm)(int64_t rows, int64_t inner, int64_t cols, int64_t j0, int64_t j1, const REAL *a,
                       int64_t a_row, int64_t a_inner, REAL alpha, const REAL *b, const REAL *bias, const REAL *init,
                       REAL *c) {
    for (int64_t r = 0; r < rows; r++) {
        REAL *cr = c + r * cols;
        const REAL *start = init ? init + r * cols : bias;
        _Pragma("omp simd")
        for (int64_t j = j0; j < j1; j++) cr[j] = start ? start[j] : (REAL)0;
        for (int64_t t = 0; t < inner; t++) {
            REAL s = alpha * a[r * a_row + t * a_inner];
            const REAL *bt = b + t * cols;
            _Pragma("omp simd")
            for (int64_t j = j0; j < j1; j++) cr[j] += s * bt[j];
        }
    }
}
#endif
