/* log Bernoulli(value; sigmoid(a)) summed over each row, float32 (nvil/core/ops.py: bernoulli_log_prob), in one pass:

       out[r] = sum_j v_j a_j - softplus(a_j),   a = a row (r mod a_period), v = value row (r mod v_period),
       softplus(a) = max(a, 0) + log1p(exp(-|a|)),

   the form of log sigmoid(+-a) that neither overflows nor cancels. exp(-|a|) in (0, 1] and log1p of it from the
   polynomials below: no calls into libm, so the loop vectorises (torch's float32 softplus calls a scalar log1p).
   log1p(y) for y in (0, 1] as 2 atanh(s), s = y / (2 + y) in (0, 1/3], to s^15: truncation below 1e-9. Either operand's rows may
   repeat (the K-sample bounds' x, and q's first logits, the same for every sample: no K copies of them). Each block
   of 128 terms is summed in float32 (in the vector lanes), the blocks of a row in double; out is float32, rows
   r0 .. r1 - 1; a [a_period, width] and value [v_period, width] row-major. A NaN in a row gives NaN, as torch's
   form. */

/* a * b + c as one fused multiply-add where the CPU has one (every AVX2 machine): with -ffp-contract=off (-std=c11)
   the compiler contracts nothing else. Written out, the polynomials below are Estrin's scheme (pairs, then pairs of
   pairs) rather than Horner's: a chain of ~4 dependent FMAs per polynomial instead of ~14 multiplies and adds. These
   loops are latency bound (each vector's terms one long chain), so the shorter chains are the speed. The same
   Taylor coefficients; values within an ulp
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

/* exp(x <= 0) by Cody-Waite reduction to |r| <= ln2 / 2 and a degree-7 Taylor polynomial, scaled by 2^k through the
   exponent bits (arguments below -87 taken as -87, where float32 runs out of normal values: exp(-87) ~ 1.6e-38, 0
   beside any term it joins). Relative error ~1e-7, as torch's float32 exp / log1p. */
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

static inline float sd_log1p_small(float y) {
    float s = y / (2.0f + y), s2 = s * s;
    return 2.0f * s * sd_poly7(s2, s2 * s2, 1.0f, 1.0f / 3, 1.0f / 5, 1.0f / 7, 1.0f / 9, 1.0f / 11, 1.0f / 13,
                               1.0f / 15);
}

/* A block's terms summed in float32 (the vector lanes' partial sums), the blocks of a row in double. */
#define SD_BLOCK 128

static float blp_block(const float *a, const float *v, int64_t n) {
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; j++) {
        float x = a[j], positive = x > 0.0f ? x : 0.0f;  /* a select, not fmaxf: a libm call here */
        sum += v[j] * x - positive - sd_log1p_small(sd_exp_nonpositive(-__builtin_fabsf(x)));
    }
    return sum;
}

static float blp_dot(const float *a, const float *v, int64_t n) {
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; j++) sum += v[j] * a[j];
    return sum;
}

/* With a_zero (not NULL: each of the a_period rows' log-probability of the value 0, -sum_j softplus(a_j), as this
   kernel gives it) a row costs its dot product only: the softplus terms of a row that repeats are summed once. */
void bernoulli_log_prob_f32(int64_t r0, int64_t r1, int64_t width, const float *a, int64_t a_period,
                            const float *value, int64_t v_period, const float *a_zero, float *out) {
    for (int64_t r = r0; r < r1; r++) {
        const float *row = a + (r % a_period) * width, *v = value + (r % v_period) * width;
        double sum = a_zero ? (double)a_zero[r % a_period] : 0.0;
        for (int64_t j = 0; j < width; j += SD_BLOCK) {
            int64_t n = width - j < SD_BLOCK ? width - j : SD_BLOCK;
            sum += (double)(a_zero ? blp_dot(row + j, v + j, n) : blp_block(row + j, v + j, n));
        }
        out[r] = (float)sum;
    }
}
