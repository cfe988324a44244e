//! `smallgemm bench`: smallgemm against LIBXSMM, OpenBLAS, MKL's JIT, nano-gemm,
//! matrixmultiply and a naive loop, beside this machine's measured limits (the library is
//! `smallgemm-bench`). `bench --gpu` never gets here: main hands GPU invocations to gpu.rs
//! before this parser runs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use smallgemm::{Dtype, Isa};
use smallgemm_bench::{report, suite, Competitor, Config, Regime};

use crate::run::IsaArg;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DtypesArg {
    F64,
    F32,
    Both,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RegimeArg {
    Hot,
    Stream,
    Both,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A smoke run: sizes 2, 4, 8, 16, 32 and 16x16x8, few samples, a 256 MiB stream.
    #[arg(long)]
    quick: bool,
    /// Square sizes n (m = n = k): a list and ranges, e.g. `2..32` or `2,4,8,16..20`.
    #[arg(long)]
    sizes: Option<String>,
    /// More shapes as MxNxK, comma-separated (e.g. `16x16x8,64x64x32`); replaces the
    /// default small-k shapes.
    #[arg(long)]
    shapes: Option<String>,
    /// Leave out the papers' small-k shapes (k = 8, 16, 32 with m = n varying).
    #[arg(long)]
    no_small_k: bool,
    #[arg(long, value_enum, default_value = "both")]
    dtype: DtypesArg,
    #[arg(long, value_enum, default_value = "both")]
    regime: RegimeArg,
    /// Thread counts, comma-separated; `all` is every core (default: 1,all).
    #[arg(long)]
    threads: Option<String>,
    /// Competitors, comma-separated, from: smallgemm, libxsmm, mkl-jit, openblas,
    /// nano-gemm, matrixmultiply, naive (default: every one built in).
    #[arg(long)]
    competitors: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    isa: IsaArg,
    /// alpha (LIBXSMM 1.17 runs only with alpha = 1).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    alpha: f64,
    /// beta (LIBXSMM 1.17 runs only with beta = 0 or 1).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    beta: f64,
    /// Samples per figure (upper bound; a time budget may stop earlier).
    #[arg(long)]
    reps: Option<usize>,
    /// Bytes of A, B and C per thread in the hot regime, in KiB (default: half of L2, at most
    /// 512).
    #[arg(long)]
    hot_kib: Option<usize>,
    /// Bytes of A, B and C in the streaming regime, in MiB (default 1024; the quick run 256).
    #[arg(long)]
    stream_mib: Option<usize>,
    /// Skip the JIT-latency measurement.
    #[arg(long)]
    no_latency: bool,
    /// Write the figures as CSV here (limits and latency beside it, as
    /// <stem>-limits.csv and <stem>-latency.csv).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write an SVG plot of GFLOP/s against n (square sizes) with the bound here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Seed of the random operands.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn bench(args: &BenchArgs) -> Result<ExitCode, String> {
    // Other targets that parse the same flags would dispatch here, before the CPU run.
    cpu(args)
}

fn cpu(args: &BenchArgs) -> Result<ExitCode, String> {
    let config = config(args)?;
    let start = std::time::Instant::now();
    let mut progress =
        |line: &str| eprintln!("bench [{:>6.1} s]: {line}", start.elapsed().as_secs_f64());
    let report = suite::run(&config, &mut progress)?;
    print!("{}", report::table(&report));
    if let Some(path) = &args.csv {
        write(path, &report::csv(&report))?;
        write(&sibling(path, "limits"), &report::limits_csv(&report))?;
        if report.latency.is_some() {
            write(&sibling(path, "latency"), &report::latency_csv(&report))?;
        }
    }
    if let Some(path) = &args.svg {
        match report::svg(&report)? {
            Some(svg) => write(path, &svg)?,
            None => eprintln!("bench: no square shape measured, no SVG written"),
        }
    }
    if report
        .check_failures
        .iter()
        .any(|f| f.0 == Competitor::Smallgemm)
    {
        eprintln!("smallgemm: a smallgemm kernel failed its correctness check (see Notes)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// `dir/stem-suffix.csv` for `dir/stem.csv`.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("bench".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-{suffix}.csv"))
}

/// The run the flags describe, starting from the standard or the quick configuration.
pub fn config(args: &BenchArgs) -> Result<Config, String> {
    let mut c = if args.quick {
        Config::quick()
    } else {
        Config::standard()
    };
    c.isa = match args.isa {
        IsaArg::Auto => None,
        IsaArg::Avx2 => Some(Isa::Avx2),
        IsaArg::Avx512 => Some(Isa::Avx512),
    };
    c.dtypes = match args.dtype {
        DtypesArg::F64 => vec![Dtype::F64],
        DtypesArg::F32 => vec![Dtype::F32],
        DtypesArg::Both => vec![Dtype::F64, Dtype::F32],
    };
    c.regimes = match args.regime {
        RegimeArg::Hot => vec![Regime::Hot],
        RegimeArg::Stream => vec![Regime::Stream],
        RegimeArg::Both => vec![Regime::Hot, Regime::Stream],
    };
    if args.sizes.is_some() || args.shapes.is_some() || args.no_small_k {
        let mut shapes: Vec<suite::Shape> = match &args.sizes {
            Some(s) => parse_sizes(s)?.into_iter().map(|n| (n, n, n)).collect(),
            None if args.quick => c
                .shapes
                .iter()
                .copied()
                .filter(|s| s.0 == s.1 && s.1 == s.2)
                .collect(),
            None => suite::square_shapes(2, 32),
        };
        match &args.shapes {
            Some(s) => shapes.extend(parse_shapes(s)?),
            None if !args.no_small_k && !args.quick => shapes.extend(suite::small_k_shapes()),
            None => {}
        }
        shapes.dedup();
        c.shapes = shapes;
    }
    if let Some(t) = &args.threads {
        c.threads = parse_threads(t)?;
    }
    if let Some(list) = &args.competitors {
        c.competitors = list
            .split(',')
            .map(|name| {
                let name = name.trim();
                Competitor::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = Competitor::ALL.iter().map(|c| c.name()).collect();
                    format!("unknown competitor `{name}` (known: {})", known.join(", "))
                })
            })
            .collect::<Result<_, _>>()?;
    }
    c.alpha = args.alpha;
    c.beta = args.beta;
    if let Some(r) = args.reps {
        if r == 0 {
            return Err("--reps must be at least 1".into());
        }
        for t in [&mut c.hot, &mut c.stream, &mut c.probe] {
            t.reps = r;
            t.min_reps = t.min_reps.min(r);
            // Asked-for samples are taken, whatever the default time budget says.
            t.budget = Duration::MAX;
        }
        c.latency_reps = r;
    }
    if let Some(k) = args.hot_kib {
        c.hot_bytes = k.checked_mul(1 << 10).ok_or("--hot-kib is too large")?;
    }
    if let Some(m) = args.stream_mib {
        c.stream_bytes = m.checked_mul(1 << 20).ok_or("--stream-mib is too large")?;
    }
    if args.no_latency {
        c.latency_reps = 0;
    }
    c.seed = args.seed;
    c.validate()?;
    Ok(c)
}

fn number(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))
}

/// `2..32`, `2,4,8`, `2..8,16`: inclusive ranges and single sizes.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once("..") {
            Some((lo, hi)) => {
                let hi = hi.strip_prefix('=').unwrap_or(hi);
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi || hi - lo > 4096 {
                    return Err(format!("bad size range `{part}`"));
                }
                out.extend(lo..=hi);
            }
            None => out.push(number(part)?),
        }
    }
    if out.is_empty() {
        return Err("no sizes given".into());
    }
    Ok(out)
}

/// `16x16x8,64x64x32`.
pub fn parse_shapes(s: &str) -> Result<Vec<suite::Shape>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let dims: Vec<usize> = p.split('x').map(number).collect::<Result<_, _>>()?;
            match dims[..] {
                [m, n, k] => Ok((m, n, k)),
                _ => Err(format!("shape `{p}` is not MxNxK")),
            }
        })
        .collect()
}

/// `1,2` or `1,all`.
pub fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    let mut v: Vec<usize> = s
        .split(',')
        .map(|p| match p.trim() {
            "all" => Ok(suite::all_cores()),
            other => number(other),
        })
        .collect::<Result<_, _>>()?;
    v.dedup();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shapes_parse() {
        assert_eq!(parse_sizes("2..4,8").unwrap(), vec![2, 3, 4, 8]);
        assert_eq!(parse_sizes("2..=3").unwrap(), vec![2, 3]);
        assert!(parse_sizes("4..2").is_err());
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes("").is_err());
        assert_eq!(parse_shapes("16x16x8").unwrap(), vec![(16, 16, 8)]);
        assert!(parse_shapes("16x16").is_err());
        assert_eq!(parse_threads("1,all").unwrap()[0], 1);
        assert!(parse_threads("one").is_err());
    }
}
