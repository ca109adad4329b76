/* One sequential sweep over laterally coupled binary units (the semi-RBM's pixels), blocked: included twice by
   sequential.c, with REAL (float, double), NAME(x) (x_f32, x_f64) and WIDTH (the block: 64 floats or 32 doubles,
   8 AVX registers of running fields). The list kernel: the default on CPUs without AVX-512; ``lateral_tiled.h`` is
   the other (nvil.native.lateral_sweep picks).

   Unit j turns on where field_j + beta (v L)_j > threshold_j (the logit of its uniform), in index order or reversed,
   each decision seeing the units decided before it. Per block of WIDTH units and per chain, the block's fields
   sum_k v_k L[k, block] come from the chain's current v as a sum of the rows of L's block columns of the units that
   are on (loads and adds into registers, no stores: a GEMM's inner loop over the ~half of the units that are on);
   then the WIDTH decisions in order, each change moving the block's fields by delta L[j, block]. Each chain keeps
   the list of its units that are on (with each unit's place in it, so a change costs O(1)). Blocks are the outer
   loop, so L's block columns stay in cache across the chains. The same decisions as the eager ``blocked_sweep`` up
   to rounding (tests compare them in float64). v must hold 0 / 1.

   thresholds NULL: each block's thresholds are drawn here, log(u / (1 - u)) of the counter-based uniforms of draws
   c M + j (NAME(uniforms_into), sequential.c), in a SIMD loop, instead of read from memory filled by the caller. */

typedef REAL NAME(vec) __attribute__((vector_size(32))); /* one AVX register (GCC / Clang vector extension) */

void NAME(lateral_sweep)(int64_t c0, int64_t c1, int64_t M, REAL *v, const REAL *field, const REAL *thresholds,
                         const REAL *jscale, int reverse, const REAL *J, int32_t *on, int32_t *place, int32_t *count,
                         uint64_t seed) {
    /* on, place: [c1 - c0, M]; count: [c1 - c0] (scratch) */
    for (int64_t c = c0; c < c1; c++) {
        int32_t *list = on + (c - c0) * M, *where = place + (c - c0) * M, n = 0;
        for (int64_t k = 0; k < M; k++)
            if (v[c * M + k] != 0) {
                where[k] = n;
                list[n++] = (int32_t)k;
            }
        count[c - c0] = n;
    }
    int64_t blocks = (M + WIDTH - 1) / WIDTH;
    for (int64_t bi = 0; bi < blocks; bi++) {
        int64_t j0 = (reverse ? blocks - 1 - bi : bi) * WIDTH;
        int64_t width = M - j0 < WIDTH ? M - j0 : WIDTH;
        for (int64_t c = c0; c < c1; c++) {
            REAL *vc = v + c * M;
            const REAL *fc = field + c * M, *tc = thresholds ? thresholds + c * M + j0 : NULL;
            REAL drawn[WIDTH];
            if (!tc) {
                NAME(uniforms_into)(seed, c * M + j0, width, drawn);
                _Pragma("omp simd")
                for (int64_t l = 0; l < width; l++) drawn[l] = NAME(log)(drawn[l] / ((REAL)1 - drawn[l]));
                tc = drawn;
            }
            int32_t *list = on + (c - c0) * M, *where = place + (c - c0) * M, n = count[c - c0];
            REAL beta = jscale ? jscale[c] : 1;
            REAL acc[WIDTH];
            if (width == WIDTH) { /* WIDTH / lanes accumulators held in registers */
                enum { PER_REG = 32 / sizeof(REAL), REGS = WIDTH / PER_REG };
                NAME(vec) sum[REGS];
                for (int q = 0; q < REGS; q++) sum[q] = (NAME(vec)){0};
                for (int32_t i = 0; i < n; i++) {
                    const REAL *Jk = J + (int64_t)list[i] * M + j0;
                    for (int q = 0; q < REGS; q++) {
                        NAME(vec) row;
                        memcpy(&row, Jk + q * PER_REG, sizeof row);
                        sum[q] += row;
                    }
                }
                memcpy(acc, sum, sizeof acc);
            } else {
                for (int l = 0; l < WIDTH; l++) acc[l] = 0;
                for (int32_t i = 0; i < n; i++) {
                    const REAL *Jk = J + (int64_t)list[i] * M + j0;
                    for (int64_t l = 0; l < width; l++) acc[l] += Jk[l];
                }
            }
            for (int64_t t = 0; t < width; t++) {
                int64_t l = reverse ? width - 1 - t : t, j = j0 + l;
                REAL next = fc[j] + beta * acc[l] > tc[l] ? 1 : 0;
                REAL delta = next - vc[j];
                if (delta == 0) continue;
                const REAL *Jj = J + j * M + j0;
                for (int64_t m = 0; m < width; m++) acc[m] += delta * Jj[m];
                vc[j] = next;
                if (next != 0) { /* j joins the list */
                    where[j] = n;
                    list[n++] = (int32_t)j;
                } else { /* j leaves it: the last entry takes its place */
                    int32_t last = list[--n];
                    list[where[j]] = last;
                    where[last] = where[j];
                }
            }
            count[c - c0] = n;
        }
    }
}
