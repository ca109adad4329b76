/* Adam's update (Kingma & Ba 2015, Algorithm 1, in torch.optim.Adam's form: no weight decay, AMSGrad or maximize),
   float32, over every parameter of an optimiser in one call (nvil/native/adam.py):

       t <- t + 1,   m <- m + (1 - beta1) (g - m),   v <- beta2 v + (1 - beta2) g^2,
       theta <- theta - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps),

   the operations of ATen's fused CPU kernel in their order (m's lerp one fused multiply-add, from the nearer end
   as torch's lerp: m + w (g - m) for w = 1 - beta1 < 1/2, else g + (w - 1)(g - m); the rest unfused: -std=c11
   contracts nothing), so theta, m and v agree with torch's to float32 rounding. Each tensor k is
   n[k] floats in any layout the four of them share (the input-major weights of NVIL's sparse-input path too: the
   update is elementwise); t[k] is its float32 step count, as torch keeps it. Per tensor the bias corrections are
   computed once in double. What it saves is torch's Python (~0.3 ms per NVIL update at batch 20 on a Zen 3 core:
   three groups, 0.4 M parameters); in the training loop this loop, like torch's kernel, is bound by memory (~0.55
   ms: m and v leave the caches between steps; bench/RESULTS.md, twenty-fourth session). The caller's threads each
   take the same share of every tensor (threads.h). */

static void adam_span_f32(int64_t i0, int64_t i1, float *p, const float *g, float *m, float *v, float w, float b2,
                          float c2, float step_size, float bc2_sqrt, float eps) {
    int near_m = w < 0.5f;
    float coeff = near_m ? w : w - 1.0f;
    #pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float gi = g[i];
        float mi = fmaf(coeff, gi - m[i], near_m ? m[i] : gi);
        float vi = v[i] * b2 + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

/* The step counts, then each tensor's bias-corrected rates into step_size[k] and bc2_sqrt[k] (2 x count doubles). */
static void adam_rates_f32(int64_t count, float *const *t, const double *lr, double beta1, double beta2,
                           double *step_size, double *bc2_sqrt) {
    for (int64_t k = 0; k < count; k++) {
        double step = (double)(*t[k] += 1.0f);
        step_size[k] = lr[k] / (1.0 - pow(beta1, step));
        bc2_sqrt[k] = sqrt(1.0 - pow(beta2, step));
    }
}
