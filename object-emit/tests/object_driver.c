/* Links smallgemm-emitted object kernels (see kernels.list) with only cc and checks them
 * against a naive reference. The header comes from `smallgemm emit --header`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

static unsigned long long state = 7;
static double rnd(void) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(state >> 11) / 9007199254740992.0;
    return (state >> 9) & 1 ? 0.25 + 0.75 * u : -0.25 - 0.75 * u;
}

static int failures = 0;

/* Column-major reference for one batch; `ta`/`tb` say whether op() transposes. */
static void check(const char *name, int m, int n, int k, int ta, int tb, int lda, int ldb,
                  double alpha, double beta, const double *a, const double *b,
                  const double *c0, const double *c, int batch, int is_float) {
    int ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
    size_t sa = (size_t)lda * (ca - 1) + ra, sb = (size_t)ldb * (cb - 1) + rb, sc = (size_t)m * n;
    for (int i = 0; i < batch; i++)
        for (int col = 0; col < n; col++)
            for (int row = 0; row < m; row++) {
                double s = 0, mag = 0;
                for (int p = 0; p < k; p++) {
                    double x = ta ? a[i * sa + p + (size_t)row * lda] : a[i * sa + row + (size_t)p * lda];
                    double y = tb ? b[i * sb + col + (size_t)p * ldb] : b[i * sb + p + (size_t)col * ldb];
                    s += x * y;
                    mag += fabs(x * y);
                }
                size_t at = i * sc + row + (size_t)col * m;
                double want = alpha * s + (beta == 0 ? 0 : beta * c0[at]);
                double old = beta == 0 ? 0 : fabs(beta * c0[at]); /* C is NaN when beta = 0 */
                double tol = (is_float ? 1e-6 : 1e-14) * (k + 3) * (fabs(alpha) * mag + old + 1);
                if (!(fabs(c[at] - want) <= tol)) {
                    if (failures++ < 10)
                        fprintf(stderr, "FAIL %s: matrix %d C[%d,%d] = %.17g, want %.17g\n", name, i,
                                row, col, c[at], want);
                }
            }
}

#define BATCH 5
#define RUN(T, NAME, M, N, K, TA, TB, LDA, LDB, ALPHA, BETA, CALL)                           \
    do {                                                                                     \
        int ra = TA ? K : M, ca = TA ? M : K, rb = TB ? N : K, cb = TB ? K : N;              \
        size_t sa = (size_t)(LDA) * (ca - 1) + ra, sb = (size_t)(LDB) * (cb - 1) + rb;       \
        size_t la = sa * BATCH, lb = sb * BATCH, lc = (size_t)(M) * (N) * BATCH;             \
        T *a = malloc(la * sizeof(T)), *b = malloc(lb * sizeof(T)), *c = malloc(lc * sizeof(T)); \
        double *ad = malloc(la * 8), *bd = malloc(lb * 8), *c0 = malloc(lc * 8), *c1 = malloc(lc * 8); \
        for (size_t x = 0; x < la; x++) ad[x] = a[x] = (T)rnd();                             \
        for (size_t x = 0; x < lb; x++) bd[x] = b[x] = (T)rnd();                             \
        for (size_t x = 0; x < lc; x++) c0[x] = c[x] = (BETA) == 0 ? NAN : (T)rnd();         \
        CALL;                                                                                \
        for (size_t x = 0; x < lc; x++) c1[x] = c[x];                                        \
        check(NAME, M, N, K, TA, TB, LDA, LDB, ALPHA, BETA, ad, bd, c0, c1, BATCH,           \
              sizeof(T) == 4);                                                               \
        free(a); free(b); free(c); free(ad); free(bd); free(c0); free(c1);                   \
    } while (0)

int main(void) {
#ifdef NEEDS_AVX512
    if (!__builtin_cpu_supports("avx512f")) {
        printf("skipped: this CPU has no AVX-512\n");
        return 0;
    }
#endif
    RUN(double, "k_d8", 8, 8, 8, 0, 0, 8, 8, 1.0, 0.0, k_d8(a, b, c, BATCH));
    RUN(double, "k_d13_rt", 13, 5, 7, 0, 0, 13, 7, 0.75, -1.5, k_d13_rt(a, b, c, BATCH, 0.75, -1.5));
    RUN(float, "k_s9_ta", 9, 3, 4, 1, 0, 4, 4, -2.0f, 1.0f, k_s9_ta(a, b, c, BATCH, -2.0f));
    RUN(double, "k_d5_tb", 5, 6, 3, 0, 1, 7, 6, 2.5, 0.25, k_d5_tb(a, b, c, BATCH, 0.25));
    RUN(float, "k_s17_fixed", 17, 2, 33, 0, 0, 17, 33, -1.0f, 0.5f, k_s17_fixed(a, b, c, BATCH));
    printf("%d failed\n", failures);
    return failures != 0;
}
