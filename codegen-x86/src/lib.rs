//! smallgemm's x86-64 backend: a lowered [`Program`] becomes AVX2 or AVX-512 machine code
//! (written by a direct encoder, `encode.rs`), and machine code becomes an Intel-syntax
//! listing (iced-x86's formatter).
//!
//! The emitted function is position independent (branches and its tail-mask constants are
//! RIP-relative), has the signature
//! `fn(a: *const T, b: *const T, c: *mut T, batch: usize, [alpha: T], [beta: T])`
//! with the scalars present as `Program::params` lists them, in the System V or Microsoft
//! x64 calling convention ([`CallConv`]), preserves every callee-saved register it uses,
//! and runs `vzeroupper` before it returns.

mod abi;
mod disasm;
mod emit;
#[cfg(test)]
mod emit_iced;
mod encode;
#[cfg(test)]
mod encode_tests;
mod regs;

use smallgemm_ir::{Isa, MachineCode, Program};
use thiserror::Error;

pub use abi::CallConv;
pub use disasm::{disassemble, listing};

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EmitError {
    #[error("the program needs {needed} general registers; the x86-64 backend has {available}")]
    TooManyGeneralRegisters { needed: usize, available: usize },
    #[error("the program uses vector register {0}, beyond what it declares")]
    TooManyVectorRegisters(usize),
    #[error("the program uses general register {0}, beyond what it declares")]
    UndeclaredGeneralRegister(u8),
    #[error("the program needs {0} masks; AVX-512 has 7 opmask registers")]
    TooManyMasks(usize),
    #[error("mask m{0} has no vector register on AVX2")]
    MaskWithoutRegister(u8),
    #[error("the program stores a run-time scalar it does not declare")]
    UnknownParam,
    #[error("{0} is not available on {1}")]
    Unsupported(&'static str, Isa),
    #[error("iced-x86: {0}")]
    Encoder(String),
    #[error("a Narrow prefix must be followed, in its body, by an operation other than a loop or another prefix")]
    StrayNarrow,
}

impl From<iced_x86::IcedError> for EmitError {
    fn from(e: iced_x86::IcedError) -> Self {
        EmitError::Encoder(e.to_string())
    }
}

/// Encodes `program` for `isa` with the System V calling convention.
pub fn emit(program: &Program, isa: Isa) -> Result<MachineCode, EmitError> {
    emit_with(program, isa, CallConv::SysV)
}

/// Encodes `program` for `isa` with calling convention `conv`.
pub fn emit_with(program: &Program, isa: Isa, conv: CallConv) -> Result<MachineCode, EmitError> {
    let max_vregs = smallgemm_ir::Target::new(isa).vector_registers();
    if program.vregs > max_vregs {
        return Err(EmitError::TooManyVectorRegisters(program.vregs));
    }
    let mut emitter = emit::Emitter::new(program, isa, conv)?;
    emitter.body()?;
    emitter.finish()
}

/// The iced-x86 path the encoder replaced, kept as the tests' oracle.
#[cfg(test)]
pub(crate) fn emit_iced(
    program: &Program,
    isa: Isa,
    conv: CallConv,
) -> Result<MachineCode, EmitError> {
    let max_vregs = smallgemm_ir::Target::new(isa).vector_registers();
    if program.vregs > max_vregs {
        return Err(EmitError::TooManyVectorRegisters(program.vregs));
    }
    let mut emitter = emit_iced::Emitter::new(program, isa, conv)?;
    emitter.body()?;
    emitter.finish()
}
