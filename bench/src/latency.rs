//! JIT latency: the time from spec to callable kernel on a fresh `Jit` (a cache miss), the
//! first such compile in the process on its own, and the time of a cache hit; beside
//! LIBXSMM's dispatch (JIT) and lookup times and MKL's jitter creation for the same shapes
//! when those features are on.

use std::time::Instant;

use smallgemm::{GemmSpec, Isa, Jit};

use crate::competitor::{Context, Problem, Real};
use crate::stats::Summary;

/// Latency figures of one spec, in seconds.
#[derive(Clone, Debug)]
pub struct Latency {
    pub spec: GemmSpec,
    /// `Jit::kernel` on a fresh `Jit`, timed from outside.
    pub miss: Summary,
    /// The kernel's own `compile_time()` (plan, lower, encode, map) over the same compiles.
    pub compile_time: Summary,
    /// `Jit::kernel` on a warm cache.
    pub hit: Summary,
    /// LIBXSMM's dispatch of a kernel it has not generated yet (feature `libxsmm`).
    pub libxsmm_miss: Option<Summary>,
    /// LIBXSMM's dispatch of a kernel it has.
    pub libxsmm_hit: Option<Summary>,
    /// MKL's `mkl_jit_create_?gemm` (MKL has no cache: every create generates).
    pub mkl_create: Option<Summary>,
}

/// The latency report: the first compile of the process, then per spec.
#[derive(Clone, Debug)]
pub struct LatencyReport {
    /// Seconds of the very first `Jit::kernel` miss in this process (cold code paths,
    /// first code-memory mapping), and its spec.
    pub first_in_process: Option<(GemmSpec, f64)>,
    pub specs: Vec<Latency>,
}

/// Lookups timed together for one cache-hit sample: a hit is tens of nanoseconds.
const HITS_PER_SAMPLE: usize = 2000;

/// Measures `specs` (each with `reps` samples) on `isa`. Call it before anything else in
/// the process compiles a kernel, so that the first compile is the process's first.
pub fn measure<T: Real>(
    ctx: &Context,
    isa: Isa,
    specs: &[GemmSpec],
    reps: usize,
    first: &mut Option<(GemmSpec, f64)>,
) -> Result<Vec<Latency>, String> {
    let reps = reps.max(3);
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let (mut miss, mut internal) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let jit = Jit::with_isa(isa).map_err(|e| e.to_string())?;
            let start = Instant::now();
            let kernel = jit.kernel(spec).map_err(|e| e.to_string())?;
            let t = start.elapsed().as_secs_f64();
            if first.is_none() {
                // The process's first compile is reported on its own, not as a sample.
                *first = Some((*spec, t));
                continue;
            }
            miss.push(t);
            internal.push(kernel.compile_time().as_secs_f64());
        }
        let jit = Jit::with_isa(isa).map_err(|e| e.to_string())?;
        jit.kernel(spec).map_err(|e| e.to_string())?;
        let mut hit = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            for _ in 0..HITS_PER_SAMPLE {
                std::hint::black_box(
                    jit.kernel(std::hint::black_box(spec))
                        .map_err(|e| e.to_string())?,
                );
            }
            hit.push(start.elapsed().as_secs_f64() / HITS_PER_SAMPLE as f64);
        }
        let summary = |v: &[f64]| Summary::of(v).ok_or_else(|| "no latency samples".to_string());
        let p = Problem::<T>::new(
            spec,
            T::from_f64(spec.alpha().value().unwrap_or(1.0)),
            T::from_f64(spec.beta().value().unwrap_or(1.0)),
        );
        out.push(Latency {
            spec: *spec,
            miss: summary(&miss)?,
            compile_time: summary(&internal)?,
            hit: summary(&hit)?,
            libxsmm_miss: libxsmm_miss(&p, reps),
            libxsmm_hit: libxsmm_hit(&p, reps),
            mkl_create: mkl_create(ctx, &p, reps),
        });
    }
    Ok(out)
}

/// LIBXSMM dispatch misses: the first sample is the spec's own kernel; later samples use a
/// larger lda (a kernel LIBXSMM has not generated, with the same work) since LIBXSMM's code
/// registry cannot be emptied.
#[cfg(feature = "libxsmm")]
fn libxsmm_miss<T: Real>(p: &Problem<T>, reps: usize) -> Option<Summary> {
    if crate::Competitor::Libxsmm
        .supports(p.alpha.to_f64(), p.beta.to_f64())
        .is_err()
    {
        return None;
    }
    let mut miss = Vec::with_capacity(reps);
    for r in 0..reps {
        // lda grows by the sample index (+ a large offset so that no other spec of the run
        // asks for the same kernel).
        let lda = if r == 0 { p.lda } else { p.lda + 1000 + r };
        let start = Instant::now();
        crate::ffi::libxsmm::dispatch(p, lda).ok()?;
        miss.push(start.elapsed().as_secs_f64());
    }
    Summary::of(&miss)
}

#[cfg(not(feature = "libxsmm"))]
fn libxsmm_miss<T: Real>(_: &Problem<T>, _: usize) -> Option<Summary> {
    None
}

#[cfg(feature = "libxsmm")]
fn libxsmm_hit<T: Real>(p: &Problem<T>, reps: usize) -> Option<Summary> {
    crate::Competitor::Libxsmm
        .supports(p.alpha.to_f64(), p.beta.to_f64())
        .ok()?;
    crate::ffi::libxsmm::dispatch(p, p.lda).ok()?;
    let mut hit = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..HITS_PER_SAMPLE {
            std::hint::black_box(
                crate::ffi::libxsmm::dispatch(std::hint::black_box(p), p.lda).ok()?,
            );
        }
        hit.push(start.elapsed().as_secs_f64() / HITS_PER_SAMPLE as f64);
    }
    Summary::of(&hit)
}

#[cfg(not(feature = "libxsmm"))]
fn libxsmm_hit<T: Real>(_: &Problem<T>, _: usize) -> Option<Summary> {
    None
}

#[cfg(feature = "mkl")]
fn mkl_create<T: Real>(ctx: &Context, p: &Problem<T>, reps: usize) -> Option<Summary> {
    let mkl = ctx.mkl.as_ref().ok()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        let jit = crate::ffi::mkl::MklJit::new(mkl.clone(), *p).ok()?;
        t.push(start.elapsed().as_secs_f64());
        drop(jit);
    }
    Summary::of(&t)
}

#[cfg(not(feature = "mkl"))]
fn mkl_create<T: Real>(_: &Context, _: &Problem<T>, _: usize) -> Option<Summary> {
    None
}
