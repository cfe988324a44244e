//! `smallgemm`: run and verify JIT kernels, or emit their machine code.

mod bench;
mod emit;
mod gpu;
mod run;
mod tune;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use smallgemm::{Dtype, GemmSpec, Layout, Scalar, Trans};

#[derive(Parser)]
#[command(name = "smallgemm", version, about = "JIT-compiled batched small GEMM")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile, run on random data, check against a higher-precision reference, time.
    /// With no shape: a sweep over square sizes 2..32 in f64 and f32.
    Run(run::RunArgs),
    /// Write a kernel's machine code as an Intel-syntax listing, raw bytes or an object file;
    /// with --isa sm_80 or sm_90, its PTX.
    Emit(emit::EmitArgs),
    /// Show the CPU's supported instruction sets and what the JIT picks.
    Info,
    /// Benchmark against LIBXSMM, OpenBLAS, MKL JIT, nano-gemm, matrixmultiply and a naive
    /// loop, beside this machine's measured limits; JIT latency.
    Bench(bench::BenchArgs),
    /// Search each shape's schedules, time them, and store the winners in the tuning
    /// database the JIT reads (`--gpu`: the GPU tuner).
    Tune(tune::TuneArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DtypeArg {
    F64,
    F32,
}

impl From<DtypeArg> for Dtype {
    fn from(d: DtypeArg) -> Dtype {
        match d {
            DtypeArg::F64 => Dtype::F64,
            DtypeArg::F32 => Dtype::F32,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LayoutArg {
    Col,
    Row,
}

/// The GEMM shape and storage flags shared by `run` and `emit`.
#[derive(Args, Clone, Debug)]
pub struct ShapeArgs {
    /// Rows of op(A) and C.
    #[arg(long)]
    pub m: Option<usize>,
    /// Columns of op(B) and C.
    #[arg(long)]
    pub n: Option<usize>,
    /// Columns of op(A), rows of op(B).
    #[arg(long)]
    pub k: Option<usize>,
    /// op(A) = A transposed.
    #[arg(long)]
    pub trans_a: bool,
    /// op(B) = B transposed.
    #[arg(long)]
    pub trans_b: bool,
    /// Storage order of A, B and C.
    #[arg(long, value_enum, default_value = "col")]
    pub layout: LayoutArg,
    /// Leading dimensions (default: tight).
    #[arg(long)]
    pub lda: Option<usize>,
    #[arg(long)]
    pub ldb: Option<usize>,
    #[arg(long)]
    pub ldc: Option<usize>,
}

impl ShapeArgs {
    /// The spec for these flags with the given dtype, shape and scalar kinds.
    pub fn spec(
        &self,
        dtype: Dtype,
        shape: (usize, usize, usize),
        alpha: Scalar,
        beta: Scalar,
    ) -> Result<GemmSpec, smallgemm::SpecError> {
        self.builder(dtype, shape, alpha, beta).build()
    }

    /// The spec builder for these flags, to add more before building.
    pub fn builder(
        &self,
        dtype: Dtype,
        (m, n, k): (usize, usize, usize),
        alpha: Scalar,
        beta: Scalar,
    ) -> smallgemm::GemmSpecBuilder {
        let t = |on: bool| if on { Trans::T } else { Trans::N };
        let mut b = GemmSpec::builder(dtype, m, n, k)
            .trans_a(t(self.trans_a))
            .trans_b(t(self.trans_b))
            .layout(match self.layout {
                LayoutArg::Col => Layout::ColMajor,
                LayoutArg::Row => Layout::RowMajor,
            })
            .alpha(alpha)
            .beta(beta);
        if let Some(ld) = self.lda {
            b = b.lda(ld);
        }
        if let Some(ld) = self.ldb {
            b = b.ldb(ld);
        }
        if let Some(ld) = self.ldc {
            b = b.ldc(ld);
        }
        b
    }

    /// (m, n, k) when all three are given; an error when only some are.
    pub fn shape(&self) -> Result<Option<(usize, usize, usize)>, String> {
        match (self.m, self.n, self.k) {
            (Some(m), Some(n), Some(k)) => Ok(Some((m, n, k))),
            (None, None, None) => Ok(None),
            _ => Err("give all of --m, --n and --k, or none of them".into()),
        }
    }
}

fn main() -> ExitCode {
    // GPU invocations (emit --isa sm_80|sm_90, run --isa cuda, bench/tune --gpu) have
    // their own parser in gpu.rs.
    if let Some(result) = gpu::dispatch(&std::env::args().skip(1).collect::<Vec<_>>()) {
        return result.unwrap_or_else(|message| {
            eprintln!("smallgemm: {message}");
            ExitCode::from(2)
        });
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Emit(args) => emit::emit(&args),
        Command::Info => info(),
        Command::Tune(args) => tune::tune(&args),
        Command::Bench(args) => bench::bench(&args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("smallgemm: {message}");
            ExitCode::from(2)
        }
    }
}

fn info() -> Result<ExitCode, String> {
    let isas = smallgemm::supported_isas();
    let names: Vec<_> = isas.iter().map(|i| i.name()).collect();
    println!(
        "supported: {}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    match smallgemm::detect() {
        Ok(t) => println!("JIT target: {t}"),
        Err(e) => println!("JIT target: none ({e})"),
    }
    Ok(ExitCode::SUCCESS)
}
