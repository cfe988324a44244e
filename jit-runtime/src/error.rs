//! The one error type of the runtime: every public function returns it instead of panicking.

use smallgemm_codegen_x86::EmitError;
use smallgemm_ir::{BatchForm, Dtype, Isa, LowerError, Operand, SpecError};
use thiserror::Error;

#[derive(Clone, Debug, PartialEq, Error)]
pub enum Error {
    #[error("invalid GEMM: {0}")]
    Spec(#[from] SpecError),
    #[error("cannot lower the kernel: {0}")]
    Lower(#[from] LowerError),
    #[error("cannot encode the kernel: {0}")]
    Emit(#[from] EmitError),
    #[error("cannot encode the NEON kernel: {0}")]
    EmitNeon(#[from] smallgemm_codegen_arm::EmitError),
    #[error("this CPU supports none of AVX-512 (F, VL, DQ, BW), AVX2 with FMA and AArch64 NEON; smallgemm's JIT needs one of them")]
    NoSupportedIsa,
    #[error("this build has no code generator for {0}")]
    NoBackend(Isa),
    #[error("this CPU does not support {isa} (it has: {available})")]
    IsaNotAvailable { isa: Isa, available: String },
    #[error("the kernel computes {kernel:?} but the buffers hold {given:?}")]
    DtypeMismatch { kernel: Dtype, given: Dtype },
    #[error("the kernel was compiled for {which} = {compiled}, but {which} = {given} was passed")]
    ScalarMismatch {
        which: &'static str,
        compiled: f64,
        given: f64,
    },
    #[error("{operand} holds {len} elements; a batch of {batch} needs {required}")]
    SliceTooShort {
        operand: Operand,
        len: usize,
        required: usize,
        batch: usize,
    },
    #[error("the kernel takes {kernel:?} batches but was called with {called:?}")]
    BatchForm {
        kernel: BatchForm,
        called: BatchForm,
    },
    #[error("the batch has {a} A, {b} B and {c} C matrices; the counts must be equal")]
    BatchLengths { a: usize, b: usize, c: usize },
    #[error("{operand} matrix {index} holds {len} elements; it needs {required}")]
    MatrixTooShort {
        operand: Operand,
        index: usize,
        len: usize,
        required: usize,
    },
    #[error("the groups hold {groups} products but {matrices} matrices were given")]
    GroupSizes { groups: usize, matrices: usize },
    #[error("tuning database: {0}")]
    TuningDb(String),
    #[error("cannot start the worker threads: {0}")]
    Threads(String),
    #[error("the pointer to {operand} is null")]
    NullPointer { operand: Operand },
    #[error("the pointer to {operand} is not aligned to its element size")]
    Misaligned { operand: Operand },
    #[error("cannot map executable memory: {0}")]
    ExecutableMemory(String),
}
