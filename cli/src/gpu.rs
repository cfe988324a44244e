//! The GPU side of the `smallgemm` command: `emit --isa sm_80|sm_90` (PTX), `run --isa
//! cuda` (run and verify on the GPU), `bench --gpu` (against cuBLAS) and `tune --gpu`.
//! `main` hands these invocations here before its own parser sees them, so the CPU
//! subcommands keep their flags.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use smallgemm::cuda::bench::{self, BenchConfig, Report};
use smallgemm::cuda::{self, f16, BatchKind, Gpu, GpuElement};
use smallgemm::tuning::{self, TuningDb};
use smallgemm::{Dtype, GemmSpec, Layout, Operand, Scalar, Trans};
use smallgemm_ir::reference::SplitMix64;
use smallgemm_ir::{row_tile_warps, ColMajorProblem, GpuSchedule, GpuTarget, Sm, Staging};

/// Whether `args` (without the program name) is a GPU invocation; if so, runs it.
pub fn dispatch(args: &[String]) -> Option<Result<ExitCode, String>> {
    let sub = args.first()?.as_str();
    let has = |flag: &str, values: &[&str]| {
        args.windows(2)
            .any(|w| w[0] == flag && values.contains(&w[1].as_str()))
            || values
                .iter()
                .any(|v| args.iter().any(|a| *a == format!("{flag}={v}")))
    };
    let gpu = match sub {
        "emit" => has("--isa", &["sm_80", "sm_90", "sm80", "sm90"]),
        "run" => has("--isa", &["cuda"]),
        "bench" | "tune" => args.iter().any(|a| a == "--gpu"),
        _ => false,
    };
    if !gpu {
        return None;
    }
    let argv = std::iter::once("smallgemm".to_string()).chain(args.iter().cloned());
    let cli = match GpuCli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Some(Ok(ExitCode::from(2)));
        }
    };
    Some(match cli.command {
        GpuCommand::Emit(a) => emit(&a),
        GpuCommand::Run(a) => run(&a),
        GpuCommand::Bench(a) => run_bench(&a),
        GpuCommand::Tune(a) => tune(&a),
    })
}

#[derive(Parser)]
#[command(name = "smallgemm", about = "smallgemm's GPU commands")]
struct GpuCli {
    #[command(subcommand)]
    command: GpuCommand,
}

#[derive(Subcommand)]
enum GpuCommand {
    /// Write a kernel's PTX (--isa sm_80 or sm_90).
    Emit(EmitArgs),
    /// Run and verify kernels on the GPU (--isa cuda).
    Run(RunArgs),
    /// smallgemm against cuBLAS on the GPU (--gpu).
    Bench(BenchArgs),
    /// Sweep GPU schedules and store the winners (--gpu).
    Tune(TuneArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DtypeArg {
    F64,
    F32,
    F16,
}

impl From<DtypeArg> for Dtype {
    fn from(d: DtypeArg) -> Dtype {
        match d {
            DtypeArg::F64 => Dtype::F64,
            DtypeArg::F32 => Dtype::F32,
            DtypeArg::F16 => Dtype::F16,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KindArg {
    Strided,
    Pointer,
    Variable,
}

#[derive(Args, Clone, Debug)]
struct Shape {
    #[arg(long)]
    m: Option<usize>,
    #[arg(long)]
    n: Option<usize>,
    #[arg(long)]
    k: Option<usize>,
    #[arg(long)]
    trans_a: bool,
    #[arg(long)]
    trans_b: bool,
    /// Storage order of A, B and C: col or row.
    #[arg(long, default_value = "col")]
    layout: String,
    #[arg(long)]
    lda: Option<usize>,
    #[arg(long)]
    ldb: Option<usize>,
    #[arg(long)]
    ldc: Option<usize>,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "1", allow_negative_numbers = true)]
    alpha: String,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "0", allow_negative_numbers = true)]
    beta: String,
}

fn scalar(name: &str, text: &str) -> Result<Scalar, String> {
    if text == "runtime" {
        return Ok(Scalar::Runtime);
    }
    let v: f64 = text
        .parse()
        .map_err(|_| format!("--{name} takes a number or \"runtime\", not {text:?}"))?;
    Scalar::fixed(v).map_err(|e| e.to_string())
}

impl Shape {
    fn shape(&self) -> Result<Option<(usize, usize, usize)>, String> {
        match (self.m, self.n, self.k) {
            (Some(m), Some(n), Some(k)) => Ok(Some((m, n, k))),
            (None, None, None) => Ok(None),
            _ => Err("give all of --m, --n and --k, or none of them".into()),
        }
    }

    fn spec(&self, dtype: Dtype, (m, n, k): (usize, usize, usize)) -> Result<GemmSpec, String> {
        let t = |on: bool| if on { Trans::T } else { Trans::N };
        let layout = match self.layout.as_str() {
            "col" => Layout::ColMajor,
            "row" => Layout::RowMajor,
            other => return Err(format!("--layout is col or row, not {other:?}")),
        };
        let mut b = GemmSpec::builder(dtype, m, n, k)
            .trans_a(t(self.trans_a))
            .trans_b(t(self.trans_b))
            .layout(layout)
            .alpha(scalar("alpha", &self.alpha)?)
            .beta(scalar("beta", &self.beta)?);
        if let Some(v) = self.lda {
            b = b.lda(v);
        }
        if let Some(v) = self.ldb {
            b = b.ldb(v);
        }
        if let Some(v) = self.ldc {
            b = b.ldc(v);
        }
        b.build().map_err(|e| e.to_string())
    }
}

#[derive(Args, Debug)]
struct EmitArgs {
    /// sm_80 or sm_90.
    #[arg(long)]
    isa: Sm,
    #[arg(long, value_enum, default_value = "f64")]
    dtype: DtypeArg,
    #[command(flatten)]
    shape: Shape,
    /// Only ptx.
    #[arg(long, default_value = "ptx")]
    format: String,
    #[arg(long, value_enum, default_value = "strided")]
    batch_kind: KindArg,
    /// A GPU schedule as JSON (default: the planner's).
    #[arg(long)]
    schedule: Option<String>,
    #[arg(short, long)]
    output: Option<PathBuf>,
}

fn kind(k: KindArg) -> BatchKind {
    match k {
        KindArg::Strided => BatchKind::Strided,
        KindArg::Pointer => BatchKind::PointerArray,
        KindArg::Variable => BatchKind::VariableSize,
    }
}

fn emit(args: &EmitArgs) -> Result<ExitCode, String> {
    if args.format != "ptx" {
        return Err(format!(
            "--format {} is not a GPU format (ptx)",
            args.format
        ));
    }
    let shape = args
        .shape
        .shape()?
        .ok_or("emit needs a shape: --m, --n and --k")?;
    let spec = args.shape.spec(args.dtype.into(), shape)?;
    let schedule: Option<GpuSchedule> = match &args.schedule {
        Some(text) => Some(serde_json::from_str(text).map_err(|e| format!("--schedule: {e}"))?),
        None => None,
    };
    let kernel = smallgemm_codegen_ptx::generate(
        &spec,
        &GpuTarget::new(args.isa),
        schedule.as_ref(),
        kind(args.batch_kind),
    )
    .map_err(|e| e.to_string())?;
    let text = format!(
        "// {}\n// launch: {} threads/block, {} problems/block, {} bytes dynamic shared memory\n{}",
        spec.name(),
        kernel.threads_per_block,
        kernel.schedule.tba,
        kernel.shared_bytes,
        kernel.ptx
    );
    match &args.output {
        Some(p) => {
            std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?
        }
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| format!("cannot write to standard output: {e}"))?,
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
struct RunArgs {
    /// cuda.
    #[arg(long)]
    isa: String,
    /// Element type (default: all three in the sweep).
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    #[command(flatten)]
    shape: Shape,
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    #[arg(long, default_value_t = 0)]
    device: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `spec` on random data and checks every element against an f64 reference (sentinels
/// after C, NaN in C for beta = 0); returns (max relative error, tolerance).
fn verify<T: GpuElement>(
    gpu: &Gpu,
    spec: &GemmSpec,
    batch: usize,
    seed: u64,
) -> Result<(f64, f64), String> {
    verify_with::<T>(gpu, spec, batch, seed, None)
}

/// [`verify`] with the given schedule instead of the runtime's.
fn verify_with<T: GpuElement>(
    gpu: &Gpu,
    spec: &GemmSpec,
    batch: usize,
    seed: u64,
    schedule: Option<&GpuSchedule>,
) -> Result<(f64, f64), String> {
    let mut rng = SplitMix64::new(seed);
    let mut random = |n: usize| -> Vec<T> { (0..n).map(|_| T::from_f64(rng.nonzero())).collect() };
    let a = random(spec.required_len(Operand::A, batch));
    let b = random(spec.required_len(Operand::B, batch));
    let clen = spec.required_len(Operand::C, batch);
    let mut c = random(clen + 16);
    if spec.beta() == Scalar::Zero {
        for v in c.iter_mut().take(clen) {
            *v = T::from_f64(f64::NAN);
        }
    }
    let (alpha, beta) = (
        spec.alpha().value().unwrap_or(1.25),
        spec.beta().value().unwrap_or(-0.5),
    );
    let e = |e: cuda::CudaError| e.to_string();
    let (da, db, mut dc) = (
        gpu.upload(&a).map_err(e)?,
        gpu.upload(&b).map_err(e)?,
        gpu.upload(&c).map_err(e)?,
    );
    let kernel = match schedule {
        Some(s) => gpu.kernel_with_schedule(spec, BatchKind::Strided, s),
        None => gpu.kernel(spec, BatchKind::Strided),
    }
    .map_err(e)?;
    kernel
        .launch_strided(gpu.stream(), &da, &db, &mut dc, batch, alpha, beta)
        .map_err(e)?;
    let out = gpu.download(&dc).map_err(e)?;
    let tol = 2.0 * (spec.k() as f64 + 3.0) * spec.dtype().unit_roundoff();
    let mut worst: f64 = 0.0;
    for i in (0..batch).step_by((batch / 97).max(1)) {
        for col in 0..spec.n() {
            for row in 0..spec.m() {
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for p in 0..spec.k() {
                    let x =
                        a[i * spec.stride(Operand::A) + spec.index(Operand::A, row, p)].to_f64();
                    let y =
                        b[i * spec.stride(Operand::B) + spec.index(Operand::B, p, col)].to_f64();
                    sum += x * y;
                    mag += (x * y).abs();
                }
                let at = i * spec.stride(Operand::C) + spec.index(Operand::C, row, col);
                let (mut want, mut scale) = (alpha * sum, alpha.abs() * mag);
                if beta != 0.0 {
                    want += beta * c[at].to_f64();
                    scale += (beta * c[at].to_f64()).abs();
                }
                let want = T::from_f64(want).to_f64();
                let err = (out[at].to_f64() - want).abs() / scale.max(f64::MIN_POSITIVE);
                let err = if err.is_nan() { f64::INFINITY } else { err };
                worst = worst.max(err);
            }
        }
    }
    if out[clen..]
        .iter()
        .zip(&c[clen..])
        .any(|(x, y)| x.to_f64().to_bits() != y.to_f64().to_bits())
    {
        return Err(format!("{}: the kernel wrote past the last C", spec.name()));
    }
    Ok((worst, tol))
}

fn run(args: &RunArgs) -> Result<ExitCode, String> {
    if args.isa != "cuda" {
        return Err(format!("--isa {} is not a GPU (cuda)", args.isa));
    }
    let gpu = Gpu::new(args.device).map_err(|e| e.to_string())?;
    println!("device {} ({})", gpu.name(), gpu.target().sm);
    let cases: Vec<GemmSpec> = match args.shape.shape()? {
        Some(shape) => vec![args
            .shape
            .spec(args.dtype.map(Into::into).unwrap_or(Dtype::F64), shape)?],
        None => {
            let dtypes: Vec<Dtype> = match args.dtype {
                Some(d) => vec![d.into()],
                None => vec![Dtype::F64, Dtype::F32, Dtype::F16],
            };
            let mut v = Vec::new();
            for d in dtypes {
                let top = if d == Dtype::F16 { 128 } else { 32 };
                for n in 2..=top {
                    v.push(args.shape.spec(d, (n, n, n))?);
                }
            }
            v
        }
    };
    let mut failed = 0;
    for spec in &cases {
        let r = match spec.dtype() {
            Dtype::F64 => verify::<f64>(&gpu, spec, args.batch, args.seed),
            Dtype::F32 => verify::<f32>(&gpu, spec, args.batch, args.seed),
            Dtype::F16 => verify::<f16>(&gpu, spec, args.batch, args.seed),
        };
        match r {
            Ok((err, tol)) if err <= tol => {
                // The entry name shows the schedule (tuned or planned).
                let entry = gpu
                    .kernel(spec, BatchKind::Strided)
                    .map(|k| k.ptx().entry.clone())
                    .unwrap_or_default();
                println!("ok   {entry} max error {err:.2e} (tolerance {tol:.2e})")
            }
            Ok((err, tol)) => {
                failed += 1;
                println!(
                    "FAIL {} max error {err:.2e} > tolerance {tol:.2e}",
                    spec.name()
                )
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {e}")
            }
        }
    }
    println!("{} of {} passed", cases.len() - failed, cases.len());
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[arg(long)]
    gpu: bool,
    /// A few sizes per dtype instead of every size.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Folder for bench.csv and bench.svg.
    #[arg(long, default_value = "gpu-bench")]
    out: PathBuf,
    /// Only the f16 sizes (no f64/f32, no variable-size batches).
    #[arg(long)]
    f16_only: bool,
    /// Only the variable-size batches.
    #[arg(long)]
    variable_only: bool,
    /// The f16 sizes to measure (default: 2..=128).
    #[arg(long, value_delimiter = ',')]
    f16_sizes: Option<Vec<usize>>,
    #[arg(long, default_value_t = 0)]
    device: usize,
}

fn run_bench(args: &BenchArgs) -> Result<ExitCode, String> {
    let gpu = Gpu::new(args.device).map_err(|e| e.to_string())?;
    let mut cfg = BenchConfig {
        reps: args.reps,
        ..BenchConfig::default()
    };
    if args.quick {
        cfg.f64_sizes = vec![2, 4, 8, 16, 24, 32];
        cfg.f32_sizes = vec![2, 4, 8, 16, 24, 32];
        cfg.f16_sizes = vec![2, 8, 16, 32, 64, 128];
    }
    if args.f16_only {
        cfg.f64_sizes.clear();
        cfg.f32_sizes.clear();
        cfg.variable.clear();
    }
    if args.variable_only {
        cfg.f64_sizes.clear();
        cfg.f32_sizes.clear();
        cfg.f16_sizes.clear();
    }
    if let Some(sizes) = &args.f16_sizes {
        cfg.f16_sizes = sizes.clone();
    }
    println!("device {} ({})", gpu.name(), gpu.target().sm);
    println!("dtype     n     batch  ours GF/s  ours %bound  cuBLAS GF/s  cuBLAS %bound  speedup  schedule");
    let report = bench::run(&gpu, &cfg, |row, bw| println!("{}", Report::line(row, bw)))
        .map_err(|e| e.to_string())?;
    println!(
        "copy bandwidth {:.0} GB/s; bound = flops / (bytes / bandwidth), bytes = A, B, C read + C written",
        report.bandwidth / 1e9
    );
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    for (name, text) in [
        ("bench.txt", report.table()),
        ("bench.csv", report.csv()),
        ("bench.svg", report.svg()),
    ] {
        let p = args.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    println!("wrote {}/bench.{{txt,csv,svg}}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
struct TuneArgs {
    #[arg(long)]
    gpu: bool,
    /// Element types to tune (default: all three).
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Square sizes (default: 2..32, and 2..128 step 2 for f16... see --sizes).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Tune the variable-size batch (sizes uniform in 1..=32) instead of square sizes.
    #[arg(long)]
    variable: bool,
    /// The tuning database the winners are merged into (its `gpu` section): the same file
    /// as the CPU tuner's, by default `smallgemm::tuning::default_path()`. The runtime
    /// (`Gpu::kernel`) uses the entries of its device.
    #[arg(long)]
    db: Option<PathBuf>,
    /// f16: only the tensor-core candidates (both fragment loaders).
    #[arg(long)]
    mma_only: bool,
    /// With --variable: also tune the schedule of each bucket of the bucketed launch
    /// (`Gpu::bucket_variable`), one bucket after another, keeping each bucket's best.
    #[arg(long)]
    buckets: bool,
    /// f16 tensor-core candidates: only those that load fragments with `ldmatrix`.
    #[arg(long)]
    ldmatrix_only: bool,
    /// f16 tensor-core candidates: the planned schedule, and those with `ldmatrix` and the C
    /// prefetch (or C through shared memory) with up to 2 problems per block and (above 24)
    /// at least 2 warps: the winners' ranges of a full sweep (docs/gpu-notes.md, version 6).
    #[arg(long)]
    quick_mma: bool,
    /// f16 tensor-core candidates: the planned schedule, and those with `ldmatrix` and C
    /// through shared memory (`FlatC`) with up to 2 problems per block and at least 2 warps,
    /// or flat A and B with the C prefetch, up to 2 problems per block and at least 4 warps.
    #[arg(long)]
    flatc_only: bool,
    /// Only the planned schedule, with each count of blocks per SM that ptxas must make
    /// room for (`min_blocks`: 0, the code generator's rule, and 1..=4 up to what the
    /// block's threads allow), each also with the last k step a full `m16n8k16`
    /// (`full_last_k_step`, where that changes the code).
    #[arg(long)]
    min_blocks: bool,
    /// f16 tensor-core candidates: only the planned schedule and `FlatC` with `ldmatrix`, 8
    /// and 16 warps and one problem per block, each with 1, 2 and 3 tiles per warp group
    /// (`mma_group`) where grouping takes effect.
    #[arg(long)]
    groups: bool,
    /// f16 tensor-core candidates: only the planned schedule and `FlatC` with `ldmatrix`, 8
    /// and 16 warps and each multiple of the row tiles from 4 to 16 warps, one problem per
    /// block, each as it is and with C's copy in A's place (`c_over_a`, where it takes
    /// effect) with the code generator's blocks per SM and with 2 and 3.
    #[arg(long)]
    c_over_a: bool,
    /// f16 tensor-core candidates: only the planned schedule and those that copy A and B
    /// verbatim and read fragments with 16-bit loads (`flat_fragments`): 1, 2, 4 and 8
    /// warps, 1 and 2 problems per block, with the C prefetch and with C through shared
    /// memory.
    #[arg(long)]
    flat_fragments: bool,
    /// f16 tensor-core candidates: only the planned schedule, it with its verbatim copies
    /// through `cp.async` (`async_copies`, where it takes effect), and up to 64 the
    /// flat-fragment schedules with C through shared memory (1, 2 and 4 warps, 1 and 2
    /// problems per block) with `cp.async`.
    #[arg(long)]
    async_copies: bool,
    /// f16 tensor-core candidates: only the planned schedule, then with A and B realigned
    /// in shared memory from verbatim copies (`realign_in_shared`, where it takes effect):
    /// the planned schedule and `FlatC` with `ldmatrix` at 8, 16 and each multiple of the
    /// row tiles from 4 to 16 warps (up to 48 also 2 and 4 warps with 1, 2 and 4 problems
    /// per block), with and without the other copies through `cp.async`,
    /// and with and without C's copy in A's place (warps keeping one row of tiles each) or
    /// in groups of 1, 2 and 3 tiles (the others).
    #[arg(long)]
    realign_in_shared: bool,
    /// Only the planned schedule, the schedule in use (the tuning database's entry for the
    /// device, shipped or the user's, else the planned one) and the schedules in this
    /// file: a JSON array of objects in the tuning database's form, each a change to the
    /// schedule in use (the fields left out keep its values; e.g. `[{"warps": 14,
    /// "min_blocks": 2}]`). Those that do not fit a size, or repeat another's code, are
    /// left out there.
    #[arg(long)]
    schedules: Option<PathBuf>,
    /// Only the planned schedule, the schedule in use and its neighbours, as with
    /// `--schedules`: single-field changes (flags on and off, blocks per SM 0..=4,
    /// `row_group`, `mma_group`, 4 to 16 warps).
    #[arg(long, conflicts_with = "schedules")]
    neighbours: bool,
    #[arg(long, default_value_t = 0)]
    device: usize,
}

/// The candidates a variable-size batch can run (FMA kernels with padded staging), each
/// also with vector reads of A and B (`vector_reads`), and each of those with the staging
/// through `cp.async` (`async_copies`); then the planned schedule with 6, 7 and 8 blocks
/// per SM for ptxas (`min_blocks`: with it the H200's f64 buckets of 32 and 64 threads took
/// more registers and gained 3 points; docs/gpu-notes.md, version 30).
fn variable_candidates(spec: &GemmSpec, target: &GpuTarget) -> Vec<GpuSchedule> {
    let mut out: Vec<GpuSchedule> = candidates(spec, target)
        .into_iter()
        .filter(|s| s.mma.is_none() && s.stage == Staging::Padded)
        .flat_map(|s| [false, true].map(|vector_reads| GpuSchedule { vector_reads, ..s }))
        .flat_map(|s| [false, true].map(|async_copies| GpuSchedule { async_copies, ..s }))
        .collect();
    if let Ok(planned) = smallgemm_codegen_ptx::plan(spec, target, BatchKind::VariableSize) {
        out.extend([6, 7, 8].map(|min_blocks| GpuSchedule {
            min_blocks,
            ..planned
        }));
    }
    out
}

/// Candidate schedules for a square problem, pruned by the hard limits of the device and
/// the soft rule of paper 001 (lightweight blocks: 64..=512 threads win for batches). FMA
/// kernels with flat staging come with their copies through `cp.async` too: on an H200
/// those won at nearly every f64 and f32 size (docs/gpu-notes.md, version 28).
pub fn candidates(spec: &GemmSpec, target: &GpuTarget) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let mut out = Vec::new();
    // Wider tiles only pay from about 16 (f16 FMA kernels, variable batches).
    let wide: &[(u32, u32)] = if spec.m().max(spec.n()) >= 16 {
        &[(8, 4), (8, 8)]
    } else {
        &[]
    };
    for (rm, rn, stage) in [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4)]
        .iter()
        .chain(wide)
        .copied()
        .flat_map(|(rm, rn)| {
            [Staging::Padded, Staging::Flat, Staging::FlatC].map(move |st| (rm, rn, st))
        })
    {
        for threads in [64u32, 128, 256, 512, 1024] {
            let mut s = GpuSchedule::fma(rm, rn, 1, stage);
            let tpp = s.fma_threads(&p);
            s.tba = (threads / tpp).max(1);
            // Blocks less than half full of threads waste the block's slots.
            if tpp > threads || s.tba * tpp * 2 <= threads {
                continue;
            }
            // Padded staging twice without `cp.async` (the second one is a duplicate).
            for async_copies in [false, stage != Staging::Padded] {
                let s = GpuSchedule { async_copies, ..s };
                if s.validate(&p, target).is_ok() && !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
    if spec.dtype() == Dtype::F16 && spec.m().max(spec.n()) >= 8 {
        out.extend(mma_candidates(spec, target, &[false, true]));
    }
    out
}

/// Tensor-core candidates: 1, 2, 4, 8 or 16 warps and one a row tile (where that is
/// another count up to 16), 1, 2 or 4 problems per block (at most
/// 16 warps a block), the fragment loaders in `loaders` (`ldmatrix` or not), with and without
/// the C prefetch, flat staging of A and B where a side is not a multiple of 8 (the only
/// sizes where it differs from the padded loader; each with the slot division by a
/// multiply-high and without), and C through shared memory (`FlatC`, where the prefetch is
/// moot: tried without; also with its copies through `cp.async`, and with A and B straight
/// into their slots).
pub fn mma_candidates(spec: &GemmSpec, target: &GpuTarget, loaders: &[bool]) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let odd = [spec.m(), spec.n(), spec.k()].iter().any(|x| x % 8 != 0);
    let stages: &[Staging] = if odd {
        &[Staging::Padded, Staging::Flat, Staging::FlatC]
    } else {
        &[Staging::Padded, Staging::FlatC]
    };
    // The columns' lengths of A and B as stored (`slot_copies` copies columns of whole
    // pairs).
    let a_lead = if p.trans_a == Trans::N { p.m } else { p.k };
    let b_lead = if p.trans_b == Trans::N { p.k } else { p.n };
    let mut out = Vec::new();
    // One warp a row tile, its column tiles in groups (`row_group`): the H200's winners at
    // 34..47 and 65..79 (docs/gpu-notes.md, version 29).
    let row_tiles = p.m.div_ceil(16) as u32;
    let mut counts = vec![1, 2, 4, 8, 16];
    if row_tiles <= 16 && !counts.contains(&row_tiles) {
        counts.push(row_tiles);
    }
    for warps in counts {
        for tba in [1, 2, 4] {
            for &ldmatrix in loaders {
                for &stage in stages {
                    for prefetch_c in [false, true] {
                        if stage == Staging::FlatC && prefetch_c {
                            continue;
                        }
                        let s = GpuSchedule {
                            stage,
                            prefetch_c,
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        };
                        if s.validate(&p, target).is_ok() && warps * tba <= 16 {
                            out.push(s);
                            if stage == Staging::Flat {
                                // The realigning loaders' two forms of the slot division.
                                out.push(GpuSchedule {
                                    mul_hi_slots: true,
                                    ..s
                                });
                            }
                            if stage == Staging::FlatC {
                                out.extend(grouped(&p, &s));
                                // C's copy through `cp.async`, and A and B straight into
                                // their slots where a column's length is even
                                // (`slot_copies`): the H200's winners at 34..116
                                // (docs/gpu-notes.md, version 30).
                                let copied = GpuSchedule {
                                    async_copies: true,
                                    ..s
                                };
                                let mut forms = vec![copied];
                                if [a_lead, b_lead].iter().any(|x| x % 2 == 0) {
                                    forms.push(GpuSchedule {
                                        slot_copies: true,
                                        ..copied
                                    });
                                }
                                for f in &forms {
                                    out.push(*f);
                                    out.extend(grouped(&p, f));
                                }
                                // The epilogue's 16-bit accesses where C's copy is padded
                                // (m even) and would move by tiles: the H200's winners at
                                // 66, 68, 114 and 116 (docs/gpu-notes.md, version 31).
                                if p.m % 2 == 0 && target.sm == Sm::Sm90 {
                                    out.extend(forms.iter().map(|f| GpuSchedule {
                                        element_epilogue: true,
                                        ..*f
                                    }));
                                }
                                // The epilogue's loads before its stores: each tile's
                                // where it moves elements (m odd: C's copy verbatim; sm_80),
                                // a group's where tiles move whole (m even on sm_90): the
                                // H200's winners at 97, 122, 126 and 19 more sizes
                                // (docs/gpu-notes.md, version 32).
                                let first = |f: &GpuSchedule| GpuSchedule {
                                    epilogue_loads_first: true,
                                    ..*f
                                };
                                for f in &forms {
                                    if p.m % 2 == 0 && target.sm == Sm::Sm90 {
                                        out.extend(grouped(&p, f).iter().map(first));
                                    } else {
                                        out.push(first(f));
                                    }
                                }
                                // The epilogue's lanes in swapped order where C's copy is
                                // verbatim (m odd): its 16-bit accesses were the odd sizes'
                                // largest bank conflicts (ncu at 113: 1,679 wavefronts a
                                // problem for an ideal 895; docs/gpu-notes.md, version 33).
                                // Only where the order changes the code (C's copy in
                                // shared memory, a table other than the plain one).
                                if p.m % 2 == 1 {
                                    for f in &forms {
                                        let swapped = GpuSchedule {
                                            epilogue_swaps: true,
                                            ..*f
                                        };
                                        if ptx_code(spec, target, &swapped)
                                            != ptx_code(spec, target, f)
                                        {
                                            out.push(swapped);
                                        }
                                    }
                                }
                                // The last k step a full `m16n8k16` where at most 8 of k are
                                // left: the narrow step's fewer registers may let one more
                                // block onto an SM, which lost 17 points at 84 on the H200
                                // (docs/gpu-notes.md, version 33).
                                if (1..=8).contains(&(p.k % 16)) {
                                    out.extend(forms.iter().map(|f| GpuSchedule {
                                        full_last_k_step: true,
                                        ..*f
                                    }));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out.extend(row_pair_candidates(&p, target, loaders, &out));
    out
}

/// Two row tiles a warp (`row_pairs`), one problem a block, C through shared memory and
/// its copy through `cp.async`, at each multiple of the pairs up to 16 warps: with at most
/// one block per SM asked of ptxas (twice A's fragments in registers), alone and with the
/// column tiles in groups (the H200's winners at 52..128), and with A's fragments loaded
/// at each k step for one group of all a warp's column tiles (`stream_a`, the code
/// generator's blocks per SM: the winners at 113..127 odd; docs/gpu-notes.md, version 34).
/// Only those not already in `before`.
fn row_pair_candidates(
    p: &ColMajorProblem,
    target: &GpuTarget,
    loaders: &[bool],
    before: &[GpuSchedule],
) -> Vec<GpuSchedule> {
    let pairs = p.m.div_ceil(32) as u32;
    if p.m <= 16 || !loaders.contains(&true) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for warps in (1..=16 / pairs).map(|x| x * pairs) {
        let s = GpuSchedule {
            stage: Staging::FlatC,
            async_copies: true,
            row_pairs: true,
            min_blocks: 1,
            ..GpuSchedule::mma(warps, 1, true)
        };
        if s.validate(p, target).is_err() {
            continue;
        }
        out.push(s);
        out.extend(grouped(p, &s));
        out.push(GpuSchedule {
            stream_a: true,
            row_group: 16,
            min_blocks: 0,
            ..s
        });
    }
    out.retain(|s| !before.contains(s));
    out
}

/// `s` with its tiles in groups where a row has enough column tiles: 2 and 3 tiles per
/// warp group (`mma_group`) where the warp count is no multiple of the row tiles, else 3
/// and 5 column tiles together (`row_group`: each warp keeps one row of tiles).
fn grouped(p: &ColMajorProblem, s: &GpuSchedule) -> Vec<GpuSchedule> {
    let (mt, nt) = (p.m.div_ceil(16) as u32, p.n.div_ceil(8) as u32);
    if s.mma.is_none() {
        return Vec::new();
    }
    if s.warps % mt != 0 {
        (2..=3)
            .filter(|&g| g <= nt)
            .map(|mma_group| GpuSchedule { mma_group, ..*s })
            .collect()
    } else {
        [3, 5]
            .into_iter()
            .filter(|&g| g <= nt)
            .map(|row_group| GpuSchedule { row_group, ..*s })
            .collect()
    }
}

/// `tune --flat-fragments`: the planned schedule, then A and B copied verbatim with
/// fragments read by 16-bit loads (`flat_fragments`): 1, 2, 4 and 8 warps, 1 and 2
/// problems per block, with the C prefetch (`Flat`) and with C through shared memory
/// (`FlatC`).
fn flat_fragment_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    planned: Option<GpuSchedule>,
) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let mut out: Vec<GpuSchedule> = planned.into_iter().collect();
    for warps in [1, 2, 4, 8] {
        for tba in [1, 2] {
            for (stage, prefetch_c) in [(Staging::Flat, true), (Staging::FlatC, false)] {
                let s = GpuSchedule {
                    stage,
                    prefetch_c,
                    flat_fragments: true,
                    ..GpuSchedule::mma(warps, tba, false)
                };
                if s.validate(&p, target).is_ok() {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// `tune --async-copies`: the planned schedule, it with `async_copies` where that changes
/// its code, and up to 64 (verbatim fragments lost from 65 in version 15's sweep) `FlatC`
/// flat-fragment schedules of 1, 2 and 4 warps and 1 and 2 problems per block with
/// `async_copies`.
fn async_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    planned: Option<GpuSchedule>,
) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let out: Vec<GpuSchedule> = planned.into_iter().collect();
    let mut more: Vec<GpuSchedule> = planned
        .map(|s| GpuSchedule {
            async_copies: !s.async_copies,
            ..s
        })
        .into_iter()
        .collect();
    if p.m.max(p.n) <= 64 {
        more.extend(
            flat_fragment_candidates(spec, target, None)
                .into_iter()
                .filter(|s| s.stage == Staging::FlatC && s.warps <= 4)
                .map(|s| GpuSchedule {
                    async_copies: true,
                    ..s
                }),
        );
    }
    with_distinct(spec, target, out, more)
}

/// `tune --realign-in-shared`: the planned schedule, then with `realign_in_shared` (where
/// it changes the code): the planned schedule and `FlatC` with `ldmatrix` at 8 and 16
/// warps and each multiple of the row tiles from 4 to 16, one problem per block (up to 48
/// also 2 and 4 warps with 1, 2 and 4 problems per block), each with and without
/// `async_copies`, and where the warps keep one row of tiles each with and without
/// `c_over_a`, elsewhere in groups of 1, 2 and 3 tiles; each also with 16-byte vectors
/// instead of words (`realign_vectors`) where that changes the code.
fn realign_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    planned: Option<GpuSchedule>,
) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let mt = p.m.div_ceil(16) as u32;
    let out: Vec<GpuSchedule> = planned.into_iter().collect();
    let mut shapes: Vec<(u32, u32)> = row_tile_warps(&p).into_iter().map(|w| (w, 1)).collect();
    if p.m.max(p.n) <= 48 {
        // Small problems: also 2 and 4 warps, 1, 2 and 4 problems per block.
        shapes.extend(
            [2, 4]
                .into_iter()
                .flat_map(|w| [1, 2, 4].map(|tba| (w, tba))),
        );
    }
    let mut more = Vec::new();
    let flatc = shapes.into_iter().map(|(warps, tba)| flatc(warps, tba));
    for s in planned.into_iter().chain(flatc) {
        let s = GpuSchedule {
            realign_in_shared: true,
            ..s
        };
        let layouts: Vec<GpuSchedule> = if s.warps % mt == 0 {
            [false, true]
                .map(|c_over_a| GpuSchedule {
                    c_over_a,
                    mma_group: 0,
                    ..s
                })
                .into()
        } else {
            [0, 2, 3]
                .map(|mma_group| GpuSchedule {
                    c_over_a: false,
                    mma_group,
                    ..s
                })
                .into()
        };
        for l in layouts {
            more.extend(
                [s.async_copies, !s.async_copies]
                    .map(|async_copies| GpuSchedule { async_copies, ..l }),
            );
        }
    }
    // Only where the flag changes the code (A or B realigned).
    more.retain(|s| {
        let without = GpuSchedule {
            realign_in_shared: false,
            ..*s
        };
        ptx_code(spec, target, s) != ptx_code(spec, target, &without)
    });
    // Each also with 16-byte vectors where the words would realign (`realign_vectors`:
    // the planned kernels' winners at 61..125 on an H200; elsewhere the code is the same
    // and `with_distinct` drops it).
    let vectors: Vec<GpuSchedule> = more
        .iter()
        .map(|s| GpuSchedule {
            realign_vectors: true,
            ..*s
        })
        .collect();
    more.extend(vectors);
    with_distinct(spec, target, out, more)
}

/// A tensor-core schedule with `ldmatrix` and C through shared memory (`FlatC`).
fn flatc(warps: u32, tba: u32) -> GpuSchedule {
    GpuSchedule {
        stage: Staging::FlatC,
        ..GpuSchedule::mma(warps, tba, true)
    }
}

/// `out` followed by the schedules of `more` that fit and whose code differs from every
/// one before them.
fn with_distinct(
    spec: &GemmSpec,
    target: &GpuTarget,
    mut out: Vec<GpuSchedule>,
    more: impl IntoIterator<Item = GpuSchedule>,
) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let mut seen: Vec<Option<String>> = out.iter().map(|s| ptx_code(spec, target, s)).collect();
    for s in more {
        if s.validate(&p, target).is_err() || out.contains(&s) {
            continue;
        }
        let text = ptx_code(spec, target, &s);
        if !seen.contains(&text) {
            seen.push(text);
            out.push(s);
        }
    }
    out
}

/// The changes to planned schedules that `tune --schedules FILE` reads: a JSON array of
/// objects.
fn schedule_changes(
    file: &std::path::Path,
) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: expected a JSON array of objects (schedule fields): {e}",
            file.display()
        )
    })
}

/// `tune --neighbours`: changes of one field (or of warps and blocks per SM together) of
/// the schedule in use: each epilogue and copy flag on and off, `slot_copies`,
/// `element_epilogue`, `full_last_k_step` and `realign_vectors` on, 0..=4 blocks per SM,
/// `row_group` 0, 2, 3, 4, 5, 8, `mma_group` 0, 2, 3, and 4 to 16 warps. On the H200 this
/// list without `realign_vectors` (given to `--schedules`) won 9 of 26 f16 sizes below or
/// near 85% of the bound, by 1.5 to 5.6 points (docs/gpu-notes.md, version 36).
fn neighbour_changes() -> Vec<serde_json::Map<String, serde_json::Value>> {
    use serde_json::Value;
    let change = |fields: &[(&str, Value)]| {
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<serde_json::Map<_, _>>()
    };
    let mut out = Vec::new();
    for flag in [
        "epilogue_loads_first",
        "epilogue_swaps",
        "async_copies",
        "stream_a",
        "row_pairs",
    ] {
        for on in [true, false] {
            out.push(change(&[(flag, Value::from(on))]));
        }
    }
    for flag in [
        "slot_copies",
        "element_epilogue",
        "full_last_k_step",
        "realign_vectors",
    ] {
        out.push(change(&[(flag, Value::from(true))]));
    }
    out.extend((0..=4).map(|b| change(&[("min_blocks", Value::from(b))])));
    out.extend([0, 2, 3, 4, 5, 8].map(|g| change(&[("row_group", Value::from(g))])));
    out.extend([0, 2, 3].map(|g| change(&[("mma_group", Value::from(g))])));
    out.extend([4, 5, 6, 7, 8, 10, 12, 14, 16].map(|w| change(&[("warps", Value::from(w))])));
    out.extend(
        [(8, 2), (7, 3), (14, 1)]
            .map(|(w, b)| change(&[("warps", Value::from(w)), ("min_blocks", Value::from(b))])),
    );
    out
}

/// `tune --schedules`: the schedule in use, then it under each change (those that fit and
/// whose code differs from every one before).
fn changed_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    in_use: GpuSchedule,
    changes: &[serde_json::Map<String, serde_json::Value>],
) -> Result<Vec<GpuSchedule>, String> {
    let more = changes
        .iter()
        .map(|c| with_changes(&in_use, c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(with_distinct(spec, target, vec![in_use], more))
}

/// `base` with the fields of `change` replaced.
fn with_changes(
    base: &GpuSchedule,
    change: &serde_json::Map<String, serde_json::Value>,
) -> Result<GpuSchedule, String> {
    let mut v = serde_json::to_value(base).map_err(|e| e.to_string())?;
    let fields = v.as_object_mut().ok_or("a schedule is a JSON object")?;
    for (key, value) in change {
        if !fields.contains_key(key) {
            return Err(format!("--schedules: no schedule field `{key}`"));
        }
        fields.insert(key.clone(), value.clone());
    }
    serde_json::from_value(v).map_err(|e| format!("--schedules: {e}"))
}

/// `tune --groups`: the planned schedule and `FlatC` with `ldmatrix`, 8 and 16 warps, one
/// problem per block, each as it is and grouped (without the C prefetch, which measured a
/// loss with groups: 33 74.5 -> 61.9%, 91 73.7 -> 55.4% with 2 tiles a group).
fn group_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    planned: Option<GpuSchedule>,
) -> Vec<GpuSchedule> {
    let p = spec.col_major();
    let mut out: Vec<GpuSchedule> = planned.into_iter().collect();
    let flatc = [8, 16].map(|warps| flatc(warps, 1));
    for s in out.clone().iter().chain(&flatc) {
        if s.validate(&p, target).is_err() {
            continue;
        }
        for c in std::iter::once(*s).chain(if s.prefetch_c { vec![] } else { grouped(&p, s) }) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The PTX of `spec` under `s` less its entry name and comments (None where it does not
/// compile): schedules with the same code are one candidate.
fn ptx_code(spec: &GemmSpec, target: &GpuTarget, s: &GpuSchedule) -> Option<String> {
    smallgemm_codegen_ptx::generate(spec, target, Some(s), BatchKind::Strided)
        .ok()
        .map(|k| {
            k.ptx
                .replace(&k.entry, "")
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect()
        })
}

/// `tune --c-over-a`: the planned schedule and `FlatC` with `ldmatrix`, 8 and 16 warps and
/// each multiple of the row tiles from 4 to 16 warps, one problem per block, each as it is
/// and with C's copy in A's place (`c_over_a`) where the warps keep one row of tiles each,
/// that with 0, 2 and 3 blocks per SM for ptxas.
fn c_over_a_candidates(
    spec: &GemmSpec,
    target: &GpuTarget,
    planned: Option<GpuSchedule>,
) -> Vec<GpuSchedule> {
    let mt = spec.m().div_ceil(16) as u32;
    let out: Vec<GpuSchedule> = planned.into_iter().collect();
    let flatc = row_tile_warps(&spec.col_major())
        .into_iter()
        .map(|w| flatc(w, 1));
    // Counts of blocks per SM that give the code of another candidate are timed once.
    let more = out.clone().into_iter().chain(flatc).flat_map(|s| {
        let mut more = vec![s];
        if s.stage == Staging::FlatC && s.tba == 1 && s.warps % mt == 0 {
            // Warps keeping one row of tiles each: with 0, 2 and 3 blocks per SM, C's copy
            // where it is and over A.
            for c_over_a in [false, true] {
                more.extend([0, 2, 3].map(|min_blocks| GpuSchedule {
                    c_over_a,
                    min_blocks,
                    ..s
                }));
            }
        }
        more
    });
    with_distinct(spec, target, out, more)
}

fn tune(args: &TuneArgs) -> Result<ExitCode, String> {
    let mut gpu = Gpu::new(args.device).map_err(|e| e.to_string())?;
    let dtypes: Vec<Dtype> = match args.dtype {
        Some(d) => vec![d.into()],
        None => vec![Dtype::F64, Dtype::F32, Dtype::F16],
    };
    let mut probe = bench::Probe::new(128 << 20);
    let path = match &args.db {
        Some(p) => p.clone(),
        None => tuning::default_path().ok_or("no HOME: give --db")?,
    };
    let mut tdb = TuningDb::load(&path).map_err(|e| e.to_string())?;
    tdb.version = tuning::VERSION;
    let changes = match (&args.schedules, args.neighbours) {
        (Some(file), _) => Some(schedule_changes(file)?),
        (None, true) => Some(neighbour_changes()),
        (None, false) => None,
    };
    let db = &mut tdb.gpu;
    if args.variable {
        for d in dtypes {
            let spec = GemmSpec::builder(d, 32, 32, 32)
                .alpha(Scalar::fixed(1.5).map_err(|e| e.to_string())?)
                .beta(Scalar::fixed(0.5).map_err(|e| e.to_string())?)
                .build()
                .map_err(|e| e.to_string())?;
            let mut best: Option<(f64, GpuSchedule)> = None;
            let mut line = format!("{} variable 1..32:", d.name());
            let bw = bench::copy_bandwidth(&gpu, 256 << 20, 5).map_err(|e| e.to_string())?;
            for s in variable_candidates(&spec, gpu.target()) {
                match probe.time_variable(&gpu, d, &s, args.reps) {
                    Ok(row) => {
                        let frac = row.ours_fraction(bw);
                        line.push_str(&format!(" [{}]={:.0}%", s.label(), 100.0 * frac));
                        if best.is_none_or(|(b, _)| frac > b) {
                            best = Some((frac, s));
                        }
                    }
                    Err(e) => line.push_str(&format!(" [{}]=error({e})", s.label())),
                }
            }
            for lanes in [1, 2, 4, 8, 16] {
                match probe.time_bucketed(&gpu, d, lanes, args.reps) {
                    Ok(row) => line.push_str(&format!(
                        " [bucketed, {lanes} streams]={:.0}%",
                        100.0 * row.ours_fraction(bw)
                    )),
                    Err(e) => line.push_str(&format!(" [bucketed {lanes}]=error({e})")),
                }
            }
            println!("{line}");
            if let Some((frac, s)) = best {
                println!("  best {} at {:.1}% of the bound", s.label(), 100.0 * frac);
                let key = cuda::gpu_tuning_key(gpu.name(), &spec, BatchKind::VariableSize);
                db.insert(key, serde_json::to_value(s).map_err(|e| e.to_string())?);
            }
            if args.buckets {
                for (key, s) in tune_buckets(&mut gpu, &mut probe, &spec, bw, args.reps)? {
                    db.insert(key, serde_json::to_value(s).map_err(|e| e.to_string())?);
                }
            }
        }
        tdb.save(&path).map_err(|e| e.to_string())?;
        println!("wrote {}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    for d in dtypes {
        let sizes = args.sizes.clone().unwrap_or_else(|| match d {
            Dtype::F16 => (2..=128).step_by(2).collect(),
            _ => (2..=32).collect(),
        });
        for n in sizes {
            let spec = GemmSpec::builder(d, n, n, n)
                .alpha(Scalar::fixed(1.5).map_err(|e| e.to_string())?)
                .beta(Scalar::fixed(0.5).map_err(|e| e.to_string())?)
                .build()
                .map_err(|e| e.to_string())?;
            let mut timed: Vec<(f64, GpuSchedule)> = Vec::new();
            let mut line = format!("{} n={n}:", d.name());
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).ok();
            let quick = |s: &GpuSchedule| {
                Some(*s) == planned
                    || (s.ldmatrix
                        && (s.prefetch_c || s.stage == Staging::FlatC)
                        && s.tba <= 2
                        && (s.warps >= 2 || n <= 24))
            };
            let all = match (args.min_blocks, planned, &changes) {
                (true, Some(p), _) => {
                    let threads = p.resources(&spec.col_major()).threads_per_block.max(1);
                    // Counts past what shared memory allows give the same code: one each.
                    let mut seen = Vec::new();
                    // Each also with the last k step full (`full_last_k_step`, where it
                    // changes the code): another lever on the registers.
                    (0..=4)
                        .filter(|&b| b * threads <= 2048)
                        .flat_map(|b| {
                            [false, true].map(|full_last_k_step| GpuSchedule {
                                min_blocks: b,
                                full_last_k_step,
                                ..p
                            })
                        })
                        .filter(|s| {
                            let text = ptx_code(&spec, gpu.target(), s);
                            let new = !seen.contains(&text);
                            seen.push(text);
                            new
                        })
                        .collect()
                }
                _ if args.c_over_a && d == Dtype::F16 => {
                    c_over_a_candidates(&spec, gpu.target(), planned)
                }
                _ if args.groups && d == Dtype::F16 => {
                    group_candidates(&spec, gpu.target(), planned)
                }
                _ if args.flat_fragments && d == Dtype::F16 => {
                    flat_fragment_candidates(&spec, gpu.target(), planned)
                }
                _ if args.async_copies && d == Dtype::F16 => {
                    async_candidates(&spec, gpu.target(), planned)
                }
                _ if args.realign_in_shared && d == Dtype::F16 => {
                    realign_candidates(&spec, gpu.target(), planned)
                }
                (_, Some(p), Some(changes)) => {
                    // The changes apply to the schedule in use: the tuning database's entry
                    // for this device where it fits, else the planned one.
                    let in_use = gpu
                        .tuned_schedule(&spec, BatchKind::Strided)
                        .filter(|s| s.validate(&spec.col_major(), gpu.target()).is_ok())
                        .unwrap_or(p);
                    changed_candidates(&spec, gpu.target(), in_use, changes)?
                }
                _ => candidates(&spec, gpu.target()),
            };
            // As they take effect (`row_pairs` where the warps suit it), each once.
            let mut distinct: Vec<GpuSchedule> = Vec::new();
            for s in all.into_iter().map(|s| s.effective(&spec.col_major())) {
                if !distinct.contains(&s) {
                    distinct.push(s);
                }
            }
            let mut list: Vec<GpuSchedule> = distinct
                .into_iter()
                .filter(|s| !args.mma_only || s.mma.is_some())
                .filter(|s| !args.ldmatrix_only || s.mma.is_none() || s.ldmatrix)
                .filter(|s| !args.quick_mma || s.mma.is_none() || quick(s))
                .filter(|s| {
                    !args.flatc_only
                        || s.mma.is_none()
                        || Some(*s) == planned
                        || (s.ldmatrix && s.stage == Staging::FlatC && s.tba <= 2 && s.warps >= 2)
                        // Flat A and B (whole-vector stores since version 8) with the C
                        // prefetch: the other form where the staging differs.
                        || (s.ldmatrix
                            && s.stage == Staging::Flat
                            && s.prefetch_c
                            && s.tba <= 2
                            && s.warps >= 4)
                })
                .collect();
            // The planned schedule is always timed, whatever the candidates' filters: a
            // sweep without it stored winners slower than the planner where the planner
            // uses what the candidates lack (`cp.async` copies: f32 17 on an H200, 89.6%
            // of the bound planned, 76.2% tuned; docs/gpu-notes.md, version 27).
            if let Some(p) = planned.filter(|p| !list.contains(p)) {
                list.insert(0, p);
            }
            for s in list {
                match probe.time(&gpu, d, n, &s, args.reps) {
                    Ok(row) => {
                        let gf = row.flops / row.ours_s / 1e9;
                        line.push_str(&format!(" [{}]={gf:.0}", s.label()));
                        timed.push((gf, s));
                    }
                    Err(e) => line.push_str(&format!(" [{}]=error({e})", s.label())),
                }
            }
            println!("{line}");
            // The fastest candidate whose results match the reference (a tensor-core kernel
            // with C over A computed wrong results at two sizes: docs/gpu-notes.md, version
            // 12): checked before it is stored.
            timed.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut best = None;
            for (gf, s) in timed {
                let ok = match d {
                    Dtype::F64 => verify_with::<f64>(&gpu, &spec, 300, 7, Some(&s)),
                    Dtype::F32 => verify_with::<f32>(&gpu, &spec, 300, 7, Some(&s)),
                    Dtype::F16 => verify_with::<f16>(&gpu, &spec, 300, 7, Some(&s)),
                };
                match ok {
                    Ok((err, tol)) if err <= tol => {
                        best = Some((gf, s));
                        break;
                    }
                    Ok((err, tol)) => println!(
                        "  {} is wrong (error {err:.2e} > {tol:.2e}): skipped",
                        s.label()
                    ),
                    Err(e) => println!("  {} failed: {e}", s.label()),
                }
            }
            if let Some((gf, s)) = best {
                let key = cuda::gpu_tuning_key(gpu.name(), &spec, BatchKind::Strided);
                if Some(s) == planned && !tuning::shipped().gpu.contains_key(&key) {
                    // No entry: the runtime plans the same schedule, and a stale entry
                    // from an earlier sweep would stand in its way. (Where the shipped
                    // database has an entry, the planned one is stored: without it, the
                    // runtime would take the shipped one.)
                    println!(
                        "  best: the planned schedule {} at {gf:.0} GFLOP/s",
                        s.label()
                    );
                    tdb.gpu.remove(&key);
                } else {
                    println!("  best {} at {gf:.0} GFLOP/s", s.label());
                    tdb.gpu
                        .insert(key, serde_json::to_value(s).map_err(|e| e.to_string())?);
                }
                // Saved after every size: a sweep stopped by a time limit keeps its winners.
                tdb.save(&path).map_err(|e| e.to_string())?;
            }
        }
    }
    tdb.save(&path).map_err(|e| e.to_string())?;
    println!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// Tunes the schedule of each bucket of the bucketed variable-size batch (sizes uniform in
/// 1..=32, four streams): bucket by bucket, largest first, every FMA candidate of the
/// bucket's spec is timed in the whole bucketed launch with the other buckets at their
/// best so far; a bucket keeps its planned schedule unless a candidate beats it. Returns
/// the tuning database entries of the buckets whose best is not the planned schedule.
fn tune_buckets(
    gpu: &mut Gpu,
    probe: &mut bench::Probe,
    spec: &GemmSpec,
    bw: f64,
    reps: usize,
) -> Result<Vec<(String, GpuSchedule)>, String> {
    let d = spec.dtype();
    let mut picks = std::collections::HashMap::new();
    let mut measure = |gpu: &mut Gpu, picks: &std::collections::HashMap<String, GpuSchedule>| {
        gpu.set_tuned(picks.clone());
        probe
            .time_bucketed(gpu, d, 4, reps)
            .map(|row| row.ours_fraction(bw))
            .map_err(|e| e.to_string())
    };
    let mut current = measure(gpu, &picks)?;
    println!(
        "{} bucketed, planned schedules: {:.1}%",
        d.name(),
        100.0 * current
    );
    let mut sides = cuda::bucket_bounds(spec);
    sides.sort_by_key(|&(m, n, k)| std::cmp::Reverse(m * n * k));
    for (m, n, k) in sides {
        let sub = cuda::bucket_spec(spec, m, n, k).map_err(|e| e.to_string())?;
        let key = cuda::gpu_tuning_key(gpu.name(), &sub, BatchKind::VariableSize);
        let mut line = format!("  bucket {m}x{n}x{k}:");
        let mut best = None;
        for s in variable_candidates(&sub, gpu.target()) {
            picks.insert(key.clone(), s);
            match measure(gpu, &picks) {
                Ok(frac) => {
                    line.push_str(&format!(" [{}]={:.1}%", s.label(), 100.0 * frac));
                    if frac > current {
                        current = frac;
                        best = Some(s);
                    }
                }
                Err(e) => line.push_str(&format!(" [{}]=error({e})", s.label())),
            }
        }
        match best {
            Some(s) => {
                picks.insert(key, s);
                line.push_str(&format!(" -> {}", s.label()));
            }
            None => {
                picks.remove(&key);
                line.push_str(" -> planned");
            }
        }
        println!("{line}");
    }
    let last = measure(gpu, &picks)?;
    println!(
        "{} bucketed, tuned schedules: {:.1}% (best seen {:.1}%)",
        d.name(),
        100.0 * last,
        100.0 * current
    );
    Ok(picks.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn square(n: usize) -> GemmSpec {
        GemmSpec::builder(Dtype::F16, n, n, n)
            .alpha(Scalar::fixed(1.5).unwrap())
            .beta(Scalar::fixed(0.5).unwrap())
            .build()
            .unwrap()
    }

    /// Candidate `s` comes in `candidates` with `twin` (it without the flag under test),
    /// compiles, and gives code of its own.
    fn assert_own_kernel(
        spec: &GemmSpec,
        target: &GpuTarget,
        candidates: &[GpuSchedule],
        s: &GpuSchedule,
        twin: &GpuSchedule,
        what: &str,
    ) {
        assert!(candidates.contains(twin), "{what}: {s:?}");
        let code = ptx_code(spec, target, s);
        assert!(code.is_some(), "{what}: {s:?} does not compile");
        assert_ne!(code, ptx_code(spec, target, twin), "{what}: {s:?}");
    }

    /// Every candidate of `candidates` that has the flag under test (`twin` gives it
    /// without the flag, None where it does not have it) passes `assert_own_kernel`;
    /// returns how many have it.
    fn assert_flag_kernels(
        spec: &GemmSpec,
        target: &GpuTarget,
        candidates: &[GpuSchedule],
        twin: impl Fn(&GpuSchedule) -> Option<GpuSchedule>,
    ) -> usize {
        let what = spec.name();
        candidates
            .iter()
            .filter_map(|s| twin(s).map(|t| (s, t)))
            .inspect(|(s, t)| assert_own_kernel(spec, target, candidates, s, t, &what))
            .count()
    }

    /// How many of the default tensor-core candidates of the square `n` on `target` have the
    /// flag `flag` gives, each checked by `assert_flag_kernels` against itself without it.
    fn flag_kernels(
        target: &GpuTarget,
        n: usize,
        flag: impl Fn(&mut GpuSchedule) -> &mut bool,
    ) -> usize {
        let spec = square(n);
        let c = mma_candidates(&spec, target, &[true]);
        assert_flag_kernels(&spec, target, &c, |s| {
            let mut twin = *s;
            std::mem::replace(flag(&mut twin), false).then_some(twin)
        })
    }

    /// The default FMA candidates (`tune --gpu` without filters) offer each flat-staged
    /// schedule also through `cp.async`, as a kernel of its own: the H200's winners.
    #[test]
    fn default_candidates_copy_flat_spans_through_cp_async_too() {
        let target = GpuTarget::new(Sm::Sm90);
        for dtype in [Dtype::F64, Dtype::F32] {
            for n in [9, 25] {
                let spec = GemmSpec::builder(dtype, n, n, n).build().unwrap();
                let c = candidates(&spec, &target);
                let copied: Vec<_> = c.iter().filter(|s| s.async_copies).collect();
                assert!(!copied.is_empty(), "{dtype:?} {n}");
                for s in copied {
                    assert_ne!(s.stage, Staging::Padded, "{dtype:?} {n}: {s:?}");
                    let plain = GpuSchedule {
                        async_copies: false,
                        ..*s
                    };
                    assert_own_kernel(&spec, &target, &c, s, &plain, &format!("{dtype:?} {n}"));
                }
            }
        }
    }

    /// The default tensor-core candidates offer one warp a row tile (3, 7 and 8 row tiles
    /// at 40, 100 and 120), and column tiles in groups (`row_group`) only where each warp
    /// keeps a row of tiles, each group with code of its own.
    #[test]
    fn default_candidates_group_the_column_tiles_of_a_row() {
        let target = GpuTarget::new(Sm::Sm90);
        for n in [40, 100, 120] {
            let spec = square(n);
            let mt = n.div_ceil(16) as u32;
            let c = mma_candidates(&spec, &target, &[true]);
            // (With `epilogue_loads_first` too, and with two row tiles a warp, whose own
            // tests pair them.)
            let grouped: Vec<_> = c
                .iter()
                .filter(|s| s.row_group > 1 && !s.epilogue_loads_first && !s.row_pairs)
                .collect();
            assert!(grouped.iter().any(|s| s.warps == mt), "n = {n}");
            for s in grouped {
                assert_eq!(s.warps % mt, 0, "n = {n}: {s:?}");
                let plain = GpuSchedule { row_group: 0, ..*s };
                assert_own_kernel(&spec, &target, &c, s, &plain, &format!("n = {n}"));
            }
        }
    }

    /// The default tensor-core candidates offer C through shared memory also with its copy
    /// through `cp.async`, and with A and B straight into their slots (`slot_copies`) where
    /// a column's length is even, each a kernel of its own (114: columns of 4-byte vectors;
    /// 120: whole 16-byte ones); at 113 no column's length is even.
    #[test]
    fn default_candidates_copy_a_and_b_straight_into_their_slots() {
        let target = GpuTarget::new(Sm::Sm90);
        for n in [113, 114, 120] {
            let spec = square(n);
            let c = mma_candidates(&spec, &target, &[true]);
            assert!(c.iter().any(|s| s.async_copies_apply()), "n = {n}");
            let slots = assert_flag_kernels(&spec, &target, &c, |s| {
                assert!(!s.slot_copies || s.slot_copies_apply(), "n = {n}: {s:?}");
                s.slot_copies.then_some(GpuSchedule {
                    slot_copies: false,
                    ..*s
                })
            });
            assert_eq!(slots == 0, n % 2 == 1, "n = {n}");
        }
    }

    /// The default tensor-core candidates on sm_90 offer C through shared memory also with
    /// the epilogue's 16-bit accesses (`element_epilogue`) where m is even (C's copy
    /// padded, moved by tiles otherwise), each a kernel of its own; none where m is odd.
    #[test]
    fn default_candidates_offer_the_element_epilogue() {
        let target = GpuTarget::new(Sm::Sm90);
        for n in [66, 113, 120] {
            let element = flag_kernels(&target, n, |s| &mut s.element_epilogue);
            assert_eq!(element == 0, n % 2 == 1, "n = {n}");
        }
    }

    /// The default tensor-core candidates offer C through shared memory with the
    /// epilogue's loads before its stores (`epilogue_loads_first`): where m is odd (C's
    /// copy verbatim) and on sm_80 (elements moved one by one), and where tiles move whole
    /// (m even, sm_90) in groups of tiles, each a kernel of its own.
    #[test]
    fn default_candidates_offer_the_loads_first() {
        for (sm, n) in [
            (Sm::Sm90, 66),
            (Sm::Sm90, 97),
            (Sm::Sm90, 126),
            (Sm::Sm80, 113),
            (Sm::Sm80, 66),
        ] {
            let first = flag_kernels(&GpuTarget::new(sm), n, |s| &mut s.epilogue_loads_first);
            assert!(first > 0, "{sm:?} n = {n}");
        }
    }

    /// The default f16 tensor-core candidates offer the epilogue's swapped lane order
    /// (`epilogue_swaps`) where m is odd (C's copy verbatim), as kernels of their own where
    /// the order changes (97, 113), and not where m is even.
    #[test]
    fn default_candidates_offer_the_epilogue_swaps() {
        let target = GpuTarget::new(Sm::Sm90);
        for (n, offered) in [(97, true), (113, true), (98, false)] {
            let swapped = flag_kernels(&target, n, |s| &mut s.epilogue_swaps);
            assert_eq!(swapped > 0, offered, "n = {n}");
        }
    }

    /// The default f16 tensor-core candidates offer the last k step as a full `m16n8k16`
    /// (`full_last_k_step`) as kernels of their own where at most 8 of k are left, and not
    /// elsewhere.
    #[test]
    fn default_candidates_offer_the_full_last_k_step() {
        let target = GpuTarget::new(Sm::Sm90);
        for (n, offered) in [
            (84, true),
            (113, true),
            (36, true),
            (96, false),
            (45, false),
        ] {
            let full = flag_kernels(&target, n, |s| &mut s.full_last_k_step);
            assert_eq!(full > 0, offered, "n = {n}");
        }
    }

    /// The default f16 tensor-core candidates offer two row tiles a warp (`row_pairs`) at
    /// each multiple of the pairs, each a kernel of its own (the same schedule with one
    /// row tile a warp, where the warps suit that, differs).
    #[test]
    fn default_candidates_offer_row_pairs() {
        let target = GpuTarget::new(Sm::Sm90);
        for (n, warps) in [
            (122, vec![4, 8, 12, 16]),
            (58, vec![2, 4, 6, 8]),
            (16, vec![]),
        ] {
            let spec = square(n);
            let c = mma_candidates(&spec, &target, &[true]);
            let mut offered: Vec<u32> = c.iter().filter(|s| s.row_pairs).map(|s| s.warps).collect();
            offered.sort_unstable();
            offered.dedup();
            let streamed = c.iter().filter(|s| s.row_pairs && s.stream_a).count();
            assert_eq!(streamed, offered.len(), "n = {n}");
            assert!(
                warps.iter().all(|w| offered.contains(w)),
                "n = {n}: {offered:?}"
            );
            assert_eq!(offered.is_empty(), warps.is_empty(), "n = {n}");
            for s in c.iter().filter(|s| s.row_pairs) {
                let one_row = GpuSchedule {
                    row_pairs: false,
                    ..*s
                };
                assert!(ptx_code(&spec, &target, s).is_some(), "n = {n}: {s:?}");
                assert_ne!(
                    ptx_code(&spec, &target, s),
                    ptx_code(&spec, &target, &one_row)
                );
            }
        }
    }

    /// The variable-size candidates end with the planned schedule at 6, 7 and 8 blocks per
    /// SM (the H200's f64 bucket entries: 7), each a kernel of its own that fits.
    #[test]
    fn variable_candidates_ask_for_blocks_per_sm() {
        let target = GpuTarget::new(Sm::Sm90);
        for (dtype, m, n, k) in [
            (Dtype::F64, 32, 32, 32),
            (Dtype::F64, 16, 32, 16),
            (Dtype::F32, 32, 32, 16),
        ] {
            let spec = GemmSpec::builder(dtype, m, n, k).build().unwrap();
            let planned =
                smallgemm_codegen_ptx::plan(&spec, &target, BatchKind::VariableSize).unwrap();
            let c = variable_candidates(&spec, &target);
            for min_blocks in [6, 7, 8] {
                let s = GpuSchedule {
                    min_blocks,
                    ..planned
                };
                assert!(c.contains(&s), "{dtype:?} {m}x{n}x{k}: {s:?}");
                let kernel = smallgemm_codegen_ptx::generate(
                    &spec,
                    &target,
                    Some(&s),
                    BatchKind::VariableSize,
                )
                .unwrap_or_else(|e| panic!("{dtype:?} {m}x{n}x{k}: {e}"));
                assert!(
                    kernel.ptx.contains(".minnctapersm"),
                    "{dtype:?} {m}x{n}x{k}"
                );
            }
        }
    }

    /// `tune --async-copies` offers the planned schedule first, then only schedules that fit
    /// and whose code differs: at 127 the planned one with `cp.async`, at 20 also the
    /// flat-fragment ones.
    #[test]
    fn async_candidates_are_distinct_and_fit() {
        let target = GpuTarget::new(Sm::Sm90);
        for n in [20, 45, 126, 127] {
            let spec = square(n);
            let planned = smallgemm_codegen_ptx::plan(&spec, &target, BatchKind::Strided).unwrap();
            let c = async_candidates(&spec, &target, Some(planned));
            assert_eq!(c[0], planned, "n = {n}");
            assert!(
                c.iter().any(|s| s.async_copies != planned.async_copies),
                "n = {n}"
            );
            let codes: Vec<_> = c.iter().map(|s| ptx_code(&spec, &target, s)).collect();
            for (i, code) in codes.iter().enumerate() {
                assert!(code.is_some(), "n = {n}: {:?} does not compile", c[i]);
                assert!(!codes[..i].contains(code), "n = {n}: {:?} repeats", c[i]);
                assert!(c[i].validate(&spec.col_major(), &target).is_ok());
            }
            assert_eq!(c.iter().any(|s| s.flat_fragments), n <= 64, "n = {n}");
        }
    }

    /// `tune --schedules` offers the planned schedule, then each change that fits once;
    /// a field that is not a schedule's, or a value of the wrong type, is an error.
    #[test]
    fn schedule_changes_apply_to_the_plan() {
        let target = GpuTarget::new(Sm::Sm90);
        let spec = square(97);
        let planned = smallgemm_codegen_ptx::plan(&spec, &target, BatchKind::Strided).unwrap();
        let dir = std::env::temp_dir().join(format!("smallgemm-changes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("changes.json");
        // The plan itself, a repeat, and 40 warps (more than a problem may have) add
        // nothing.
        let text = r#"[{"warps": 7, "min_blocks": 3}, {}, {"warps": 7, "min_blocks": 3},
            {"warps": 40}, {"stage": "flat", "prefetch_c": true}]"#;
        std::fs::write(&file, text).unwrap();
        let changes = schedule_changes(&file).unwrap();
        let c = changed_candidates(&spec, &target, planned, &changes).unwrap();
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(c[0], planned);
        assert_eq!((c[1].warps, c[1].min_blocks), (7, 3));
        assert_eq!(c[1].stage, planned.stage);
        assert_eq!((c[2].stage, c[2].prefetch_c), (Staging::Flat, true));
        assert_eq!(c[2].warps, planned.warps);
        for bad in [r#"[{"wraps": 7}]"#, r#"[{"warps": "seven"}]"#] {
            std::fs::write(&file, bad).unwrap();
            let changes = schedule_changes(&file).unwrap();
            assert!(
                changed_candidates(&spec, &target, planned, &changes).is_err(),
                "{bad}"
            );
        }
        std::fs::write(&file, r#"{"warps": 7}"#).unwrap();
        assert!(schedule_changes(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `tune --neighbours`: every change names real fields with values of their types, and
    /// at an odd size (97's H200 entry) most give kernels of their own.
    #[test]
    fn neighbour_changes_apply_to_the_schedule_in_use() {
        let target = GpuTarget::new(Sm::Sm90);
        let spec = square(97);
        let in_use = GpuSchedule {
            min_blocks: 3,
            async_copies: true,
            realign_in_shared: true,
            epilogue_swaps: true,
            epilogue_loads_first: true,
            stage: Staging::FlatC,
            ..GpuSchedule::mma(7, 1, true)
        };
        let changes = neighbour_changes();
        for c in &changes {
            with_changes(&in_use, c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        }
        let c = changed_candidates(&spec, &target, in_use, &changes).unwrap();
        assert_eq!(c[0], in_use);
        assert!(c.len() > 20, "{} candidates", c.len());
    }

    /// `tune --realign-in-shared` offers the planned schedule first, then distinct ones
    /// that fit, with the flag where A and B are realigned (33, 97, 115, 127; several
    /// problems per block at 33), nothing more where they are not (128, a multiple of 8).
    #[test]
    fn realign_candidates_are_distinct_and_fit() {
        let target = GpuTarget::new(Sm::Sm90);
        for n in [33, 97, 115, 127, 128] {
            let spec = square(n);
            let planned = smallgemm_codegen_ptx::plan(&spec, &target, BatchKind::Strided).unwrap();
            let c = realign_candidates(&spec, &target, Some(planned));
            assert_eq!(c[0], planned, "n = {n}");
            let codes: Vec<_> = c.iter().map(|s| ptx_code(&spec, &target, s)).collect();
            for (i, code) in codes.iter().enumerate() {
                assert!(code.is_some(), "n = {n}: {:?} does not compile", c[i]);
                assert!(!codes[..i].contains(code), "n = {n}: {:?} repeats", c[i]);
                assert!(c[i].validate(&spec.col_major(), &target).is_ok());
            }
            assert_eq!(c.len() > 1, n != 128, "n = {n}: {c:?}");
            assert!(c[1..].iter().all(|s| s.realign_in_shared), "n = {n}");
            assert_eq!(c.iter().any(|s| s.tba > 1), n == 33, "n = {n}");
            // 16-byte vectors where the words realign (not at 127, whose banks keep the
            // vectors anyway).
            let vectors = c.iter().any(|s| s.realign_vectors && s != &planned);
            assert_eq!(vectors, [33, 97, 115].contains(&n), "n = {n}");
        }
    }
}
