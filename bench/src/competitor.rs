//! The GEMM implementations under test, each behind one interface: run a strided batch of
//! column-major GEMMs (no transposes, tight leading dimensions) on slices, with the alpha and
//! beta values they were prepared with.

use std::sync::Arc;

use smallgemm::{Element, GemmSpec, Jit, Kernel, Operand};

use crate::ffi;

/// One implementation, prepared for one spec: runs `batch` matrices starting at the first
/// element of each slice. Shared by the threads of a measurement (each with its own C).
pub trait BatchGemm<T>: Send + Sync {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String>;
    /// Something the report should say about this implementation for this shape.
    fn note(&self) -> Option<String> {
        None
    }
}

/// Who competes. smallgemm first: every ratio is smallgemm / the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Competitor {
    Smallgemm,
    Libxsmm,
    MklJit,
    Openblas,
    NanoGemm,
    Matrixmultiply,
    Naive,
}

impl Competitor {
    pub const ALL: [Competitor; 7] = [
        Competitor::Smallgemm,
        Competitor::Libxsmm,
        Competitor::MklJit,
        Competitor::Openblas,
        Competitor::NanoGemm,
        Competitor::Matrixmultiply,
        Competitor::Naive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Competitor::Smallgemm => "smallgemm",
            Competitor::Libxsmm => "libxsmm",
            Competitor::MklJit => "mkl-jit",
            Competitor::Openblas => "openblas",
            Competitor::NanoGemm => "nano-gemm",
            Competitor::Matrixmultiply => "matrixmultiply",
            Competitor::Naive => "naive",
        }
    }

    pub fn from_name(name: &str) -> Option<Competitor> {
        Competitor::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Why this build cannot run it (its cargo feature is off), or `None`.
    pub fn missing_feature(self) -> Option<&'static str> {
        match self {
            Competitor::Libxsmm if !cfg!(feature = "libxsmm") => Some("libxsmm"),
            Competitor::MklJit if !cfg!(feature = "mkl") => Some("mkl"),
            Competitor::Openblas if !cfg!(feature = "openblas") => Some("openblas"),
            _ => None,
        }
    }

    /// Whether it can compute `alpha`, `beta` at all (LIBXSMM 1.17: alpha = 1, beta 0 or 1).
    pub fn supports(self, alpha: f64, beta: f64) -> Result<(), String> {
        match self {
            Competitor::Libxsmm if alpha != 1.0 || !(beta == 0.0 || beta == 1.0) => {
                Err("LIBXSMM 1.17 takes alpha = 1 and beta = 0 or 1 only".into())
            }
            _ => Ok(()),
        }
    }
}

/// Process-wide state the competitors need: smallgemm's JIT (its cache stays warm over the
/// run) and the dynamically loaded libraries.
pub struct Context {
    pub jit: Jit,
    #[cfg(feature = "mkl")]
    pub mkl: Result<Arc<ffi::mkl::Mkl>, String>,
}

impl Context {
    pub fn new(jit: Jit) -> Context {
        #[cfg(feature = "openblas")]
        ffi::openblas::single_threaded();
        #[cfg(feature = "libxsmm")]
        ffi::libxsmm::init();
        Context {
            jit,
            #[cfg(feature = "mkl")]
            mkl: ffi::mkl::Mkl::load().map(Arc::new),
        }
    }

    /// The name and version of each linked library, for the report.
    pub fn library_versions(&self) -> Vec<(Competitor, String)> {
        #[allow(unused_mut)] // pushed to only with features on
        let mut v = vec![(
            Competitor::Smallgemm,
            format!(
                "smallgemm {} ({})",
                env!("CARGO_PKG_VERSION"),
                self.jit.target()
            ),
        )];
        #[cfg(feature = "libxsmm")]
        v.push((Competitor::Libxsmm, ffi::libxsmm::version()));
        #[cfg(feature = "mkl")]
        v.push((
            Competitor::MklJit,
            match &self.mkl {
                Ok(m) => m.version(),
                Err(e) => format!("not loaded: {e}"),
            },
        ));
        #[cfg(feature = "openblas")]
        v.push((Competitor::Openblas, ffi::openblas::version()));
        v
    }
}

/// The element types the competitors are instantiated for, with each library's entry point.
pub trait Real: Element + ffi::Ffi {
    /// matrixmultiply's gemm for this type, column-major (column strides in elements).
    ///
    /// # Safety
    ///
    /// As `matrixmultiply::dgemm`: a, b and c point to m x k, k x n and m x n matrices
    /// with these strides, valid for reads (c also for writes), c not overlapping a or b.
    #[allow(clippy::too_many_arguments)]
    unsafe fn mm_gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        csa: isize,
        b: *const Self,
        csb: isize,
        beta: Self,
        c: *mut Self,
        csc: isize,
    );
    fn nano_plan(m: usize, n: usize, k: usize) -> nano_gemm::Plan<Self>;
}

impl Real for f64 {
    unsafe fn mm_gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        csa: isize,
        b: *const f64,
        csb: isize,
        beta: f64,
        c: *mut f64,
        csc: isize,
    ) {
        matrixmultiply::dgemm(m, k, n, alpha, a, 1, csa, b, 1, csb, beta, c, 1, csc)
    }
    fn nano_plan(m: usize, n: usize, k: usize) -> nano_gemm::Plan<f64> {
        nano_gemm::Plan::new_colmajor_lhs_and_dst_f64(m, n, k)
    }
}

impl Real for f32 {
    unsafe fn mm_gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        csa: isize,
        b: *const f32,
        csb: isize,
        beta: f32,
        c: *mut f32,
        csc: isize,
    ) {
        matrixmultiply::sgemm(m, k, n, alpha, a, 1, csa, b, 1, csb, beta, c, 1, csc)
    }
    fn nano_plan(m: usize, n: usize, k: usize) -> nano_gemm::Plan<f32> {
        nano_gemm::Plan::new_colmajor_lhs_and_dst_f32(m, n, k)
    }
}

/// The shape, strides and scalars every competitor needs, taken from the spec.
#[derive(Clone, Copy, Debug)]
pub struct Problem<T> {
    pub spec: GemmSpec,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub sa: usize,
    pub sb: usize,
    pub sc: usize,
    pub alpha: T,
    pub beta: T,
}

impl<T: Real> Problem<T> {
    pub fn new(spec: &GemmSpec, alpha: T, beta: T) -> Problem<T> {
        Problem {
            spec: *spec,
            m: spec.m(),
            n: spec.n(),
            k: spec.k(),
            lda: spec.ld(Operand::A),
            ldb: spec.ld(Operand::B),
            ldc: spec.ld(Operand::C),
            sa: spec.stride(Operand::A),
            sb: spec.stride(Operand::B),
            sc: spec.stride(Operand::C),
            alpha,
            beta,
        }
    }

    /// Checks that the slices hold `batch` matrices (what `Kernel::run` checks for
    /// smallgemm), so that the loops below may use raw pointers.
    pub fn check(&self, a: &[T], b: &[T], c: &[T], batch: usize) -> Result<(), String> {
        for (op, len) in [
            (Operand::A, a.len()),
            (Operand::B, b.len()),
            (Operand::C, c.len()),
        ] {
            let need = self.spec.required_len(op, batch);
            if len < need {
                return Err(format!(
                    "{op:?} holds {len} elements, {batch} matrices need {need}"
                ));
            }
        }
        Ok(())
    }
}

impl Competitor {
    /// Prepares this competitor for `spec` (column-major, no transposes) with the given
    /// alpha and beta: compiles, plans or dispatches its kernel.
    pub fn prepare<T: Real>(
        self,
        ctx: &Context,
        spec: &GemmSpec,
        alpha: T,
        beta: T,
    ) -> Result<Box<dyn BatchGemm<T>>, String> {
        if let Some(feature) = self.missing_feature() {
            return Err(format!("built without the `{feature}` feature"));
        }
        self.supports(alpha.to_f64(), beta.to_f64())?;
        let p = Problem::new(spec, alpha, beta);
        Ok(match self {
            Competitor::Smallgemm => Box::new(SmallgemmRun {
                kernel: ctx.jit.kernel(spec).map_err(|e| e.to_string())?,
                alpha,
                beta,
            }),
            Competitor::Naive => Box::new(Naive(p)),
            Competitor::Matrixmultiply => Box::new(Matrixmultiply(p)),
            Competitor::NanoGemm => Box::new(NanoGemm {
                plan: T::nano_plan(p.m, p.n, p.k),
                p,
            }),
            #[cfg(feature = "libxsmm")]
            Competitor::Libxsmm => Box::new(ffi::libxsmm::Libxsmm::new(p)?),
            #[cfg(feature = "openblas")]
            Competitor::Openblas => Box::new(ffi::openblas::Openblas(p)),
            #[cfg(feature = "mkl")]
            Competitor::MklJit => Box::new(ffi::mkl::MklJit::new(ctx.mkl.clone()?, p)?),
            #[allow(unreachable_patterns)]
            _ => return Err("not built in".into()),
        })
    }
}

struct SmallgemmRun<T> {
    kernel: Arc<Kernel>,
    alpha: T,
    beta: T,
}

impl<T: Real> BatchGemm<T> for SmallgemmRun<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        // The checked entry point: its checks are part of what a user pays.
        self.kernel
            .run(a, b, c, batch, self.alpha, self.beta)
            .map_err(|e| e.to_string())
    }
}

/// The textbook loop, in the cache-friendly order for column-major data (j, p, i), with the
/// BLAS rule that C is not read when beta = 0.
struct Naive<T>(Problem<T>);

impl<T: Real> BatchGemm<T> for Naive<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.0;
        p.check(a, b, c, batch)?;
        let zero = T::from_f64(0.0);
        for i in 0..batch {
            let (a, b) = (&a[i * p.sa..], &b[i * p.sb..]);
            let c = &mut c[i * p.sc..];
            for j in 0..p.n {
                let col = &mut c[j * p.ldc..j * p.ldc + p.m];
                if p.beta == zero {
                    col.fill(zero);
                } else {
                    col.iter_mut().for_each(|x| *x = p.beta * *x);
                }
                for l in 0..p.k {
                    let s = p.alpha * b[l + j * p.ldb];
                    let a_col = &a[l * p.lda..l * p.lda + p.m];
                    for (x, &y) in col.iter_mut().zip(a_col) {
                        *x = *x + s * y;
                    }
                }
            }
        }
        Ok(())
    }
}

/// matrixmultiply's gemm, called once per matrix.
struct Matrixmultiply<T>(Problem<T>);

impl<T: Real> BatchGemm<T> for Matrixmultiply<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.0;
        p.check(a, b, c, batch)?;
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        for i in 0..batch {
            // SAFETY: the slices hold the batch (checked); matrix i is inside them.
            unsafe {
                T::mm_gemm(
                    p.m,
                    p.k,
                    p.n,
                    p.alpha,
                    a.add(i * p.sa),
                    p.lda as isize,
                    b.add(i * p.sb),
                    p.ldb as isize,
                    p.beta,
                    c.add(i * p.sc),
                    p.ldc as isize,
                )
            }
        }
        Ok(())
    }
}

/// nano-gemm's plan for the shape, executed once per matrix. Its convention is
/// dst = alpha·dst + beta·lhs·rhs, so our alpha and beta change places.
struct NanoGemm<T: 'static> {
    plan: nano_gemm::Plan<T>,
    p: Problem<T>,
}

// SAFETY: a Plan is immutable after construction; its raw pointers point to the crate's
// static kernel and mask tables, so sharing it between threads is sound.
unsafe impl<T: Send + 'static> Send for NanoGemm<T> {}
// SAFETY: as above; execution only reads the plan.
unsafe impl<T: Sync + 'static> Sync for NanoGemm<T> {}

impl<T: Real> BatchGemm<T> for NanoGemm<T> {
    fn run(&self, a: &[T], b: &[T], c: &mut [T], batch: usize) -> Result<(), String> {
        let p = &self.p;
        p.check(a, b, c, batch)?;
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        for i in 0..batch {
            // SAFETY: the slices hold the batch (checked); the plan was made for m, n, k.
            unsafe {
                self.plan.execute_unchecked(
                    p.m,
                    p.n,
                    p.k,
                    c.add(i * p.sc),
                    1,
                    p.ldc as isize,
                    a.add(i * p.sa),
                    1,
                    p.lda as isize,
                    b.add(i * p.sb),
                    1,
                    p.ldb as isize,
                    p.beta,
                    p.alpha,
                    false,
                    false,
                )
            }
        }
        Ok(())
    }
}
