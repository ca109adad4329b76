/* Single-site Gibbs sweeps over binary units, the whole sweep in one call (nvil/native/__init__.py loads this file).

   The target is the one of nvil/mcmc/sequential_gibbs.py: unit j's log-odds given the rest is

       logit_j = r_j - sign_j sum_f coef_f sum_k log(s_fk + p_fk e^{m_fjk}),     sign_j = 2 h_j - 1,

   with r = u + J h the quadratic field, p = sigmoid(a_f), s = sigmoid(-a_f) the running probabilities of each softplus
   factor f, and e^{m} its flip table row exp(+-M_fj) (``up`` where h_j = 0, ``down`` where h_j = 1), for the factors
   that unit j enters (lo_f <= j < hi_f). The logit is tempered by beta[c]; the new h_j is drawn (mode 0:
   pick < sigmoid(logit)), forced (1: pick) or the argmax (2: logit > 0); where it flips, r moves by (h_j' - h_j) J_j
   (at the units this sweep has still to visit: the caller recomputes r from h before each sweep) and each factor's
   p, s move to
   p e^m / den, s / den (den = s + p e^m). The same arithmetic as the eager path, so the chains agree with it up to
   rounding; sum_k log(den_k) takes one log per product of R terms (R from the table's reach, up to 64), so the
   logs are a small part of the work.

   Chains are independent: this call does chains c0..c1-1 (threads.h runs ranges in OpenMP threads), in blocks
   of up to BLOCK chains with the same direction, so a unit's table rows are read once per block. Two precisions,
   from one body (REAL float / double). The log is a short polynomial of the mantissa that the compiler vectorises
   (relative error ~1e-7 in float, ~1e-16 in double): the inner loops run at SIMD width without -ffast-math. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 8  /* chains per block of the SequentialGibbs sweep */
#define LANES 16 /* running products per log in gain_* */

static inline float log_f32(float x) {
    /* x = 2^k m, m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.1716 (musl's split). */
    uint32_t ix;
    memcpy(&ix, &x, 4);
    uint32_t shifted = ix - 0x3f3504f3u;
    int32_t k = (int32_t)shifted >> 23;
    uint32_t im = (shifted & 0x007fffffu) + 0x3f3504f3u;
    float m;
    memcpy(&m, &im, 4);
    float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float series = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9))));
    return 2.0f * t * series + (float)k * 0.693147180559945309f;
}

static inline double log_f64(double x) {
    uint64_t ix;
    memcpy(&ix, &x, 8);
    uint64_t shifted = ix - 0x3fe6a09e667f3bcdull; /* sqrt(1/2) */
    int64_t k = (int64_t)shifted >> 52;
    uint64_t im = (shifted & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull;
    double m;
    memcpy(&m, &im, 8);
    double t = (m - 1.0) / (m + 1.0), t2 = t * t;
    double series = 1.0 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 * (1.0 / 9 + t2 * (1.0 / 11
                    + t2 * (1.0 / 13 + t2 * (1.0 / 15 + t2 * (1.0 / 17 + t2 * (1.0 / 19 + t2 * (1.0 / 21))))))))));
    return 2.0 * t * series + (double)k * 0.693147180559945309417;
}

#define DEFINE_SWEEP(REAL, SUFFIX, LOG, EXP)                                                                        \
                                                                                                                    \
static REAL gain_##SUFFIX(const REAL *p, const REAL *s, const REAL *e, int64_t K, int64_t R) {                     \
    /* sum_k log(s_k + p_k e_k): LANES running products, one log per lane every R products (R chosen so that a  \
       product of R terms, each in [exp(-|M|), exp(|M|)], stays inside REAL's normal range) */                       \
    REAL acc[LANES] = {0}, prod[LANES];                                                                             \
    int64_t full = K / LANES;                                                                                       \
    for (int64_t v0 = 0; v0 < full; v0 += R) {                                                                      \
        int64_t v1 = v0 + R < full ? v0 + R : full;                                                                 \
        _Pragma("omp simd")                                                                                         \
        for (int l = 0; l < LANES; l++) prod[l] = 1;                                                                \
        for (int64_t v = v0; v < v1; v++) {                                                                         \
            const REAL *pv = p + v * LANES, *sv = s + v * LANES, *ev = e + v * LANES;                               \
            _Pragma("omp simd")                                                                                     \
            for (int l = 0; l < LANES; l++) prod[l] *= sv[l] + pv[l] * ev[l];                                       \
        }                                                                                                           \
        _Pragma("omp simd")                                                                                         \
        for (int l = 0; l < LANES; l++) acc[l] += LOG(prod[l]);                                                     \
    }                                                                                                               \
    REAL total = 0;                                                                                                 \
    for (int l = 0; l < LANES; l++) total += acc[l];                                                                \
    REAL tail = 1;                                                                                                  \
    for (int64_t k = full * LANES, n = 0; k < K; k++) {                                                             \
        tail *= s[k] + p[k] * e[k];                                                                                 \
        if (++n == R) {                                                                                             \
            total += LOG(tail);                                                                                     \
            tail = 1;                                                                                               \
            n = 0;                                                                                                  \
        }                                                                                                           \
    }                                                                                                               \
    return total + LOG(tail);                                                                                       \
}                                                                                                                   \
                                                                                                                    \
static void move_##SUFFIX(REAL *p, REAL *s, const REAL *e, int64_t K) {                                            \
    _Pragma("omp simd")                                                                                             \
    for (int64_t k = 0; k < K; k++) {                                                                               \
        REAL pe = p[k] * e[k], inv = (REAL)1 / (pe + s[k]);                                                         \
        p[k] = pe * inv;                                                                                            \
        s[k] = s[k] * inv;                                                                                          \
    }                                                                                                               \
}                                                                                                                   \
                                                                                                                    \
static void block_##SUFFIX(const int64_t *chains, int64_t B, int reverse, int64_t M, REAL *h, const REAL *picks,    \
                           int mode, const REAL *beta, REAL *logits, REAL *r, const REAL *J, int64_t F, REAL **p,    \
                           REAL **s, REAL **up, REAL **down, const int64_t *K,                                      \
                           const int64_t *lo, const int64_t *hi, const int64_t *R, const double *coef) {            \
    for (int64_t i = 0; i < M; i++) {                                                                               \
        int64_t j = reverse ? M - 1 - i : i;                                                                        \
        for (int64_t b = 0; b < B; b++) {                                                                           \
            int64_t c = chains[b];                                                                                  \
            REAL h_j = h[c * M + j];                                                                                \
            int on = h_j > 0;                                                                                       \
            REAL logit = r[c * M + j];                                                                              \
            for (int64_t f = 0; f < F; f++) {                                                                       \
                if (j < lo[f] || j >= hi[f]) continue;                                                              \
                const REAL *e = (on ? down[f] : up[f]) + j * K[f];                                                  \
                REAL g = gain_##SUFFIX(p[f] + c * K[f], s[f] + c * K[f], e, K[f], R[f]);                            \
                logit = on ? logit - (REAL)coef[f] * g : logit + (REAL)coef[f] * g;                                 \
            }                                                                                                       \
            if (beta) logit = beta[c] * logit;                                                                      \
            REAL pick = picks ? picks[c * M + j] : 0;                                                               \
            REAL next;                                                                                              \
            if (mode == 0) next = pick < (REAL)1 / ((REAL)1 + EXP(-logit)) ? 1 : 0;                                 \
            else if (mode == 1) next = pick;                                                                        \
            else next = logit > 0 ? 1 : 0;                                                                          \
            if (logits) logits[c * M + j] = logit;                                                                  \
            if (next == h_j) continue;                                                                              \
            for (int64_t f = 0; f < F; f++) {                                                                       \
                if (j < lo[f] || j >= hi[f]) continue;                                                              \
                move_##SUFFIX(p[f] + c * K[f], s[f] + c * K[f], (on ? down[f] : up[f]) + j * K[f], K[f]);          \
            }                                                                                                       \
            if (J) {                                                                                                \
                REAL delta = next - h_j;                                                                            \
                REAL *rc = r + c * M;                                                                               \
                const REAL *Jj = J + j * M;                                                                         \
                int64_t k0 = reverse ? 0 : j + 1, k1 = reverse ? j : M; /* only the units still to visit */         \
                _Pragma("omp simd")                                                                                 \
                for (int64_t k = k0; k < k1; k++) rc[k] += delta * Jj[k];                                           \
            }                                                                                                       \
            h[c * M + j] = next;                                                                                    \
        }                                                                                                           \
    }                                                                                                               \
}                                                                                                                   \
                                                                                                                    \
void sequential_sweep_##SUFFIX(int64_t c0, int64_t c1, int64_t M, REAL *h, const REAL *picks, int mode,             \
                               const REAL *beta, const uint8_t *reverse, REAL *logits, REAL *r, const REAL *J,      \
                               int64_t F, REAL **p, REAL **s, REAL **up, REAL **down,                               \
                               const int64_t *K, const int64_t *lo, const int64_t *hi, const int64_t *R,            \
                               const double *coef) {                                                                \
    for (int dir = 0; dir < 2; dir++) {                                                                             \
        int64_t chains[BLOCK], B = 0;                                                                               \
        for (int64_t c = c0; c < c1; c++) {                                                                         \
            if ((reverse ? reverse[c] != 0 : 0) != dir) continue;                                                   \
            chains[B++] = c;                                                                                        \
            if (B == BLOCK) {                                                                                       \
                block_##SUFFIX(chains, B, dir, M, h, picks, mode, beta, logits, r, J, F, p, s, up, down,    \
                               K, lo, hi, R, coef);                                                                 \
                B = 0;                                                                                              \
            }                                                                                                       \
        }                                                                                                           \
        if (B) block_##SUFFIX(chains, B, dir, M, h, picks, mode, beta, logits, r, J, F, p, s, up, down, K,  \
                              lo, hi, R, coef);                                                                     \
    }                                                                                                               \
}

DEFINE_SWEEP(float, f32, log_f32, expf)
DEFINE_SWEEP(double, f64, log_f64, exp)

/* Counter-based uniforms for the pixel sweep. Word w under seed s is SplitMix64's output mix(s + (w + 1) gamma)
   (Steele, Lea & Flood 2014: the generator seeded with s, after w + 1 steps). Float draw i takes 23 bits of word
   i / 2 (bits 41..63 for even i, 9..31 for odd i), double draw i 52 bits of word i; with i = chain * M + unit a draw
   depends on the seed, its chain and its unit only, never on threads or blocks. The uniforms are the midpoints
   (k + 1/2) 2^-23 or (k + 1/2) 2^-52, exact in their type and strictly inside (0, 1), so the threshold
   log(u / (1 - u)) is finite. */
static inline uint64_t splitmix64(uint64_t seed, uint64_t w) {
    uint64_t z = seed + (w + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float high23(uint64_t z) { return ((float)(z >> 41) + 0.5f) * 0x1p-23f; }

static inline float low23(uint64_t z) { return ((float)((z >> 9) & 0x7fffffu) + 0.5f) * 0x1p-23f; }

static void uniforms_into_f32(uint64_t seed, int64_t i0, int64_t n, float *out) {
    if (n <= 0) return;
    int64_t w = i0 >> 1, at = 0;
    if (i0 & 1) out[at++] = low23(splitmix64(seed, (uint64_t)w++)); /* the odd half of the first word */
    int64_t pairs = (n - at) / 2;
    float *o = out + at;
    _Pragma("omp simd")
    for (int64_t k = 0; k < pairs; k++) {
        uint64_t z = splitmix64(seed, (uint64_t)(w + k));
        o[2 * k] = high23(z);
        o[2 * k + 1] = low23(z);
    }
    if (at + 2 * pairs < n) out[n - 1] = high23(splitmix64(seed, (uint64_t)(w + pairs)));
}

static void uniforms_into_f64(uint64_t seed, int64_t i0, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = ((double)(splitmix64(seed, (uint64_t)(i0 + i)) >> 12) + 0.5) * 0x1p-52;
}

void uniforms_f32(int64_t i0, int64_t n, uint64_t seed, float *out) { uniforms_into_f32(seed, i0, n, out); }

void uniforms_f64(int64_t i0, int64_t n, uint64_t seed, double *out) { uniforms_into_f64(seed, i0, n, out); }

/* Autoregressive Bernoulli units (models/autoregressive.py): per chain, unit j on where u_j < sigmoid(l_j), in index
   order, l the base logits plus W h over the units drawn so far, kept current by adding row j of wt (column j of the
   strictly lower-triangular W) to the logits of the units after j when unit j comes on. The same operations in the
   same order as the eager loop, one call instead of a few kernel launches per unit. */
#define DEFINE_AUTOREGRESSIVE(REAL, SUFFIX, EXP)                                                                   \
void autoregressive_##SUFFIX(int64_t c0, int64_t c1, int64_t n, const REAL *base, const REAL *wt, const REAL *u,  \
                             REAL *logits, REAL *h) {                                                             \
    for (int64_t c = c0; c < c1; c++) {                                                                             \
        REAL *l = logits + c * n, *hc = h + c * n;                                                                  \
        const REAL *uc = u + c * n;                                                                                 \
        memcpy(l, base + c * n, (size_t)n * sizeof(REAL));                                                          \
        for (int64_t j = 0; j < n; j++) {                                                                           \
            hc[j] = uc[j] < (REAL)1 / ((REAL)1 + EXP(-l[j])) ? (REAL)1 : (REAL)0;                                   \
            if (hc[j] == (REAL)0) continue;                                                                         \
            const REAL *w = wt + j * n;                                                                             \
            _Pragma("omp simd")                                                                                     \
            for (int64_t k = j + 1; k < n; k++) l[k] += w[k];                                                       \
        }                                                                                                           \
    }                                                                                                               \
}

DEFINE_AUTOREGRESSIVE(float, f32, expf)
DEFINE_AUTOREGRESSIVE(double, f64, exp)

/* The pixel sweep's two kernels (nvil.native.lateral_sweep picks one): the list kernel, and the register-tiled one
   (4 SIMD registers of units per block, TILE chains per tile: 6 x 4 of the 32 512-bit registers; 2 x 4 of the 16
   256-bit ones). Only the tiled one has its multiply-adds contracted to FMAs (-std=c11 turns contraction off): its
   field products are by 0 / 1 and -1 / 0 / 1, exact either way; field + beta (v L) may round once instead of twice. */
#if defined(__AVX512F__)
#define VECTOR_BYTES 64
#define TILE 6
#else
#define VECTOR_BYTES 32
#define TILE 2
#endif

#define REAL float
#define NAME(x) x##_f32
#define WIDTH 64
#include "lateral_sweep.h"
#undef WIDTH
#define WIDTH (4 * VECTOR_BYTES / 4)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#include "lateral_tiled.h"
#pragma GCC pop_options
#undef REAL
#undef NAME
#undef WIDTH

#define REAL double
#define NAME(x) x##_f64
#define WIDTH 32
#include "lateral_sweep.h"
#undef WIDTH
#define WIDTH (4 * VECTOR_BYTES / 8)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#include "lateral_tiled.h"
#pragma GCC pop_options
#undef REAL
#undef NAME
#undef WIDTH

/* A Bernoulli layer's log-probability, float32 (bernoulli_log_prob.h). */
#include "bernoulli_log_prob.h"

/* Every range kernel's OpenMP driver (threads.h). */
#include "threads.h"
