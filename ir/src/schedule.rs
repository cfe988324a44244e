//! `Schedule`: the tunable choices for one kernel, as plain data.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spec::{ColMajorProblem, Scalar, Trans};
use crate::target::{Isa, MaskSupport, Target};

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
    /// Bytes per vector register used: one of [`Target::vector_widths`], or 0 for the
    /// target's widest. Narrower vectors (xmm/ymm under AVX-512VL) fit small m exactly: no
    /// tail masks, and stores that do not spill into the next column or matrix.
    #[serde(default)]
    pub vector_bytes: usize,
    /// Matrices of the batch per trip of the batch loop (0 or 1: one), the rest in a loop of
    /// one per trip after it: amortises the loop's pointer increments and branch over
    /// several tiny matrices.
    #[serde(default)]
    pub batch_unroll: usize,
    /// Prefetch each line of the next trip's matrices before the first access to the same
    /// line of the current ones (strided batches on x86; see `prefetch.rs`).
    #[serde(default)]
    pub prefetch: bool,
    /// Split the tail of m (m mod lanes rows) into vectors of 1, 2, 4, 8 lanes that plain
    /// moves load and store exactly (x86: vmovss, vmovsd, xmm, ymm) instead of one masked
    /// vector: more FMAs, but no masked store that stalls the loads of C after it.
    #[serde(default)]
    pub split_tail: bool,
    /// With several matrices per trip of the batch loop, alternate the operations of each
    /// pair of them (the second in other registers) where the code allows: two independent
    /// FMA chains side by side for the out-of-order core.
    #[serde(default)]
    pub interleave: bool,
    /// Several matrices, or the columns of one, side by side in the lanes of a vector, for
    /// 2x2x2, 3x3x3 and 4x4xk with k a multiple of 4 (see `lane_pack.rs`): groups of four
    /// lanes hold a 2x2 C or a column of a 4x4 one, A's columns are repeated across groups
    /// and B's elements picked by in-register permutes (3x3x3: one vector holds C, full
    /// permutes). Block fields (m_vectors, n_cols, k_unroll, the unroll flags,
    /// split_tail, interleave) do not apply; `batch_unroll` counts vectors of C.
    #[serde(default)]
    pub lane_pack: bool,
    /// With m one more than a multiple of the lanes (two in f32), compute C's last rows as
    /// dot products of op(A)'s last rows with B's columns (vectors along k, several columns
    /// summed across lanes at once by `Op::TransposeAdd`) instead of with a tail vector of
    /// one or two lanes, which costs as many FMAs as a full one: AVX-512 with 64-byte
    /// vectors, or AVX2 with 32-byte ones (there A not transposed and k at least a vector:
    /// a partial last chunk of k overlaps the one before instead of taking a mask); B not
    /// transposed. The register blocks cover the other rows.
    ///
    /// With two (f64), four or eight rows past a multiple (fewer than the lanes), a packed
    /// tail instead: each lane of one vector per column holds a (row, step of k) pair, the
    /// rows' `lanes / rows` steps side by side, so that one FMA does that many steps of the
    /// tail (op(B)'s steps broadcast as a group); a short tree of transpose-adds sums the
    /// steps (AVX-512 only).
    #[serde(default)]
    pub dot_tail: bool,
    /// Hold the block's elements of op(B) for a step of k in registers, one broadcast per
    /// column, and stream op(A) through a single register a vector at a time (each vector
    /// FMAed into all of the block's columns), instead of holding the step's A vectors and
    /// one broadcast: `m_vectors * n_cols + n_cols + 1` registers instead of
    /// `m_vectors * n_cols + m_vectors + 1`, the same loads. It fits blocks taller than wide
    /// in AVX2's 16 registers (4x3, 6x2: LIBXSMM's AVX2 layout). Where B is broadcast into
    /// a register ([`BOperand::Broadcast`]) only.
    #[serde(default)]
    pub b_resident: bool,
}

/// The most matrices one trip of the batch loop may do.
pub const MAX_BATCH_UNROLL: usize = 16;

fn yes() -> bool {
    true
}

/// Why a schedule cannot be lowered for a problem on a target.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("a register block needs at least one vector and one column")]
    EmptyBlock,
    #[error("{0} loads and stores tails exactly already: no split tails")]
    SplitTail(Target),
    #[error("at most {MAX_BATCH_UNROLL} matrices per trip of the batch loop, not {0}")]
    BatchUnroll(usize),
    #[error("lane packing: {0}")]
    LanePack(&'static str),
    #[error("dot-product tail: {0}")]
    DotTail(&'static str),
    #[error("op(B) in registers needs B broadcast into registers ({0} does not)")]
    BResident(Target),
    #[error("{target} has no {bytes}-byte vectors")]
    VectorWidth { bytes: usize, target: Target },
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
    /// Registers holding B during a step of k: one to broadcast into, none when FMA
    /// broadcasts from memory, whole vectors of B with FMA by element (see [`BOperand`]).
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

/// How a step of k gets its elements of op(B) to the FMAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BOperand {
    /// The FMA broadcasts the element from memory (AVX-512 `{1toN}`): no register. Only for
    /// blocks one vector tall (schedules, and the short row panels of taller ones:
    /// [`BOperand::for_panel`]): each FMA reloads the element, so taller blocks broadcast
    /// once per column into a register instead (the load ports, not the FMAs, would bound
    /// them).
    Memory,
    /// One broadcast per element into a register, reused by the block's column.
    Broadcast,
    /// One broadcast per element into a register of its own, all of a step's columns held
    /// while the step's A vectors pass through one register ([`Schedule::b_resident`]).
    BroadcastColumns,
    /// FMA by element, op(B)'s columns contiguous (B not transposed): one vector per column
    /// of the block holds `lanes` consecutive steps of k.
    VectorsAlongK,
    /// FMA by element, op(B)'s rows contiguous (B transposed): one vector per `lanes`
    /// columns of the block holds their elements of one step of k.
    VectorsAlongN,
}

impl BOperand {
    /// How the blocks of `s` get op(B) on `target`.
    pub fn of(problem: &ColMajorProblem, target: Target, s: &Schedule) -> BOperand {
        if target.fma_by_element() {
            match problem.trans_b {
                Trans::N => BOperand::VectorsAlongK,
                Trans::T => BOperand::VectorsAlongN,
            }
        } else if target.fma_broadcast_operand() && s.m_vectors == 1 {
            BOperand::Memory
        } else if s.b_resident {
            BOperand::BroadcastColumns
        } else {
            BOperand::Broadcast
        }
    }

    /// How a row panel `vectors` tall of a schedule whose blocks take B as `self` gets it:
    /// a panel one vector tall (the rows past a taller schedule's last whole block) gains
    /// nothing from a broadcast register, each element serving one FMA, so where the FMA
    /// can broadcast from memory it does.
    pub fn for_panel(self, target: Target, vectors: usize) -> BOperand {
        if self == BOperand::Broadcast && vectors == 1 && target.fma_broadcast_operand() {
            BOperand::Memory
        } else {
            self
        }
    }

    /// Vector registers holding B for a block of `cols` columns.
    pub fn registers(self, cols: usize, lanes: usize) -> usize {
        match self {
            BOperand::Memory => 0,
            BOperand::Broadcast => 1,
            BOperand::BroadcastColumns => cols,
            BOperand::VectorsAlongK => cols,
            BOperand::VectorsAlongN => cols.div_ceil(lanes),
        }
    }

    /// Loads of B per step of k for a block of `cols` columns (amortised over a group of
    /// `lanes` steps along k); embedded broadcasts count as loads.
    pub fn loads_per_step(self, cols: usize, lanes: usize) -> f64 {
        match self {
            BOperand::Memory | BOperand::Broadcast | BOperand::BroadcastColumns => cols as f64,
            BOperand::VectorsAlongK => cols as f64 / lanes as f64,
            BOperand::VectorsAlongN => cols.div_ceil(lanes) as f64,
        }
    }
}

/// Temporaries the epilogue C = alpha * acc + beta * C needs: the old C when it is read, and
/// a register each for an alpha or beta that is a general value.
pub fn epilogue_temporaries(alpha: Scalar, beta: Scalar) -> usize {
    let reads_c = (beta != Scalar::Zero) as usize;
    reads_c + alpha.is_general() as usize + beta.is_general() as usize
}

impl Schedule {
    /// Bytes per vector on `target` (the target's widest unless the schedule narrows it).
    pub fn vector_width(&self, target: Target) -> usize {
        if self.vector_bytes == 0 {
            target.vector_bytes()
        } else {
            self.vector_bytes
        }
    }

    /// Elements of `dtype` per vector on `target`.
    pub fn lanes(&self, target: Target, dtype: crate::Dtype) -> usize {
        self.vector_width(target) / dtype.size()
    }

    /// Lanes of the vectors that hold the last `tail` (< lanes) rows of a row block: one
    /// masked vector, or with `split_tail` one vector per power of two, largest first.
    pub fn tail_pieces(&self, tail: usize) -> impl Iterator<Item = usize> {
        let split = self.split_tail;
        let whole = (tail != 0 && !split).then_some(tail);
        // The bits of `tail`, highest first (a handful: tail < lanes).
        let bits = (0..usize::BITS - tail.leading_zeros())
            .rev()
            .map(|b| 1usize << b)
            .filter(move |&bit| split && tail & bit != 0);
        whole.into_iter().chain(bits)
    }

    /// Vector registers that hold `rows` rows of a register block.
    pub fn block_vectors(&self, rows: usize, lanes: usize) -> usize {
        rows / lanes + self.tail_pieces(rows % lanes).count()
    }

    /// The most vectors any row block of `problem` has.
    fn max_block_vectors(&self, problem: &ColMajorProblem, lanes: usize) -> usize {
        let rem = problem.m % (self.m_vectors * lanes);
        self.m_vectors.max(self.block_vectors(rem, lanes))
    }

    /// Whether the last rows of `problem`'s columns take a masked vector access on `target`
    /// (not split into whole narrower vectors, nor a width plain moves handle).
    pub fn masked_tail(&self, problem: &ColMajorProblem, target: Target) -> bool {
        let tail_bytes = (problem.m % self.lanes(target, problem.dtype)) * problem.dtype.size();
        !self.split_tail && tail_bytes != 0 && target.masked_tail(tail_bytes)
    }

    /// Register use of this schedule for `problem` on `target`.
    pub fn registers(&self, problem: &ColMajorProblem, target: Target) -> RegisterUse {
        let lanes = self.lanes(target, problem.dtype);
        let vectors = self.max_block_vectors(problem, lanes);
        let b_operand = BOperand::of(problem, target, self);
        RegisterUse {
            accumulators: vectors * self.n_cols,
            // With B in registers the step's A vectors pass through one.
            a_vectors: if b_operand == BOperand::BroadcastColumns {
                1
            } else {
                vectors
            },
            broadcast: b_operand.registers(self.n_cols, lanes),
            epilogue: epilogue_temporaries(problem.alpha, problem.beta),
            masks: match target.masks() {
                // Tails that plain moves handle need no mask register.
                MaskSupport::VectorRegister => self.masked_tail(problem, target) as usize,
                MaskSupport::MaskRegisters { .. } | MaskSupport::PartialAccess => 0,
            },
        }
    }

    /// Checks the hard constraints (the register file) for `problem` on `target`.
    pub fn validate(&self, problem: &ColMajorProblem, target: Target) -> Result<(), ScheduleError> {
        if self.dot_tail {
            self.validate_dot_tail(problem, target)?;
        }
        if self.lane_pack {
            return crate::lane_pack::geometry(problem, target, self).map(drop);
        }
        if self.m_vectors == 0 || self.n_cols == 0 {
            return Err(ScheduleError::EmptyBlock);
        }
        if self.split_tail && target.masks() == MaskSupport::PartialAccess {
            return Err(ScheduleError::SplitTail(target));
        }
        if self.b_resident && BOperand::of(problem, target, self) != BOperand::BroadcastColumns {
            return Err(ScheduleError::BResident(target));
        }
        self.validate_common(target)?;
        registers_fit(self.registers(problem, target).total(), target)
    }

    /// Where a dot-product tail ([`Schedule::dot_tail`]) can be lowered.
    fn validate_dot_tail(
        &self,
        problem: &ColMajorProblem,
        target: Target,
    ) -> Result<(), ScheduleError> {
        let why = if self.lane_pack {
            Some("not with lane packing")
        } else {
            dot_tail_unfit(problem, target, self.vector_width(target))
        };
        match why {
            Some(why) => Err(ScheduleError::DotTail(why)),
            None => registers_fit(self.dot_tail_registers(problem, target), target),
        }
    }

    /// Vector registers of a dot-product tail: one sum per lane, A's rows, B's column and
    /// the shuffle's temporary; a packed tail's: one sum per column of a block, A's group,
    /// B's group, the temporary and the indices of two permutes.
    pub fn dot_tail_registers(&self, problem: &ColMajorProblem, target: Target) -> usize {
        let lanes = self.lanes(target, problem.dtype);
        let rows = problem.m % lanes;
        match packed_tail_group(rows, lanes, self.vector_width(target), problem.k) {
            Some(group) => packed_tail_columns(problem.n, group) + 5,
            None => lanes + rows + 2,
        }
    }

    /// The checks register-blocked and lane-packed schedules share: matrices per trip and
    /// the vector width.
    pub(crate) fn validate_common(&self, target: Target) -> Result<(), ScheduleError> {
        if self.batch_unroll > MAX_BATCH_UNROLL {
            return Err(ScheduleError::BatchUnroll(self.batch_unroll));
        }
        if self.vector_bytes != 0 && !target.vector_widths().contains(&self.vector_bytes) {
            return Err(ScheduleError::VectorWidth {
                bytes: self.vector_bytes,
                target,
            });
        }
        Ok(())
    }
}

/// Why `problem` on `target` with `vector_bytes`-byte vectors cannot have a dot-product
/// tail ([`Schedule::dot_tail`]), or None where it can: the planner asks before it plans
/// one, and validation.
pub(crate) fn dot_tail_unfit(
    problem: &ColMajorProblem,
    target: Target,
    vector_bytes: usize,
) -> Option<&'static str> {
    let lanes = vector_bytes / problem.dtype.size();
    let rows = problem.m % lanes;
    let packed = |k| packed_tail_group(rows, lanes, vector_bytes, k);
    let avx2 = target.isa == Isa::Avx2 && vector_bytes == 32;
    if !(target.isa == Isa::Avx512 && vector_bytes == 64 || avx2) {
        Some("64-byte vectors (AVX-512) or 32-byte ones (AVX2) only")
    } else if avx2 && !(rows == 1 || rows == 2 && lanes == 8) {
        // Packed tails insert their groups with AVX-512 forms.
        Some("on AVX2, m must be 1 more than a multiple of the lanes (or 2 in f32)")
    } else if avx2 && (problem.k < lanes || problem.trans_a == Trans::T) {
        // AVX2 has no mask registers to spare: a partial last chunk of k overlaps the one
        // before it, its repeated lanes zero in A's row, which is gathered for that.
        Some("on AVX2, k must be at least the lanes and A not transposed")
    } else if rows == 0 || rows > 2 && packed(usize::MAX).is_none() {
        // Four rows as dot products lost 8-30% wherever measured (f64 12, 20, 28; f32 20):
        // they are packed instead.
        Some("m must be 1, 2, 4 or 8 more than a multiple of the lanes")
    } else if rows > 2 && packed(problem.k).is_none() {
        Some("a packed tail needs k of at least lanes / (m mod lanes)")
    } else if problem.trans_b == Trans::T {
        Some("B's columns must be contiguous (B not transposed)")
    } else {
        None
    }
}

/// Steps of k per vector of a packed tail ([`Schedule::dot_tail`]) of `rows` rows in
/// vectors of `lanes`, `vector_bytes` bytes: 64-byte vectors only (AVX-512), rows a power
/// of two below the lanes whose elements fill at least 16 bytes (a piece the tail's loads
/// insert whole: f64 2 and 4, f32 4 and 8), and k at least one group. None where C's tail
/// rows are dot products (one row, two f32, two f64 with k short of a group, any on AVX2)
/// or take no tail of this kind.
pub(crate) fn packed_tail_group(
    rows: usize,
    lanes: usize,
    vector_bytes: usize,
    k: usize,
) -> Option<usize> {
    let bytes = rows * vector_bytes / lanes;
    let group = lanes / rows.max(1);
    let fits = vector_bytes == 64 && rows.is_power_of_two() && rows < lanes && bytes >= 16;
    (fits && k >= group).then_some(group)
}

/// Columns of C per block of a packed tail over `n` columns with `group` steps of k a
/// vector: whole trees of `group` columns, at most 24 (the sums' registers), in blocks as
/// even as that allows.
pub(crate) fn packed_tail_columns(n: usize, group: usize) -> usize {
    const MOST: usize = 24;
    let n = n.div_ceil(group) * group;
    let blocks = n.div_ceil(MOST);
    n.div_ceil(blocks).div_ceil(group) * group
}

/// Operations of a packed tail's groups unrolled over `n` columns and `k` steps in groups
/// of `group`: a broadcast and an FMA per column and group. The planner packs a tail only
/// within its unrolling budget, and the lowering loops the groups past it.
pub(crate) fn packed_tail_unrolled_ops(n: usize, k: usize, group: usize) -> usize {
    2 * n * k.div_ceil(group)
}

/// Whether `needed` vector registers fit `target`'s register file.
pub(crate) fn registers_fit(needed: usize, target: Target) -> Result<(), ScheduleError> {
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
