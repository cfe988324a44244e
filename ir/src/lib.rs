//! smallgemm's intermediate representation.
//!
//! ```text
//! GemmSpec ──plan──▶ Schedule ──lower──▶ Program ──(backend)──▶ machine code
//! ```
//!
//! - [`GemmSpec`]: the problem (sizes, transposes, layout, leading dimensions, alpha/beta
//!   kinds, batch strides), validated on construction.
//! - [`Target`]: what the machine offers (vector width, registers, masks).
//! - [`Schedule`]: the tunable blocking and unrolling, as serde data; [`plan`] picks one.
//! - [`Program`]: the lowered kernel as vector operations; [`lower`] builds it and
//!   [`interpret`] runs it in plain Rust as the oracle for backends.
//! - [`reference`]: the higher-precision reference GEMM and the checking harness.

mod element;
pub mod gpu;
mod interp;
pub mod lane_pack;
mod lower;
mod plan;
mod prefetch;
mod program;
pub mod reference;
mod schedule;
mod spec;
pub mod stream_store;
mod target;

pub use element::Element;
pub use gpu::{
    plan_gpu, row_tile_warps, Accumulate, GpuResources, GpuSchedule, GpuScheduleError, GpuTarget,
    MmaShape, SharedLayout, Sm, Staging,
};
pub use interp::{interpret, interpret_pointer_arrays, InterpError};
pub use lower::{lower, LowerError};
pub use plan::{
    batch_unroll, choose_unrolling, estimated_cycles, estimated_ops, interleave, plan,
    plan_streaming, prefetch_pays, streams_differently, UNROLL_BUDGET,
};
pub use program::{
    narrowed_ops, transpose_add_operands, transpose_add_order, transpose_add_shuffles, Addr, Gpr,
    MachineCode, Mask, MaskDecl, Op, OpCounts, Param, Program, Shuffle, Trips, VReg,
};
pub use schedule::{epilogue_temporaries, BOperand, RegisterUse, Schedule, ScheduleError};
pub use spec::{
    BatchForm, ColMajorProblem, Dtype, GemmSpec, GemmSpecBuilder, Layout, Operand, Scalar,
    SpecError, Trans,
};
pub use target::{Isa, MaskSupport, Target};

/// Plans (unless `schedule` is given) and lowers `spec` for `target`.
pub fn compile_program(
    spec: &GemmSpec,
    target: Target,
    schedule: Option<&Schedule>,
) -> Result<(Schedule, Program), LowerError> {
    let problem = spec.col_major();
    if !target.supports(problem.dtype) {
        return Err(LowerError::UnsupportedDtype {
            dtype: problem.dtype,
            target,
        });
    }
    let schedule = match schedule {
        Some(s) => *s,
        None => plan(&problem, target),
    };
    let program = lower(&problem, target, &schedule)?;
    Ok((schedule, program))
}
