//! `Schedule`: the tunable choices for one kernel, as plain data.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spec::{ColMajorProblem, Scalar};
use crate::target::{MaskSupport, Target};

/// How a CPU kernel is blocked and unrolled. The planner picks one; the tuner may replace it.
/// Column-major terms: a register block is `m_vectors` vectors of C rows by `n_cols` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schedule {
    /// Vector registers along m in one register block (rows = m_vectors * lanes).
    pub m_vectors: usize,
    /// Columns of C in one register block: one broadcast of B each per step of k.
    pub n_cols: usize,
    /// Steps of k per iteration of the k loop; 0 unrolls k fully.
    #[serde(default)]
    pub k_unroll: usize,
    /// Emit every row block inline (true) or loop over the full ones (false).
    #[serde(default = "yes")]
    pub unroll_m_blocks: bool,
    /// Emit every column block inline (true) or loop over the full ones (false).
    #[serde(default = "yes")]
    pub unroll_n_blocks: bool,
}

fn yes() -> bool {
    true
}

/// Why a schedule cannot be lowered for a problem on a target.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("a register block needs at least one vector and one column")]
    EmptyBlock,
    #[error("the schedule needs {needed} vector registers; {target} has {available}")]
    TooManyRegisters {
        needed: usize,
        available: usize,
        target: Target,
    },
}

/// How the vector registers of a kernel are spent (see [`Schedule::registers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterUse {
    /// C accumulators: m_vectors * n_cols.
    pub accumulators: usize,
    /// A vectors of one step of k.
    pub a_vectors: usize,
    /// Registers to broadcast B into (0 when FMA broadcasts from memory).
    pub broadcast: usize,
    /// Temporaries of the alpha/beta epilogue (they reuse the A and broadcast registers).
    pub epilogue: usize,
    /// Registers that hold a tail mask for the whole kernel.
    pub masks: usize,
}

impl RegisterUse {
    pub fn total(&self) -> usize {
        self.accumulators + (self.a_vectors + self.broadcast).max(self.epilogue) + self.masks
    }
}

/// Temporaries the epilogue C = alpha * acc + beta * C needs: the old C when it is read, and
/// a register each for an alpha or beta that is a general value.
pub fn epilogue_temporaries(alpha: Scalar, beta: Scalar) -> usize {
    let reads_c = (beta != Scalar::Zero) as usize;
    reads_c + alpha.is_general() as usize + beta.is_general() as usize
}

impl Schedule {
    /// Register use of this schedule for `problem` on `target`.
    pub fn registers(&self, problem: &ColMajorProblem, target: Target) -> RegisterUse {
        let lanes = target.lanes(problem.dtype);
        let has_tail = problem.m % lanes != 0;
        RegisterUse {
            accumulators: self.m_vectors * self.n_cols,
            a_vectors: self.m_vectors,
            broadcast: (!target.fma_broadcast_operand()) as usize,
            epilogue: epilogue_temporaries(problem.alpha, problem.beta),
            masks: match target.masks() {
                MaskSupport::VectorRegister => has_tail as usize,
                MaskSupport::MaskRegisters { .. } => 0,
            },
        }
    }

    /// Checks the hard constraints (the register file) for `problem` on `target`.
    pub fn validate(&self, problem: &ColMajorProblem, target: Target) -> Result<(), ScheduleError> {
        if self.m_vectors == 0 || self.n_cols == 0 {
            return Err(ScheduleError::EmptyBlock);
        }
        let needed = self.registers(problem, target).total();
        let available = target.vector_registers();
        if needed > available {
            return Err(ScheduleError::TooManyRegisters {
                needed,
                available,
                target,
            });
        }
        Ok(())
    }
}
