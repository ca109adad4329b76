/* AIS's weight increment for an RBM (estimators/ais_rbm.py: softplus_difference), float32, one pass over a(x):

       out[r] = sum_j softplus(beta_hi a_rj) - softplus(beta_lo a_rj)
              = sum_j d max(a_rj, 0) + log1p(expm1(-d t_rj) sigmoid(-beta_lo t_rj)),   t = |a|, d = beta_hi - beta_lo,

   the form that neither overflows nor cancels for tiny d (ais_rbm.py). Each term in float32 from polynomials that the
   compiler vectorises (no calls into libm): exp(x <= 0) by Cody-Waite reduction to |r| <= ln2 / 2 and a degree-7
   Taylor polynomial, scaled by 2^k through the exponent bits (arguments below -87 taken as -87, where float32
   runs out of normal values: exp(-87) ~ 1.6e-38, 0 beside any term it joins);
   expm1(y <= 0) by its own Taylor polynomial where |y| <= ln2 / 2 (no cancellation), else exp(y) - 1; log1p(y) on
   y in (-1/2, 0] (guaranteed here: expm1 is in (-1, 0] and sigmoid(-beta_lo t) in (0, 1/2]) as 2 atanh(s),
   s = y / (2 + y) in [-1/3, 0], to s^15. Each block of 128 terms is summed in float32 (in the vector lanes),
   the blocks of a row in double. Rows r0 .. r1 - 1 of a [rows, width]
   row-major matrix; out is double [rows]. Relative error per term ~1e-7, as torch's float32 expm1 / log1p. */

/* a * b + c as one fused multiply-add where the CPU has one (every AVX2 machine): with -ffp-contract=off (-std=c11)
   the compiler contracts nothing else. Written out, the polynomials below are Estrin's scheme (pairs, then pairs of
   pairs) rather than Horner's: a chain of ~4 dependent FMAs per polynomial instead of ~14 multiplies and adds. These
   loops are latency bound (each vector's terms one long chain), so the shorter chains are the speed: 1.5-2.5x per
   term on a Zen 3 core (bench/RESULTS.md, twenty-fifth session). The same Taylor coefficients; values within an ulp
   or two of the Horner forms'. */
#ifdef __FMA__
#define SD_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define SD_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* c0 + c1 x + ... + c7 x^7 by Estrin's scheme, given x and x^2. */
static inline float sd_poly7(float x, float x2, float c0, float c1, float c2, float c3, float c4, float c5,
                             float c6, float c7) {
    float x4 = x2 * x2;
    float p01 = SD_FMA(c1, x, c0), p23 = SD_FMA(c3, x, c2), p45 = SD_FMA(c5, x, c4), p67 = SD_FMA(c7, x, c6);
    return SD_FMA(SD_FMA(p67, x2, p45), x4, SD_FMA(p23, x2, p01));
}

static inline float sd_exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;   /* exp(-87) ~ 1.6e-38, the last normal float's order: an underflow to ~0 */
    float k = SD_FMA(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  /* round to nearest: 1.5 * 2^23 */
    float r = SD_FMA(k, -1.42860682030941723212e-6f, SD_FMA(k, -0.693145751953125f, x));
    float p = sd_poly7(r, r * r, 1.0f, 1.0f, 0.5f, 1.6666667163e-1f, 4.1666667908e-2f, 8.3333337680e-3f,
                       1.3888889225e-3f, 1.9841270114e-4f);
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)k + 127) << 23;
    return p * scale.f;
}

static inline float sd_expm1_nonpositive(float y) {
    float far = sd_exp_nonpositive(y) - 1.0f;
    float near = y * sd_poly7(y, y * y, 1.0f, 0.5f, 1.6666667163e-1f, 4.1666667908e-2f, 8.3333337680e-3f,
                              1.3888889225e-3f, 1.9841270114e-4f, 2.4801587642e-5f);
    return y < -0.34657359f ? far : near;  /* both computed: no branch in the vectorised loop */
}

static inline float sd_log1p_small(float y) {
    float s = y / (2.0f + y), s2 = s * s;
    return 2.0f * s * sd_poly7(s2, s2 * s2, 1.0f, 1.0f / 3, 1.0f / 5, 1.0f / 7, 1.0f / 9, 1.0f / 11, 1.0f / 13,
                               1.0f / 15);
}

/* A block's terms summed in float32 (the vector lanes' partial sums), the blocks of a row in double. */
#define SD_BLOCK 128

static float sd_block_logs(const float *x, int64_t n, float beta_lo, float d) {
    float logs = 0.0f;
    #pragma omp simd reduction(+:logs)
    for (int64_t j = 0; j < n; j++) {
        float t = __builtin_fabsf(x[j]);
        float e = sd_exp_nonpositive(-beta_lo * t);
        logs += sd_log1p_small(sd_expm1_nonpositive(-d * t) * (e / (1.0f + e)));
    }
    return logs;
}

static float sd_block_positive(const float *x, int64_t n) {
    float positive = 0.0f;
    #pragma omp simd reduction(+:positive)
    for (int64_t j = 0; j < n; j++) positive += x[j] > 0.0f ? x[j] : 0.0f;  /* a select: fmaxf is a libm call */
    return positive;
}

void softplus_difference_f32(int64_t r0, int64_t r1, int64_t width, const float *a, float beta_lo, float d,
                             double *out) {
    for (int64_t r = r0; r < r1; r++) {
        const float *row = a + r * width;
        double logs = 0.0, positive = 0.0;
        for (int64_t j = 0; j < width; j += SD_BLOCK) {
            int64_t n = width - j < SD_BLOCK ? width - j : SD_BLOCK;
            logs += (double)sd_block_logs(row + j, n, beta_lo, d);
            positive += (double)sd_block_positive(row + j, n);
        }
        out[r] = logs + (double)d * positive;
    }
}
