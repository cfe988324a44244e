//! `smallgemm run`: compile, check against the reference, time.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, ValueEnum};
use smallgemm::{Dtype, Element, GemmSpec, Isa, Jit, Scalar};
use smallgemm_bench::buffer::AlignedBuf;
use smallgemm_bench::suite::{default_hot_bytes, hot_batch};
use smallgemm_ir::reference::TestData;

use crate::{DtypeArg, ShapeArgs};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum IsaArg {
    Auto,
    Avx2,
    Avx512,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Element type (default: both, in the sweep; f64 for one shape).
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Matrices per call (default: enough to fill half of L2, at most 512 KiB: a batch that
    /// stays in L2).
    #[arg(long)]
    batch: Option<usize>,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 31)]
    reps: usize,
    #[arg(long, value_enum, default_value = "auto")]
    isa: IsaArg,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    alpha: f64,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    beta: f64,
    /// Seed of the random operands.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Each timed sample runs at least this long, so the clock's resolution does not matter.
const MIN_SAMPLE_SECONDS: f64 = 100e-6;

pub fn run(args: &RunArgs) -> Result<ExitCode, String> {
    if args.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    if !(args.alpha.is_finite() && args.beta.is_finite()) {
        return Err("--alpha and --beta must be finite".into());
    }
    let jit = match args.isa {
        IsaArg::Auto => Jit::new(),
        IsaArg::Avx2 => Jit::with_isa(Isa::Avx2),
        IsaArg::Avx512 => Jit::with_isa(Isa::Avx512),
    }
    .map_err(|e| e.to_string())?;
    let (alpha, beta) = (
        Scalar::from_value(args.alpha),
        Scalar::from_value(args.beta),
    );
    let cases: Vec<(Dtype, (usize, usize, usize))> = match args.shape.shape()? {
        Some(shape) => vec![(args.dtype.map_or(Dtype::F64, Into::into), shape)],
        None => {
            let dtypes = match args.dtype {
                Some(d) => vec![d.into()],
                None => vec![Dtype::F64, Dtype::F32],
            };
            dtypes
                .into_iter()
                .flat_map(|d| (2..=32).map(move |n| (d, (n, n, n))))
                .collect()
        }
    };
    let mut failures = 0;
    for (dtype, shape) in cases {
        let spec = args
            .shape
            .spec(dtype, shape, alpha, beta)
            .map_err(|e| e.to_string())?;
        let ok = match dtype {
            Dtype::F64 => run_one::<f64>(&jit, &spec, args),
            Dtype::F32 => run_one::<f32>(&jit, &spec, args),
            Dtype::F16 => return Err("f16 kernels run on GPUs only".into()),
        }?;
        failures += !ok as usize;
    }
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("smallgemm: {failures} check(s) FAILED");
        ExitCode::FAILURE
    })
}

fn run_one<T: Element>(jit: &Jit, spec: &GemmSpec, args: &RunArgs) -> Result<bool, String> {
    let batch = args.batch.unwrap_or(hot_batch(spec, default_hot_bytes()));
    let kernel = jit.kernel(spec).map_err(|e| e.to_string())?;
    let (alpha, beta) = (T::from_f64(args.alpha), T::from_f64(args.beta));

    let mut data = TestData::<T>::new(spec, batch, args.seed);
    // A and B as line-aligned copies, as `smallgemm bench` lays out its operands: on the
    // reference data's own, 16 bytes past a line, f64 8x8x8 timed 43.8 GFLOP/s against the
    // bench's 57.4.
    let (a, b) = (
        AlignedBuf::from_slice(&data.a)?,
        AlignedBuf::from_slice(&data.b)?,
    );
    kernel
        .run(&a, &b, data.c_mut(), batch, alpha, beta)
        .map_err(|e| e.to_string())?;
    let report = data.check(alpha.to_f64(), beta.to_f64());

    // Timing, on an aligned copy of C too: warm up, size the samples, take the median.
    let mut c = AlignedBuf::from_slice(data.c_mut())?;
    let mut call = || kernel.run(&a, &b, &mut c, batch, alpha, beta);
    call().map_err(|e| e.to_string())?;
    let start = Instant::now();
    call().map_err(|e| e.to_string())?;
    let once = start.elapsed().as_secs_f64().max(1e-9);
    let inner = ((MIN_SAMPLE_SECONDS / once).ceil() as usize).max(1);
    let mut samples = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let start = Instant::now();
        for _ in 0..inner {
            call().map_err(|e| e.to_string())?;
        }
        samples.push(start.elapsed().as_secs_f64() / inner as f64);
    }
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    let gflops = spec.flops() * batch as f64 / median / 1e9;

    let t = |on: bool| if on { 't' } else { 'n' };
    println!(
        "{} {:>3}x{:<3}x{:<3} {}{} alpha={} beta={} {:<6} compile {:>7.1} µs  {:>7.2} GFLOP/s  max rel err {:.2e}  {}",
        spec.dtype().name(),
        spec.m(),
        spec.n(),
        spec.k(),
        t(args.shape.trans_a),
        t(args.shape.trans_b),
        args.alpha,
        args.beta,
        kernel.target(),
        kernel.compile_time().as_secs_f64() * 1e6,
        gflops,
        report.max_error,
        if report.passed() { "ok" } else { "FAIL" }
    );
    if let Some(why) = &report.failure {
        eprintln!("  {why}");
    }
    Ok(report.passed())
}
