//! LIBXSMM 1.17 (the system library, Debian's `libxsmm-dev`, linked statically): its JIT
//! kernel for the shape, dispatched once and called in a loop, one call per matrix, without
//! prefetch arguments. It takes alpha = 1 and beta = 0 or 1 only.

use std::ffi::{c_char, c_int, CStr};

use crate::competitor::{BatchGemm, Problem, Real};

/// A LIBXSMM kernel: `void (*)(const T* a, const T* b, T* c, ...)`.
pub type Kernel<T> = unsafe extern "C" fn(*const T, *const T, *mut T, ...);

/// `libxsmm_dmmdispatch` / `libxsmm_smmdispatch`.
pub type Dispatch<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const T,
    *const T,
    *const c_int,
    *const c_int,
) -> Option<Kernel<T>>;

// Linked by the build script (static libxsmm).
extern "C" {
    fn libxsmm_init();
    fn libxsmm_get_target_arch() -> *const c_char;
    pub fn libxsmm_dmmdispatch(
        m: c_int,
        n: c_int,
        k: c_int,
        lda: *const c_int,
        ldb: *const c_int,
        ldc: *const c_int,
        alpha: *const f64,
        beta: *const f64,
        flags: *const c_int,
        prefetch: *const c_int,
    ) -> Option<Kernel<f64>>;
    pub fn libxsmm_smmdispatch(
        m: c_int,
        n: c_int,
        k: c_int,
        lda: *const c_int,
        ldb: *const c_int,
        ldc: *const c_int,
        alpha: *const f32,
        beta: *const f32,
        flags: *const c_int,
        prefetch: *const c_int,
    ) -> Option<Kernel<f32>>;
}

const FLAGS_NONE: c_int = 0;
const PREFETCH_NONE: c_int = 0;

pub fn init() {
    // SAFETY: idempotent library initialisation.
    unsafe { libxsmm_init() }
}

pub fn version() -> String {
    // SAFETY: returns a static NUL-terminated string (or null).
    let arch = unsafe { libxsmm_get_target_arch() };
    let arch = if arch.is_null() {
        "?".into()
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(arch) }
            .to_string_lossy()
            .into_owned()
    };
    format!(
        "LIBXSMM {} (JIT target {arch})",
        option_env!("SMALLGEMM_LIBXSMM_VERSION").unwrap_or("1.17")
    )
}

fn int(x: usize) -> Result<c_int, String> {
    c_int::try_from(x).map_err(|_| format!("{x} does not fit a LIBXSMM int"))
}

/// Dispatches (JIT-compiles on first request, then looks up) the kernel for `p`'s shape
/// with leading dimension of A `lda` (the latency probe varies it to force new kernels).
pub fn dispatch<T: Real>(p: &Problem<T>, lda: usize) -> Result<Kernel<T>, String> {
    let (m, n, k) = (int(p.m)?, int(p.n)?, int(p.k)?);
    let (lda, ldb, ldc) = (int(lda)?, int(p.ldb)?, int(p.ldc)?);
    let (flags, prefetch) = (FLAGS_NONE, PREFETCH_NONE);
    // SAFETY: every pointer points to a live local for the duration of the call.
    let kernel = unsafe {
        T::XSMM_DISPATCH(
            m, n, k, &lda, &ldb, &ldc, &p.alpha, &p.beta, &flags, &prefetch,
        )
    };
    kernel.ok_or_else(|| format!("LIBXSMM has no kernel for {}x{}x{}", p.m, p.n, p.k))
}

pub struct Libxsmm<T> {
    kernel: Kernel<T>,
    p: Problem<T>,
}

impl<T: Real> Libxsmm<T> {
    pub fn new(p: Problem<T>) -> Result<Self, String> {
        Ok(Libxsmm {
            kernel: dispatch(&p, p.lda)?,
            p,
        })
    }
}

impl<T: Real> BatchGemm<T> for Libxsmm<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.p;
        p.check(a, b, c, batch)?;
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        for i in 0..batch {
            // SAFETY: the slices hold the batch (checked); the kernel was generated for this
            // shape and reads A and B, reads and writes C, of one matrix.
            unsafe { (self.kernel)(a.add(i * p.sa), b.add(i * p.sb), c.add(i * p.sc)) }
        }
        Ok(())
    }
}
