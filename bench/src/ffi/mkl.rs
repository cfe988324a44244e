//! MKL's JIT (`mkl_cblas_jit_create_?gemm`), from the PyPI wheels `mkl`/`mkl-devel`.
//!
//! libmkl_rt is loaded at run time (dlopen) rather than linked: pip puts it under the Python
//! prefix, which no linker or loader searches, and a dependency's build script cannot give
//! the final binary an rpath. The build script records where it found the library
//! (`SMALLGEMM_MKL_LIB_DIR`); `MKL_LIB_DIR` at run time overrides it.

use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::Arc;

use libloading::Library;

use crate::competitor::{BatchGemm, Problem, Real};

const COL_MAJOR: c_int = 102;
const NO_TRANS: c_int = 111;
const JIT_SUCCESS: c_int = 0;
/// The jitter exists but calls the standard gemm (no specialised code for this shape).
const NO_JIT: c_int = 1;

/// `mkl_cblas_jit_create_?gemm(jitter, layout, transa, transb, m, n, k, alpha, lda, ldb,
/// beta, ldc)`.
pub type CreateFn<T> = unsafe extern "C" fn(
    *mut *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    T,
    c_int,
    c_int,
    T,
    c_int,
) -> c_int;
/// A JIT kernel: `void (*)(void* jitter, T* a, T* b, T* c)`.
pub type KernelFn<T> = unsafe extern "C" fn(*mut c_void, *mut T, *mut T, *mut T);
/// `mkl_jit_get_?gemm_ptr(jitter)`.
pub type GetFn<T> = unsafe extern "C" fn(*const c_void) -> Option<KernelFn<T>>;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_char, c_int);

/// libmkl_rt, loaded, with the entry points the bench uses.
pub struct Mkl {
    pub create_d: CreateFn<f64>,
    pub create_s: CreateFn<f32>,
    pub get_d: GetFn<f64>,
    pub get_s: GetFn<f32>,
    destroy: DestroyFn,
    version: VersionFn,
    path: PathBuf,
    // Keeps the code above mapped; dropped last.
    _lib: Library,
}

/// Where to look for libmkl_rt, most specific first.
fn candidates() -> Vec<PathBuf> {
    let names = ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"];
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("MKL_LIB_DIR") {
        dirs.push(d.into());
    }
    if let Some(d) = option_env!("SMALLGEMM_MKL_LIB_DIR").filter(|d| !d.is_empty()) {
        dirs.push(d.into());
    }
    let mut paths: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .collect();
    // Last, the loader's own search (LD_LIBRARY_PATH, ld.so.cache).
    paths.extend(names.iter().map(PathBuf::from));
    paths
}

impl Mkl {
    pub fn load() -> Result<Mkl, String> {
        let mut tried = Vec::new();
        for path in candidates() {
            // SAFETY: loading libmkl_rt runs its initialisers, which have no preconditions.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Mkl::from_library(lib, path),
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(format!(
            "libmkl_rt not found (pip install mkl mkl-devel; or set MKL_LIB_DIR): {}",
            tried.join("; ")
        ))
    }

    fn from_library(lib: Library, path: PathBuf) -> Result<Mkl, String> {
        fn sym<F: Copy>(lib: &Library, name: &[u8]) -> Result<F, String> {
            // SAFETY: every caller names F as the symbol's C signature from MKL's headers
            // (mkl_cblas.h, mkl_service.h); the pointers are used only while the library
            // stays loaded (it is kept in `Mkl`).
            unsafe { lib.get::<F>(name) }
                .map(|s| *s)
                .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))
        }
        Ok(Mkl {
            create_d: sym(&lib, b"mkl_cblas_jit_create_dgemm\0")?,
            create_s: sym(&lib, b"mkl_cblas_jit_create_sgemm\0")?,
            get_d: sym(&lib, b"mkl_jit_get_dgemm_ptr\0")?,
            get_s: sym(&lib, b"mkl_jit_get_sgemm_ptr\0")?,
            destroy: sym(&lib, b"mkl_jit_destroy\0")?,
            version: sym(&lib, b"mkl_get_version_string\0")?,
            path,
            _lib: lib,
        })
    }

    pub fn version(&self) -> String {
        let mut buf = [0 as c_char; 256];
        // SAFETY: writes at most len bytes, NUL-terminated.
        unsafe { (self.version)(buf.as_mut_ptr(), buf.len() as c_int) };
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        format!(
            "{} ({})",
            String::from_utf8_lossy(&bytes).trim(),
            self.path.display()
        )
    }
}

fn int(x: usize) -> Result<c_int, String> {
    c_int::try_from(x).map_err(|_| format!("{x} does not fit an MKL int"))
}

/// One MKL jitter: created for a shape, destroyed on drop.
pub struct MklJit<T> {
    mkl: Arc<Mkl>,
    jitter: *mut c_void,
    kernel: KernelFn<T>,
    /// Whether MKL generated code (false: the jitter calls the standard gemm).
    pub jitted: bool,
    p: Problem<T>,
}

// SAFETY: a jitter is immutable after creation and MKL documents its kernels as callable
// from several threads at once.
unsafe impl<T: Send> Send for MklJit<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for MklJit<T> {}

impl<T: Real> MklJit<T> {
    pub fn new(mkl: Arc<Mkl>, p: Problem<T>) -> Result<Self, String> {
        let (create, get) = T::mkl_entry(&mkl);
        let mut jitter: *mut c_void = std::ptr::null_mut();
        // SAFETY: `jitter` is a valid out-pointer; the arguments follow mkl_cblas.h.
        let status = unsafe {
            create(
                &mut jitter,
                COL_MAJOR,
                NO_TRANS,
                NO_TRANS,
                int(p.m)?,
                int(p.n)?,
                int(p.k)?,
                p.alpha,
                int(p.lda)?,
                int(p.ldb)?,
                p.beta,
                int(p.ldc)?,
            )
        };
        if !(status == JIT_SUCCESS || status == NO_JIT) || jitter.is_null() {
            return Err(format!("mkl_jit_create failed (status {status})"));
        }
        // SAFETY: jitter was just created.
        let Some(kernel) = (unsafe { get(jitter) }) else {
            // SAFETY: jitter was created above and is not used again.
            unsafe { (mkl.destroy)(jitter) };
            return Err("mkl_jit_get_gemm_ptr returned null".into());
        };
        Ok(MklJit {
            mkl,
            jitter,
            kernel,
            jitted: status == JIT_SUCCESS,
            p,
        })
    }
}

impl<T> Drop for MklJit<T> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, no kernel call outlives self.
        unsafe { (self.mkl.destroy)(self.jitter) };
    }
}

impl<T: Real> BatchGemm<T> for MklJit<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.p;
        p.check(a, b, c, batch)?;
        // MKL's kernel signature takes mutable A and B; it only reads them.
        let (a, b, c) = (a.as_ptr() as *mut T, b.as_ptr() as *mut T, c.as_mut_ptr());
        for i in 0..batch {
            // SAFETY: the slices hold the batch (checked); the kernel reads A and B and
            // writes C of one matrix, as created for this shape.
            unsafe {
                (self.kernel)(
                    self.jitter,
                    a.add(i * p.sa),
                    b.add(i * p.sb),
                    c.add(i * p.sc),
                )
            }
        }
        Ok(())
    }

    fn note(&self) -> Option<String> {
        (!self.jitted).then(|| "MKL generated no JIT code (standard gemm)".to_string())
    }
}
