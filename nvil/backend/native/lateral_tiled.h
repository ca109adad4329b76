/* The semi-RBM's pixel sweep as ``lateral_sweep.h`` makes it, register-tiled over chains (``lateral_tiled``; the
   default where the CPU has AVX-512, nvil.native.lateral_sweep): included twice by sequential.c, with REAL (float,
   double), NAME(x) (x_f32, x_f64), VECTOR_BYTES (one SIMD register), WIDTH (units per block: 4 registers) and TILE
   (chains per register tile).

   Unit j turns on where field_j + beta (v L)_j > threshold_j (the logit of its uniform), in index order or reversed,
   each decision seeing the units decided before it. L's columns are taken WIDTH at a time (copied once per block
   into a contiguous panel) and the chains TILE at a time: the tile's block fields sum_k v_k L[k, block] are a small
   matrix product over all M units, TILE x WIDTH accumulators held in registers (each panel row loaded once for the
   tile, not once per chain); then the block's WIDTH decisions in order, the tile's chains side by side, each change
   moving its chain's accumulators by delta L[j, block] (a panel row, shared by the tile) without leaving the
   registers. The same decisions as the eager ``blocked_sweep`` up to rounding (tests compare them in float64).
   v must hold 0 / 1. It does M x WIDTH multiply-adds per chain and block where the list kernel adds only the rows
   of the units that are on, but from registers at full SIMD width instead of one L2 load per add: with 512-bit
   registers (6 chains x 4 registers of accumulators) it is faster than the list kernel on 100 chains of 784
   pixels, 15% or half of them on (bench/sequential_sweeps.py); an AVX2 build (2 chains x 4 256-bit registers) is
   slower than the list kernel, so without AVX-512 the list kernel is the default.

   thresholds NULL: each block's thresholds are drawn here, log(u / (1 - u)) of the counter-based uniforms of draws
   c M + j (NAME(uniforms_into), sequential.c), in a SIMD loop, instead of read from memory filled by the caller. */

typedef REAL NAME(tvec) __attribute__((vector_size(VECTOR_BYTES))); /* one SIMD register (GCC / Clang extension) */
typedef REAL NAME(tload) __attribute__((vector_size(VECTOR_BYTES), aligned(sizeof(REAL)), may_alias)); /* a load */
enum { NAME(LANES) = VECTOR_BYTES / sizeof(REAL), NAME(REGS) = WIDTH / NAME(LANES), NAME(PANEL_WIDTH) = WIDTH };

/* One decision of the tile's chains at block position l (a compile-time constant once the loops are unrolled). */
#define TILE_DECIDE(l)                                                                                             \
    if ((l) < width) {                                                                                              \
        const NAME(tload) *row = (const NAME(tload) *)(panel + (j0 + (l)) * WIDTH);                                  \
        _Pragma("GCC unroll 16")                                                                                    \
        for (int r = 0; r < TILE; r++) {                                                                            \
            REAL next = fr[r][j0 + (l)] + beta[r] * sum[r][(l) / NAME(LANES)][(l) % NAME(LANES)] > tr[r][l] ? 1 : 0; \
            REAL delta = next - vr[r][j0 + (l)];                                                                    \
            vr[r][j0 + (l)] = next;                                                                                 \
            _Pragma("GCC unroll 16")                                                                                \
            for (int q = 0; q < NAME(REGS); q++) sum[r][q] += delta * row[q];                                       \
        }                                                                                                           \
    }

/* The sweep of one block of ``width`` <= WIDTH units from j0 for the tile's TILE chains: vr, fr, tr their v, field
   and block thresholds (rows past the last chain point at scratch), panel the block's columns of L [M, WIDTH]
   (zero past ``width``). */
static void NAME(tile_block)(int64_t M, REAL *vr[TILE], const REAL *fr[TILE], const REAL *tr[TILE],
                             const REAL beta[TILE], const REAL *panel, int64_t j0, int64_t width, int reverse) {
    NAME(tvec) sum[TILE][NAME(REGS)];
    for (int r = 0; r < TILE; r++)
        for (int q = 0; q < NAME(REGS); q++) sum[r][q] = (NAME(tvec)){0};
    for (int64_t k = 0; k < M; k++) {
        const NAME(tload) *row = (const NAME(tload) *)(panel + k * WIDTH);
        _Pragma("GCC unroll 16")
        for (int r = 0; r < TILE; r++) {
            REAL vk = vr[r][k];
            _Pragma("GCC unroll 16")
            for (int q = 0; q < NAME(REGS); q++) sum[r][q] += vk * row[q];
        }
    }
    if (reverse) {
        _Pragma("GCC unroll 128")
        for (int t = WIDTH - 1; t >= 0; t--) TILE_DECIDE(t);
    } else {
        _Pragma("GCC unroll 128")
        for (int t = 0; t < WIDTH; t++) TILE_DECIDE(t);
    }
}

/* panel: WIDTH M REALs of scratch; dummy: 2 M REALs zeroed by the caller, the v and field of a tile's missing chains
   (their decisions land there and are discarded; zeros keep their products finite). */
void NAME(lateral_tiled)(int64_t c0, int64_t c1, int64_t M, REAL *v, const REAL *field, const REAL *thresholds,
                         const REAL *jscale, int reverse, const REAL *J, uint64_t seed, REAL *panel, REAL *dummy) {
    REAL *dummy_v = dummy, *dummy_f = dummy + M;
    int64_t blocks = (M + WIDTH - 1) / WIDTH;
    for (int64_t bi = 0; bi < blocks; bi++) {
        int64_t j0 = (reverse ? blocks - 1 - bi : bi) * WIDTH;
        int64_t width = M - j0 < WIDTH ? M - j0 : WIDTH;
        for (int64_t k = 0; k < M; k++) {
            memcpy(panel + k * WIDTH, J + k * M + j0, width * sizeof(REAL));
            for (int64_t l = width; l < WIDTH; l++) panel[k * WIDTH + l] = 0;
        }
        for (int64_t g = c0; g < c1; g += TILE) {
            int64_t rows = c1 - g < TILE ? c1 - g : TILE;
            REAL drawn[TILE][WIDTH], beta[TILE];
            REAL *vr[TILE];
            const REAL *fr[TILE], *tr[TILE];
            for (int64_t r = 0; r < TILE; r++) {
                int64_t c = g + (r < rows ? r : 0);
                if (thresholds) {
                    tr[r] = thresholds + c * M + j0;
                } else {
                    NAME(uniforms_into)(seed, c * M + j0, width, drawn[r]);
                    _Pragma("omp simd")
                    for (int64_t l = 0; l < width; l++) drawn[r][l] = NAME(log)(drawn[r][l] / ((REAL)1 - drawn[r][l]));
                    tr[r] = drawn[r];
                }
                vr[r] = r < rows ? v + c * M : dummy_v;
                fr[r] = r < rows ? field + c * M : dummy_f;
                beta[r] = jscale ? jscale[c] : 1;
            }
            NAME(tile_block)(M, vr, fr, tr, beta, panel, j0, width, reverse);
        }
    }
}

#undef TILE_DECIDE
