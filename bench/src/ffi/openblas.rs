//! OpenBLAS (the system library, `libopenblas-dev`): a loop of `cblas_?gemm`, one call per
//! matrix, with OpenBLAS's own threading off (the bench splits the batch over threads).

use std::ffi::{c_char, c_int, CStr};

use crate::competitor::{BatchGemm, Problem, Real};

const COL_MAJOR: c_int = 102;
const NO_TRANS: c_int = 111;

/// `cblas_dgemm` / `cblas_sgemm`.
pub type CblasGemm<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    T,
    *const T,
    c_int,
    *const T,
    c_int,
    T,
    *mut T,
    c_int,
);

// Linked by the build script (`-l openblas`).
extern "C" {
    pub fn cblas_dgemm(
        layout: c_int,
        transa: c_int,
        transb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        b: *const f64,
        ldb: c_int,
        beta: f64,
        c: *mut f64,
        ldc: c_int,
    );
    pub fn cblas_sgemm(
        layout: c_int,
        transa: c_int,
        transb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    fn openblas_set_num_threads(n: c_int);
    fn openblas_get_config() -> *const c_char;
}

/// One thread inside OpenBLAS: every call is one small GEMM, and threads are ours.
pub fn single_threaded() {
    // SAFETY: plain setter, no preconditions.
    unsafe { openblas_set_num_threads(1) }
}

pub fn version() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string (or null).
    let p = unsafe { openblas_get_config() };
    if p.is_null() {
        return "OpenBLAS".into();
    }
    // SAFETY: non-null, NUL-terminated, static.
    format!(
        "OpenBLAS {}",
        unsafe { CStr::from_ptr(p) }.to_string_lossy()
    )
}

pub struct Openblas<T>(pub Problem<T>);

fn int(x: usize) -> Result<c_int, String> {
    c_int::try_from(x).map_err(|_| format!("{x} does not fit a BLAS int"))
}

impl<T: Real> BatchGemm<T> for Openblas<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.0;
        p.check(a, b, c, batch)?;
        let (m, n, k) = (int(p.m)?, int(p.n)?, int(p.k)?);
        let (lda, ldb, ldc) = (int(p.lda)?, int(p.ldb)?, int(p.ldc)?);
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        for i in 0..batch {
            // SAFETY: the slices hold the batch (checked); matrix i is inside them.
            unsafe {
                T::CBLAS_GEMM(
                    COL_MAJOR,
                    NO_TRANS,
                    NO_TRANS,
                    m,
                    n,
                    k,
                    p.alpha,
                    a.add(i * p.sa),
                    lda,
                    b.add(i * p.sb),
                    ldb,
                    p.beta,
                    c.add(i * p.sc),
                    ldc,
                )
            }
        }
        Ok(())
    }
}
