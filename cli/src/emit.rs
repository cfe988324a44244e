//! `smallgemm emit`: machine code of kernels, as a listing, raw bytes or an object file.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, ValueEnum};
use smallgemm::{generate_with_abi, Abi, GemmSpec, Isa, Scalar, Schedule, Target};
use smallgemm_object::{c_header, c_prototype, write_object, Function, ObjectTarget};

use crate::{DtypeArg, ShapeArgs};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Intel-syntax listing with offsets and bytes.
    Asm,
    /// The raw machine code (instructions, then constants).
    Bin,
    /// A relocatable object file (ELF, Mach-O or COFF per --target).
    Obj,
}

/// One kernel: what a command line or a line of a `--list` file describes.
#[derive(Args, Clone, Debug)]
pub struct KernelArgs {
    #[arg(long, value_enum, default_value = "f64")]
    dtype: DtypeArg,
    #[command(flatten)]
    shape: ShapeArgs,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "1", allow_hyphen_values = true)]
    alpha: String,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    beta: String,
    /// Elements from one A of the batch to the next (default: packed back to back).
    #[arg(long)]
    stride_a: Option<usize>,
    /// Elements from one B of the batch to the next (default: packed back to back).
    #[arg(long)]
    stride_b: Option<usize>,
    /// Elements from one C of the batch to the next (default: packed back to back).
    #[arg(long)]
    stride_c: Option<usize>,
    /// Function name in the object file (default: a name that encodes the spec).
    #[arg(long)]
    name: Option<String>,
    /// A CPU schedule as JSON (the tuning database's form, e.g. `{"m_vectors":2,
    /// "n_cols":12}`; fields left out take their defaults) instead of the planner's.
    #[arg(long)]
    schedule: Option<String>,
}

/// A line of a `--list` file.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
struct ListLine {
    #[command(flatten)]
    kernel: KernelArgs,
}

#[derive(Args, Debug)]
pub struct EmitArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Instruction set to generate for (this CPU need not run it): avx2, avx512 or neon;
    /// sm_80 or sm_90 writes PTX for NVIDIA GPUs (f16 too; see `emit --isa sm_90 --help`).
    #[arg(long)]
    isa: Isa,
    /// Generate for AMD Zen 4's target, as the JIT detects it there (`Target::AVX512_HALVES`:
    /// 512-bit operations run as two 256-bit halves, so tails narrow also in blocks of
    /// their own). With --isa avx512 only.
    #[arg(long)]
    halves_512: bool,
    /// Generate for AMD's cores as the JIT detects them: with --isa avx2
    /// `Target::AVX2_AMD` (masked stores and cross-lane permutes are slow there: tails of C
    /// are stored in whole pieces, f64 is not lane-packed), with --isa avx512 Zen 4's target
    /// (as --halves-512).
    #[arg(long)]
    amd: bool,
    #[arg(long, value_enum, default_value = "asm")]
    format: Format,
    /// Object format and calling convention for --format obj (default: x86_64-linux).
    #[arg(long)]
    target: Option<ObjectTarget>,
    /// Kernels to emit, one per line as emit flags (`--name k4 --m 4 --n 4 --k 4 ...`;
    /// blank lines and lines starting with # are skipped): --format obj puts them all in
    /// one object, asm lists them one after another.
    #[arg(long, conflicts_with_all = ["m", "n", "k"])]
    list: Option<PathBuf>,
    /// Also write the C prototypes of the emitted functions to this header.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Output file (default: standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

fn scalar(name: &str, text: &str) -> Result<Scalar, String> {
    if text == "runtime" {
        return Ok(Scalar::Runtime);
    }
    let value: f64 = text
        .parse()
        .map_err(|_| format!("--{name} takes a number or \"runtime\", not {text:?}"))?;
    Scalar::fixed(value).map_err(|e| e.to_string())
}

impl KernelArgs {
    fn schedule(&self) -> Result<Option<Schedule>, String> {
        self.schedule
            .as_deref()
            .map(|json| serde_json::from_str(json).map_err(|e| format!("--schedule {json:?}: {e}")))
            .transpose()
    }

    fn spec(&self) -> Result<GemmSpec, String> {
        let shape = self
            .shape
            .shape()?
            .ok_or("a kernel needs a shape: --m, --n and --k")?;
        let alpha = scalar("alpha", &self.alpha)?;
        let beta = scalar("beta", &self.beta)?;
        let mut builder = self.shape.builder(self.dtype.into(), shape, alpha, beta);
        if let Some(s) = self.stride_a {
            builder = builder.stride_a(s);
        }
        if let Some(s) = self.stride_b {
            builder = builder.stride_b(s);
        }
        if let Some(s) = self.stride_c {
            builder = builder.stride_c(s);
        }
        builder.build().map_err(|e| e.to_string())
    }
}

/// A generated kernel and its symbol name.
struct Emitted {
    name: String,
    spec: GemmSpec,
    generated: smallgemm::Generated,
}

pub fn emit(args: &EmitArgs) -> Result<ExitCode, String> {
    let kernels = match &args.list {
        None => vec![args.kernel.clone()],
        Some(path) => read_list(path)?,
    };
    let object_target = match (args.format, args.target) {
        (Format::Obj, None) if args.isa == Isa::Avx2 || args.isa == Isa::Avx512 => {
            Some(ObjectTarget::X86_64Linux)
        }
        (Format::Obj, None) => return Err("--format obj needs --target".into()),
        (Format::Obj, Some(t)) => Some(t),
        (_, Some(_)) => return Err("--target applies to --format obj only".into()),
        (_, None) => None,
    };
    if let Some(t) = object_target {
        let x86 = matches!(args.isa, Isa::Avx2 | Isa::Avx512);
        if t.is_x86_64() != x86 {
            return Err(format!("--isa {} cannot run on --target {t}", args.isa));
        }
    }
    let target = match (args.isa, args.halves_512, args.amd) {
        (_, false, false) => Target::new(args.isa),
        (Isa::Avx512, ..) => Target::AVX512_HALVES,
        (Isa::Avx2, false, true) => Target::AVX2_AMD,
        (_, true, _) => return Err("--halves-512 applies to --isa avx512 only".into()),
        (isa, ..) => return Err(format!("--amd applies to --isa avx2 and avx512, not {isa}")),
    };
    let abi = match object_target {
        Some(t) if t.is_windows() => Abi::Windows,
        _ => Abi::Native,
    };
    let mut emitted = Vec::new();
    for kernel in &kernels {
        let spec = kernel.spec()?;
        let schedule = kernel.schedule()?;
        let generated = generate_with_abi(&spec, target, schedule.as_ref(), abi)
            .map_err(|e| format!("{}: {e}", spec.name()))?;
        let name = kernel.name.clone().unwrap_or_else(|| spec.name());
        emitted.push(Emitted {
            name,
            spec,
            generated,
        });
    }
    let bytes = match (args.format, object_target) {
        (Format::Obj, Some(target)) => {
            let functions: Vec<Function<'_>> = emitted
                .iter()
                .map(|e| Function {
                    name: &e.name,
                    code: &e.generated.code.bytes,
                })
                .collect();
            write_object(target, &functions).map_err(|e| e.to_string())?
        }
        (Format::Bin, _) => match emitted.as_slice() {
            [one] => one.generated.code.bytes.clone(),
            _ => return Err("--format bin writes one kernel; use obj or asm for a list".into()),
        },
        _ => emitted
            .iter()
            .map(|e| listing(e, args.isa))
            .collect::<Vec<_>>()
            .join("\n")
            .into_bytes(),
    };
    if let Some(path) = &args.header {
        let prototypes: Vec<String> = emitted
            .iter()
            .map(|e| {
                format!(
                    "/* {} */\n{}",
                    e.spec.name(),
                    c_prototype(&e.name, e.spec.dtype(), &e.generated.program.params)
                )
            })
            .collect();
        let guard = path.file_stem().map_or("smallgemm_kernels".into(), |s| {
            s.to_string_lossy().to_string()
        });
        std::fs::write(path, c_header(&guard, &prototypes))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    match &args.output {
        Some(path) => std::fs::write(path, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        None => std::io::stdout()
            .write_all(&bytes)
            .map_err(|e| format!("cannot write to standard output: {e}"))?,
    }
    Ok(ExitCode::SUCCESS)
}

fn read_list(path: &PathBuf) -> Result<Vec<KernelArgs>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut kernels = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parsed = ListLine::try_parse_from(line.split_whitespace())
            .map_err(|e| format!("{}:{}: {}", path.display(), i + 1, e.render()))?;
        kernels.push(parsed.kernel);
    }
    if kernels.is_empty() {
        return Err(format!("{} lists no kernels", path.display()));
    }
    Ok(kernels)
}

fn listing(e: &Emitted, isa: Isa) -> String {
    let params: Vec<String> = e
        .generated
        .program
        .params
        .iter()
        .map(|p| format!("{p:?}").to_lowercase())
        .collect();
    format!(
        "; {} ({})\n; isa {isa}, schedule {:?}\n; kernel(a, b, c, batch{}{}); {} bytes\n{}",
        e.name,
        e.spec.name(),
        e.generated.schedule,
        if params.is_empty() { "" } else { ", " },
        params.join(", "),
        e.generated.code.bytes.len(),
        smallgemm::listing(isa, &e.generated.code)
    )
}
