//! Lowering: (problem, target, schedule) → `Program`. The one place where blocking and
//! unrolling become concrete.
//!
//! Column-major throughout (row-major specs arrive swapped, see `GemmSpec::col_major`).
//! A register block holds `m_vectors` vectors of C rows × `n_cols` columns in accumulators;
//! each step of k loads one column segment of op(A) into `m_vectors` registers and multiplies
//! it by one broadcast element of op(B) per column (paper 000, Algorithm 1, with the roles of
//! rows and columns exchanged for column-major storage). C is read and written once per
//! block, in the epilogue that applies alpha and beta. When op(A) = Aᵀ its column segments
//! are not contiguous, so each row panel of op(A) is first copied into scratch memory.

use std::collections::HashMap;

use thiserror::Error;

use crate::program::{Addr, Gpr, Mask, MaskDecl, Op, Param, Program, Trips, VReg};
use crate::schedule::{BOperand, RegisterUse, Schedule, ScheduleError};
use crate::spec::{BatchForm, ColMajorProblem, Scalar, Trans};
use crate::target::{MaskSupport, Target};

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum LowerError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("{target} has no kernels for {dtype:?}")]
    UnsupportedDtype { dtype: crate::Dtype, target: Target },
    #[error("an address offset of {0} bytes does not fit in 32 bits")]
    OffsetOverflow(i64),
}

/// Scratch offsets of the spilled scalars; the packed panel starts at `PANEL_OFFSET`.
const ALPHA_SLOT: i32 = 0;
const BETA_SLOT: i32 = 8;
const PANEL_OFFSET: i64 = 64;

/// A general register plus a constant byte offset: where an operand block starts.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    reg: Gpr,
    offset: i64,
    /// `reg` points at the block's address (an entry of a pointer array), not at the block:
    /// the address must be loaded before the cursor can address memory.
    indirect: bool,
}

impl Cursor {
    fn at(reg: Gpr) -> Cursor {
        Cursor {
            reg,
            offset: 0,
            indirect: false,
        }
    }
    fn plus(self, bytes: i64) -> Cursor {
        debug_assert!(!self.indirect || bytes == 0, "offset an unloaded pointer");
        Cursor {
            offset: self.offset + bytes,
            ..self
        }
    }
}

/// A register block's rows: `vectors` registers, the last one masked when `tail`.
#[derive(Clone, Copy, Debug)]
struct RowBlock {
    rows: usize,
    vectors: usize,
    tail: bool,
}

/// Where a dot-product tail (`Schedule::dot_tail`) keeps its operands: byte offsets in
/// scratch memory, each 64-byte aligned.
#[derive(Clone, Copy, Debug)]
struct DotTail {
    /// C's rows past the last whole vector that are dot products (m % lanes).
    rows: usize,
    /// op(A)'s last `rows` rows, gathered there when A is not transposed (k elements each,
    /// `a_row_bytes` apart).
    a_row: i64,
    /// Bytes from one gathered row of A to the next: k rounded up to whole vectors.
    a_row_bytes: i64,
    /// The rows' products with B's columns, column by column (`rows` elements a column),
    /// rounded up to whole vectors.
    sums: i64,
    /// The mask of k's last group of lanes, when it is partial.
    k_mask: Option<Mask>,
    /// Where no mask register is to spare (AVX2) and k's last group of lanes is partial:
    /// that group starts at k - lanes instead, overlapping the one before; in A's gathered
    /// rows its lanes the group before has are zero, the rest of A's row after them.
    overlap: bool,
    /// A packed tail's steps of k per vector (`lanes / rows`), or None for dot products.
    /// Lane `group * r + t` of a group of op(A) holds op(A)[row r, step t of the group]; the
    /// last group ends at k, its lanes of steps the one before has zero. A not transposed,
    /// each group is built in a register as the tail needs it; transposed, they are
    /// gathered at `a_row`, one vector each (`a_row_bytes` apart).
    group: Option<usize>,
}

/// The vector registers a packed tail's groups pass through: op(A)'s group, op(B)'s
/// broadcast, and the indices that put A's loads in place.
#[derive(Clone, Copy, Debug)]
struct PackedRegs {
    a: VReg,
    b: VReg,
    a_index: VReg,
}

/// Loop-carried general registers, one per role, so that sibling blocks reuse them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    MatrixA,
    MatrixB,
    MatrixC,
    RowA,
    RowC,
    RowCount,
    ColB,
    ColC,
    ColCount,
    StepA,
    StepB,
    StepCount,
}

struct Lowering<'a> {
    p: &'a ColMajorProblem,
    target: Target,
    s: Schedule,
    regs: RegisterUse,
    elt: i64,
    lanes: usize,
    /// Masks of the tail's vectors (one, or one per piece with `split_tail`): (mask, lanes),
    /// in the order of the vectors.
    tail_masks: Vec<(Mask, u32)>,
    /// Masks of partial B vectors (FMA by element), after the tail mask: (mask, lanes).
    b_masks: Vec<(Mask, u32)>,
    b_operand: BOperand,
    gprs: HashMap<Role, Gpr>,
    next_gpr: u8,
    /// Leading dimension (elements) of the packed op(A) panel.
    panel_ld: usize,
    /// Vector registers the program uses (the schedule's, plus epilogue extras).
    vregs_used: usize,
    /// Where the current matrix's A, B and C are: in the argument registers (strided), or
    /// behind them (pointer arrays: indirect cursors).
    bases: [Cursor; 3],
    /// C's last row as dot products, when the schedule asks and A and B are read at all.
    dot: Option<DotTail>,
    /// Columns of the current row panel's blocks: the schedule's, or more where the panel
    /// is shorter than the schedule's blocks ([`Lowering::panel_cols`]).
    cols: usize,
}

/// Lowers `problem` with `schedule` for `target`.
pub fn lower(
    problem: &ColMajorProblem,
    target: Target,
    schedule: &Schedule,
) -> Result<Program, LowerError> {
    if !target.supports(problem.dtype) {
        return Err(LowerError::UnsupportedDtype {
            dtype: problem.dtype,
            target,
        });
    }
    let mut program = if schedule.lane_pack {
        // Its own lowering, which validates the schedule as it lays the problem out.
        crate::lane_pack::lower(problem, target, schedule)?
    } else {
        lower_blocks(problem, target, schedule)?
    };
    if schedule.prefetch && problem.batch_form == BatchForm::Strided {
        program.gprs = crate::prefetch::insert(
            &mut program.ops,
            target.prefetch_trips,
            target.prefetch_min_bytes_ahead,
            target.prefetch_spread && packed_densely(problem),
            program.gprs,
        );
    }
    Ok(program)
}

/// Whether each matrix of the batch is less than a cache line from the next, so that
/// prefetching the whole stride of each operand ([`crate::Target::prefetch_spread`]) asks
/// for no line the kernel does not read.
fn packed_densely(p: &ColMajorProblem) -> bool {
    let line = crate::prefetch::LINE as usize;
    let elt = p.dtype.size();
    [
        (p.stride_a, p.m * p.k),
        (p.stride_b, p.k * p.n),
        (p.stride_c, p.m * p.n),
    ]
    .iter()
    .all(|&(stride, tight)| stride.saturating_sub(tight) * elt < line)
}

/// [`lower`] for register-block schedules, without the prefetches.
fn lower_blocks(
    problem: &ColMajorProblem,
    target: Target,
    schedule: &Schedule,
) -> Result<Program, LowerError> {
    schedule.validate(problem, target)?;
    let lanes = schedule.lanes(target, problem.dtype);
    let regs = schedule.registers(problem, target);
    let mut l = Lowering {
        p: problem,
        target,
        s: *schedule,
        regs,
        elt: problem.dtype.size() as i64,
        lanes,
        tail_masks: schedule
            .tail_pieces(problem.m % lanes)
            .enumerate()
            .map(|(i, n)| (Mask(i as u8), n as u32))
            .collect(),
        b_masks: Vec::new(),
        b_operand: BOperand::of(problem, target, schedule),
        gprs: HashMap::new(),
        next_gpr: Gpr::FIRST_FREE,
        panel_ld: schedule.m_vectors.min(problem.m.div_ceil(lanes)) * lanes,
        bases: [Gpr::A, Gpr::B, Gpr::C].map(Cursor::at),
        vregs_used: regs.total(),
        dot: None,
        cols: schedule.n_cols,
    };
    l.program()
}

impl Lowering<'_> {
    fn program(&mut self) -> Result<Program, LowerError> {
        let p = self.p;
        let mut setup = Vec::new();
        let mut masks = Vec::new();
        for &(mask, lanes) in &self.tail_masks {
            // Tails that plain moves handle exactly keep no mask in a register.
            let exact = !self.target.masked_tail(lanes as usize * p.dtype.size());
            let vreg = match self.target.masks() {
                MaskSupport::VectorRegister if !exact => Some(VReg((self.regs.total() - 1) as u8)),
                _ => None,
            };
            masks.push(MaskDecl { mask, lanes, vreg });
            setup.push(Op::SetMask { mask, lanes });
        }
        let params = spill_scalars(p, &mut setup);
        let packs = p.trans_a == Trans::T && p.alpha != Scalar::Zero;
        let spills = p.alpha.is_general() || p.beta.is_general();
        let mut scratch_bytes = if packs {
            let panel = (self.panel_ld * p.k) as i64 * self.elt;
            (PANEL_OFFSET + panel + 63) / 64 * 64
        } else if spills {
            PANEL_OFFSET
        } else {
            0
        };
        if self.s.dot_tail && p.alpha != Scalar::Zero {
            let rows = p.m % self.lanes;
            let vector_bytes = self.lanes * self.elt as usize;
            let group = crate::schedule::packed_tail_group(rows, self.lanes, vector_bytes, p.k);
            let gathers = group.is_some() && !packs_in_registers(p);
            // After the scalars and the packed panel: A's rows (or groups), then the sums.
            let a_row = scratch_bytes.max(PANEL_OFFSET);
            let (a_row_bytes, gathered) = match group {
                Some(group) if gathers => (64, p.k.div_ceil(group) as i64 * 64),
                Some(_) => (64, 0),
                None => {
                    let bytes = p.k.div_ceil(self.lanes) as i64 * 64;
                    // A transposed: its rows are read in place.
                    (bytes, (p.trans_a == Trans::N) as i64 * rows as i64 * bytes)
                }
            };
            let sums = a_row + gathered;
            scratch_bytes = sums + (p.n * rows).div_ceil(self.lanes) as i64 * 64;
            let rest = p.k % self.lanes;
            let partial = rest != 0 && group.is_none();
            let overlap = partial && self.target.masks() == MaskSupport::VectorRegister;
            let k_mask = if partial && !overlap {
                self.b_mask(rest)
            } else {
                None
            };
            // The last group's lanes of steps the one before has: zero once, for good (the
            // gathers never write them). A packed tail's last gathered group, or each row's
            // last chunk of dot products where it overlaps the one before.
            let zeroed: Vec<i64> = match group {
                Some(group) if gathers && p.k % group != 0 => {
                    vec![a_row + (p.k / group) as i64 * 64]
                }
                None if overlap => {
                    let last = a_row + (p.k - rest) as i64 * self.elt;
                    (0..rows as i64).map(|r| last + r * a_row_bytes).collect()
                }
                _ => Vec::new(),
            };
            if !zeroed.is_empty() {
                setup.push(Op::Zero { dst: VReg(0) });
            }
            for at in zeroed {
                setup.push(Op::Store {
                    addr: addr(Cursor::at(Gpr::SCRATCH).plus(at))?,
                    src: VReg(0),
                    mask: None,
                });
            }
            self.dot = Some(DotTail {
                rows,
                a_row,
                a_row_bytes,
                sums,
                k_mask,
                overlap,
                group,
            });
            let needed = self.s.dot_tail_registers(p, self.target);
            self.vregs_used = self.vregs_used.max(needed);
        }

        let mut body = Vec::new();
        let strides = match p.batch_form {
            BatchForm::Strided => [p.stride_a, p.stride_b, p.stride_c].map(|s| s as i64 * self.elt),
            BatchForm::PointerArrays => {
                // The argument registers walk the pointer arrays; blocks load the matrices'
                // addresses from them as they start (`direct`). With alpha = 0 A and B are
                // never read, so neither are their arrays (BLAS callers may pass null ones).
                let reads_ab = p.alpha != Scalar::Zero;
                for (i, base) in self.bases.iter_mut().enumerate() {
                    base.indirect = i == 2 || reads_ab;
                }
                [8; 3]
            }
        };
        // Several matrices per trip first (their offsets from the argument registers grow
        // by a stride each), unless the offsets would not fit in 32 bits.
        let unroll = self.s.batch_unroll.max(1);
        let mut unrolled = None;
        if unroll >= 2 && strides.iter().all(|s| s.abs() * (unroll as i64) < 1 << 30) {
            let bases = self.bases;
            let mut matrices = Vec::new();
            for i in 0..unroll as i64 {
                for (base, stride) in self.bases.iter_mut().zip(strides) {
                    base.offset = i * stride;
                }
                let mut ops = Vec::new();
                self.rows(&mut ops)?;
                matrices.push(ops);
            }
            self.bases = bases;
            let mut ops = self.interleave_pairs(matrices, &masks);
            advance_bases(&mut ops, strides, unroll)?;
            unrolled = Some(Op::Loop {
                counter: Gpr::BATCH,
                trips: Trips::RegisterBy(unroll as u32),
                body: ops,
            });
        }
        self.rows(&mut body)?;
        advance_bases(&mut body, strides, 1)?;
        // Partial B vectors: only targets with FMA by element, whose masks take no register.
        for &(mask, lanes) in &self.b_masks {
            masks.push(MaskDecl {
                mask,
                lanes,
                vreg: None,
            });
            setup.insert(0, Op::SetMask { mask, lanes });
        }
        let mut ops = setup;
        ops.extend(unrolled);
        ops.push(Op::Loop {
            counter: Gpr::BATCH,
            trips: Trips::Register,
            body,
        });
        Ok(Program {
            dtype: p.dtype,
            lanes: self.lanes,
            params,
            scratch_bytes: scratch_bytes as u32,
            vregs: self.vregs_used,
            gprs: self.next_gpr as usize,
            masks,
            ops,
        })
    }

    /// The matrices of one trip of the batch loop, in pairs whose operations alternate (the
    /// second of each pair in registers above the first's), so that the out-of-order core
    /// sees two independent FMA chains side by side. Only for straight-line vector code on
    /// strided batches (whose C matrices never overlap), with registers for both and no mask
    /// in a vector register; otherwise one matrix after the other.
    fn interleave_pairs(&mut self, matrices: Vec<Vec<Op>>, masks: &[MaskDecl]) -> Vec<Op> {
        fn straight(ops: &[Op]) -> bool {
            ops.iter().all(|op| {
                matches!(
                    op,
                    Op::Narrow { .. }
                        | Op::Zero { .. }
                        | Op::Load { .. }
                        | Op::Store { .. }
                        | Op::StorePieces { .. }
                        | Op::Broadcast { .. }
                        | Op::BroadcastGroup { .. }
                        | Op::Permute { .. }
                        | Op::InsertGroup { .. }
                        | Op::PermuteVar { .. }
                        | Op::Fma { .. }
                        | Op::FmaBroadcast { .. }
                        | Op::FmaLane { .. }
                        | Op::Add { .. }
                        | Op::Sub { .. }
                        | Op::Mul { .. }
                )
            })
        }
        let shift = self.vregs_used;
        let fits = 2 * shift <= self.target.vector_registers();
        if !self.s.interleave
            || !fits
            || self.p.batch_form != BatchForm::Strided
            || masks.iter().any(|m| m.vreg.is_some())
            || !matrices.iter().all(|m| straight(m))
        {
            return matrices.concat();
        }
        self.vregs_used = 2 * shift;
        let mut out = Vec::new();
        let mut it = matrices.into_iter();
        while let Some(first) = it.next() {
            let Some(second) = it.next() else {
                out.extend(first);
                break;
            };
            debug_assert_eq!(first.len(), second.len());
            let (mut a, mut b) = (first.into_iter(), second.into_iter());
            // One operation of each in turn, each with its Narrow prefix if it has one.
            while push_unit(&mut out, &mut a, 0) {
                push_unit(&mut out, &mut b, shift as u8);
            }
        }
        out
    }

    fn gpr(&mut self, role: Role) -> Gpr {
        let next = &mut self.next_gpr;
        *self.gprs.entry(role).or_insert_with(|| {
            *next += 1;
            Gpr(*next - 1)
        })
    }

    fn acc(&self, vector: usize, col: usize) -> VReg {
        VReg((vector * self.cols + col) as u8)
    }

    /// Temporaries: the A registers, the broadcast register and any epilogue extras.
    fn temp(&self, i: usize) -> VReg {
        VReg((self.regs.accumulators + i) as u8)
    }

    fn row_block(&self, rows: usize) -> RowBlock {
        RowBlock {
            rows,
            vectors: self.s.block_vectors(rows, self.lanes),
            tail: rows % self.lanes != 0,
        }
    }

    /// Byte offset of vector `v` of a row block from the block's first row.
    fn vector_offset(&self, rb: RowBlock, v: usize) -> i64 {
        let full = rb.rows / self.lanes;
        let lanes = if v <= full {
            v * self.lanes
        } else {
            full * self.lanes
                + self.tail_masks[..v - full]
                    .iter()
                    .map(|&(_, n)| n as usize)
                    .sum::<usize>()
        };
        lanes as i64 * self.elt
    }

    /// Repeats `block` over `count` equal blocks: inline with growing offsets, or as a loop
    /// that advances cursor registers; then the remainder block after them. `block` learns
    /// whether it makes the remainder, and whether its code is the last block's alone (not
    /// a loop body that also serves the blocks before).
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        out: &mut Vec<Op>,
        count: usize,
        unroll: bool,
        cursors: [(Role, Cursor, i64); 2],
        counter: Role,
        mut block: impl FnMut(
            &mut Self,
            &mut Vec<Op>,
            [Cursor; 2],
            bool,
            bool,
        ) -> Result<(), LowerError>,
        has_remainder: bool,
    ) -> Result<(), LowerError> {
        let [(r0, c0, step0), (r1, c1, step1)] = cursors;
        if count >= 2 && !unroll {
            let k0 = self.cursor_in(out, r0, c0);
            let k1 = self.cursor_in(out, r1, c1);
            let (g0, g1) = (k0.reg, k1.reg);
            let mut body = Vec::new();
            block(self, &mut body, [k0, k1], false, false)?;
            body.push(Op::AddImm {
                dst: g0,
                imm: imm(step0)?,
            });
            body.push(Op::AddImm {
                dst: g1,
                imm: imm(step1)?,
            });
            let counter = self.gpr(counter);
            out.push(Op::Loop {
                counter,
                trips: Trips::Const(count as u32),
                body,
            });
            if has_remainder {
                block(self, out, [k0, k1], true, true)?;
            }
        } else {
            let (c0, c1) = (self.direct(out, c0), self.direct(out, c1));
            for i in 0..count as i64 {
                let at = [c0.plus(i * step0), c1.plus(i * step1)];
                let final_block = !has_remainder && i + 1 == count as i64;
                block(self, out, at, false, final_block)?;
            }
            if has_remainder {
                let n = count as i64;
                block(
                    self,
                    out,
                    [c0.plus(n * step0), c1.plus(n * step1)],
                    true,
                    true,
                )?;
            }
        }
        Ok(())
    }

    /// A cursor in the register of `role`, starting where `c` does: a copy of `c`'s register
    /// (the offset stays constant), or the address loaded through an indirect `c`.
    fn cursor_in(&mut self, out: &mut Vec<Op>, role: Role, c: Cursor) -> Cursor {
        let dst = self.gpr(role);
        if c.indirect {
            out.push(Op::LoadAddress {
                dst,
                addr: Addr::new(c.reg, c.offset as i32),
            });
            Cursor::at(dst)
        } else {
            out.push(Op::Copy { dst, src: c.reg });
            Cursor { reg: dst, ..c }
        }
    }

    /// `c` as a cursor that addresses memory, an indirect one's address loaded into the
    /// register of `role` (one the caller knows free).
    fn loaded(&mut self, out: &mut Vec<Op>, c: Cursor, role: Role) -> Cursor {
        if c.indirect {
            self.cursor_in(out, role, c)
        } else {
            c
        }
    }

    /// `c` as a cursor that addresses memory: indirect ones load the matrix's address into
    /// the register of that matrix (only blocks that are inlined need one).
    fn direct(&mut self, out: &mut Vec<Op>, c: Cursor) -> Cursor {
        let role = [Role::MatrixA, Role::MatrixB, Role::MatrixC]
            [self.bases.iter().position(|b| b.reg == c.reg).unwrap_or(2)];
        self.loaded(out, c, role)
    }

    /// All row blocks of one matrix (and its dot-product tail, after them).
    fn rows(&mut self, out: &mut Vec<Op>) -> Result<(), LowerError> {
        let p = self.p;
        let dot = self.dot;
        // Gathers first, so that their stores are long retired when the tail loads them.
        match dot {
            Some(d) if d.group.is_some() && !packs_in_registers(p) => {
                self.gather_packed_groups(out, d)?
            }
            Some(d) if d.group.is_none() && p.trans_a == Trans::N => self.gather_dot_row(out, d)?,
            _ => {}
        }
        let m = p.m - dot.map_or(0, |d| d.rows);
        let mr = self.s.m_vectors * self.lanes;
        let (full, rem) = (m / mr, m % mr);
        let a_step = match p.trans_a {
            Trans::N => mr as i64 * self.elt,
            Trans::T => (mr * p.lda) as i64 * self.elt,
        };
        let c_step = mr as i64 * self.elt;
        let (full_block, rem_block) = (self.row_block(mr), self.row_block(rem));
        self.repeat(
            out,
            full,
            self.s.unroll_m_blocks,
            [
                (Role::RowA, self.bases[0], a_step),
                (Role::RowC, self.bases[2], c_step),
            ],
            Role::RowCount,
            |l, out, [a, c], last, _| {
                let rb = if last { rem_block } else { full_block };
                l.row_panel(out, a, c, rb)
            },
            rem != 0,
        )?;
        match dot {
            Some(d) if d.group.is_some() => self.packed_rows(out, d),
            Some(d) => self.dot_row(out, d),
            None => Ok(()),
        }
    }

    /// Copies op(A)'s last `d.rows` rows into a packed tail's groups in scratch memory
    /// (see [`DotTail::group`]), a scalar at a time.
    fn gather_packed_groups(&mut self, out: &mut Vec<Op>, d: DotTail) -> Result<(), LowerError> {
        let (p, elt) = (self.p, self.elt);
        let group = d.group.expect("a packed tail");
        let a = self.loaded(out, self.bases[0], Role::RowA);
        let (row_bytes, step_bytes) = match p.trans_a {
            Trans::N => (elt, p.lda as i64 * elt),
            Trans::T => (p.lda as i64 * elt, elt),
        };
        let first_row = p.m - d.rows;
        // No block is live between matrices.
        let t = VReg(0);
        for q in 0..p.k.div_ceil(group) {
            let start = packed_group_start(q, group, p.k);
            for r in 0..d.rows {
                // Steps the group before has stay zero.
                for i in (q * group - start)..group {
                    let from = (first_row + r) as i64 * row_bytes + (start + i) as i64 * step_bytes;
                    out.push(Op::LoadScalar {
                        dst: t,
                        addr: addr(a.plus(from))?,
                    });
                    let to = d.a_row + q as i64 * d.a_row_bytes + (group * r + i) as i64 * elt;
                    out.push(Op::StoreScalar {
                        addr: addr(Cursor::at(Gpr::SCRATCH).plus(to))?,
                        src: t,
                    });
                }
            }
        }
        Ok(())
    }

    /// C's last `d.rows` rows as a packed tail: per block of columns, one sum per column
    /// whose lanes hold (row, step) pairs; each group of A's rows FMAed with a broadcast of
    /// the same steps of every column of B; then per `group` columns a tree of
    /// transpose-adds sums the steps and a permute puts the sums in column order, stored to
    /// scratch for the rows' blocks to take into the usual epilogue.
    fn packed_rows(&mut self, out: &mut Vec<Op>, d: DotTail) -> Result<(), LowerError> {
        let (p, elt, lanes) = (self.p, self.elt, self.lanes);
        let group = d.group.expect("a packed tail");
        let b = self.loaded(out, self.bases[1], Role::ColB);
        let order = crate::program::grouped_transpose_add_order(elt as usize, lanes, group)
            .ok_or(ScheduleError::DotTail("64-byte vectors (AVX-512) only"))?;
        // Lane l of the sums (column l / rows, row l % rows) from the tree's lane with it.
        let mut indices = [0u8; 16];
        for (lane, &pair) in order.iter().enumerate() {
            indices[pair] = lane as u8;
        }
        let block = crate::schedule::packed_tail_columns(p.n, group);
        let sum = |j: usize| VReg(j as u8);
        let [a_reg, b_reg, tmp, index, a_index] = [0, 1, 2, 3, 4].map(|i| VReg((block + i) as u8));
        out.push(Op::Indices {
            dst: index,
            indices,
        });
        // Where the groups are built in registers: op(A)'s tail rows, and the indices that
        // put the loads' lane `rows * t + r` (step t of row r) in place.
        let a_rows = if packs_in_registers(p) {
            let a = self.loaded(out, self.bases[0], Role::RowA);
            let mut indices = [0u8; 16];
            for (lane, index) in indices.iter_mut().enumerate().take(lanes) {
                let (r, t) = (lane / group, lane % group);
                *index = (d.rows * t + r) as u8;
            }
            out.push(Op::Indices {
                dst: a_index,
                indices,
            });
            Some(a.plus((p.m - d.rows) as i64 * elt))
        } else {
            None
        };
        let regs = PackedRegs {
            a: a_reg,
            b: b_reg,
            a_index,
        };
        let a_col = p.lda as i64 * elt;
        let scratch = Cursor::at(Gpr::SCRATCH);
        // Each group's op(A): the tail rows at its first step, or its gathered vector.
        let (a_first, a_group) = match a_rows {
            Some(a_rows) => (a_rows, group as i64 * a_col),
            None => (scratch.plus(d.a_row), d.a_row_bytes),
        };
        // Whole groups unrolled, or, where the blocks loop over k and the groups' broadcasts
        // and FMAs would pass the planner's unrolling budget, in a loop of the blocks' steps
        // of k (rounded up to groups); then the last one overlapping them where k is not a
        // multiple of the group.
        let whole = p.k / group;
        let unrolled_ops = crate::schedule::packed_tail_unrolled_ops(p.n, p.k, group);
        let k_unroll = match self.s.k_unroll {
            u if u > 0 && unrolled_ops > crate::plan::UNROLL_BUDGET => u.div_ceil(group),
            _ => 0,
        };
        for first in (0..p.n).step_by(block) {
            let cols = block.min(p.n - first);
            for j in 0..cols {
                out.push(Op::Zero { dst: sum(j) });
            }
            let b_first = b.plus(first as i64 * p.ldb as i64 * elt);
            let b_group = group as i64 * elt;
            let [a_end, b_end] = self.steps(
                out,
                (whole, k_unroll),
                a_first,
                a_group,
                b_first,
                b_group,
                |l, out, a, b| l.packed_group(out, d, regs, a, b, cols, 0),
            )?;
            if p.k % group != 0 {
                // Back to the group's first step, k - group; its steps before `skip` are
                // the whole groups' last ones.
                let skip = group - p.k % group;
                let (a, b) = match a_rows {
                    Some(_) => (
                        a_end.plus(-(skip as i64) * a_col),
                        b_end.plus(-(skip as i64) * elt),
                    ),
                    None => (a_end, b_end.plus(-(skip as i64) * elt)),
                };
                self.packed_group(out, d, regs, a, b, cols, skip)?;
            }
            for tree in (0..cols).step_by(group) {
                let inputs = (0..group).map(|i| (sum(tree + i), tree + i < cols));
                let folded = transpose_add_tree(out, inputs.collect(), tmp);
                out.push(Op::PermuteVar {
                    dst: folded,
                    index,
                    src: folded,
                });
                out.push(Op::Store {
                    addr: addr(scratch.plus(d.sums + ((first + tree) * d.rows) as i64 * elt))?,
                    src: folded,
                    mask: None,
                });
            }
        }
        self.dot_epilogue(out, d)
    }

    /// One group of a packed tail's steps for `cols` columns: its op(A) in a register
    /// (built from the tail rows at `a`, their first `skip` steps zero, or loaded from its
    /// gathered vector at `a`), FMAed with a broadcast of the same steps of each column of
    /// op(B) from `b` on.
    #[allow(clippy::too_many_arguments)]
    fn packed_group(
        &mut self,
        out: &mut Vec<Op>,
        d: DotTail,
        regs: PackedRegs,
        a: Cursor,
        b: Cursor,
        cols: usize,
        skip: usize,
    ) -> Result<(), LowerError> {
        let (p, elt) = (self.p, self.elt);
        let group = d.group.expect("a packed tail");
        if packs_in_registers(p) {
            let column = |t: usize| addr(a.plus(t as i64 * p.lda as i64 * elt));
            if skip == 0 {
                let load = Op::Load {
                    dst: regs.a,
                    addr: column(0)?,
                    mask: None,
                };
                push_at(out, Some((d.rows as i64 * elt) as u32), load);
            } else {
                out.push(Op::Zero { dst: regs.a });
            }
            for t in skip.max(1)..group {
                out.push(Op::InsertGroup {
                    dst: regs.a,
                    addr: column(t)?,
                    group: t as u8,
                    lanes: d.rows as u8,
                });
            }
            out.push(Op::PermuteVar {
                dst: regs.a,
                index: regs.a_index,
                src: regs.a,
            });
        } else {
            out.push(Op::Load {
                dst: regs.a,
                addr: addr(a)?,
                mask: None,
            });
        }
        let b_col = p.ldb as i64 * elt;
        for j in 0..cols {
            out.push(Op::BroadcastGroup {
                dst: regs.b,
                addr: addr(b.plus(j as i64 * b_col))?,
                lanes: group as u8,
            });
            out.push(Op::Fma {
                acc: VReg(j as u8),
                a: regs.a,
                b: regs.b,
                negate: p.alpha == Scalar::MinusOne,
            });
        }
        Ok(())
    }

    /// Copies op(A)'s last `d.rows` rows (A not transposed: rows of A, lda apart) into
    /// scratch memory, each contiguous for the dot-product tail's vector loads.
    fn gather_dot_row(&mut self, out: &mut Vec<Op>, d: DotTail) -> Result<(), LowerError> {
        let (p, elt) = (self.p, self.elt);
        let a = self.loaded(out, self.bases[0], Role::RowA);
        // No block is live between matrices.
        let t = VReg(0);
        // With `overlap`, the steps of k's partial last group move up past its zero lanes.
        let whole = (p.k - p.k % self.lanes) as i64;
        let shift = (self.lanes - p.k % self.lanes) as i64;
        for r in 0..d.rows {
            let row = a.plus((p.m - d.rows + r) as i64 * elt);
            let to = d.a_row + r as i64 * d.a_row_bytes;
            for q in 0..p.k as i64 {
                let at = if d.overlap && q >= whole {
                    q + shift
                } else {
                    q
                };
                out.push(Op::LoadScalar {
                    dst: t,
                    addr: addr(row.plus(q * p.lda as i64 * elt))?,
                });
                out.push(Op::StoreScalar {
                    addr: addr(Cursor::at(Gpr::SCRATCH).plus(to + at * elt))?,
                    src: t,
                });
            }
        }
        Ok(())
    }

    /// C's last `d.rows` rows: each (row, column) pair's dot product of a row of op(A) with
    /// B's column, a vector of k at a time; `lanes` pairs (`lanes / rows` columns, each
    /// column's rows side by side) summed across their lanes together by a tree of
    /// transpose-adds into one vector of sums, stored to scratch column by column; then
    /// the rows' blocks take their accumulators from there into the usual epilogue.
    fn dot_row(&mut self, out: &mut Vec<Op>, d: DotTail) -> Result<(), LowerError> {
        let (p, elt, lanes, rows) = (self.p, self.elt, self.lanes, d.rows);
        // The blocks' loop registers are free again: the rows need no more of them.
        let b = self.loaded(out, self.bases[1], Role::ColB);
        let first_row = p.m - rows;
        let a_rows: Vec<Cursor> = match p.trans_a {
            Trans::N => (0..rows)
                .map(|r| Cursor::at(Gpr::SCRATCH).plus(d.a_row + r as i64 * d.a_row_bytes))
                .collect(),
            Trans::T => {
                let a = self.loaded(out, self.bases[0], Role::RowA);
                (0..rows)
                    .map(|r| a.plus(((first_row + r) * p.lda) as i64 * elt))
                    .collect()
            }
        };
        let order = crate::program::transpose_add_order(elt as usize, lanes)
            .ok_or(ScheduleError::DotTail("64-byte vectors (AVX-512) only"))?;
        // Input q of the tree sums in register q; then A's rows, B's column, the temporary.
        let input = |q: usize| VReg(q as u8);
        let a_reg = |r: usize| VReg((lanes + r) as u8);
        let (b_reg, tmp) = (VReg((lanes + rows) as u8), VReg((lanes + rows + 1) as u8));
        let negate = p.alpha == Scalar::MinusOne;
        let chunks = p.k.div_ceil(lanes);
        let b_col = p.ldb as i64 * elt;
        let scratch = Cursor::at(Gpr::SCRATCH);
        let group = lanes / rows;
        for first in (0..p.n).step_by(group) {
            let cols = group.min(p.n - first);
            // Pair (row r, column first + j) lands in lane j * rows + r of the sums.
            // Inputs with a pair; the others are never written (their lanes of the result
            // are never read), so the folds skip or reuse them.
            let mut used = vec![false; lanes];
            for &q in &order[..cols * rows] {
                used[q] = true;
            }
            for q in (0..lanes).filter(|&q| used[q]) {
                out.push(Op::Zero { dst: input(q) });
            }
            for chunk in 0..chunks {
                let last = chunk + 1 == chunks;
                let mask = if last { d.k_mask } else { None };
                let along_k = (chunk * lanes) as i64 * elt;
                let b_along_k = if last && d.overlap {
                    (p.k - lanes) as i64 * elt
                } else {
                    along_k
                };
                for (r, a_row) in a_rows.iter().enumerate() {
                    out.push(Op::Load {
                        dst: a_reg(r),
                        addr: addr(a_row.plus(along_k))?,
                        mask,
                    });
                }
                for j in 0..cols {
                    out.push(Op::Load {
                        dst: b_reg,
                        addr: addr(b.plus((first + j) as i64 * b_col + b_along_k))?,
                        mask,
                    });
                    for r in 0..rows {
                        out.push(Op::Fma {
                            acc: input(order[j * rows + r]),
                            a: a_reg(r),
                            b: b_reg,
                            negate,
                        });
                    }
                }
            }
            let inputs = (0..lanes).map(input).zip(used).collect();
            let folded = transpose_add_tree(out, inputs, tmp);
            out.push(Op::Store {
                addr: addr(scratch.plus(d.sums + (first * rows) as i64 * elt))?,
                src: folded,
                mask: None,
            });
        }
        self.dot_epilogue(out, d)
    }

    /// The tail rows' blocks: their accumulators loaded from the sums in scratch, then the
    /// usual epilogue.
    fn dot_epilogue(&mut self, out: &mut Vec<Op>, d: DotTail) -> Result<(), LowerError> {
        let (p, elt, rows) = (self.p, self.elt, d.rows);
        let first_row = p.m - rows;
        let scratch = Cursor::at(Gpr::SCRATCH);
        let c = self
            .loaded(out, self.bases[2], Role::ColC)
            .plus(first_row as i64 * elt);
        let rb = self.row_block(rows);
        let nr = self.s.n_cols;
        for first in (0..p.n).step_by(nr) {
            let cols = nr.min(p.n - first);
            for j in 0..cols {
                let at = scratch.plus(d.sums + ((first + j) * rows) as i64 * elt);
                if rows == 1 {
                    out.push(Op::LoadScalar {
                        dst: self.acc(0, j),
                        addr: addr(at)?,
                    });
                    continue;
                }
                for v in 0..rb.vectors {
                    let load = Op::Load {
                        dst: self.acc(v, j),
                        addr: addr(at.plus(self.vector_offset(rb, v)))?,
                        mask: self.mask_for(rb, v),
                    };
                    push_at(out, self.narrow_bytes(rb, v), load);
                }
            }
            let c = c.plus((first * p.ldc) as i64 * elt);
            self.epilogue(out, c, rb, cols, first + cols == p.n)?;
        }
        Ok(())
    }

    /// One row panel: pack op(A) if needed, then every column block.
    fn row_panel(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        c: Cursor,
        rb: RowBlock,
    ) -> Result<(), LowerError> {
        let p = self.p;
        let (a, a_col) = if p.trans_a == Trans::T && p.alpha != Scalar::Zero {
            self.pack_panel(out, a, rb)?;
            (
                Cursor::at(Gpr::SCRATCH).plus(PANEL_OFFSET),
                self.panel_ld as i64 * self.elt,
            )
        } else {
            (a, p.lda as i64 * self.elt)
        };
        let nr = self.panel_cols(rb);
        self.cols = nr;
        let (full, rem) = (p.n / nr, p.n % nr);
        let b_col = self.b_col_bytes();
        let done = self.repeat(
            out,
            full,
            self.s.unroll_n_blocks,
            [
                (Role::ColB, self.bases[1], nr as i64 * b_col),
                (Role::ColC, c, (nr * p.ldc) as i64 * self.elt),
            ],
            Role::ColCount,
            // The last block's code holds the matrix's last column (a loop's body serves
            // every block: it has none of its own).
            |l, out, [b, c], last, ends| {
                let cols = if last { rem } else { nr };
                l.block(out, a, a_col, b, c, rb, cols, ends)
            },
            rem != 0,
        );
        self.cols = self.s.n_cols;
        done
    }

    /// Columns per block in a row panel of `rb`: a panel fewer vectors tall than the
    /// schedule's blocks (the rows past the last whole block) spends the accumulators
    /// those vectors leave free on more columns, in blocks of even width, so that each
    /// of its steps of k loads A and runs its loop once for more FMAs. Only where B comes
    /// through one broadcast register or from memory: a register per column (`b_resident`,
    /// FMA by element) would outgrow the schedule's registers.
    fn panel_cols(&self, rb: RowBlock) -> usize {
        let n = self.s.n_cols;
        let widen = rb.vectors < self.s.m_vectors
            && matches!(self.b_operand, BOperand::Broadcast | BOperand::Memory);
        if !widen {
            return n;
        }
        let most = (self.s.m_vectors * n / rb.vectors).min(self.p.n);
        let blocks = self.p.n.div_ceil(most);
        self.p.n.div_ceil(blocks).max(n)
    }

    /// Bytes between op(B)[p, j] and op(B)[p, j + 1].
    fn b_col_bytes(&self) -> i64 {
        match self.p.trans_b {
            Trans::N => (self.p.ldb as i64) * self.elt,
            Trans::T => self.elt,
        }
    }

    /// Bytes between op(B)[p, j] and op(B)[p + 1, j].
    fn b_row_bytes(&self) -> i64 {
        match self.p.trans_b {
            Trans::N => self.elt,
            Trans::T => (self.p.ldb as i64) * self.elt,
        }
    }

    /// Runs `step(out, a, b)` `k` times: inline, or in a loop of `u` steps (0 unrolls
    /// fully) that advances two cursors by `a_step` and `b_step` bytes per step. Returns
    /// the cursors just past the last step.
    #[allow(clippy::too_many_arguments)]
    fn steps(
        &mut self,
        out: &mut Vec<Op>,
        (k, u): (usize, usize),
        a: Cursor,
        a_step: i64,
        b: Cursor,
        b_step: i64,
        mut step: impl FnMut(&mut Self, &mut Vec<Op>, Cursor, Cursor) -> Result<(), LowerError>,
    ) -> Result<[Cursor; 2], LowerError> {
        if u == 0 || k / u < 2 {
            for i in 0..k as i64 {
                step(self, out, a.plus(i * a_step), b.plus(i * b_step))?;
            }
            let n = k as i64;
            return Ok([a.plus(n * a_step), b.plus(n * b_step)]);
        }
        let (ga, gb) = (self.gpr(Role::StepA), self.gpr(Role::StepB));
        out.push(Op::Copy {
            dst: ga,
            src: a.reg,
        });
        out.push(Op::Copy {
            dst: gb,
            src: b.reg,
        });
        let (ka, kb) = (Cursor::at(ga).plus(a.offset), Cursor::at(gb).plus(b.offset));
        let mut body = Vec::new();
        for i in 0..u as i64 {
            step(self, &mut body, ka.plus(i * a_step), kb.plus(i * b_step))?;
        }
        body.push(Op::AddImm {
            dst: ga,
            imm: imm(u as i64 * a_step)?,
        });
        body.push(Op::AddImm {
            dst: gb,
            imm: imm(u as i64 * b_step)?,
        });
        let counter = self.gpr(Role::StepCount);
        out.push(Op::Loop {
            counter,
            trips: Trips::Const((k / u) as u32),
            body,
        });
        for i in 0..(k % u) as i64 {
            step(self, out, ka.plus(i * a_step), kb.plus(i * b_step))?;
        }
        let n = (k % u) as i64;
        Ok([ka.plus(n * a_step), kb.plus(n * b_step)])
    }

    /// Copies op(A)[rows of rb, 0..k] (stored transposed at `a`) into the scratch panel,
    /// column-major with leading dimension `panel_ld`.
    fn pack_panel(&mut self, out: &mut Vec<Op>, a: Cursor, rb: RowBlock) -> Result<(), LowerError> {
        let (elt, lda, ld) = (self.elt, self.p.lda as i64, self.panel_ld as i64);
        let t = self.temp(0);
        let dst = Cursor::at(Gpr::SCRATCH).plus(PANEL_OFFSET);
        let k = (self.p.k, self.s.k_unroll);
        self.steps(out, k, a, elt, dst, ld * elt, |_, out, src, dst| {
            for i in 0..rb.rows as i64 {
                out.push(Op::LoadScalar {
                    dst: t,
                    addr: addr(src.plus(i * lda * elt))?,
                });
                out.push(Op::StoreScalar {
                    addr: addr(dst.plus(i * elt))?,
                    src: t,
                });
            }
            Ok(())
        })?;
        Ok(())
    }

    /// One register block: accumulate over k, then the epilogue.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        a_col: i64,
        b: Cursor,
        c: Cursor,
        rb: RowBlock,
        cols: usize,
        ends_matrix: bool,
    ) -> Result<(), LowerError> {
        for v in 0..rb.vectors {
            for j in 0..cols {
                out.push(Op::Zero {
                    dst: self.acc(v, j),
                });
            }
        }
        if self.p.alpha != Scalar::Zero {
            let b_row = self.b_row_bytes();
            let (k, u) = (self.p.k, self.s.k_unroll);
            if self.b_operand == BOperand::VectorsAlongK {
                // Groups of `lanes` steps share one B vector per column; a partial group last.
                let g = self.lanes;
                let a_group = g as i64 * a_col;
                let b_group = g as i64 * b_row;
                let [a_end, b_end] = self.steps(
                    out,
                    (k / g, u.div_ceil(g)),
                    a,
                    a_group,
                    b,
                    b_group,
                    |l, out, a, b| l.k_group(out, a, a_col, b, rb, cols, g),
                )?;
                if k % g != 0 {
                    self.k_group(out, a_end, a_col, b_end, rb, cols, k % g)?;
                }
            } else {
                self.steps(out, (k, u), a, a_col, b, b_row, |l, out, a, b| {
                    l.step(out, a, b, rb, cols)
                })?;
            }
        }
        self.epilogue(out, c, rb, cols, ends_matrix)
    }

    /// One step of k: load a column segment of op(A), FMA it with a broadcast of op(B)[p, j]
    /// into each column's accumulators.
    fn step(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        b: Cursor,
        rb: RowBlock,
        cols: usize,
    ) -> Result<(), LowerError> {
        let negate = self.p.alpha == Scalar::MinusOne;
        if self.b_operand == BOperand::BroadcastColumns {
            return self.step_b_resident(out, a, b, rb, cols);
        }
        let a_regs: Vec<VReg> = (0..rb.vectors).map(|v| self.temp(v)).collect();
        let a_reg = |v: usize| a_regs[v];
        for v in 0..rb.vectors {
            self.load_a(out, a_reg(v), a, rb, v)?;
        }
        let b_col = self.b_col_bytes();
        if self.b_operand == BOperand::VectorsAlongN {
            // op(B)[p, j..j + lanes] is one vector: load it once, FMA by each of its lanes.
            for (g, first) in (0..cols).step_by(self.lanes).enumerate() {
                let n = self.lanes.min(cols - first);
                let bv = self.temp(self.regs.a_vectors + g);
                let mask = self.b_mask(n);
                out.push(Op::Load {
                    dst: bv,
                    addr: addr(b.plus(first as i64 * b_col))?,
                    mask,
                });
                for j in first..first + n {
                    for v in 0..rb.vectors {
                        out.push(Op::FmaLane {
                            acc: self.acc(v, j),
                            a: self.temp(v),
                            b: bv,
                            lane: (j - first) as u8,
                            negate,
                        });
                    }
                }
            }
            return Ok(());
        }
        let from_memory = self.b_operand.for_panel(self.target, rb.vectors) == BOperand::Memory;
        for j in 0..cols {
            let b_addr = addr(b.plus(j as i64 * b_col))?;
            if from_memory {
                for v in 0..rb.vectors {
                    let fma = Op::FmaBroadcast {
                        acc: self.acc(v, j),
                        a: a_reg(v),
                        b: b_addr,
                        negate,
                    };
                    push_at(out, self.narrow_bytes(rb, v), fma);
                }
            } else {
                let bt = self.temp(self.regs.a_vectors);
                out.push(Op::Broadcast {
                    dst: bt,
                    addr: b_addr,
                });
                for v in 0..rb.vectors {
                    let fma = Op::Fma {
                        acc: self.acc(v, j),
                        a: a_reg(v),
                        b: bt,
                        negate,
                    };
                    push_at(out, self.narrow_bytes(rb, v), fma);
                }
            }
        }
        Ok(())
    }

    /// Loads vector `v` of `rb`'s column segment of op(A) at `a` into `dst`: through its
    /// mask where it is the tail, at the tail's narrowed width.
    fn load_a(
        &self,
        out: &mut Vec<Op>,
        dst: VReg,
        a: Cursor,
        rb: RowBlock,
        v: usize,
    ) -> Result<(), LowerError> {
        let load = Op::Load {
            dst,
            addr: addr(a.plus(self.vector_offset(rb, v)))?,
            mask: self.mask_for(rb, v),
        };
        push_at(out, self.narrow_bytes(rb, v), load);
        Ok(())
    }

    /// One step of k with op(B) in registers (`Schedule::b_resident`): broadcast the
    /// step's element of each column into a register of its own, then load the column
    /// segment of op(A) a vector at a time into one register and FMA it into every column.
    fn step_b_resident(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        b: Cursor,
        rb: RowBlock,
        cols: usize,
    ) -> Result<(), LowerError> {
        let negate = self.p.alpha == Scalar::MinusOne;
        let a_reg = self.temp(0);
        let b_reg = |j: usize| self.temp(1 + j);
        let b_col = self.b_col_bytes();
        for j in 0..cols {
            out.push(Op::Broadcast {
                dst: b_reg(j),
                addr: addr(b.plus(j as i64 * b_col))?,
            });
        }
        for v in 0..rb.vectors {
            let narrow = self.narrow_bytes(rb, v);
            self.load_a(out, a_reg, a, rb, v)?;
            for j in 0..cols {
                let fma = Op::Fma {
                    acc: self.acc(v, j),
                    a: a_reg,
                    b: b_reg(j),
                    negate,
                };
                push_at(out, narrow, fma);
            }
        }
        Ok(())
    }

    /// `steps` (at most `lanes`) steps of k with FMA by element, op(B) not transposed: one B
    /// vector per column holds op(B)[p..p + steps, j]; each step loads its A vectors and
    /// multiplies them by lane (step) of every column's B vector.
    #[allow(clippy::too_many_arguments)]
    fn k_group(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        a_col: i64,
        b: Cursor,
        rb: RowBlock,
        cols: usize,
        steps: usize,
    ) -> Result<(), LowerError> {
        let negate = self.p.alpha == Scalar::MinusOne;
        let b_col = self.b_col_bytes();
        let mask = self.b_mask(steps);
        for j in 0..cols {
            out.push(Op::Load {
                dst: self.temp(self.regs.a_vectors + j),
                addr: addr(b.plus(j as i64 * b_col))?,
                mask,
            });
        }
        for s in 0..steps {
            let a = a.plus(s as i64 * a_col);
            for v in 0..rb.vectors {
                self.load_a(out, self.temp(v), a, rb, v)?;
            }
            for j in 0..cols {
                for v in 0..rb.vectors {
                    out.push(Op::FmaLane {
                        acc: self.acc(v, j),
                        a: self.temp(v),
                        b: self.temp(self.regs.a_vectors + j),
                        lane: s as u8,
                        negate,
                    });
                }
            }
        }
        Ok(())
    }

    /// The mask of a B vector with `lanes` elements: none for a whole vector; the tail mask
    /// when it has as many lanes, else one more mask (FMA-by-element targets keep masks in
    /// no register, see `MaskSupport::PartialAccess`).
    fn b_mask(&mut self, lanes: usize) -> Option<Mask> {
        if lanes >= self.lanes {
            return None;
        }
        let lanes = lanes as u32;
        if let Some(&(mask, _)) = self
            .tail_masks
            .iter()
            .chain(&self.b_masks)
            .find(|(_, n)| *n == lanes)
        {
            return Some(mask);
        }
        let mask = Mask((self.tail_masks.len() + self.b_masks.len()) as u8);
        self.b_masks.push((mask, lanes));
        Some(mask)
    }

    /// The width the arithmetic of vector `v` of `rb` runs at when it is a tail narrower than
    /// a vector beside full ones: the smallest x86 vector (16 or 32 bytes) that holds its
    /// lanes, as MKL's kernels do (measured, 20x20x20 f64 in L1: the 4-row tail's FMAs as
    /// ymm instead of zmm took the kernel from 0.69-0.93x to 0.93-1.01x MKL JIT's speed).
    /// On Intel not for blocks of tails alone: narrow FMAs do not issue on the 512-bit-only
    /// FMA port, and such blocks lost (10x10x10 f64, 1x10 blocks: 0.70-0.75x against
    /// 0.78-0.94x MKL JIT); where 512-bit operations run as halves, there too
    /// ([`Target::narrow_tail_bytes`]). None: full width.
    fn narrow_bytes(&self, rb: RowBlock, v: usize) -> Option<u32> {
        let full = rb.rows / self.lanes;
        if !rb.tail || v < full {
            return None;
        }
        let tail_bytes = self.tail_masks[v - full].1 as usize * self.elt as usize;
        self.target
            .narrow_tail_bytes(full, tail_bytes, self.lanes * self.elt as usize)
            .map(|bytes| bytes as u32)
    }

    /// The lanes of vector `vector` of `rb` when its store of C goes in whole pieces
    /// (`Op::StorePieces`) instead of through its mask: a masked tail on a target whose
    /// masked stores are slow ([`Target::tail_stores_in_pieces`]).
    ///
    /// Also the tails of the matrix's last column where C is read (`ends_matrix`): the masked
    /// store's whole vector reaches past the column, into the next matrix's C in a packed
    /// batch, whose first load of C then waits until the store commits, which ties each
    /// matrix of the batch to the one before ([`Target::tail_store_holds_up_loads`]).
    fn store_pieces(&self, rb: RowBlock, vector: usize, ends_matrix: bool) -> Option<u8> {
        let full = rb.rows / self.lanes;
        if !rb.tail || vector < full {
            return None;
        }
        let lanes = self.tail_masks[vector - full].1;
        let bytes = lanes as usize * self.elt as usize;
        let crosses = ends_matrix
            && self.p.beta != Scalar::Zero
            && self.narrow_bytes(rb, vector).is_none()
            && self.target.tail_store_holds_up_loads(bytes);
        (crosses || self.target.tail_stores_in_pieces(bytes)).then_some(lanes as u8)
    }

    fn mask_for(&self, rb: RowBlock, vector: usize) -> Option<Mask> {
        let full = rb.rows / self.lanes;
        (rb.tail && vector >= full).then(|| self.tail_masks[vector - full].0)
    }

    /// C = alpha * acc + beta * C for the block, reading and writing each C vector once.
    /// With alpha = -1 the FMAs were negated, so acc already holds alpha * A * B.
    fn epilogue(
        &mut self,
        out: &mut Vec<Op>,
        c: Cursor,
        rb: RowBlock,
        cols: usize,
        ends_matrix: bool,
    ) -> Result<(), LowerError> {
        let (alpha, beta) = (self.p.alpha, self.p.beta);
        // Whether column j is the matrix's last, whose tail's store reaches past the matrix.
        let last = |j: usize| ends_matrix && j + 1 == cols;
        let mut next = 0;
        let mut take = || {
            next += 1;
            self.temp(next - 1)
        };
        let scalars = EpilogueScalars {
            alpha: alpha.is_general().then(&mut take),
            beta: beta.is_general().then(&mut take),
        };
        let old = (beta != Scalar::Zero).then(&mut take);
        scalars.load(out);
        let col_bytes = (self.p.ldc as i64) * self.elt;
        let offsets: Vec<i64> = (0..rb.vectors).map(|v| self.vector_offset(rb, v)).collect();
        let at = |v: usize, j: usize| addr(c.plus(offsets[v] + j as i64 * col_bytes));
        // A load from C right after a store to the same 64 bytes waits for the store (a
        // masked store blocks forwarding for its whole vector, and tails overlap the next
        // column). When the registers allow, load all of the block's C before storing any.
        let free = self.target.vector_registers() - self.regs.total();
        let loads_first = old.is_some() && rb.vectors * cols <= free;
        let first_free = self.regs.total();
        let old_at = |v: usize, j: usize| match (loads_first, old) {
            (true, _) => Some(VReg((first_free + j * rb.vectors + v) as u8)),
            (false, t) => t,
        };
        if loads_first {
            for j in 0..cols {
                for v in 0..rb.vectors {
                    let load = Op::Load {
                        dst: old_at(v, j).expect("C is read"),
                        addr: at(v, j)?,
                        mask: self.mask_for(rb, v),
                    };
                    push_at(out, self.narrow_bytes(rb, v), load);
                }
            }
            self.vregs_used = self.vregs_used.max(first_free + rb.vectors * cols);
        }
        // Too few registers to hold the block's C, and a tail whose masked stores would
        // block the next column's loads: fold C into the accumulators (one temporary,
        // reused), then store them all.
        if let (Some(t), false, true) = (old, loads_first, rb.tail) {
            for j in 0..cols {
                for v in 0..rb.vectors {
                    let (at, mask) = (at(v, j)?, self.mask_for(rb, v));
                    let narrow = self.narrow_bytes(rb, v);
                    fold_old_c(out, beta, self.acc(v, j), t, at, mask, scalars, narrow);
                }
            }
            for j in 0..cols {
                for v in 0..rb.vectors {
                    let store = store_c(
                        at(v, j)?,
                        self.acc(v, j),
                        self.mask_for(rb, v),
                        self.store_pieces(rb, v, last(j)),
                    );
                    push_at(out, self.narrow_bytes(rb, v), store);
                }
            }
            return Ok(());
        }
        for j in 0..cols {
            for v in 0..rb.vectors {
                let old = old_at(v, j).map(|t| (t, loads_first));
                let (at, mask) = (at(v, j)?, self.mask_for(rb, v));
                let narrow = self.narrow_bytes(rb, v);
                let pieces = self.store_pieces(rb, v, last(j));
                let acc = self.acc(v, j);
                finish_vector(out, beta, acc, at, mask, old, scalars, narrow, pieces);
            }
        }
        Ok(())
    }
}

/// Alpha and beta in vector registers, where they are general values (spilled to scratch
/// memory by [`spill_scalars`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct EpilogueScalars {
    pub alpha: Option<VReg>,
    pub beta: Option<VReg>,
}

impl EpilogueScalars {
    /// Broadcasts the general scalars from scratch memory into their registers.
    pub(crate) fn load(self, out: &mut Vec<Op>) {
        for (v, slot) in [(self.alpha, ALPHA_SLOT), (self.beta, BETA_SLOT)] {
            if let Some(dst) = v {
                out.push(Op::Broadcast {
                    dst,
                    addr: Addr::new(Gpr::SCRATCH, slot),
                });
            }
        }
    }
}

/// Stores the general scalars (run-time arguments, or constants other than 0 and ±1) in
/// scratch memory, for [`EpilogueScalars::load`]; returns the run-time ones, in argument
/// order.
pub(crate) fn spill_scalars(p: &ColMajorProblem, setup: &mut Vec<Op>) -> Vec<Param> {
    let mut params = Vec::new();
    for (scalar, param, slot) in [
        (p.alpha, Param::Alpha, ALPHA_SLOT),
        (p.beta, Param::Beta, BETA_SLOT),
    ] {
        let addr = Addr::new(Gpr::SCRATCH, slot);
        match scalar {
            Scalar::Runtime => {
                params.push(param);
                setup.push(Op::StoreParam { param, addr });
            }
            Scalar::Fixed(bits) => setup.push(Op::StoreConst {
                value: f64::from_bits(bits),
                addr,
            }),
            _ => {}
        }
    }
    params
}

/// Moves the A, B and C argument registers `matrices` matrices on: `strides` bytes each
/// (a zero stride, an operand shared by the batch, stays).
pub(crate) fn advance_bases(
    out: &mut Vec<Op>,
    strides: [i64; 3],
    matrices: usize,
) -> Result<(), LowerError> {
    for (reg, bytes) in [Gpr::A, Gpr::B, Gpr::C].into_iter().zip(strides) {
        if bytes != 0 {
            out.push(Op::AddImm {
                dst: reg,
                imm: imm(bytes * matrices as i64)?,
            });
        }
    }
    Ok(())
}

/// Bytes of scratch memory a kernel without a packed A panel needs for its scalars.
pub(crate) fn scalar_scratch_bytes(p: &ColMajorProblem) -> u32 {
    if p.alpha.is_general() || p.beta.is_general() {
        PANEL_OFFSET as u32
    } else {
        0
    }
}

/// The store of a finished vector of C (`src` is not read again): through `mask`, or in
/// whole pieces of `pieces` lanes where the target's masked stores are slow.
fn store_c(at: Addr, src: VReg, mask: Option<Mask>, pieces: Option<u8>) -> Op {
    match pieces {
        Some(lanes) => Op::StorePieces {
            addr: at,
            src,
            lanes,
        },
        None => Op::Store {
            addr: at,
            src,
            mask,
        },
    }
}

/// C = alpha * r + beta * C for one vector of C at `at`, then the store (in `pieces`, see
/// [`store_c`]). `old` is the register for C's old value when beta != 0, and whether it was
/// loaded already. With alpha = -1 the FMAs were negated, so r already holds alpha * A * B.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_vector(
    out: &mut Vec<Op>,
    beta: Scalar,
    r: VReg,
    at: Addr,
    mask: Option<Mask>,
    old: Option<(VReg, bool)>,
    scalars: EpilogueScalars,
    narrow: Option<u32>,
    pieces: Option<u8>,
) {
    // The tail vector's operations, its moves included, at its narrowed width.
    let narrowed = |out: &mut Vec<Op>, op: Op| push_at(out, narrow, op);
    let (alpha_v, beta_v) = (scalars.alpha, scalars.beta);
    let result = match old {
        None => {
            if let Some(av) = alpha_v {
                narrowed(
                    out,
                    Op::Mul {
                        dst: r,
                        a: r,
                        b: av,
                    },
                );
            }
            r
        }
        Some((t, loaded)) => {
            if !loaded {
                narrowed(
                    out,
                    Op::Load {
                        dst: t,
                        addr: at,
                        mask,
                    },
                );
            }
            if let Some(bv) = beta_v {
                narrowed(
                    out,
                    Op::Mul {
                        dst: t,
                        a: t,
                        b: bv,
                    },
                );
            }
            match (beta, alpha_v) {
                (Scalar::MinusOne, av) => {
                    if let Some(av) = av {
                        narrowed(
                            out,
                            Op::Mul {
                                dst: r,
                                a: r,
                                b: av,
                            },
                        );
                    }
                    narrowed(out, Op::Sub { dst: r, a: r, b: t });
                    r
                }
                (_, Some(av)) => {
                    narrowed(
                        out,
                        Op::Fma {
                            acc: t,
                            a: r,
                            b: av,
                            negate: false,
                        },
                    );
                    t
                }
                (_, None) => {
                    narrowed(out, Op::Add { dst: r, a: r, b: t });
                    r
                }
            }
        }
    };
    narrowed(out, store_c(at, result, mask, pieces));
}

/// r = alpha * r + beta * C, with C read from `at` into the temporary `t`: unlike
/// [`finish_vector`], the result stays in r, and nothing is stored. With alpha = -1 the
/// FMAs were negated, so r already holds alpha * A * B.
#[allow(clippy::too_many_arguments)]
fn fold_old_c(
    out: &mut Vec<Op>,
    beta: Scalar,
    r: VReg,
    t: VReg,
    at: Addr,
    mask: Option<Mask>,
    scalars: EpilogueScalars,
    narrow: Option<u32>,
) {
    if let Some(av) = scalars.alpha {
        push_at(
            out,
            narrow,
            Op::Mul {
                dst: r,
                a: r,
                b: av,
            },
        );
    }
    push_at(
        out,
        narrow,
        Op::Load {
            dst: t,
            addr: at,
            mask,
        },
    );
    let fold = match (beta, scalars.beta) {
        (_, Some(bv)) => Op::Fma {
            acc: r,
            a: t,
            b: bv,
            negate: false,
        },
        (Scalar::MinusOne, None) => Op::Sub { dst: r, a: r, b: t },
        (_, None) => Op::Add { dst: r, a: r, b: t },
    };
    push_at(out, narrow, fold);
}

/// Pushes `op`, after an `Op::Narrow` prefix of `bytes` when given.
fn push_at(out: &mut Vec<Op>, bytes: Option<u32>, op: Op) {
    if let Some(bytes) = bytes {
        out.push(Op::Narrow { bytes });
    }
    out.push(op);
}

/// Moves the next operation of `ops`, with its `Narrow` prefix if it has one, to `out`, its
/// vector registers `shift` higher; false when `ops` is done.
fn push_unit(out: &mut Vec<Op>, ops: &mut impl Iterator<Item = Op>, shift: u8) -> bool {
    let Some(op) = ops.next() else {
        return false;
    };
    let prefix = matches!(op, Op::Narrow { .. });
    out.push(shift_vregs(op, shift));
    if prefix {
        out.extend(ops.next().map(|op| shift_vregs(op, shift)));
    }
    true
}

/// `op` with every vector register `shift` higher.
fn shift_vregs(op: Op, shift: u8) -> Op {
    let s = |r: VReg| VReg(r.0 + shift);
    match op {
        Op::Zero { dst } => Op::Zero { dst: s(dst) },
        Op::Load { dst, addr, mask } => Op::Load {
            dst: s(dst),
            addr,
            mask,
        },
        Op::Store { addr, src, mask } => Op::Store {
            addr,
            src: s(src),
            mask,
        },
        Op::Broadcast { dst, addr } => Op::Broadcast { dst: s(dst), addr },
        Op::BroadcastGroup { dst, addr, lanes } => Op::BroadcastGroup {
            dst: s(dst),
            addr,
            lanes,
        },
        Op::Indices { dst, indices } => Op::Indices {
            dst: s(dst),
            indices,
        },
        Op::PermuteVar { dst, index, src } => Op::PermuteVar {
            dst: s(dst),
            index: s(index),
            src: s(src),
        },
        Op::InsertGroup {
            dst,
            addr,
            group,
            lanes,
        } => Op::InsertGroup {
            dst: s(dst),
            addr,
            group,
            lanes,
        },
        Op::Permute { dst, src, select } => Op::Permute {
            dst: s(dst),
            src: s(src),
            select,
        },
        Op::LoadScalar { dst, addr } => Op::LoadScalar { dst: s(dst), addr },
        Op::StoreScalar { addr, src } => Op::StoreScalar { addr, src: s(src) },
        Op::StoreStream { addr, src } => Op::StoreStream { addr, src: s(src) },
        Op::StorePieces { addr, src, lanes } => Op::StorePieces {
            addr,
            src: s(src),
            lanes,
        },
        Op::Fma { acc, a, b, negate } => Op::Fma {
            acc: s(acc),
            a: s(a),
            b: s(b),
            negate,
        },
        Op::FmaBroadcast { acc, a, b, negate } => Op::FmaBroadcast {
            acc: s(acc),
            a: s(a),
            b,
            negate,
        },
        Op::FmaLane {
            acc,
            a,
            b,
            lane,
            negate,
        } => Op::FmaLane {
            acc: s(acc),
            a: s(a),
            b: s(b),
            lane,
            negate,
        },
        Op::Add { dst, a, b } => Op::Add {
            dst: s(dst),
            a: s(a),
            b: s(b),
        },
        Op::Sub { dst, a, b } => Op::Sub {
            dst: s(dst),
            a: s(a),
            b: s(b),
        },
        Op::Mul { dst, a, b } => Op::Mul {
            dst: s(dst),
            a: s(a),
            b: s(b),
        },
        other => other,
    }
}

/// Whether a packed tail builds its groups of op(A) in a register from whole loads of the
/// rows (A not transposed: `Op::InsertGroup`), rather than gathering them into scratch
/// memory a scalar at a time (A transposed, each step of a row `lda` apart).
fn packs_in_registers(p: &ColMajorProblem) -> bool {
    p.trans_a == Trans::N
}

/// The first step of k of a packed tail's group `q` of `group` steps: the last group ends
/// at k (overlapping the one before where k is not a multiple of the group), so that no
/// load of B reaches past its column.
fn packed_group_start(q: usize, group: usize, k: usize) -> usize {
    (q * group).min(k - group)
}

/// Folds `inputs` (register, holds a sum) in neighbouring pairs with transpose-adds at
/// chunk widths len/2 .. 1 into one register, returned. An input without a sum (whose
/// lanes of the result are never read) is never read: its partner folds with itself.
fn transpose_add_tree(out: &mut Vec<Op>, mut live: Vec<(VReg, bool)>, tmp: VReg) -> VReg {
    let mut width = live.len() / 2;
    while width >= 1 {
        live = live
            .chunks(2)
            .map(|pair| {
                let [(a, a_used), (b, b_used)] = [pair[0], pair[1]];
                let (dst, a, b) = match (a_used, b_used) {
                    (true, true) => (a, a, b),
                    (true, false) => (a, a, a),
                    (false, true) => (b, b, b),
                    (false, false) => return (a, false),
                };
                out.push(Op::TransposeAdd {
                    dst,
                    a,
                    b,
                    tmp,
                    width: width as u8,
                });
                (dst, true)
            })
            .collect();
        width /= 2;
    }
    live[0].0
}

pub(crate) fn imm(bytes: i64) -> Result<i32, LowerError> {
    i32::try_from(bytes).map_err(|_| LowerError::OffsetOverflow(bytes))
}

fn addr(c: Cursor) -> Result<Addr, LowerError> {
    Ok(Addr::new(c.reg, imm(c.offset)?))
}
