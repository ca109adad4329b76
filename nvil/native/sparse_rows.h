/* An affine layer whose input is centred sparse data, v = x - m with x mostly zero (binarised MNIST: ~13% of the
   pixels on), as the first layer of NVIL's inference network and of its input-dependent baselines sees it (Mnih &
   Gregor 2014, Sec. 4: "centering the input vectors"). Included twice by sequential.c, with REAL (float, double) and
   NAME(x) (x_f32, x_f64); nvil/native/sparse_rows.py: centred_linear, centred_update_.

   The weight is stored input-major, wt [D, H] = W' (row j: the weights out of input j; nvil.ops.input_major_), so
   the rows of the inputs that are on are contiguous:

       centred_linear:  out[n, :] = base + sum_{j : x_nj != 0} x_nj wt[j, :],   base = b - m wt   (= v W' + b)
       centred_update:  wt[j, :] += alpha (sum_{n : x_nj != 0} x_nj d[n, :] - m_j dsum),   dsum = sum_n d[n, :]
                                                                                (= wt + alpha v' d, one pass over wt)

   with x_nj = v_nj + m_j, exactly 0 where x_nj = 0 (-m + m = 0 in floating point). A dense GEMM does N D H
   multiply-adds; these do (nonzeros of x) H and one pass over wt, each row read once per example that has it on
   (centred_linear) or once in all (centred_update). With AVX-512 the H outputs of a row are taken 8 registers at a
   time, their sums held in registers over the row's inputs (masked loads for the last partial register); elsewhere
   plain loops that the compiler vectorises. The sums come in another order than a GEMM's: equal up to rounding
   (tests/test_native_sparse.py, float64 and float32). */

#include <stdlib.h>
#if defined(__AVX512F__)
#include <immintrin.h>

/* The lanes of a register starting `left` elements before the end of a row: all of them, the first `left`, or none
   (also used by skinny_gemm.h). */
static inline SR_MASK NAME(lane_mask)(int64_t left) {
    return left >= SR_LANES ? (SR_MASK)~(SR_MASK)0 : left > 0 ? (SR_MASK)((1u << left) - 1) : (SR_MASK)0;
}
#endif

/* The inputs j of row n of x = v + m that are nonzero, into idx; returns how many. With AVX-512 sixteen (eight)
   inputs per compare, then one step per nonzero: a scalar scan's count carried from input to input cost ~3 cycles an
   input, as much as the products it selects. */
static int64_t NAME(row_nonzeros)(const REAL *vn, const REAL *m, int64_t D, int32_t *idx) {
    int64_t c = 0;
#if defined(__AVX512F__)
    for (int64_t j0 = 0; j0 < D; j0 += SR_LANES) {
        int64_t left = D - j0;
        SR_MASK mk = NAME(lane_mask)(left);
        uint32_t on = SR_NONZERO(mk, SR_ADD(SR_LOADZ(mk, vn + j0), SR_LOADZ(mk, m + j0)));
        for (; on; on &= on - 1) idx[c++] = (int32_t)(j0 + __builtin_ctz(on));
    }
#else
    for (int64_t j = 0; j < D; j++) {
        idx[c] = (int32_t)j;
        c += (vn[j] + m[j] != (REAL)0);
    }
#endif
    return c;
}

/* For each input j0 <= j < j1, the examples n with x_nj = v_nj + m_j nonzero, in order, and alpha x_nj:
   ex[(j - j0) * N + t] and scale[(j - j0) * N + t] for t < count[j - j0]. One pass over the rows of v (each row's
   nonzeros as row_nonzeros finds them). */
static void NAME(column_lists)(const REAL *v, const REAL *m, int64_t N, int64_t D, int64_t j0, int64_t j1,
                               REAL alpha, int32_t *row, int32_t *ex, REAL *scale, int64_t *count) {
    for (int64_t j = j0; j < j1; j++) count[j - j0] = 0;
    for (int64_t n = 0; n < N; n++) {
        const REAL *vn = v + n * D + j0;
        int64_t c = NAME(row_nonzeros)(vn, m + j0, j1 - j0, row);
        for (int64_t t = 0; t < c; t++) {
            int64_t at = row[t] * N + count[row[t]]++;
            ex[at] = (int32_t)n;
            scale[at] = alpha * (vn[row[t]] + m[j0 + row[t]]);
        }
    }
}

/* out[:H] = first + second_scale second + sum_t scale[t] rows[which[t] * H], the one operation of both kernels:
   first, second and the rows [H] (second may be NULL); out may be first (updated in place). */
#if defined(__AVX512F__)
#define SR_REGS 8

static void NAME(combine)(int64_t H, const REAL *first, const REAL *second, REAL second_scale, int64_t c,
                          const REAL *rows, const int32_t *which, const REAL *scale, REAL *out) {
    for (int64_t k0 = 0; k0 < H; k0 += SR_REGS * SR_LANES) {
        SR_MASK mk[SR_REGS];
        SR_VEC acc[SR_REGS];
        for (int q = 0; q < SR_REGS; q++) {  /* full registers, then the partial one, then none */
            int64_t left = H - k0 - (int64_t)q * SR_LANES;
            mk[q] = NAME(lane_mask)(left);
            acc[q] = SR_LOADZ(mk[q], first + k0 + q * SR_LANES);
            if (second) acc[q] = SR_FMA(SR_SET1(second_scale), SR_LOADZ(mk[q], second + k0 + q * SR_LANES), acc[q]);
        }
        for (int64_t t = 0; t < c; t++) {
            const REAL *row = rows + (int64_t)which[t] * H + k0;
            SR_VEC s = SR_SET1(scale[t]);
            for (int q = 0; q < SR_REGS; q++) acc[q] = SR_FMA(s, SR_LOADZ(mk[q], row + q * SR_LANES), acc[q]);
        }
        for (int q = 0; q < SR_REGS; q++) SR_STORE(out + k0 + q * SR_LANES, mk[q], acc[q]);
    }
}
#undef SR_REGS

#else /* plain loops, vectorised by the compiler */

static void NAME(combine)(int64_t H, const REAL *first, const REAL *second, REAL second_scale, int64_t c,
                          const REAL *rows, const int32_t *which, const REAL *scale, REAL *out) {
    _Pragma("omp simd")
    for (int64_t k = 0; k < H; k++) out[k] = second ? first[k] + second_scale * second[k] : first[k];
    for (int64_t t = 0; t < c; t++) {
        const REAL *row = rows + (int64_t)which[t] * H;
        REAL s = scale[t];
        _Pragma("omp simd")
        for (int64_t k = 0; k < H; k++) out[k] += s * row[k];
    }
}
#endif

/* Examples n0..n1-1: out[n] = base + sum over the inputs j on in row n of x_nj wt[j]. Returns 0, or 1 where its
   scratch could not be allocated. */
int NAME(centred_linear)(int64_t n0, int64_t n1, int64_t D, int64_t H, const REAL *v, const REAL *m, const REAL *wt,
                         const REAL *base, REAL *out) {
    int32_t *idx = malloc((size_t)D * sizeof(int32_t));
    REAL *scale = malloc((size_t)D * sizeof(REAL));
    int failed = !idx || !scale;
    for (int64_t n = n0; n < n1 && !failed; n++) {
        const REAL *vn = v + n * D;
        int64_t c = NAME(row_nonzeros)(vn, m, D, idx);
        for (int64_t t = 0; t < c; t++) scale[t] = vn[idx[t]] + m[idx[t]];
        NAME(combine)(H, base, NULL, 0, c, wt, idx, scale, out + n * H);
    }
    free(idx), free(scale);
    return failed;
}

/* Rows j0..j1-1 of wt: wt[j] += alpha (sum over the examples n with input j on of x_nj d[n] - m_j dsum). Returns 0,
   or 1 where its scratch could not be allocated. */
int NAME(centred_update)(int64_t j0, int64_t j1, int64_t N, int64_t D, int64_t H, const REAL *v, const REAL *m,
                         const REAL *d, const REAL *dsum, REAL alpha, REAL *wt) {
    int32_t *row = malloc((size_t)(j1 - j0 + 1) * sizeof(int32_t));
    int32_t *ex = malloc((size_t)((j1 - j0) * N + 1) * sizeof(int32_t));
    REAL *scale = malloc((size_t)((j1 - j0) * N + 1) * sizeof(REAL));
    int64_t *count = malloc((size_t)(j1 - j0 + 1) * sizeof(int64_t));
    int failed = !row || !ex || !scale || !count;
    if (!failed) NAME(column_lists)(v, m, N, D, j0, j1, alpha, row, ex, scale, count);
    for (int64_t j = j0; j < j1 && !failed; j++) {
        int64_t c = count[j - j0];
        if (c == 0 && m[j] == (REAL)0) continue;
        NAME(combine)(H, wt + j * H, dsum, -alpha * m[j], c, d, ex + (j - j0) * N, scale + (j - j0) * N, wt + j * H);
    }
    free(row), free(ex), free(scale), free(count);
    return failed;
}
