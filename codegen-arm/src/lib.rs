//! smallgemm's AArch64 backend: a lowered [`Program`] becomes NEON machine code (encoded
//! with dynasm, AAPCS64 calling convention), and machine code becomes a listing
//! (yaxpeax-arm).
//!
//! The emitted function is position independent (only PC-relative branches, no constants),
//! has the signature
//! `extern "C" fn(a: *const T, b: *const T, c: *mut T, batch: usize, [alpha: T], [beta: T])`
//! with the scalars present as `Program::params` lists them (in v0, v1), and preserves
//! x19..x28 and the low halves of v8..v15 when it uses them. Tails along m or of a B vector
//! are partial loads and stores (`ldr d`/`ldr s`, a lane `ld1`/`st1` for three f32 lanes):
//! NEON has no masks, and no byte beyond the enabled lanes is read or written.

mod abi;
mod disasm;
mod emit;
mod regs;

use smallgemm_ir::{MachineCode, Program};
use thiserror::Error;

pub use disasm::{disassemble, listing};

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EmitError {
    #[error("the program needs {needed} general registers; the AArch64 backend has {available}")]
    TooManyGeneralRegisters { needed: usize, available: usize },
    #[error("the program uses vector register {0}, beyond what it declares or NEON has (32)")]
    TooManyVectorRegisters(usize),
    #[error("the program uses general register {0}, beyond what it declares")]
    UndeclaredGeneralRegister(u8),
    #[error("the program has {0} lanes per vector; NEON registers hold 16 bytes")]
    Lanes(usize),
    #[error("lane {0} is beyond the vector")]
    Lane(u8),
    #[error("mask m{0} is used but not declared")]
    UndeclaredMask(u8),
    #[error("the program stores a run-time scalar it does not declare")]
    UnknownParam,
    #[error("the program overwrites v0/v1 before storing the run-time scalars they carry")]
    ParamClobbered,
    #[error("{0} is not available on NEON")]
    Unsupported(&'static str),
    #[error("{0} bytes of code: a loop's branches reach 1 MiB on AArch64; unroll less (loop over the blocks)")]
    CodeTooLarge(usize),
    #[error("dynasm: {0}")]
    Assembler(String),
}

/// Encodes `program` as AArch64 NEON machine code.
pub fn emit(program: &Program) -> Result<MachineCode, EmitError> {
    if program.vregs > 32 {
        return Err(EmitError::TooManyVectorRegisters(program.vregs));
    }
    let mut emitter = emit::Emitter::new(program)?;
    emitter.body()?;
    emitter.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallgemm_ir::{Dtype, GemmSpec, Schedule, Target};

    /// A schedule that unrolls every block of f64 73x62x43 writes more than 1 MiB of code,
    /// beyond the reach of the batch loop's conditional branches: a clear error, where the
    /// planner's schedule (which loops over the blocks) emits.
    #[test]
    fn code_beyond_the_branch_reach_is_a_clear_error() {
        let spec = GemmSpec::builder(Dtype::F64, 73, 62, 43).build().unwrap();
        let p = spec.col_major();
        let planned = smallgemm_ir::plan(&p, Target::NEON);
        assert!(emit(&smallgemm_ir::lower(&p, Target::NEON, &planned).unwrap()).is_ok());
        let unrolled = Schedule {
            m_vectors: 1,
            n_cols: 3,
            k_unroll: 0,
            unroll_m_blocks: true,
            unroll_n_blocks: true,
            ..planned
        };
        let program = smallgemm_ir::lower(&p, Target::NEON, &unrolled).unwrap();
        let err = emit(&program).unwrap_err();
        assert!(
            matches!(err, EmitError::CodeTooLarge(n) if n > 1 << 20),
            "{err}"
        );
    }
}
