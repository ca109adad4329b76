/* The OpenMP drivers of the range kernels (nvil/native/__init__.py: one call each, no thread pool in Python):
   included by sequential.c after every kernel, once per floating type with REAL (float, double) and S (f32, f64).

   Each NAME_threads_S splits [0, n) (chains, examples, rows of a weight or column blocks) into `threads` contiguous
   ranges and runs its range kernel on each, in OpenMP's threads where the library is built with -fopenmp: it then
   shares the OpenMP runtime torch loaded, so the ranges go to torch's own pool, whose workers spin between torch's
   parallel regions, instead of to a second pool beside them (which cost AIS a fifth of its step at 2 threads).
   Built without OpenMP, the ranges run one after another. No value depends on the ranges: every chain, row and
   column is computed by the same operations whichever range holds it. The drivers of kernels that need scratch
   allocate it per range and return 1 where that fails (any range), else 0. */

/* The body for each range [begin, end) of `threads` over [0, n), in OpenMP's threads; FOR_RANGES_FAILED also ORs
   the `failed` the bodies set into the caller's. */
#define RANGE_LOOP(n, ...)                                                                                          \
    for (int t_ = 0; t_ < threads; t_++) {                                                                          \
        int64_t begin = (n) * t_ / threads, end = (n) * (t_ + 1) / threads;                                         \
        __VA_ARGS__;                                                                                                \
    }
#define FOR_RANGES(n, ...)                                                                                          \
    _Pragma("omp parallel for num_threads(threads) schedule(static, 1)") RANGE_LOOP(n, __VA_ARGS__)
#define FOR_RANGES_FAILED(n, ...)                                                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(static, 1) reduction(|: failed)")                       \
    RANGE_LOOP(n, __VA_ARGS__)

#define DEFINE_THREADS(REAL, S)                                                                                     \
void sequential_sweep_threads_##S(int64_t n, int threads, int64_t M, REAL *h, const REAL *picks, int mode,          \
                                  const REAL *beta, const uint8_t *reverse, REAL *logits, REAL *r, const REAL *J,   \
                                  int64_t F, REAL **p, REAL **s, REAL **up, REAL **down, const int64_t *K,          \
                                  const int64_t *lo, const int64_t *hi, const int64_t *R, const double *coef) {     \
    FOR_RANGES(n, sequential_sweep_##S(begin, end, M, h, picks, mode, beta, reverse, logits, r, J, F, p, s, up,     \
                                       down, K, lo, hi, R, coef))                                                   \
}                                                                                                                   \
                                                                                                                    \
void autoregressive_threads_##S(int64_t n, int threads, int64_t units, const REAL *base, const REAL *wt,            \
                                const REAL *u, REAL *logits, REAL *h) {                                             \
    FOR_RANGES(n, autoregressive_##S(begin, end, units, base, wt, u, logits, h))                                    \
}                                                                                                                   \
                                                                                                                    \
/* the list kernel's scratch per range: the units that are on and their places [end - begin, M], their counts */    \
int lateral_sweep_threads_##S(int64_t n, int threads, int64_t M, REAL *v, const REAL *field,                        \
                              const REAL *thresholds, const REAL *jscale, int reverse, const REAL *L,               \
                              uint64_t seed) {                                                                      \
    int failed = 0;                                                                                                 \
    FOR_RANGES_FAILED(n, {                                                                                          \
        int32_t *on = malloc((size_t)(2 * (end - begin) * M + 1) * sizeof(int32_t));                                \
        int32_t *count = malloc((size_t)(end - begin + 1) * sizeof(int32_t));                                       \
        if (on && count)                                                                                            \
            lateral_sweep_##S(begin, end, M, v, field, thresholds, jscale, reverse, L, on,                          \
                              on + (end - begin) * M, count, seed);                                                 \
        else                                                                                                        \
            failed = 1;                                                                                             \
        free(on), free(count);                                                                                      \
    })                                                                                                              \
    return failed;                                                                                                  \
}                                                                                                                   \
                                                                                                                    \
/* the tiled kernel's scratch per range: a panel of L's block columns, the v and field of a tile's missing chains */ \
int lateral_tiled_threads_##S(int64_t n, int threads, int64_t M, REAL *v, const REAL *field,                        \
                              const REAL *thresholds, const REAL *jscale, int reverse, const REAL *L,               \
                              uint64_t seed) {                                                                      \
    int failed = 0;                                                                                                 \
    FOR_RANGES_FAILED(n, {                                                                                          \
        REAL *panel = malloc((size_t)(PANEL_WIDTH_##S * M + 1) * sizeof(REAL));                                     \
        REAL *dummy = calloc((size_t)(2 * M + 1), sizeof(REAL));                                                    \
        if (panel && dummy)                                                                                         \
            lateral_tiled_##S(begin, end, M, v, field, thresholds, jscale, reverse, L, seed, panel, dummy);         \
        else                                                                                                        \
            failed = 1;                                                                                             \
        free(panel), free(dummy);                                                                                   \
    })                                                                                                              \
    return failed;                                                                                                  \
}

DEFINE_THREADS(float, f32)
DEFINE_THREADS(double, f64)

/* A Bernoulli layer's log-probability per row, float32 only (bernoulli_log_prob.h). */
void bernoulli_log_prob_threads_f32(int64_t rows, int64_t width, const float *a, int64_t a_period,
                                    const float *value, int64_t v_period, const float *a_zero, float *out,
                                    int threads) {
    FOR_RANGES(rows, bernoulli_log_prob_f32(begin, end, width, a, a_period, value, v_period, a_zero, out))
}

#undef RANGE_LOOP
#undef FOR_RANGES
#undef FOR_RANGES_FAILED
#undef DEFINE_THREADS
