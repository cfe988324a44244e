//! `smallgemm emit`: machine code of one kernel, as a listing or raw bytes.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use smallgemm::{Isa, Scalar, Target};

use crate::{DtypeArg, ShapeArgs};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    /// Intel-syntax listing with offsets and bytes.
    Asm,
    /// The raw machine code (instructions, then constants).
    Bin,
}

#[derive(Args, Debug)]
pub struct EmitArgs {
    #[arg(long, value_enum, default_value = "f64")]
    dtype: DtypeArg,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Instruction set to generate for (this CPU need not run it).
    #[arg(long)]
    isa: Isa,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "1")]
    alpha: String,
    /// A number baked into the code, or "runtime" for a kernel argument.
    #[arg(long, default_value = "0")]
    beta: String,
    #[arg(long, value_enum, default_value = "asm")]
    format: Format,
    /// Output file (default: standard output).
    #[arg(short, long)]
    output: Option<std::path::PathBuf>,
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

pub fn emit(args: &EmitArgs) -> Result<ExitCode, String> {
    let shape = args
        .shape
        .shape()?
        .ok_or("emit needs a shape: --m, --n and --k")?;
    let alpha = scalar("alpha", &args.alpha)?;
    let beta = scalar("beta", &args.beta)?;
    let spec = args
        .shape
        .spec(args.dtype.into(), shape, alpha, beta)
        .map_err(|e| e.to_string())?;
    let generated =
        smallgemm::generate(&spec, Target::new(args.isa), None).map_err(|e| e.to_string())?;
    let bytes = match args.format {
        Format::Bin => generated.code.bytes.clone(),
        Format::Asm => {
            let params: Vec<String> = generated
                .program
                .params
                .iter()
                .map(|p| format!("{p:?}").to_lowercase())
                .collect();
            let mut text = format!(
                "; {}\n; isa {}, schedule {:?}\n; kernel(a, b, c, batch{}{}) System V; {} bytes\n",
                spec.name(),
                args.isa,
                generated.schedule,
                if params.is_empty() { "" } else { ", " },
                params.join(", "),
                generated.code.bytes.len()
            );
            text.push_str(&smallgemm::listing(args.isa, &generated.code));
            text.into_bytes()
        }
    };
    match &args.output {
        Some(path) => std::fs::write(path, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        None => std::io::stdout()
            .write_all(&bytes)
            .map_err(|e| format!("cannot write to standard output: {e}"))?,
    }
    Ok(ExitCode::SUCCESS)
}
