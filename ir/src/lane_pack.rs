//! Lane-packed kernels for 2x2x2, 3x3x3 and 4x4xk, k a multiple of 4 (`Schedule::lane_pack`):
//! the CPU analogue of the papers' aggregation of tiny problems, as an in-register
//! interleaving.
//!
//! A register-blocked kernel spends a whole vector (mostly empty) per column of a 2x2 C and
//! a broadcast per element of B; its k steps are a latency chain of 2 or 4 FMAs. Here every
//! group of four lanes holds a whole 2x2 C (so a 512-bit f32 vector holds four matrices of
//! the batch) or one column of a 4x4 C, and
//!
//! ```text
//! 2x2: C  = Σk  permute(A, [2k, 2k+1, 2k, 2k+1]) ⊙ permute(B, [k, k, k+2, k+2])
//! 4x4: C  = Σk  A(:, k) in every group        ⊙ permute(B, [k, k, k, k])
//! ```
//!
//! with the permutes within groups of four lanes (`vpermilps` / `vpermpd` with an immediate)
//! and A's column repeated across groups by a load (`vbroadcastf32x4` / `vbroadcastf64x4`).
//! For k > 4 the B vector of each four steps of k (rows 4c..4c+4 of the columns of its
//! groups) is gathered by a load of its first group and inserts of the others
//! (`vinsertf32x4` / `vinsertf64x4` / `vinsertf128` from memory).
//!
//! 3x3x3 (f32, 512-bit vectors): the whole C, nine lanes in its own column-major order, is
//! one vector, and so are A and B (masked loads of nine lanes); each step of k permutes A's
//! column k and B's row k into C's layout with `vpermps` by constant index vectors:
//!
//! ```text
//! 3x3: C  = Σk  A[index_a(k)] ⊙ B[index_b(k)],  lane r + 3j: op(A)[r, k] and op(B)[k, j]
//! ```
//! 2x2 operands may be transposed (other selections); 4x4 ones may not (a row crosses
//! groups). Matrices must be contiguous (leading dimensions = the size); for several matrices per
//! vector the batch must be packed (strides = 4 elements). A batch whose length is not a
//! multiple of the matrices per vector ends with one matrix per trip, its four lanes loaded
//! and stored exactly.

use crate::lower::{
    advance_bases, finish_vector, imm, scalar_scratch_bytes, spill_scalars, EpilogueScalars,
    LowerError,
};
use crate::program::{Addr, Gpr, Mask, MaskDecl, Op, Program, Trips, VReg};
use crate::schedule::{registers_fit, Schedule, ScheduleError};
use crate::spec::{BatchForm, ColMajorProblem, Dtype, Scalar, Trans};
use crate::target::{Isa, Target};

/// How a lane-packed kernel lays a problem in vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// m = n: 2 or 4.
    pub side: usize,
    /// k: 2 for 2x2, a multiple of 4 for 4x4.
    pub depth: usize,
    /// Lanes per vector.
    pub lanes: usize,
    /// Matrices per vector of C (2x2: a group of four lanes each; else 1).
    pub per_vector: usize,
    /// Vectors per matrix of C (4x4: four columns of four lanes; 1 for 2x2).
    pub vectors: usize,
}

impl Geometry {
    /// Accumulators per vector of C: beyond four steps of k, even and odd steps sum apart,
    /// so that the FMA chain of a matrix is half as long.
    fn chains(&self) -> usize {
        if self.depth > 4 {
            2
        } else {
            1
        }
    }

    /// Vector registers of one vector group of C: accumulators, B, the repeated A column,
    /// the permuted B, and for 2x2 and 3x3 the loaded A.
    fn registers_per_group(&self) -> usize {
        (1 + self.chains()) * self.vectors
            + 2
            + (self.side != 4) as usize
            + 2 * self.eight_plus_one() as usize
    }

    /// Index vectors shared by every group: 3x3 f32's permutes of A and B for each step of
    /// k and the one that brings C's lane 8 to lane 0; 3x3 f64's two.
    fn index_registers(&self) -> usize {
        match (self.side, self.eight_plus_one()) {
            (3, false) => 2 * self.depth + 1,
            (3, true) => 2,
            _ => 0,
        }
    }

    /// 3x3 f64: C's lanes 0..8 in a vector of eight, lane 8 (C[2, 2]) a scalar beside it.
    fn eight_plus_one(&self) -> bool {
        self.side == 3 && self.lanes == 8
    }
}

/// Where lane packing does not apply, in the words of the error.
fn refuse(why: &'static str) -> ScheduleError {
    ScheduleError::LanePack(why)
}

/// The layout of `problem` under `schedule` (which must have `lane_pack`) on `target`, or why
/// lane packing cannot run it.
pub fn geometry(
    problem: &ColMajorProblem,
    target: Target,
    schedule: &Schedule,
) -> Result<Geometry, ScheduleError> {
    let p = problem;
    if target.isa == Isa::Neon {
        return Err(refuse("x86 only (in-lane permutes)"));
    }
    if !matches!(p.dtype, Dtype::F32 | Dtype::F64) {
        return Err(refuse("f32 and f64 only"));
    }
    let side = p.m;
    let depth_fits = match side {
        2 | 3 => p.k == side,
        _ => p.k % 4 == 0 && p.k > 0,
    };
    if !(2..=4).contains(&side) || p.n != side || !depth_fits {
        return Err(refuse("2x2x2, 3x3x3 and 4x4xk (k a multiple of 4) only"));
    }
    if side == 4 && (p.trans_a != Trans::N || p.trans_b != Trans::N) {
        // A transposed 4x4 operand's rows would cross groups.
        return Err(refuse("no transposes at 4x4xk"));
    }
    if p.lda != side || p.ldb != p.k || p.ldc != side {
        return Err(refuse(
            "contiguous matrices only (leading dimensions = the size)",
        ));
    }
    if p.batch_form != BatchForm::Strided {
        return Err(refuse("strided batches only"));
    }
    if p.alpha == Scalar::Zero {
        return Err(refuse("alpha = 0 reads no A or B"));
    }
    schedule.validate_common(target)?;
    let lanes = schedule.lanes(target, p.dtype);
    if lanes < 4 {
        return Err(refuse("vectors of at least four lanes"));
    }
    if p.dtype == Dtype::F64 && lanes == 4 && target.cross_lane_permutes_slow {
        // A group of four f64 lanes is a whole 256-bit vector: its permutes cross lanes.
        return Err(refuse(
            "f64 in 256-bit vectors: cross-lane permutes are slow here",
        ));
    }
    if side == 3 && (target.isa != Isa::Avx512 || lanes * p.dtype.size() != 64) {
        return Err(refuse("3x3x3 in 512-bit vectors only (full permutes)"));
    }
    let elements = side * side;
    let (per_vector, vectors) = match side {
        2 => (lanes / 4, 1),
        3 => (1, 1),
        _ => (1, elements / lanes.min(elements)),
    };
    if per_vector > 1 && [p.stride_a, p.stride_b, p.stride_c] != [elements; 3] {
        return Err(refuse(
            "several matrices per vector need a packed batch (strides = 4)",
        ));
    }
    let g = Geometry {
        side,
        depth: p.k,
        lanes,
        per_vector,
        vectors,
    };
    let scalars = p.alpha.is_general() as usize + p.beta.is_general() as usize;
    registers_fit(
        schedule.batch_unroll.max(1) * g.registers_per_group() + g.index_registers() + scalars,
        target,
    )?;
    Ok(g)
}

/// Estimated cycles per matrix of a lane-packed schedule: the permutes on the one shuffle
/// port, the FMAs (sharing that port's FMA unit with the permutes at 512 bits), the loads.
pub fn estimated_cycles(problem: &ColMajorProblem, target: Target, g: Geometry) -> f64 {
    let c_reads = (problem.beta != Scalar::Zero) as usize as f64;
    let vectors = g.vectors as f64;
    let (permutes, fmas, loads) = if g.side == 2 {
        (4.0, 2.0 + c_reads, 2.0 + c_reads)
    } else if g.eight_plus_one() {
        // Windows of A and B, their permutes; C[2, 2] by three scalar FMAs.
        (6.0, 6.0 + 2.0 * c_reads, 12.0 + 2.0 * c_reads)
    } else if g.side == 3 {
        (6.0, 3.0 + c_reads, 2.0 + c_reads)
    } else {
        let depth = g.depth as f64;
        // Beyond 4x4x4, each vector's B is gathered per four steps of k: a load and an
        // insert (a shuffle) per further group.
        let (b_loads, inserts) = if g.depth == 4 {
            (vectors, 0.0)
        } else {
            let pieces = depth / 4.0 * vectors;
            let groups = (g.lanes / 4) as f64;
            (pieces * groups, pieces * (groups - 1.0))
        };
        // (The odd steps' sum is one more addition per vector.)
        let sums = (g.chains() - 1) as f64;
        (
            depth * vectors + inserts,
            (depth + c_reads + sums) * vectors,
            depth + b_loads + vectors * c_reads,
        )
    };
    let wide = g.lanes * problem.dtype.size() == 64;
    let ports = if wide { (fmas + permutes) / 2.0 } else { 0.0 };
    let cycles = permutes
        .max(fmas / target.fma_per_cycle())
        .max(loads / target.mixed_loads_per_cycle())
        .max(ports);
    cycles / g.per_vector as f64
}

/// Operations of the lowered program: the unrolled trip and the one-matrix loop.
pub fn estimated_ops(g: Geometry, batch_unroll: usize) -> usize {
    let group = if g.side == 2 {
        11
    } else if g.side == 3 {
        17
    } else {
        let b_loads = if g.depth == 4 {
            g.vectors
        } else {
            g.depth / 4 * g.vectors * g.lanes / 4
        };
        g.depth * (1 + 2 * g.vectors) + b_loads + (2 + 2 * g.chains()) * g.vectors + 4
    };
    (batch_unroll.max(1) + 1) * group + g.index_registers()
}

/// The lane-packed schedule for `problem` on `target`, widest vectors first, with its
/// estimated cycles per matrix; None where lane packing does not apply.
pub fn plan(problem: &ColMajorProblem, target: Target) -> Option<(f64, Schedule)> {
    target.vector_widths().iter().rev().find_map(|&width| {
        let s = Schedule {
            m_vectors: 1,
            n_cols: 1,
            k_unroll: 0,
            unroll_m_blocks: true,
            unroll_n_blocks: true,
            vector_bytes: if width == target.vector_bytes() {
                0
            } else {
                width
            },
            batch_unroll: 0,
            prefetch: false,
            split_tail: false,
            interleave: false,
            lane_pack: true,
            dot_tail: false,
            b_resident: false,
        };
        let g = geometry(problem, target, &s).ok()?;
        Some((estimated_cycles(problem, target, g), s))
    })
}

/// The registers of one vector group of C.
struct GroupRegs {
    acc: Vec<VReg>,
    /// The odd steps' accumulators (k > 4).
    odd: Vec<VReg>,
    /// B's vectors; the old C after the FMAs.
    b: Vec<VReg>,
    a_loaded: VReg,
    a_group: VReg,
    b_picked: VReg,
    /// 3x3 f64: C[2, 2]'s accumulator and a scalar of A.
    lane_8: Option<(VReg, VReg)>,
    /// 3x3: the index vectors of A's and then B's permutes, by step of k (shared).
    index: Vec<VReg>,
}

/// Lowers a lane-packed schedule (see the module's text).
pub(crate) fn lower(
    problem: &ColMajorProblem,
    target: Target,
    schedule: &Schedule,
) -> Result<Program, LowerError> {
    let p = problem;
    let g = geometry(p, target, schedule)?;
    let mut next = 0u8;
    let mut take = || {
        next += 1;
        VReg(next - 1)
    };
    let scalars = EpilogueScalars {
        alpha: p.alpha.is_general().then(&mut take),
        beta: p.beta.is_general().then(&mut take),
    };
    let unroll = schedule.batch_unroll.max(1);
    let index: Vec<VReg> = (0..g.index_registers()).map(|_| take()).collect();
    let groups: Vec<GroupRegs> = (0..unroll)
        .map(|_| {
            let acc = (0..g.vectors).map(|_| take()).collect();
            let odd = (0..g.vectors * (g.chains() - 1)).map(|_| take()).collect();
            let b = (0..g.vectors).map(|_| take()).collect();
            let (a_group, b_picked) = (take(), take());
            let a_loaded = if g.side == 4 { a_group } else { take() };
            let lane_8 = g.eight_plus_one().then(|| (take(), take()));
            GroupRegs {
                lane_8,
                acc,
                odd,
                b,
                a_loaded,
                a_group,
                b_picked,
                index: index.clone(),
            }
        })
        .collect();

    let elt = p.dtype.size() as i64;
    let strides = [p.stride_a, p.stride_b, p.stride_c].map(|s| s as i64 * elt);
    let mut ops = Vec::new();
    let params = spill_scalars(p, &mut ops);
    scalars.load(&mut ops);
    let mut masks = Vec::new();
    // 3x3 f32: nine lanes of every load and store; f64: windows of three and seven.
    let whole = (g.side == 3).then_some(NINE_LANES);
    if whole.is_some() {
        let lanes: Vec<(Mask, u32)> = if g.eight_plus_one() {
            vec![(THREE_LANES, 3), (SEVEN_LANES, 7), (ONE_LANE, 1)]
        } else {
            vec![(NINE_LANES, 9), (EIGHT_LANES, 8)]
        };
        for (mask, lanes) in lanes {
            masks.push(MaskDecl {
                mask,
                lanes,
                vreg: None,
            });
            ops.push(Op::SetMask { mask, lanes });
        }
        ops.extend(if g.eight_plus_one() {
            index_vectors_f64(p, &index)
        } else {
            index_vectors(p, &index)
        });
    }

    let per_trip = unroll * g.per_vector;
    if per_trip >= 2 {
        let mut body = Vec::new();
        for (i, regs) in groups.iter().enumerate() {
            let first = (i * g.per_vector) as i64;
            let offsets = strides.map(|s| s * first);
            group(&mut body, p, g, regs, offsets, whole, scalars)?;
        }
        advance_bases(&mut body, strides, per_trip)?;
        ops.push(Op::Loop {
            counter: Gpr::BATCH,
            trips: Trips::RegisterBy(per_trip as u32),
            body,
        });
    }
    // The rest, one matrix a trip: its four lanes alone where a vector holds several.
    let mask = (g.per_vector > 1).then_some(Mask(0));
    if let Some(mask) = mask {
        masks.push(MaskDecl {
            mask,
            lanes: 4,
            vreg: None,
        });
        ops.insert(0, Op::SetMask { mask, lanes: 4 });
    }
    let mut body = Vec::new();
    group(&mut body, p, g, &groups[0], [0; 3], mask.or(whole), scalars)?;
    advance_bases(&mut body, strides, 1)?;
    ops.push(Op::Loop {
        counter: Gpr::BATCH,
        trips: Trips::Register,
        body,
    });
    Ok(Program {
        dtype: p.dtype,
        lanes: g.lanes,
        params,
        scratch_bytes: scalar_scratch_bytes(p),
        vregs: next as usize,
        gprs: Gpr::FIRST_FREE as usize,
        masks,
        ops,
    })
}

/// One vector group of C: the matrices (2x2) or the matrix (4x4) whose A, B and C start
/// `offsets` bytes past the argument registers.
fn group(
    out: &mut Vec<Op>,
    p: &ColMajorProblem,
    g: Geometry,
    regs: &GroupRegs,
    offsets: [i64; 3],
    mask: Option<Mask>,
    scalars: EpilogueScalars,
) -> Result<(), LowerError> {
    if g.eight_plus_one() {
        return group_3x3_f64(out, p, regs, offsets, scalars);
    }
    let elt = p.dtype.size() as i64;
    let at =
        |reg: Gpr, offset: i64| -> Result<Addr, LowerError> { Ok(Addr::new(reg, imm(offset)?)) };
    let [a_off, b_off, c_off] = offsets;
    let vector_bytes = g.lanes as i64 * elt;
    let negate = p.alpha == Scalar::MinusOne;
    if g.side != 4 || g.depth == 4 {
        // B is whole vectors of columns.
        for (v, &b) in regs.b.iter().enumerate() {
            out.push(Op::Load {
                dst: b,
                addr: at(Gpr::B, b_off + v as i64 * vector_bytes)?,
                mask,
            });
        }
    }
    if g.side != 4 {
        out.push(Op::Load {
            dst: regs.a_loaded,
            addr: at(Gpr::A, a_off)?,
            mask,
        });
    }
    for &acc in regs.acc.iter().chain(&regs.odd) {
        out.push(Op::Zero { dst: acc });
    }
    for k in 0..g.depth as u8 {
        if g.side == 3 {
            let (acc, b) = (regs.acc[0], regs.b[0]);
            let [index_a, index_b] = [0, 3].map(|first| regs.index[first + k as usize]);
            out.extend([
                Op::PermuteVar {
                    dst: regs.a_group,
                    index: index_a,
                    src: regs.a_loaded,
                },
                Op::PermuteVar {
                    dst: regs.b_picked,
                    index: index_b,
                    src: b,
                },
                Op::Fma {
                    acc,
                    a: regs.a_group,
                    b: regs.b_picked,
                    negate,
                },
            ]);
            continue;
        }
        if g.side == 4 && g.depth > 4 && k % 4 == 0 {
            gather_b(out, g, regs, b_off, elt, k as usize / 4)?;
        }
        if g.side == 2 {
            // Column k of op(A): elements 2k, 2k+1 of A, or k, k+2 of A transposed.
            let select = match p.trans_a {
                Trans::N => [2 * k, 2 * k + 1, 2 * k, 2 * k + 1],
                Trans::T => [k, k + 2, k, k + 2],
            };
            out.push(Op::Permute {
                dst: regs.a_group,
                src: regs.a_loaded,
                select,
            });
        } else {
            let addr = at(Gpr::A, a_off + 4 * k as i64 * elt)?;
            out.push(if g.lanes == 4 {
                Op::Load {
                    dst: regs.a_group,
                    addr,
                    mask: None,
                }
            } else {
                Op::BroadcastGroup {
                    dst: regs.a_group,
                    addr,
                    lanes: 4,
                }
            });
        }
        // op(B)[k, c] for the columns c of each group: element k + 2c of B, or 2k + c of B
        // transposed.
        let select = match (g.side, p.trans_b) {
            (2, Trans::N) => [k, k, k + 2, k + 2],
            (2, Trans::T) => [2 * k, 2 * k, 2 * k + 1, 2 * k + 1],
            _ => [k % 4; 4],
        };
        let accs = if k % 2 == 1 && !regs.odd.is_empty() {
            &regs.odd
        } else {
            &regs.acc
        };
        for (&acc, &b) in accs.iter().zip(&regs.b) {
            out.push(Op::Permute {
                dst: regs.b_picked,
                src: b,
                select,
            });
            out.push(Op::Fma {
                acc,
                a: regs.a_group,
                b: regs.b_picked,
                negate,
            });
        }
    }
    let reads_c = p.beta != Scalar::Zero;
    for (&acc, &odd) in regs.acc.iter().zip(&regs.odd) {
        out.push(Op::Add {
            dst: acc,
            a: acc,
            b: odd,
        });
    }
    for (v, (&acc, &old)) in regs.acc.iter().zip(&regs.b).enumerate() {
        let c = at(Gpr::C, c_off + v as i64 * vector_bytes)?;
        let old = reads_c.then_some((old, false));
        finish_vector(out, p.beta, acc, c, mask, old, scalars, None, None);
    }
    if g.side == 3 {
        // A masked store of nine lanes blocks the next matrix's loads of C, which overlap
        // its 64 bytes (no forwarding past a masked store; measured, 3x3x3 ran at half the
        // speed of the 1x3 block): lanes 0..8 go as a plain 32-byte store, lane 8 alone.
        // (finish_vector ends with that store; were it not last, the masked store stays.)
        let Some(&Op::Store { addr, src, .. }) = out.last() else {
            return Ok(());
        };
        out.pop();
        out.extend([
            Op::Store {
                addr,
                src,
                mask: Some(EIGHT_LANES),
            },
            Op::PermuteVar {
                dst: regs.a_group,
                index: regs.index[6],
                src,
            },
            Op::StoreScalar {
                addr: at(Gpr::C, c_off + 8 * elt)?,
                src: regs.a_group,
            },
        ]);
    }
    Ok(())
}

/// 3x3x3 f32: the masks of every load of A, B and C, and of C's first eight lanes (stored as
/// a plain 32-byte move).
const NINE_LANES: Mask = Mask(0);
const EIGHT_LANES: Mask = Mask(1);
/// 3x3x3 f64: windows of three and of seven elements (an operand's column or row, by its
/// step), and C[2, 2] alone.
const THREE_LANES: Mask = Mask(0);
const SEVEN_LANES: Mask = Mask(1);
const ONE_LANE: Mask = Mask(2);

/// Where op(X)[i, k] and op(X)[i + 1, k] lie for X = A (i a row), or op(X)[k, i] and
/// op(X)[k, i + 1] for X = B (i a column), in a contiguous 3x3 X: (element of i = 0, step).
fn line_3x3(x: Operand, trans: Trans, k: i64) -> (i64, i64) {
    match (x, trans) {
        (Operand::A, Trans::N) | (Operand::B, Trans::T) => (3 * k, 1),
        (Operand::A, Trans::T) | (Operand::B, Trans::N) => (k, 3),
    }
}

/// The operand whose line [`line_3x3`] gives.
#[derive(Clone, Copy)]
enum Operand {
    A,
    B,
}

/// One 3x3x3 f64 matrix: for each step k, windows of op(A)'s column k and op(B)'s row k
/// (three or seven elements, masked), permuted to C's lanes 0..8 (lane r + 3j: op(A)[r, k],
/// op(B)[k, j]); C[2, 2] by scalar FMAs beside them. C is a plain 64-byte vector and one
/// scalar: no masked store.
fn group_3x3_f64(
    out: &mut Vec<Op>,
    p: &ColMajorProblem,
    regs: &GroupRegs,
    offsets: [i64; 3],
    scalars: EpilogueScalars,
) -> Result<(), LowerError> {
    let [a_off, b_off, c_off] = offsets;
    // Element `element` of the matrix that starts `matrix` bytes past `reg`.
    let at = |reg: Gpr, matrix: i64, element: i64| -> Result<Addr, LowerError> {
        Ok(Addr::new(reg, imm(matrix + 8 * element)?))
    };
    let (acc, (acc_8, a_8)) = (regs.acc[0], regs.lane_8.expect("3x3 f64 registers"));
    let (a_window, b_window) = (regs.a_loaded, regs.b[0]);
    let negate = p.alpha == Scalar::MinusOne;
    out.extend([Op::Zero { dst: acc }, Op::Zero { dst: acc_8 }]);
    let window = |step: i64| if step == 1 { THREE_LANES } else { SEVEN_LANES };
    for k in 0..3 {
        let (a_first, a_step) = line_3x3(Operand::A, p.trans_a, k);
        let (b_first, b_step) = line_3x3(Operand::B, p.trans_b, k);
        out.extend([
            Op::Load {
                dst: a_window,
                addr: at(Gpr::A, a_off, a_first)?,
                mask: Some(window(a_step)),
            },
            Op::Load {
                dst: b_window,
                addr: at(Gpr::B, b_off, b_first)?,
                mask: Some(window(b_step)),
            },
            Op::PermuteVar {
                dst: regs.a_group,
                index: regs.index[0],
                src: a_window,
            },
            Op::PermuteVar {
                dst: regs.b_picked,
                index: regs.index[1],
                src: b_window,
            },
            Op::Fma {
                acc,
                a: regs.a_group,
                b: regs.b_picked,
                negate,
            },
            Op::LoadScalar {
                dst: a_8,
                addr: at(Gpr::A, a_off, a_first + 2 * a_step)?,
            },
            Op::Narrow { bytes: 16 },
            Op::FmaBroadcast {
                acc: acc_8,
                a: a_8,
                b: at(Gpr::B, b_off, b_first + 2 * b_step)?,
                negate,
            },
        ]);
    }
    let reads_c = p.beta != Scalar::Zero;
    let c = at(Gpr::C, c_off, 0)?;
    finish_vector(
        out,
        p.beta,
        acc,
        c,
        None,
        reads_c.then_some((b_window, false)),
        scalars,
        None,
        None,
    );
    let c_8 = at(Gpr::C, c_off, 8)?;
    let old = reads_c.then_some((a_8, false));
    finish_vector(
        out,
        p.beta,
        acc_8,
        c_8,
        Some(ONE_LANE),
        old,
        scalars,
        Some(16),
        None,
    );
    Ok(())
}

/// Rows 4 chunk..4 chunk + 4 of the columns of each B vector's groups (B's columns are
/// `depth` elements apart): the first group by a load of one group's width (which clears
/// the other lanes), the others inserted.
fn gather_b(
    out: &mut Vec<Op>,
    g: Geometry,
    regs: &GroupRegs,
    b_off: i64,
    elt: i64,
    chunk: usize,
) -> Result<(), LowerError> {
    let groups = g.lanes / 4;
    for (v, &b) in regs.b.iter().enumerate() {
        for group in 0..groups {
            let column = v * groups + group;
            let offset = b_off + (column * g.depth + 4 * chunk) as i64 * elt;
            let addr = Addr::new(Gpr::B, imm(offset)?);
            let load = Op::Load {
                dst: b,
                addr,
                mask: None,
            };
            match group {
                0 if groups == 1 => out.push(load),
                0 => out.extend([
                    Op::Narrow {
                        bytes: 4 * elt as u32,
                    },
                    load,
                ]),
                _ => out.push(Op::InsertGroup {
                    dst: b,
                    addr,
                    group: group as u8,
                    lanes: 4,
                }),
            }
        }
    }
    Ok(())
}

/// 3x3x3: the index vectors of the permutes that bring op(A)[r, k] and op(B)[k, j] to lane
/// r + 3j (C's column-major order), for each step k: A's first, then B's.
fn index_vectors(p: &ColMajorProblem, index: &[VReg]) -> Vec<Op> {
    let table = |f: &dyn Fn(u8, u8) -> u8| {
        let mut indices = [0u8; 16];
        for (lane, slot) in indices.iter_mut().enumerate().take(9) {
            *slot = f(lane as u8 % 3, lane as u8 / 3);
        }
        indices
    };
    // Element i of op(X)'s line k (A's column, B's row) is at first + i * step.
    let element = |x, trans, k: u8, i: u8| {
        let (first, step) = line_3x3(x, trans, k as i64);
        (first + i as i64 * step) as u8
    };
    let mut ops = Vec::new();
    for k in 0..3u8 {
        let a = table(&|r, _| element(Operand::A, p.trans_a, k, r));
        let b = table(&|_, j| element(Operand::B, p.trans_b, k, j));
        ops.push(Op::Indices {
            dst: index[k as usize],
            indices: a,
        });
        ops.push(Op::Indices {
            dst: index[3 + k as usize],
            indices: b,
        });
    }
    let mut lane_8 = [0; 16];
    lane_8[0] = 8;
    ops.push(Op::Indices {
        dst: index[6],
        indices: lane_8,
    });
    ops
}

/// 3x3x3 f64: the index vectors that bring an op(A) column window's element r, and an op(B)
/// row window's element j, to lane r + 3j.
fn index_vectors_f64(p: &ColMajorProblem, index: &[VReg]) -> Vec<Op> {
    let table = |step: i64, of_lane: fn(u8) -> u8| {
        let mut indices = [0u8; 16];
        for (lane, slot) in indices.iter_mut().enumerate().take(8) {
            *slot = of_lane(lane as u8) * step as u8;
        }
        indices
    };
    let (_, a_step) = line_3x3(Operand::A, p.trans_a, 0);
    let (_, b_step) = line_3x3(Operand::B, p.trans_b, 0);
    vec![
        Op::Indices {
            dst: index[0],
            indices: table(a_step, |lane| lane % 3),
        },
        Op::Indices {
            dst: index[1],
            indices: table(b_step, |lane| lane / 3),
        },
    ]
}
