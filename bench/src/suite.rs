//! The benchmark run: the limits, then every (dtype, regime, threads, shape) case with every
//! competitor on the same buffers, each figure beside its bound.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use smallgemm::{Dtype, Element, GemmSpec, Isa, Jit, Operand, Scalar};
use smallgemm_ir::reference::TestData;

use crate::buffer::AlignedBuf;
use crate::competitor::{BatchGemm, Competitor, Context, Real};
use crate::latency::{self, LatencyReport};
use crate::measure::{chunk, time_parallel, Timing};
use crate::probe::{self, Pattern};
use crate::stats::{self, ratio_of_medians, Summary};

/// (m, n, k).
pub type Shape = (usize, usize, usize);

/// Where the batch lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Regime {
    /// A, B and C of each thread's share fit in its L2 and are reused call after call.
    Hot,
    /// The batch spans at least `stream_bytes` (far above L3): every call streams from DRAM.
    Stream,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::Hot => "hot",
            Regime::Stream => "stream",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct Config {
    /// The JIT's ISA (and the probes' vector width); `None`: the best this CPU runs.
    pub isa: Option<Isa>,
    pub dtypes: Vec<Dtype>,
    pub shapes: Vec<Shape>,
    pub regimes: Vec<Regime>,
    /// Thread counts; each case runs at each.
    pub threads: Vec<usize>,
    pub competitors: Vec<Competitor>,
    pub alpha: f64,
    pub beta: f64,
    /// Bytes of A, B and C per thread in the hot regime.
    pub hot_bytes: usize,
    /// Bytes of A, B and C of the whole batch in the streaming regime.
    pub stream_bytes: usize,
    pub hot: Timing,
    pub stream: Timing,
    pub probe: Timing,
    /// Samples per JIT-latency figure; 0 skips the latency measurement.
    pub latency_reps: usize,
    pub seed: u64,
}

/// The papers' small-k shapes: k = 8, 16, 32 with m = n varying.
pub fn small_k_shapes() -> Vec<Shape> {
    let mut v = Vec::new();
    for k in [8, 16, 32] {
        for mn in [4, 8, 16, 24, 32, 48, 64] {
            if mn != k {
                v.push((mn, mn, k));
            }
        }
    }
    v
}

/// Square sizes `lo..=hi`.
pub fn square_shapes(lo: usize, hi: usize) -> Vec<Shape> {
    (lo..=hi).map(|n| (n, n, n)).collect()
}

/// Threads the machine offers.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Config {
    /// The full run: square 2..32 and the small-k shapes, f64 and f32, hot and streaming
    /// (1 GiB), one thread and all cores, every competitor built in, alpha = beta = 1 (the
    /// only values LIBXSMM 1.17 takes).
    pub fn standard() -> Config {
        let mut shapes = square_shapes(2, 32);
        shapes.extend(small_k_shapes());
        let cores = all_cores();
        Config {
            isa: None,
            dtypes: vec![Dtype::F64, Dtype::F32],
            shapes,
            regimes: vec![Regime::Hot, Regime::Stream],
            threads: if cores > 1 { vec![1, cores] } else { vec![1] },
            competitors: Competitor::ALL
                .into_iter()
                .filter(|c| c.missing_feature().is_none())
                .collect(),
            alpha: 1.0,
            beta: 1.0,
            hot_bytes: default_hot_bytes(),
            stream_bytes: 1 << 30,
            // Short samples: on a shared machine a sample that the scheduler interrupts is
            // an outlier, and shorter ones are interrupted less often.
            hot: Timing {
                warmup: Duration::from_millis(20),
                min_sample: Duration::from_millis(1),
                reps: 21,
                min_reps: 7,
                budget: Duration::from_millis(400),
            },
            // A streaming call takes tens of milliseconds to seconds (1 GiB): few samples.
            stream: Timing {
                warmup: Duration::ZERO,
                min_sample: Duration::ZERO,
                reps: 5,
                min_reps: 3,
                budget: Duration::from_millis(800),
            },
            probe: Timing {
                warmup: Duration::from_millis(50),
                min_sample: Duration::from_millis(5),
                reps: 21,
                min_reps: 7,
                budget: Duration::from_secs(2),
            },
            latency_reps: 31,
            seed: 1,
        }
    }

    /// A smoke run in well under a minute: a few sizes, few samples, a 256 MiB stream
    /// (still above a 105 MiB L3).
    pub fn quick() -> Config {
        let s = Config::standard();
        Config {
            shapes: vec![
                (2, 2, 2),
                (4, 4, 4),
                (8, 8, 8),
                (16, 16, 16),
                (32, 32, 32),
                (16, 16, 8),
            ],
            stream_bytes: 256 << 20,
            hot: Timing {
                warmup: Duration::from_millis(5),
                min_sample: Duration::from_millis(1),
                reps: 7,
                min_reps: 5,
                budget: Duration::from_millis(100),
            },
            stream: Timing {
                reps: 5,
                min_reps: 3,
                budget: Duration::from_millis(300),
                ..s.stream
            },
            probe: Timing {
                warmup: Duration::from_millis(10),
                min_sample: Duration::from_millis(2),
                reps: 7,
                min_reps: 5,
                budget: Duration::from_millis(300),
            },
            latency_reps: 7,
            ..s
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let nonempty = [
            ("dtypes", self.dtypes.is_empty()),
            ("shapes", self.shapes.is_empty()),
            ("regimes", self.regimes.is_empty()),
            ("threads", self.threads.is_empty()),
            ("competitors", self.competitors.is_empty()),
        ];
        if let Some((what, _)) = nonempty.iter().find(|(_, empty)| *empty) {
            return Err(format!("no {what} to measure"));
        }
        if self.dtypes.contains(&Dtype::F16) {
            return Err("f16 kernels run on GPUs only".into());
        }
        if let Some(&t) = self.threads.iter().find(|&&t| t == 0 || t > 1024) {
            return Err(format!("{t} threads: give 1 to 1024"));
        }
        if let Some(s) = self
            .shapes
            .iter()
            .find(|s| s.0 == 0 || s.1 == 0 || s.2 == 0)
        {
            return Err(format!(
                "shape {}x{}x{}: sizes must be at least 1",
                s.0, s.1, s.2
            ));
        }
        if let Some(s) = self.shapes.iter().find(|s| s.0.max(s.1).max(s.2) > 4096) {
            return Err(format!(
                "shape {}x{}x{}: sizes above 4096 are not small GEMMs",
                s.0, s.1, s.2
            ));
        }
        if !(self.alpha.is_finite() && self.beta.is_finite()) {
            return Err("alpha and beta must be finite".into());
        }
        if self.hot_bytes < 4096 || self.stream_bytes < (1 << 20) {
            return Err("hot bytes must be at least 4 KiB and stream bytes at least 1 MiB".into());
        }
        for t in [&self.hot, &self.stream, &self.probe] {
            t.validate()?;
        }
        Ok(())
    }

    fn spec(&self, dtype: Dtype, (m, n, k): Shape) -> Result<GemmSpec, String> {
        GemmSpec::builder(dtype, m, n, k)
            .alpha(Scalar::from_value(self.alpha))
            .beta(Scalar::from_value(self.beta))
            .build()
            .map_err(|e| e.to_string())
    }
}

/// The limits at one thread count.
#[derive(Clone, Debug)]
pub struct Limits {
    pub threads: usize,
    /// FMA peak, GFLOP/s, all threads together.
    pub peak_f64: Summary,
    pub peak_f32: Summary,
    /// GB/s of the GEMM pattern on data in L2 (`hot_bytes` per thread).
    pub l2: Summary,
    /// GB/s of each pattern over the streaming buffer; empty without a streaming regime.
    pub dram: Vec<(Pattern, Summary)>,
}

/// A figure's bound and what sets it.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub gflops: f64,
    /// "fma-peak", "l2" or "dram".
    pub limit: &'static str,
}

/// One measured figure.
#[derive(Clone, Debug)]
pub struct Figure {
    pub dtype: Dtype,
    pub regime: Regime,
    pub threads: usize,
    pub shape: Shape,
    pub batch: usize,
    pub competitor: Competitor,
    /// Seconds per call (the whole batch), one per sample.
    pub seconds: Vec<f64>,
    pub gflops: Summary,
    pub bound: Bound,
    /// smallgemm's GFLOP/s over this competitor's (absent for smallgemm itself).
    pub ratio: Option<Summary>,
    pub flops: f64,
    /// Bytes counted for the bound: A, B, C read once (C not when beta = 0), C written once.
    pub bytes: f64,
}

impl Figure {
    pub fn fraction_of_bound(&self) -> f64 {
        self.gflops.median / self.bound.gflops
    }
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct Report {
    pub isa: Isa,
    pub alpha: f64,
    pub beta: f64,
    pub hot_bytes: usize,
    pub stream_bytes: usize,
    pub versions: Vec<(Competitor, String)>,
    pub limits: Vec<Limits>,
    pub figures: Vec<Figure>,
    pub latency: Option<LatencyReport>,
    /// Competitors left out, failed checks, fallbacks.
    pub notes: Vec<String>,
    /// (competitor, dtype, shape, why) of every correctness check that failed.
    pub check_failures: Vec<(Competitor, Dtype, Shape, String)>,
}

impl Report {
    pub fn limits_at(&self, threads: usize) -> Option<&Limits> {
        self.limits.iter().find(|l| l.threads == threads)
    }
}

/// Runs the benchmark; `progress` gets a line per step (for a terminal's stderr).
pub fn run(config: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
    config.validate()?;
    let jit = match config.isa {
        Some(isa) => Jit::with_isa(isa),
        None => Jit::new(),
    }
    .map_err(|e| e.to_string())?;
    let isa = jit.target().isa;
    let ctx = Context::new(jit);
    let mut notes = Vec::new();
    for c in &config.competitors {
        if let Some(f) = c.missing_feature() {
            notes.push(format!(
                "{}: left out, built without the `{f}` feature",
                c.name()
            ));
        } else if let Err(e) = c.supports(config.alpha, config.beta) {
            notes.push(format!("{}: left out, {e}", c.name()));
        }
    }
    #[cfg(feature = "mkl")]
    if let Err(e) = &ctx.mkl {
        notes.push(format!("mkl-jit: {e}"));
    }

    // JIT latency first, so that the process's first compile is measured as such.
    let latency = if config.latency_reps > 0 {
        progress("JIT latency");
        let mut first = None;
        let mut specs = Vec::new();
        for &dtype in &config.dtypes {
            let s: Vec<GemmSpec> = config
                .shapes
                .iter()
                .map(|&shape| config.spec(dtype, shape))
                .collect::<Result<_, _>>()?;
            specs.extend(match dtype {
                Dtype::F32 => {
                    latency::measure::<f32>(&ctx, isa, &s, config.latency_reps, &mut first)?
                }
                _ => latency::measure::<f64>(&ctx, isa, &s, config.latency_reps, &mut first)?,
            });
        }
        Some(LatencyReport {
            first_in_process: first,
            specs,
        })
    } else {
        None
    };

    // The streaming buffer, allocated once and shared by every streaming case and probe.
    let mut arena = if config.regimes.contains(&Regime::Stream) {
        progress(&format!("allocating {} MiB", config.stream_bytes >> 20));
        // Slack for one more matrix of the largest shape, so the batch covers stream_bytes.
        let slack = config
            .shapes
            .iter()
            .map(|&(m, n, k)| m * k + k * n + m * n)
            .max()
            .unwrap_or(0);
        Some(AlignedBuf::<f64>::random(
            config.stream_bytes / 8 + slack,
            config.seed,
        )?)
    } else {
        None
    };

    let mut limits = Vec::new();
    for &threads in &config.threads {
        progress(&format!("limits at {threads} thread(s)"));
        limits.push(measure_limits(config, isa, threads, arena.as_deref_mut())?);
    }

    let mut figures = Vec::new();
    let mut kernel_notes = KernelNotes::default();
    let mut check_failures = Vec::new();
    for &dtype in &config.dtypes {
        let mut run = Runner {
            config,
            ctx: &ctx,
            checked: HashMap::new(),
            notes: &mut notes,
            kernel_notes: &mut kernel_notes,
            figures: &mut figures,
            check_failures: &mut check_failures,
            progress,
        };
        match dtype {
            Dtype::F32 => run.dtype::<f32>(arena.as_deref_mut())?,
            _ => run.dtype::<f64>(arena.as_deref_mut())?,
        }
    }
    Ok(Report {
        isa,
        alpha: config.alpha,
        beta: config.beta,
        hot_bytes: config.hot_bytes,
        stream_bytes: config.stream_bytes,
        versions: ctx.library_versions(),
        limits,
        figures,
        latency,
        notes: notes.into_iter().chain(kernel_notes.lines()).collect(),
        check_failures,
    })
}

/// What competitors said of the kernels they prepared (MKL on AMD: that it generated no
/// JIT code, for every shape), grouped by competitor and note so that a note given for
/// many kernels alike is one line of the report.
#[derive(Default)]
struct KernelNotes {
    /// (competitor, note) -> the kernels it was given for, in the order they came.
    groups: Vec<((Competitor, String), Vec<String>)>,
}

impl KernelNotes {
    fn add(&mut self, competitor: Competitor, note: String, kernel: String) {
        let key = (competitor, note);
        match self.groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, kernels)) if kernels.contains(&kernel) => {}
            Some((_, kernels)) => kernels.push(kernel),
            None => self.groups.push((key, vec![kernel])),
        }
    }

    /// One line per note and kernel, or per note where it came for more than two kernels
    /// (naming how many, the first and the last).
    fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for ((competitor, note), kernels) in &self.groups {
            let name = competitor.name();
            match kernels.as_slice() {
                [first, .., last] if kernels.len() > 2 => out.push(format!(
                    "{name}: {note}, for {} kernels ({first} .. {last})",
                    kernels.len()
                )),
                _ => out.extend(kernels.iter().map(|k| format!("{name} {k}: {note}"))),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Competitor, KernelNotes};

    #[test]
    fn notes_for_many_kernels_fold_into_one_line() {
        let mut notes = KernelNotes::default();
        for (competitor, kernel, note) in [
            (Competitor::MklJit, "dgemm_a", "no JIT code"),
            (Competitor::Libxsmm, "dgemm_a", "odd: 3 != 4"),
            (Competitor::MklJit, "dgemm_b", "no JIT code"),
            (Competitor::MklJit, "dgemm_a", "no JIT code"),
            (Competitor::MklJit, "dgemm_c", "no JIT code"),
            (Competitor::Libxsmm, "dgemm_c", "odd: 5 != 6"),
        ] {
            notes.add(competitor, note.into(), kernel.into());
        }
        assert_eq!(
            notes.lines(),
            [
                "mkl-jit: no JIT code, for 3 kernels (dgemm_a .. dgemm_c)",
                "libxsmm dgemm_a: odd: 3 != 4",
                "libxsmm dgemm_c: odd: 5 != 6",
            ]
        );
    }
}

/// A raw C pointer the threads of a measurement share; each forms a slice of its own
/// disjoint part.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: only used to hand disjoint sub-slices to the threads of one measurement.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    // A method, so that closures capture the wrapper (Sync), not the raw pointer inside.
    fn ptr(&self) -> *mut T {
        self.0
    }
}

fn measure_limits(
    config: &Config,
    isa: Isa,
    threads: usize,
    arena: Option<&mut [f64]>,
) -> Result<Limits, String> {
    let t = &config.probe;
    let rate = |samples: Vec<f64>, per_call: f64| {
        Summary::of(&samples)
            .map(|s| s.map_decreasing(|secs| per_call / secs / 1e9))
            .ok_or_else(|| "no probe samples".to_string())
    };
    let flops = probe::fma_loop_flops(isa, Dtype::F64) * threads as f64;
    let peak_f64 = rate(
        time_parallel(threads, t, |_| probe::fma_loop(isa, Dtype::F64).map(drop))?,
        flops,
    )?;
    let flops = probe::fma_loop_flops(isa, Dtype::F32) * threads as f64;
    let peak_f32 = rate(
        time_parallel(threads, t, |_| probe::fma_loop(isa, Dtype::F32).map(drop))?,
        flops,
    )?;

    // L2: each thread its own three arrays of hot_bytes / 3.
    let per = config.hot_bytes / 3 / 8;
    let mut bufs: Vec<AlignedBuf<f64>> = (0..threads * 3)
        .map(|i| AlignedBuf::random(per, config.seed + i as u64))
        .collect::<Result<_, _>>()?;
    let ptrs: Vec<SharedMut<f64>> = bufs.iter_mut().map(|b| SharedMut(b.as_mut_ptr())).collect();
    let l2_bytes =
        (per * 8 / probe::STEP_BYTES * probe::STEP_BYTES * Pattern::Gemm.traffic() * threads)
            as f64;
    let l2 = rate(
        time_parallel(threads, t, |i| {
            // SAFETY: thread i alone uses buffers 3i..3i+3, each `per` long.
            let (x, y, z) = unsafe {
                (
                    std::slice::from_raw_parts(ptrs[3 * i].ptr(), per),
                    std::slice::from_raw_parts(ptrs[3 * i + 1].ptr(), per),
                    std::slice::from_raw_parts_mut(ptrs[3 * i + 2].ptr(), per),
                )
            };
            probe::stream(isa, Pattern::Gemm, x, y, z).map(drop)
        })?,
        l2_bytes,
    )?;
    drop(bufs);

    let mut dram = Vec::new();
    if let Some(arena) = arena {
        // Three equal arrays, each thread streaming its own contiguous part of all three.
        let third = arena.len() / 3;
        let base = SharedMut(arena.as_mut_ptr());
        let timing = Timing {
            warmup: Duration::ZERO,
            min_sample: Duration::ZERO,
            ..config.stream
        };
        for pattern in Pattern::ALL {
            let samples = time_parallel(threads, &timing, |i| {
                let (start, len) = chunk(third, threads, i);
                // SAFETY: thread i alone uses elements start..start+len of each third.
                let (x, y, z) = unsafe {
                    (
                        std::slice::from_raw_parts(base.ptr().add(start), len),
                        std::slice::from_raw_parts(base.ptr().add(third + start), len),
                        std::slice::from_raw_parts_mut(base.ptr().add(2 * third + start), len),
                    )
                };
                probe::stream(isa, pattern, x, y, z).map(drop)
            })?;
            // Every thread's share has the same size up to one step; count exactly.
            let per_call: f64 = (0..threads)
                .map(|i| {
                    let len = chunk(third, threads, i).1;
                    (len * 8 / probe::STEP_BYTES * probe::STEP_BYTES * pattern.traffic()) as f64
                })
                .sum();
            dram.push((pattern, rate(samples, per_call)?));
        }
    }
    Ok(Limits {
        threads,
        peak_f64,
        peak_f32,
        l2,
        dram,
    })
}

/// Views the f64 arena as `T` (f32 or f64: any bits are valid, alignment 64).
fn view<T: Real>(arena: &mut [f64]) -> &mut [T] {
    let len = arena.len() * 8 / std::mem::size_of::<T>();
    // SAFETY: T is f32 or f64, whose size divides 8 and whose alignment the 64-byte-aligned
    // arena satisfies; every bit pattern is a valid value; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(arena.as_mut_ptr() as *mut T, len) }
}

struct Runner<'a, 'p> {
    config: &'a Config,
    ctx: &'a Context,
    /// The correctness check of each (competitor, shape), done once per dtype.
    checked: HashMap<(Competitor, Shape), Result<(), String>>,
    notes: &'a mut Vec<String>,
    kernel_notes: &'a mut KernelNotes,
    figures: &'a mut Vec<Figure>,
    check_failures: &'a mut Vec<(Competitor, Dtype, Shape, String)>,
    progress: &'p mut dyn FnMut(&str),
}

impl Runner<'_, '_> {
    fn dtype<T: Real>(&mut self, mut arena: Option<&mut [f64]>) -> Result<(), String> {
        let config = self.config;
        for &regime in &config.regimes {
            if regime == Regime::Stream {
                if let Some(arena) = arena.as_deref_mut() {
                    // Fresh values of this type (the f64 bits seen as f32 would be NaNs and
                    // denormals).
                    let mut rng = smallgemm_ir::reference::SplitMix64::new(config.seed);
                    for x in view::<T>(arena).iter_mut() {
                        *x = T::from_f64(rng.nonzero());
                    }
                }
            }
            for &threads in &config.threads {
                for &shape in &config.shapes {
                    let spec = config.spec(T::DTYPE, shape)?;
                    (self.progress)(&format!(
                        "{} {} {}t {}x{}x{}",
                        T::DTYPE.name(),
                        regime.name(),
                        threads,
                        shape.0,
                        shape.1,
                        shape.2
                    ));
                    match regime {
                        Regime::Hot => {
                            let batch = hot_batch(&spec, config.hot_bytes) * threads;
                            let mut a = AlignedBuf::<T>::random(
                                spec.required_len(Operand::A, batch),
                                config.seed,
                            )?;
                            let mut b = AlignedBuf::<T>::random(
                                spec.required_len(Operand::B, batch),
                                config.seed + 1,
                            )?;
                            let mut c = AlignedBuf::<T>::random(
                                spec.required_len(Operand::C, batch),
                                config.seed + 2,
                            )?;
                            self.case(&spec, regime, threads, batch, &mut a, &mut b, &mut c)?;
                        }
                        Regime::Stream => {
                            let Some(arena) = arena.as_deref_mut() else {
                                return Err("no streaming buffer".into());
                            };
                            let arena = view::<T>(arena);
                            let per: usize = [Operand::A, Operand::B, Operand::C]
                                .iter()
                                .map(|&o| spec.footprint(o))
                                .sum();
                            let batch = arena.len() / per;
                            let (a, rest) =
                                arena.split_at_mut(spec.required_len(Operand::A, batch));
                            let (b, c) = rest.split_at_mut(spec.required_len(Operand::B, batch));
                            self.case(&spec, regime, threads, batch, a, b, c)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `competitor` computes `spec` right (once per dtype and shape): a batch of 3
    /// against the double-double reference, with NaN in C when beta = 0.
    fn check<T: Real>(&mut self, competitor: Competitor, spec: &GemmSpec) -> Result<(), String> {
        let shape = (spec.m(), spec.n(), spec.k());
        if let Some(r) = self.checked.get(&(competitor, shape)) {
            return r.clone();
        }
        let (alpha, beta) = (
            T::from_f64(self.config.alpha),
            T::from_f64(self.config.beta),
        );
        let result = competitor
            .prepare::<T>(self.ctx, spec, alpha, beta)
            .and_then(|g| {
                let mut data = TestData::<T>::new(spec, 3, self.config.seed);
                let (a, b) = (data.a.clone(), data.b.clone());
                g.run(&a, &b, data.c_mut(), 3)?;
                let report = data.check(alpha.to_f64(), beta.to_f64());
                match report.failure {
                    None => Ok(()),
                    Some(why) => Err(format!("wrong result: {why}")),
                }
            });
        if let Err(e) = &result {
            self.check_failures
                .push((competitor, T::DTYPE, shape, e.clone()));
            self.notes.push(format!(
                "{} {} {}x{}x{}: {e}",
                competitor.name(),
                T::DTYPE.name(),
                shape.0,
                shape.1,
                shape.2
            ));
        }
        self.checked.insert((competitor, shape), result.clone());
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn case<T: Real>(
        &mut self,
        spec: &GemmSpec,
        regime: Regime,
        threads: usize,
        batch: usize,
        a: &mut [T],
        b: &mut [T],
        c: &mut [T],
    ) -> Result<(), String> {
        let config = self.config;
        let elt = T::DTYPE.size() as f64;
        let c_reads = if config.beta == 0.0 { 1.0 } else { 2.0 };
        let bytes = batch as f64
            * elt
            * (spec.footprint(Operand::A) as f64
                + spec.footprint(Operand::B) as f64
                + c_reads * spec.footprint(Operand::C) as f64);
        let flops = spec.flops() * batch as f64;
        let timing = match regime {
            Regime::Hot => config.hot,
            Regime::Stream => config.stream,
        };
        let (alpha, beta) = (T::from_f64(config.alpha), T::from_f64(config.beta));
        // Every competitor is prepared and warmed up first; then the samples are taken in
        // rounds, one sample of each competitor per round, so that a slow period of this
        // shared machine falls on all of them alike and the ratios stay meaningful.
        let mut prepared = Vec::new();
        for &competitor in &config.competitors {
            if competitor.missing_feature().is_some()
                || competitor.supports(config.alpha, config.beta).is_err()
            {
                continue;
            }
            if self.check::<T>(competitor, spec).is_err() {
                continue;
            }
            let g = competitor.prepare::<T>(self.ctx, spec, alpha, beta)?;
            if let Some(note) = g.note() {
                self.kernel_notes.add(competitor, note, spec.name());
            }
            prepared.push((competitor, g));
        }
        let mut seconds: Vec<Vec<f64>> = vec![Vec::with_capacity(timing.reps); prepared.len()];
        let one_sample = Timing {
            reps: 1,
            min_reps: 1,
            ..timing
        };
        // Later rounds warm up briefly: a competitor that follows narrower code (the naive
        // loop, matrixmultiply's AVX2 kernels) in the round otherwise pays the core's switch
        // to 512-bit execution inside its sample. Measured with no warm-up: adding the naive
        // loop or matrixmultiply to a run lowered smallgemm ÷ MKL JIT (which followed
        // smallgemm and LIBXSMM) from 1.01x to 0.93-0.95x at 12..32.
        let next_samples = Timing {
            warmup: timing.warmup.min(ROUND_WARMUP),
            ..one_sample
        };
        // The FMA loop's samples run it for a millisecond after a short warm-up in either
        // regime. A call is 0.1 ms: with the streaming timing (one call a sample, no
        // warm-up) the sample timed the other threads' wake-up as much as their FMAs, and
        // the bound of f32 at two threads read 84-93 GFLOP/s against 253 in the same run's
        // limits table (an Ice Lake VM, thirty-eighth session), which put kernels at up to
        // 151% of it.
        let fma_sample = Timing {
            warmup: ROUND_WARMUP,
            min_sample: FMA_MIN_SAMPLE,
            ..one_sample
        };
        // Saturating: `--reps` sets the budget to Duration::MAX.
        // The rounds also time the bound's probes, each a budget share of its own: the
        // memory pattern over this case's A, B and C (in L2 or from DRAM), and the FMA loop.
        let participants = prepared.len() + 2;
        let budget = timing.budget.saturating_mul(participants as u32);
        let isa = self.ctx.jit.target().isa;
        let (mut probe_bytes, mut probe_seconds) = (0.0, Vec::new());
        let mut fma_seconds = Vec::new();
        let measuring = Instant::now();
        for round in 0..timing.reps {
            if round >= timing.min_reps && measuring.elapsed() >= budget {
                break;
            }
            let t = if round == 0 {
                &one_sample
            } else {
                &next_samples
            };
            let (counted, samples) = time_gemm_pattern(isa, a, b, c, threads, t)?;
            probe_bytes = counted as f64;
            probe_seconds.extend(samples);
            fma_seconds.extend(time_parallel(threads, &fma_sample, |_| {
                probe::fma_loop(isa, T::DTYPE).map(drop)
            })?);
            for ((_, g), out) in prepared.iter().zip(&mut seconds) {
                out.extend(time_batch(&**g, spec, a, b, c, batch, threads, t)?);
            }
        }
        // Both bounds come from probes timed in this case's rounds, beside the competitors'
        // samples, so that a slow period of the shared machine moves the bound with the
        // figures (the probe at the start of a run read 9.2 to 12.3 GB/s from DRAM on one
        // thread in runs an hour apart; the FMA peak moves likewise under load).
        // The bound is the lower of the two, from DRAM too: there large matrices' few bytes
        // per flop let memory feed more than the FMA units compute (f64 32x32x32 at 31 GB/s:
        // 62 GFLOP/s against a peak of 58 on the AMD VM of the ninth session).
        let bandwidth = probe_bytes / stats::median(&probe_seconds).ok_or("no probe samples")?;
        let memory = flops / (bytes / bandwidth) / 1e9;
        let fma_flops = probe::fma_loop_flops(isa, T::DTYPE) * threads as f64;
        let fma_time = stats::median(&fma_seconds).ok_or("no probe samples")?;
        let peak = fma_flops / fma_time / 1e9;
        let bound = if peak <= memory {
            Bound {
                gflops: peak,
                limit: "fma-peak",
            }
        } else {
            Bound {
                gflops: memory,
                limit: match regime {
                    Regime::Hot => "l2",
                    Regime::Stream => "dram",
                },
            }
        };
        let smallgemm_seconds = prepared
            .iter()
            .position(|(c, _)| *c == Competitor::Smallgemm)
            .map(|i| seconds[i].clone());
        for ((competitor, _), seconds) in prepared.into_iter().zip(seconds) {
            let time = Summary::of(&seconds).ok_or("no samples")?;
            let ratio = match (&smallgemm_seconds, competitor) {
                (_, Competitor::Smallgemm) => None,
                (Some(sg), _) => ratio_of_medians(&seconds, sg),
                (None, _) => None,
            };
            self.figures.push(Figure {
                dtype: T::DTYPE,
                regime,
                threads,
                shape: (spec.m(), spec.n(), spec.k()),
                batch,
                competitor,
                seconds,
                gflops: time.map_decreasing(|s| flops / s / 1e9),
                bound,
                ratio,
                flops,
                bytes,
            });
        }
        Ok(())
    }
}

/// Warm-up before each sample after the first round (see `measure`).
const ROUND_WARMUP: Duration = Duration::from_millis(2);

/// Shortest sample of the FMA loop in a case's rounds (see `measure`).
const FMA_MIN_SAMPLE: Duration = Duration::from_millis(1);

/// Bytes of A, B and C per thread in the hot regime by default (`run` and `tune` time
/// batches of this size too): half of this core's L2, at most 512 KiB, so that the batch
/// stays inside L2 beside the code and the stack. On Xeons with 1.25-2 MiB of L2 that is
/// 512 KiB, as it always was; on a Zen 3 with 512 KiB of L2 it is 256 KiB (512 KiB there
/// filled L2 exactly: its L2 bandwidth probe read 111-120 GB/s there against 129-133 at 256
/// KiB and 129-131 at 128 KiB, six runs alternated).
pub fn default_hot_bytes() -> usize {
    (smallgemm::l2_bytes() / 2).clamp(16 << 10, 512 << 10)
}

/// Matrices per thread in the hot regime: `hot_bytes` of A, B and C.
pub fn hot_batch(spec: &GemmSpec, hot_bytes: usize) -> usize {
    (hot_bytes / spec.footprint_bytes()).clamp(1, 1 << 20)
}

/// Times the GEMM memory pattern ([`Pattern::Gemm`]) over the bytes of `a`, `b` and `c`
/// (the length of the shortest), split over `threads` contiguous chunks; returns the bytes
/// one call counts and the seconds of each sample. Every element is left as it was.
fn time_gemm_pattern<T: Element>(
    isa: Isa,
    a: &[T],
    b: &[T],
    c: &mut [T],
    threads: usize,
    timing: &Timing,
) -> Result<(usize, Vec<f64>), String> {
    let steps = a.len().min(b.len()).min(c.len()) * std::mem::size_of::<T>() / probe::STEP_BYTES;
    let z = SharedMut(c.as_mut_ptr().cast::<u8>());
    let seconds = time_parallel(threads, timing, |i| {
        let (start, len) = chunk(steps, threads, i);
        let offset = start * probe::STEP_BYTES;
        // SAFETY: thread i alone uses bytes offset..offset + len steps of each array, all
        // inside a, b and c; c is exclusively borrowed, so z overlaps neither x nor y; the
        // pattern writes back the bits it read.
        unsafe {
            probe::stream_raw(
                isa,
                Pattern::Gemm,
                a.as_ptr().cast::<u8>().add(offset),
                b.as_ptr().cast::<u8>().add(offset),
                z.ptr().add(offset),
                len * probe::STEP_BYTES,
            )
        }
        .map(drop)
    })?;
    Ok((steps * probe::STEP_BYTES * Pattern::Gemm.traffic(), seconds))
}

/// Times `g` on the batch split over `threads` contiguous chunks.
#[allow(clippy::too_many_arguments)]
fn time_batch<T: Element>(
    g: &dyn BatchGemm<T>,
    spec: &GemmSpec,
    a: &[T],
    b: &[T],
    c: &mut [T],
    batch: usize,
    threads: usize,
    timing: &Timing,
) -> Result<Vec<f64>, String> {
    let need = spec.required_len(Operand::C, batch);
    if c.len() < need
        || a.len() < spec.required_len(Operand::A, batch)
        || b.len() < spec.required_len(Operand::B, batch)
    {
        return Err("buffers too short for the batch".into());
    }
    let (sa, sb, sc) = (
        spec.stride(Operand::A),
        spec.stride(Operand::B),
        spec.stride(Operand::C),
    );
    let c_ptr = SharedMut(c.as_mut_ptr());
    time_parallel(threads, timing, |t| {
        let (start, len) = chunk(batch, threads, t);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the C matrices of different chunks are disjoint (a spec's C matrices do
        // not overlap), all inside `c` (checked above), and `c` is exclusively borrowed for
        // the whole measurement.
        let c = unsafe {
            std::slice::from_raw_parts_mut(
                c_ptr.ptr().add(start * sc),
                spec.required_len(Operand::C, len),
            )
        };
        g.run(&a[start * sa..], &b[start * sb..], c, len)
    })
}
