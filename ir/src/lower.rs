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
use crate::schedule::{RegisterUse, Schedule, ScheduleError};
use crate::spec::{ColMajorProblem, Scalar, Trans};
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
}

impl Cursor {
    fn at(reg: Gpr) -> Cursor {
        Cursor { reg, offset: 0 }
    }
    fn plus(self, bytes: i64) -> Cursor {
        Cursor {
            reg: self.reg,
            offset: self.offset + bytes,
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

/// Loop-carried general registers, one per role, so that sibling blocks reuse them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
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
    tail_mask: Option<Mask>,
    gprs: HashMap<Role, Gpr>,
    next_gpr: u8,
    /// Leading dimension (elements) of the packed op(A) panel.
    panel_ld: usize,
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
    schedule.validate(problem, target)?;
    let lanes = target.lanes(problem.dtype);
    let mut l = Lowering {
        p: problem,
        target,
        s: *schedule,
        regs: schedule.registers(problem, target),
        elt: problem.dtype.size() as i64,
        lanes,
        tail_mask: (problem.m % lanes != 0).then_some(Mask(0)),
        gprs: HashMap::new(),
        next_gpr: Gpr::FIRST_FREE,
        panel_ld: schedule.m_vectors.min(problem.m.div_ceil(lanes)) * lanes,
    };
    l.program()
}

impl Lowering<'_> {
    fn program(&mut self) -> Result<Program, LowerError> {
        let p = self.p;
        let mut setup = Vec::new();
        let mut masks = Vec::new();
        if let Some(mask) = self.tail_mask {
            let lanes = (p.m % self.lanes) as u32;
            let vreg = match self.target.masks() {
                MaskSupport::VectorRegister => Some(VReg((self.regs.total() - 1) as u8)),
                MaskSupport::MaskRegisters { .. } => None,
            };
            masks.push(MaskDecl { mask, lanes, vreg });
            setup.push(Op::SetMask { mask, lanes });
        }
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
        let packs = p.trans_a == Trans::T && p.alpha != Scalar::Zero;
        let spills = p.alpha.is_general() || p.beta.is_general();
        let scratch_bytes = if packs {
            let panel = (self.panel_ld * p.k) as i64 * self.elt;
            (PANEL_OFFSET + panel + 63) / 64 * 64
        } else if spills {
            PANEL_OFFSET
        } else {
            0
        };

        let mut body = Vec::new();
        self.rows(&mut body)?;
        for (reg, stride) in [
            (Gpr::A, p.stride_a),
            (Gpr::B, p.stride_b),
            (Gpr::C, p.stride_c),
        ] {
            if stride != 0 {
                body.push(Op::AddImm {
                    dst: reg,
                    imm: imm(stride as i64 * self.elt)?,
                });
            }
        }
        let mut ops = setup;
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
            vregs: self.regs.total(),
            gprs: self.next_gpr as usize,
            masks,
            ops,
        })
    }

    fn gpr(&mut self, role: Role) -> Gpr {
        let next = &mut self.next_gpr;
        *self.gprs.entry(role).or_insert_with(|| {
            *next += 1;
            Gpr(*next - 1)
        })
    }

    fn acc(&self, vector: usize, col: usize) -> VReg {
        VReg((vector * self.s.n_cols + col) as u8)
    }

    /// Temporaries: the A registers, the broadcast register and any epilogue extras.
    fn temp(&self, i: usize) -> VReg {
        VReg((self.regs.accumulators + i) as u8)
    }

    fn row_block(&self, rows: usize) -> RowBlock {
        RowBlock {
            rows,
            vectors: rows.div_ceil(self.lanes),
            tail: rows % self.lanes != 0,
        }
    }

    /// Repeats `block` over `count` equal blocks: inline with growing offsets, or as a loop
    /// that advances cursor registers; then the remainder block after them.
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        out: &mut Vec<Op>,
        count: usize,
        unroll: bool,
        cursors: [(Role, Cursor, i64); 2],
        counter: Role,
        mut block: impl FnMut(&mut Self, &mut Vec<Op>, [Cursor; 2], bool) -> Result<(), LowerError>,
        has_remainder: bool,
    ) -> Result<(), LowerError> {
        let [(r0, c0, step0), (r1, c1, step1)] = cursors;
        if count >= 2 && !unroll {
            let (g0, g1) = (self.gpr(r0), self.gpr(r1));
            out.push(Op::Copy {
                dst: g0,
                src: c0.reg,
            });
            out.push(Op::Copy {
                dst: g1,
                src: c1.reg,
            });
            let (k0, k1) = (
                Cursor {
                    reg: g0,
                    offset: c0.offset,
                },
                Cursor {
                    reg: g1,
                    offset: c1.offset,
                },
            );
            let mut body = Vec::new();
            block(self, &mut body, [k0, k1], false)?;
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
                block(self, out, [k0, k1], true)?;
            }
        } else {
            for i in 0..count as i64 {
                block(self, out, [c0.plus(i * step0), c1.plus(i * step1)], false)?;
            }
            if has_remainder {
                let n = count as i64;
                block(self, out, [c0.plus(n * step0), c1.plus(n * step1)], true)?;
            }
        }
        Ok(())
    }

    /// All row blocks of one matrix.
    fn rows(&mut self, out: &mut Vec<Op>) -> Result<(), LowerError> {
        let p = self.p;
        let mr = self.s.m_vectors * self.lanes;
        let (full, rem) = (p.m / mr, p.m % mr);
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
                (Role::RowA, Cursor::at(Gpr::A), a_step),
                (Role::RowC, Cursor::at(Gpr::C), c_step),
            ],
            Role::RowCount,
            |l, out, [a, c], last| {
                let rb = if last { rem_block } else { full_block };
                l.row_panel(out, a, c, rb)
            },
            rem != 0,
        )
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
                Cursor {
                    reg: Gpr::SCRATCH,
                    offset: PANEL_OFFSET,
                },
                self.panel_ld as i64 * self.elt,
            )
        } else {
            (a, p.lda as i64 * self.elt)
        };
        let nr = self.s.n_cols;
        let (full, rem) = (p.n / nr, p.n % nr);
        let b_col = self.b_col_bytes();
        self.repeat(
            out,
            full,
            self.s.unroll_n_blocks,
            [
                (Role::ColB, Cursor::at(Gpr::B), nr as i64 * b_col),
                (Role::ColC, c, (nr * p.ldc) as i64 * self.elt),
            ],
            Role::ColCount,
            |l, out, [b, c], last| {
                let cols = if last { rem } else { nr };
                l.block(out, a, a_col, b, c, rb, cols)
            },
            rem != 0,
        )
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

    /// Runs `step(out, p, a, b)` for every p in 0..k: inline, or in a loop of `k_unroll`
    /// steps that advances two cursors by `a_step` and `b_step` bytes per step.
    fn steps(
        &mut self,
        out: &mut Vec<Op>,
        a: Cursor,
        a_step: i64,
        b: Cursor,
        b_step: i64,
        mut step: impl FnMut(&mut Self, &mut Vec<Op>, Cursor, Cursor) -> Result<(), LowerError>,
    ) -> Result<(), LowerError> {
        let k = self.p.k;
        let u = self.s.k_unroll;
        if u == 0 || k / u < 2 {
            for i in 0..k as i64 {
                step(self, out, a.plus(i * a_step), b.plus(i * b_step))?;
            }
            return Ok(());
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
        let (ka, kb) = (
            Cursor {
                reg: ga,
                offset: a.offset,
            },
            Cursor {
                reg: gb,
                offset: b.offset,
            },
        );
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
        Ok(())
    }

    /// Copies op(A)[rows of rb, 0..k] (stored transposed at `a`) into the scratch panel,
    /// column-major with leading dimension `panel_ld`.
    fn pack_panel(&mut self, out: &mut Vec<Op>, a: Cursor, rb: RowBlock) -> Result<(), LowerError> {
        let (elt, lda, ld) = (self.elt, self.p.lda as i64, self.panel_ld as i64);
        let t = self.temp(0);
        let dst = Cursor {
            reg: Gpr::SCRATCH,
            offset: PANEL_OFFSET,
        };
        self.steps(out, a, elt, dst, ld * elt, |_, out, src, dst| {
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
        })
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
            self.steps(out, a, a_col, b, b_row, |l, out, a, b| {
                l.step(out, a, b, rb, cols)
            })?;
        }
        self.epilogue(out, c, rb, cols)
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
        let vec_bytes = (self.lanes as i64) * self.elt;
        let a_reg = |v: usize| self.temp(v);
        for v in 0..rb.vectors {
            out.push(Op::Load {
                dst: a_reg(v),
                addr: addr(a.plus(v as i64 * vec_bytes))?,
                mask: self.mask_for(rb, v),
            });
        }
        let b_col = self.b_col_bytes();
        for j in 0..cols {
            let b_addr = addr(b.plus(j as i64 * b_col))?;
            if self.target.fma_broadcast_operand() {
                for v in 0..rb.vectors {
                    out.push(Op::FmaBroadcast {
                        acc: self.acc(v, j),
                        a: a_reg(v),
                        b: b_addr,
                        negate,
                    });
                }
            } else {
                let bt = self.temp(self.s.m_vectors);
                out.push(Op::Broadcast {
                    dst: bt,
                    addr: b_addr,
                });
                for v in 0..rb.vectors {
                    out.push(Op::Fma {
                        acc: self.acc(v, j),
                        a: a_reg(v),
                        b: bt,
                        negate,
                    });
                }
            }
        }
        Ok(())
    }

    fn mask_for(&self, rb: RowBlock, vector: usize) -> Option<Mask> {
        (rb.tail && vector + 1 == rb.vectors)
            .then_some(self.tail_mask)
            .flatten()
    }

    /// C = alpha * acc + beta * C for the block, reading and writing each C vector once.
    /// With alpha = -1 the FMAs were negated, so acc already holds alpha * A * B.
    fn epilogue(
        &mut self,
        out: &mut Vec<Op>,
        c: Cursor,
        rb: RowBlock,
        cols: usize,
    ) -> Result<(), LowerError> {
        let (alpha, beta) = (self.p.alpha, self.p.beta);
        let mut next = 0;
        let mut take = || {
            next += 1;
            self.temp(next - 1)
        };
        let alpha_v = alpha.is_general().then(&mut take);
        let beta_v = beta.is_general().then(&mut take);
        let old = (beta != Scalar::Zero).then(&mut take);
        for (v, slot) in [(alpha_v, ALPHA_SLOT), (beta_v, BETA_SLOT)] {
            if let Some(dst) = v {
                out.push(Op::Broadcast {
                    dst,
                    addr: Addr::new(Gpr::SCRATCH, slot),
                });
            }
        }
        let vec_bytes = (self.lanes as i64) * self.elt;
        let col_bytes = (self.p.ldc as i64) * self.elt;
        for j in 0..cols {
            for v in 0..rb.vectors {
                let r = self.acc(v, j);
                let at = addr(c.plus(v as i64 * vec_bytes + j as i64 * col_bytes))?;
                let mask = self.mask_for(rb, v);
                let result = match old {
                    None => {
                        if let Some(av) = alpha_v {
                            out.push(Op::Mul {
                                dst: r,
                                a: r,
                                b: av,
                            });
                        }
                        r
                    }
                    Some(t) => {
                        out.push(Op::Load {
                            dst: t,
                            addr: at,
                            mask,
                        });
                        if let Some(bv) = beta_v {
                            out.push(Op::Mul {
                                dst: t,
                                a: t,
                                b: bv,
                            });
                        }
                        match (beta, alpha_v) {
                            (Scalar::MinusOne, av) => {
                                if let Some(av) = av {
                                    out.push(Op::Mul {
                                        dst: r,
                                        a: r,
                                        b: av,
                                    });
                                }
                                out.push(Op::Sub { dst: r, a: r, b: t });
                                r
                            }
                            (_, Some(av)) => {
                                out.push(Op::Fma {
                                    acc: t,
                                    a: r,
                                    b: av,
                                    negate: false,
                                });
                                t
                            }
                            (_, None) => {
                                out.push(Op::Add { dst: r, a: r, b: t });
                                r
                            }
                        }
                    }
                };
                out.push(Op::Store {
                    addr: at,
                    src: result,
                    mask,
                });
            }
        }
        Ok(())
    }
}

fn imm(bytes: i64) -> Result<i32, LowerError> {
    i32::try_from(bytes).map_err(|_| LowerError::OffsetOverflow(bytes))
}

fn addr(c: Cursor) -> Result<Addr, LowerError> {
    Ok(Addr::new(c.reg, imm(c.offset)?))
}
