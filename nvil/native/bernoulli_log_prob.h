/* log Bernoulli(value; sigmoid(a)) summed over each row, float32 (nvil/ops.py: bernoulli_log_prob), in one pass:

       out[r] = sum_j v_j a_j - softplus(a_j),   a = a row (r mod a_period), v = value row (r mod v_period),
       softplus(a) = max(a, 0) + log1p(exp(-|a|)),

   the form of log sigmoid(+-a) that neither overflows nor cancels. exp(-|a|) in (0, 1] and log1p of it from
   softplus_difference.h's polynomials (included before this file): no calls into libm, so the loop vectorises
   (torch's float32 softplus took ~6 ns per element on a Zen 3 core, scalar log1p; this pass with the dot
   product ~2.4, measured beside another job: bench/RESULTS.md, twenty-third session). log1p(y) for y in
   (0, 1] as 2 atanh(s), s = y / (2 + y) in (0, 1/3], to s^15: truncation below 1e-9. Either operand's rows may
   repeat (the K-sample bounds' x, and q's first logits, the same for every sample: no K copies of them). Each block
   of 128 terms is summed in float32 (in the vector lanes), the blocks of a row in double; out is float32, rows
   r0 .. r1 - 1; a [a_period, width] and value [v_period, width] row-major. A NaN in a row gives NaN, as torch's
   form. */

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
