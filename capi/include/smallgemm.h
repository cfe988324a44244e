/* smallgemm: batched small GEMM with JIT-compiled kernels — C ABI.
 *
 * The functions take exactly the parameters of MKL's cblas_?gemm_batch_strided and
 * cblas_?gemm_batch, so a program ports by renaming its calls. They return 0 on success.
 * Invalid input returns -i for the first invalid argument i (1-based, the BLAS `info`
 * convention), writes nothing to any C, and leaves a message for smallgemm_last_error().
 * A size of 0 or an empty batch is a valid no-op; k = 0 scales C by beta (BLAS semantics).
 * A null pointer where there is work to do is an invalid argument.
 *
 * Other failures return a positive code:
 *   SMALLGEMM_ERROR_UNSUPPORTED_CPU  the CPU has neither AVX-512 nor AVX2 with FMA
 *   SMALLGEMM_ERROR_INTERNAL         code generation failed (a bug: please report it)
 *
 * Batches run on all cores (SMALLGEMM_NUM_THREADS limits the threads); each matrix is
 * computed by one thread, so results do not depend on the thread count.
 * Build: cargo build --release -p smallgemm-capi  (target/release/libsmallgemm.{so,a};
 * static linking also needs -lpthread -ldl -lm). */
#ifndef SMALLGEMM_H
#define SMALLGEMM_H

#ifdef __cplusplus
extern "C" {
#endif

/* CBLAS enum values. */
#define SMALLGEMM_ROW_MAJOR 101
#define SMALLGEMM_COL_MAJOR 102
#define SMALLGEMM_NO_TRANS 111
#define SMALLGEMM_TRANS 112
#define SMALLGEMM_CONJ_TRANS 113 /* = SMALLGEMM_TRANS for real types */

#define SMALLGEMM_ERROR_UNSUPPORTED_CPU 1
#define SMALLGEMM_ERROR_INTERNAL 2

/* C_i = alpha op(A_i) op(B_i) + beta C_i for i in [0, batch_size), matrix i of X at
 * x + i * stridex (elements). Strides of A and B may be 0 (one matrix for all); C matrices
 * must not overlap. */
int smallgemm_dgemm_batch_strided(int layout, int transa, int transb, int m, int n, int k,
                                  double alpha, const double *a, int lda, long long stridea,
                                  const double *b, int ldb, long long strideb, double beta,
                                  double *c, int ldc, long long stridec, int batch_size);
int smallgemm_sgemm_batch_strided(int layout, int transa, int transb, int m, int n, int k,
                                  float alpha, const float *a, int lda, long long stridea,
                                  const float *b, int ldb, long long strideb, float beta,
                                  float *c, int ldc, long long stridec, int batch_size);

/* group_count groups; group g has its own transposes, sizes, alpha, leading dimensions,
 * beta and group_size[g] products, whose pointers follow the previous groups' in a_array,
 * b_array and c_array. */
int smallgemm_dgemm_batch(int layout, const int *transa_array, const int *transb_array,
                          const int *m_array, const int *n_array, const int *k_array,
                          const double *alpha_array, const double **a_array,
                          const int *lda_array, const double **b_array, const int *ldb_array,
                          const double *beta_array, double **c_array, const int *ldc_array,
                          int group_count, const int *group_size);
int smallgemm_sgemm_batch(int layout, const int *transa_array, const int *transb_array,
                          const int *m_array, const int *n_array, const int *k_array,
                          const float *alpha_array, const float **a_array,
                          const int *lda_array, const float **b_array, const int *ldb_array,
                          const float *beta_array, float **c_array, const int *ldc_array,
                          int group_count, const int *group_size);

/* The message of this thread's last non-zero result ("" if none). The string stays valid
 * until this thread's next failing call. */
const char *smallgemm_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
