/* The C ABI against a naive reference: every function, both layouts, all transposes,
 * random and special alpha/beta, padded leading dimensions, groups, and invalid arguments
 * (which must return -i and leave C untouched). Built and run by scripts/test.sh with the
 * system cc against target/release/libsmallgemm.so and libsmallgemm.a. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smallgemm.h"

static int failures = 0;
static int checks = 0;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            if (failures <= 20) {                                                          \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
                fprintf(stderr, __VA_ARGS__);                                              \
                fprintf(stderr, "\n");                                                     \
            }                                                                              \
        }                                                                                  \
    } while (0)

static uint64_t rng_state = 42;
static double rnd(void) { /* nonzero, both signs, in [-1, -0.25] U [0.25, 1] */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0;
    double mag = 0.25 + 0.75 * u;
    return (rng_state >> 7) & 1 ? mag : -mag;
}
static int rnd_int(int lo, int hi) { /* inclusive */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int)((rng_state >> 33) % (uint64_t)(hi - lo + 1));
}

/* Element (i, j) of op(X) where X is stored with leading dimension ld. */
static size_t at(int layout, int trans, int i, int j, int ld) {
    int r = i, c = j;
    if (trans != SMALLGEMM_NO_TRANS) { r = j; c = i; }
    return layout == SMALLGEMM_COL_MAJOR ? (size_t)r + (size_t)c * ld : (size_t)r * ld + c;
}

/* The reference in long double, into a fresh copy; beta = 0 does not read C. */
static void reference(int layout, int ta, int tb, int m, int n, int k, double alpha,
                      const double *a, int lda, const double *b, int ldb, double beta,
                      double *c, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            long double s = 0;
            for (int p = 0; p < k; p++)
                s += (long double)a[at(layout, ta, i, p, lda)] * b[at(layout, tb, p, j, ldb)];
            size_t ci = at(layout, SMALLGEMM_NO_TRANS, i, j, ldc);
            long double old = beta == 0.0 ? 0.0L : (long double)beta * c[ci];
            c[ci] = (double)((long double)alpha * s + old);
        }
}

static size_t extent(int layout, int trans, int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return 0;
    int r = rows, c = cols;
    if (trans != SMALLGEMM_NO_TRANS) { r = cols; c = rows; }
    int lead = layout == SMALLGEMM_COL_MAJOR ? r : c, other = layout == SMALLGEMM_COL_MAJOR ? c : r;
    return (size_t)ld * (other - 1) + lead;
}

static int min_ld(int layout, int trans, int rows, int cols) {
    int r = rows, c = cols;
    if (trans != SMALLGEMM_NO_TRANS) { r = cols; c = rows; }
    int lead = layout == SMALLGEMM_COL_MAJOR ? r : c;
    return lead > 1 ? lead : 1;
}

static int close_enough(double got, double want, double scale, double eps, int k) {
    return fabs(got - want) <= 4.0 * (k + 3) * eps * (scale > 1.0 ? scale : 1.0);
}

static const int layouts[2] = {SMALLGEMM_COL_MAJOR, SMALLGEMM_ROW_MAJOR};
static const int transes[3] = {SMALLGEMM_NO_TRANS, SMALLGEMM_TRANS, SMALLGEMM_CONJ_TRANS};
static const double specials[6] = {0.0, 1.0, -1.0, 1.5, -0.75, 2.0};

static void test_strided_d(void) {
    for (int t = 0; t < 300; t++) {
        int layout = layouts[t % 2], ta = transes[rnd_int(0, 2)], tb = transes[rnd_int(0, 2)];
        int m = rnd_int(1, 40), n = rnd_int(1, 40), k = rnd_int(1, 40);
        if (t % 50 == 7) k = 0;
        int lda = min_ld(layout, ta, m, k) + rnd_int(0, 3);
        int ldb = min_ld(layout, tb, k, n) + rnd_int(0, 3);
        int ldc = min_ld(layout, SMALLGEMM_NO_TRANS, m, n) + rnd_int(0, 3);
        int batch = rnd_int(1, 9);
        size_t ea = extent(layout, ta, m, k, lda), eb = extent(layout, tb, k, n, ldb);
        size_t ec = extent(layout, SMALLGEMM_NO_TRANS, m, n, ldc);
        long long sa = (long long)ea + rnd_int(0, 5), sb = (long long)eb + rnd_int(0, 5);
        long long sc = (long long)ec + rnd_int(0, 5);
        if (t % 7 == 3) sa = 0; /* one A for the whole batch */
        double alpha = t % 3 ? specials[rnd_int(0, 5)] : rnd();
        double beta = t % 4 ? specials[rnd_int(0, 5)] : rnd();
        size_t la = sa * (batch - 1) + ea + 1, lb = sb * (batch - 1) + eb + 1;
        size_t lc = sc * (batch - 1) + ec + 1;
        double *a = malloc(la * sizeof *a), *b = malloc(lb * sizeof *b);
        double *c = malloc(lc * sizeof *c), *want = malloc(lc * sizeof *c);
        for (size_t i = 0; i < la; i++) a[i] = rnd();
        for (size_t i = 0; i < lb; i++) b[i] = rnd();
        for (size_t i = 0; i < lc; i++) c[i] = want[i] = rnd();
        for (int i = 0; i < batch; i++)
            reference(layout, ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta,
                      want + i * sc, ldc);
        int info = smallgemm_dgemm_batch_strided(layout, ta, tb, m, n, k, alpha, a, lda, sa, b,
                                                 ldb, sb, beta, c, ldc, sc, batch);
        CHECK(info == 0, "dgemm_batch_strided returned %d: %s", info, smallgemm_last_error());
        for (size_t i = 0; i < lc; i++)
            CHECK(close_enough(c[i], want[i], fabs(want[i]) + k, 1.1e-16, k),
                  "strided d case %d (m=%d n=%d k=%d layout=%d ta=%d tb=%d alpha=%g beta=%g): "
                  "c[%zu] = %.17g, want %.17g", t, m, n, k, layout, ta, tb, alpha, beta, i, c[i],
                  want[i]);
        free(a); free(b); free(c); free(want);
    }
}

static void test_strided_s(void) {
    for (int t = 0; t < 150; t++) {
        int layout = layouts[t % 2], ta = transes[rnd_int(0, 2)], tb = transes[rnd_int(0, 2)];
        int m = rnd_int(1, 33), n = rnd_int(1, 33), k = rnd_int(1, 33), batch = rnd_int(1, 6);
        int lda = min_ld(layout, ta, m, k) + rnd_int(0, 2);
        int ldb = min_ld(layout, tb, k, n) + rnd_int(0, 2);
        int ldc = min_ld(layout, SMALLGEMM_NO_TRANS, m, n) + rnd_int(0, 2);
        size_t ea = extent(layout, ta, m, k, lda), eb = extent(layout, tb, k, n, ldb);
        size_t ec = extent(layout, SMALLGEMM_NO_TRANS, m, n, ldc);
        float alpha = (float)(t % 3 ? specials[rnd_int(0, 5)] : rnd());
        float beta = (float)(t % 4 ? specials[rnd_int(0, 5)] : rnd());
        size_t la = ea * batch, lb = eb * batch, lc = ec * batch;
        float *a = malloc(la * sizeof *a), *b = malloc(lb * sizeof *b), *c = malloc(lc * sizeof *c);
        double *ad = malloc(la * sizeof *ad), *bd = malloc(lb * sizeof *bd), *want = malloc(lc * sizeof *want);
        for (size_t i = 0; i < la; i++) ad[i] = a[i] = (float)rnd();
        for (size_t i = 0; i < lb; i++) bd[i] = b[i] = (float)rnd();
        for (size_t i = 0; i < lc; i++) want[i] = c[i] = (float)rnd();
        for (int i = 0; i < batch; i++)
            reference(layout, ta, tb, m, n, k, alpha, ad + i * ea, lda, bd + i * eb, ldb, beta,
                      want + i * ec, ldc);
        int info = smallgemm_sgemm_batch_strided(layout, ta, tb, m, n, k, alpha, a, lda,
                                                 (long long)ea, b, ldb, (long long)eb, beta, c,
                                                 ldc, (long long)ec, batch);
        CHECK(info == 0, "sgemm_batch_strided returned %d: %s", info, smallgemm_last_error());
        for (size_t i = 0; i < lc; i++)
            CHECK(close_enough(c[i], want[i], fabs(want[i]) + k, 6e-8, k),
                  "strided s case %d: c[%zu] = %.9g, want %.9g", t, i, c[i], want[i]);
        free(a); free(b); free(c); free(ad); free(bd); free(want);
    }
}

static void test_grouped_d(void) {
    for (int t = 0; t < 60; t++) {
        int layout = layouts[t % 2], groups = rnd_int(1, 5);
        int ta[5], tb[5], m[5], n[5], k[5], lda[5], ldb[5], ldc[5], size[5];
        double alpha[5], beta[5];
        int total = 0;
        for (int g = 0; g < groups; g++) {
            ta[g] = transes[rnd_int(0, 2)]; tb[g] = transes[rnd_int(0, 2)];
            m[g] = rnd_int(0, 20); n[g] = rnd_int(1, 20); k[g] = rnd_int(0, 20);
            lda[g] = min_ld(layout, ta[g], m[g], k[g]) + rnd_int(0, 2);
            ldb[g] = min_ld(layout, tb[g], k[g], n[g]) + rnd_int(0, 2);
            ldc[g] = min_ld(layout, SMALLGEMM_NO_TRANS, m[g], n[g]) + rnd_int(0, 2);
            alpha[g] = specials[rnd_int(0, 5)]; beta[g] = g % 2 ? rnd() : specials[rnd_int(0, 5)];
            size[g] = rnd_int(0, 6);
            total += size[g];
        }
        const double **ap = malloc((total + 1) * sizeof *ap), **bp = malloc((total + 1) * sizeof *bp);
        double **cp = malloc((total + 1) * sizeof *cp), **wp = malloc((total + 1) * sizeof *wp);
        size_t *lc = malloc((total + 1) * sizeof *lc);
        int i = 0;
        for (int g = 0; g < groups; g++)
            for (int s = 0; s < size[g]; s++, i++) {
                size_t la = extent(layout, ta[g], m[g], k[g], lda[g]) + 1;
                size_t lb = extent(layout, tb[g], k[g], n[g], ldb[g]) + 1;
                lc[i] = extent(layout, SMALLGEMM_NO_TRANS, m[g], n[g], ldc[g]) + 1;
                double *a = malloc(la * sizeof *a), *b = malloc(lb * sizeof *b);
                cp[i] = malloc(lc[i] * sizeof **cp); wp[i] = malloc(lc[i] * sizeof **wp);
                for (size_t x = 0; x < la; x++) a[x] = rnd();
                for (size_t x = 0; x < lb; x++) b[x] = rnd();
                for (size_t x = 0; x < lc[i]; x++) cp[i][x] = wp[i][x] = rnd();
                ap[i] = a; bp[i] = b;
                reference(layout, ta[g], tb[g], m[g], n[g], k[g], alpha[g], a, lda[g], b, ldb[g],
                          beta[g], wp[i], ldc[g]);
            }
        int info = smallgemm_dgemm_batch(layout, ta, tb, m, n, k, alpha, ap, lda, bp, ldb, beta,
                                         cp, ldc, groups, size);
        CHECK(info == 0, "dgemm_batch returned %d: %s", info, smallgemm_last_error());
        i = 0;
        for (int g = 0; g < groups; g++)
            for (int s = 0; s < size[g]; s++, i++)
                for (size_t x = 0; x < lc[i]; x++)
                    CHECK(close_enough(cp[i][x], wp[i][x], fabs(wp[i][x]) + k[g], 1.1e-16, k[g]),
                          "grouped case %d group %d: c[%zu] = %.17g, want %.17g", t, g, x,
                          cp[i][x], wp[i][x]);
        for (int x = 0; x < total; x++) {
            free((void *)ap[x]); free((void *)bp[x]); free(cp[x]); free(wp[x]);
        }
        free(ap); free(bp); free(cp); free(wp); free(lc);
    }
}

static void test_grouped_s(void) {
    /* Two groups of float products, one row-major transposed. */
    float a[2][12], b[2][12], c[2][12], want[2][12];
    double ad[2][12], bd[2][12], wd[2][12];
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 12; y++) {
            ad[x][y] = a[x][y] = (float)rnd(); bd[x][y] = b[x][y] = (float)rnd();
            wd[x][y] = c[x][y] = (float)rnd();
        }
    int ta[2] = {SMALLGEMM_NO_TRANS, SMALLGEMM_TRANS}, tb[2] = {SMALLGEMM_TRANS, SMALLGEMM_NO_TRANS};
    int m[2] = {3, 2}, n[2] = {2, 3}, k[2] = {4, 4}, lda[2] = {4, 2}, ldb[2] = {4, 3}, ldc[2] = {2, 3};
    float alpha[2] = {1.0f, -0.5f}, beta[2] = {0.0f, 2.0f};
    int size[2] = {1, 1};
    const float *ap[2] = {a[0], a[1]}, *bp[2] = {b[0], b[1]};
    float *cp[2] = {c[0], c[1]};
    for (int g = 0; g < 2; g++)
        reference(SMALLGEMM_ROW_MAJOR, ta[g], tb[g], m[g], n[g], k[g], alpha[g], ad[g], lda[g],
                  bd[g], ldb[g], beta[g], wd[g], ldc[g]);
    int info = smallgemm_sgemm_batch(SMALLGEMM_ROW_MAJOR, ta, tb, m, n, k, alpha, ap, lda, bp,
                                     ldb, beta, cp, ldc, 2, size);
    CHECK(info == 0, "sgemm_batch returned %d: %s", info, smallgemm_last_error());
    for (int g = 0; g < 2; g++)
        for (int y = 0; y < 12; y++) {
            want[g][y] = (float)wd[g][y];
            CHECK(fabsf(c[g][y] - want[g][y]) <= 1e-5f * (1 + fabsf(want[g][y])),
                  "sgemm_batch group %d c[%d] = %g, want %g", g, y, c[g][y], want[g][y]);
        }
}

static void test_invalid(void) {
    double a[64], b[64], c[64], keep[64];
    for (int i = 0; i < 64; i++) a[i] = b[i] = keep[i] = c[i] = rnd();
    const int CM = SMALLGEMM_COL_MAJOR, N = SMALLGEMM_NO_TRANS;
#define STRIDED(expect, ...)                                                                 \
    do {                                                                                   \
        int info = smallgemm_dgemm_batch_strided(__VA_ARGS__);                             \
        CHECK(info == (expect), "strided: expected %d, got %d (%s)", expect, info,         \
              smallgemm_last_error());                                                     \
        CHECK(memcmp(c, keep, sizeof c) == 0, "strided: C changed after error %d", expect); \
        if ((expect) != 0)                                                                 \
            CHECK(strlen(smallgemm_last_error()) > 0, "no message for %d", expect);         \
    } while (0)
    STRIDED(-1, 7, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-2, CM, 5, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-3, CM, N, 0, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-4, CM, N, N, -1, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-5, CM, N, N, 2, -2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-6, CM, N, N, 2, 2, -3, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-8, CM, N, N, 2, 2, 2, 1.0, NULL, 2, 4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-9, CM, N, N, 3, 2, 2, 1.0, a, 2, 6, b, 2, 4, 0.0, c, 3, 6, 2);
    STRIDED(-10, CM, N, N, 2, 2, 2, 1.0, a, 2, -4, b, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-11, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, NULL, 2, 4, 0.0, c, 2, 4, 2);
    STRIDED(-12, CM, SMALLGEMM_TRANS, SMALLGEMM_TRANS, 2, 3, 2, 1.0, a, 2, 4, b, 2, 6, 0.0, c, 2, 6, 2);
    STRIDED(-13, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, -1, 0.0, c, 2, 4, 2);
    STRIDED(-15, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, NULL, 2, 4, 2);
    STRIDED(-16, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 1, 4, 2);
    STRIDED(-17, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 3, 2);
    STRIDED(-18, CM, N, N, 2, 2, 2, 1.0, a, 2, 4, b, 2, 4, 0.0, c, 2, 4, -1);
    /* Valid no-ops: no work, so null pointers are fine and nothing changes. */
    STRIDED(0, CM, N, N, 0, 2, 2, 1.0, NULL, 1, 0, NULL, 2, 0, 0.0, NULL, 1, 0, 5);
    STRIDED(0, CM, N, N, 2, 2, 2, 1.0, NULL, 2, 4, NULL, 2, 4, 0.0, NULL, 2, 4, 0);
    STRIDED(0, CM, N, N, 2, 2, 0, 1.0, NULL, 2, 4, NULL, 1, 4, 1.0, c, 2, 4, 2);
    /* The first invalid argument wins. */
    STRIDED(-4, CM, N, N, -1, -1, 2, 1.0, NULL, 0, 4, b, 2, 4, 0.0, c, 2, 4, 2);

    int ta[2] = {N, N}, tb[2] = {N, N}, m[2] = {2, 2}, n[2] = {2, 2}, k[2] = {2, 2};
    int lda[2] = {2, 2}, ldb[2] = {2, 2}, ldc[2] = {2, 2}, size[2] = {1, 1};
    double al[2] = {1, 1}, be[2] = {0, 0};
    const double *ap[2] = {a, a + 8}, *bp[2] = {b, b + 8};
    double *cp[2] = {c, c + 8};
#define GROUPED(expect, ...)                                                                 \
    do {                                                                                   \
        int info = smallgemm_dgemm_batch(__VA_ARGS__);                                     \
        CHECK(info == (expect), "grouped: expected %d, got %d (%s)", expect, info,         \
              smallgemm_last_error());                                                     \
        CHECK(memcmp(c, keep, sizeof c) == 0, "grouped: C changed after error %d", expect); \
    } while (0)
    int bad_trans[2] = {N, 99}, neg[2] = {2, -1}, small_ld[2] = {2, 1}, bad_size[2] = {1, -1};
    GROUPED(-1, 0, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-2, CM, bad_trans, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-3, CM, ta, NULL, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-4, CM, ta, tb, neg, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-6, CM, ta, tb, m, n, neg, al, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-7, CM, ta, tb, m, n, k, NULL, ap, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-8, CM, ta, tb, m, n, k, al, NULL, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-9, CM, ta, tb, m, n, k, al, ap, small_ld, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(-10, CM, ta, tb, m, n, k, al, ap, lda, NULL, ldb, be, cp, ldc, 2, size);
    GROUPED(-11, CM, ta, tb, m, n, k, al, ap, lda, bp, small_ld, be, cp, ldc, 2, size);
    GROUPED(-12, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, NULL, cp, ldc, 2, size);
    GROUPED(-13, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, NULL, ldc, 2, size);
    GROUPED(-14, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, small_ld, 2, size);
    GROUPED(-15, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, -1, size);
    GROUPED(-16, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, bad_size);
    GROUPED(-16, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 2, NULL);
    const double *null_entry[2] = {a, NULL};
    GROUPED(-8, CM, ta, tb, m, n, k, al, null_entry, lda, bp, ldb, be, cp, ldc, 2, size);
    GROUPED(0, CM, ta, tb, m, n, k, al, ap, lda, bp, ldb, be, cp, ldc, 0, NULL);
}

int main(void) {
    test_strided_d();
    test_strided_s();
    test_grouped_d();
    test_grouped_s();
    test_invalid();
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
