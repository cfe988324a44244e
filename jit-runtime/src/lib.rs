//! smallgemm: batched small matrix multiplication with JIT-compiled kernels.
//!
//! For each GEMM shape it generates machine code specialised to that shape (sizes, leading
//! dimensions, transposes, alpha/beta kinds and batch strides are constants in the code),
//! register-blocked for AVX-512 or AVX2, and caches it. One call runs a whole strided batch.
//!
//! ```
//! use smallgemm::{Dtype, GemmSpec, Jit, Scalar};
//!
//! # fn main() -> Result<(), smallgemm::Error> {
//! # if smallgemm::supported_isas().is_empty() { return Ok(()); }
//! let (m, n, k, batch) = (4, 4, 4, 1000);
//! let spec = GemmSpec::builder(Dtype::F64, m, n, k)
//!     .alpha(Scalar::One)
//!     .beta(Scalar::Runtime)
//!     .build()?;
//! let a = vec![1.0; m * k * batch];
//! let b = vec![2.0; k * n * batch];
//! let mut c = vec![0.5; m * n * batch];
//! let jit = Jit::new()?; // or smallgemm::global()?
//! let kernel = jit.kernel(&spec)?; // compiled once, then cached
//! kernel.run(&a, &b, &mut c, batch, 1.0, 2.0)?; // C = A B + 2 C, for every matrix
//! assert_eq!(c[0], 4.0 * 2.0 + 1.0);
//! # Ok(())
//! # }
//! ```

mod batch;
mod cache;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod exec;
mod kernel;
mod perfmap;
pub mod tuning;

use std::sync::{Arc, OnceLock};

pub use batch::{blas_spec, GemmGroup, MatrixShape};
pub use cpu::{detect, l2_bytes, supported_isas};
pub use error::Error;
pub use kernel::listing;
pub use kernel::{generate, generate_with_abi, Abi, Generated, Kernel};
pub use smallgemm_ir::{
    BatchForm, Dtype, Element, GemmSpec, GemmSpecBuilder, Isa, Layout, MachineCode, Operand,
    Scalar, Schedule, SpecError, Target, Trans,
};

/// The JIT for one target: compiles kernels on first use and caches them, thread-safe; runs
/// batches on its own pool of worker threads (see [`Jit::with_threads`]).
pub struct Jit {
    target: Target,
    cache: cache::KernelCache,
    threads: usize,
    pool: OnceLock<Result<rayon::ThreadPool, Error>>,
    tuning: Arc<tuning::TuningDb>,
    tuning_error: Option<Error>,
}

/// The cores this process may run on, read once: `available_parallelism` reads the cgroup
/// files on every call, which cost a new `Jit` about 15 µs.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Threads a new JIT uses: `SMALLGEMM_NUM_THREADS` if set to a positive number, else every
/// core; never more than the cores, since batches of small GEMMs gain nothing from
/// oversubscription.
fn default_threads() -> usize {
    let cores = cores();
    std::env::var("SMALLGEMM_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .map_or(cores, |n| n.min(cores))
}

impl Jit {
    /// A JIT for the best ISA of this CPU (AVX-512, else AVX2).
    pub fn new() -> Result<Jit, Error> {
        Ok(Jit::for_target(cpu::detect()?))
    }

    /// A JIT for `isa`; fails if this CPU does not run it.
    pub fn with_isa(isa: Isa) -> Result<Jit, Error> {
        Ok(Jit::for_target(cpu::require(isa)?))
    }

    /// A JIT for `target` as given rather than as detected (its ISA must run on this CPU):
    /// the code another CPU of that ISA gets, for tests and for timing a target's choices
    /// against each other on one machine.
    pub fn with_target(target: Target) -> Result<Jit, Error> {
        cpu::require(target.isa)?;
        Ok(Jit::for_target(target))
    }

    fn for_target(target: Target) -> Jit {
        Jit {
            target,
            cache: cache::KernelCache::default(),
            threads: default_threads(),
            pool: OnceLock::new(),
            tuning: Arc::default(),
            tuning_error: None,
        }
        .with_default_tuning()
    }

    /// Loads the tuning database from its default place ([`tuning::default_path`]), over
    /// the shipped one ([`tuning::shipped`]). A missing file means only the shipped
    /// schedules; an unreadable one is reported by [`Jit::tuning_error`] and ignored, so a
    /// bad file never stops a computation.
    fn with_default_tuning(mut self) -> Jit {
        let user = match tuning::default_path().map(|p| tuning::TuningDb::load(&p)) {
            Some(Ok(db)) => db,
            Some(Err(e)) => {
                self.tuning_error = Some(e);
                tuning::TuningDb::default()
            }
            None => tuning::TuningDb::default(),
        };
        // The JIT reads only this CPU's entries.
        self.tuning = if user.cpu.is_empty() {
            tuning::shipped_for_this_cpu().clone()
        } else {
            Arc::new(user.with_fallback(tuning::shipped_for_this_cpu()))
        };
        self
    }

    /// This JIT with the schedules of `db` only, not the shipped ones (an empty database
    /// turns tuning off: the planner's schedules for every shape).
    pub fn with_tuning(mut self, db: tuning::TuningDb) -> Jit {
        self.tuning = Arc::new(db);
        self.tuning_error = None;
        self
    }

    /// Why the default tuning database could not be read, if it could not.
    pub fn tuning_error(&self) -> Option<&Error> {
        self.tuning_error.as_ref()
    }

    /// Tuned schedules available for this JIT's ISA on this machine.
    pub fn tuned_shapes(&self) -> usize {
        self.tuning.entries(self.target.isa)
    }

    /// This JIT with batches split over `threads` threads (at least 1, at most the cores).
    pub fn with_threads(mut self, threads: usize) -> Jit {
        self.threads = threads.clamp(1, cores());
        self.pool = OnceLock::new();
        self
    }

    /// Threads the batch functions use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The worker pool, started on first use.
    fn pool(&self) -> Result<&rayon::ThreadPool, Error> {
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("smallgemm-{i}"))
                    .build()
                    .map_err(|e| Error::Threads(e.to_string()))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// The kernel for `spec`, compiled on first request with the tuned schedule for its shape
    /// if the tuning database has one that fits, else with the planner's.
    pub fn kernel(&self, spec: &GemmSpec) -> Result<Arc<Kernel>, Error> {
        let target = self.target;
        self.cache.get_or_compile((*spec, None), || {
            let tuned = self.tuning.lookup(target.isa, spec);
            match tuned.map(|s| Kernel::compile(spec, target, Some(&s), true)) {
                Some(Ok(kernel)) => Ok(kernel),
                _ => Kernel::compile(spec, target, None, true),
            }
        })
    }

    /// The kernel for `spec` with a given schedule (for tuning), cached separately.
    pub fn kernel_with_schedule(
        &self,
        spec: &GemmSpec,
        schedule: &Schedule,
    ) -> Result<Arc<Kernel>, Error> {
        self.cache.get_or_compile((*spec, Some(*schedule)), || {
            Kernel::compile(spec, self.target, Some(schedule), false)
        })
    }

    /// How many kernels this JIT has compiled (cache misses).
    pub fn compilations(&self) -> usize {
        self.cache.compilations()
    }

    /// How many (spec, schedule) keys the cache holds.
    pub fn cached_kernels(&self) -> usize {
        self.cache.len()
    }
}

/// The process-wide JIT for this CPU's best ISA, created on first use.
pub fn global() -> Result<&'static Jit, Error> {
    static GLOBAL: OnceLock<Result<Jit, Error>> = OnceLock::new();
    GLOBAL.get_or_init(Jit::new).as_ref().map_err(Clone::clone)
}

/// One-call strided batched GEMM through the global JIT: `spec`'s alpha and beta kinds must
/// match the values (use [`Scalar::from_value`] to build them from values).
pub fn gemm_batch_strided<T: Element>(
    spec: &GemmSpec,
    a: &[T],
    b: &[T],
    c: &mut [T],
    batch: usize,
    alpha: T,
    beta: T,
) -> Result<(), Error> {
    global()?.kernel(spec)?.run(a, b, c, batch, alpha, beta)
}
