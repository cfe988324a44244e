//! The shared-memory plan of a kernel (which operands are copied flat, padded slots, C's
//! copy) and the flat copies themselves.

use super::*;

/// The worst number of distinct 4-byte words one bank serves for one shared load of a
/// whole warp, over the block's warps; `addr(t)` is thread t's byte address.
pub(super) fn bank_degree(threads: usize, elt: usize, addr: impl Fn(usize) -> usize) -> usize {
    let words = elt.div_ceil(4);
    let mut worst = 0;
    for w in 0..threads.div_ceil(32) {
        let mut banks: Vec<Vec<usize>> = vec![Vec::new(); 32];
        for t in w * 32..((w + 1) * 32).min(threads) {
            for i in 0..words {
                let word = addr(t) / 4 + i;
                let bank = &mut banks[word % 32];
                if !bank.contains(&word) {
                    bank.push(word);
                }
            }
        }
        worst = worst.max(banks.iter().map(Vec::len).max().unwrap_or(0));
    }
    worst
}

/// A line of global memory in bytes: `flat_copy`'s `line` places a span's vectors in
/// shared memory as they lie in their lines.
pub(super) const LINE: usize = 128;

/// The room a region needs for `flat_copy`'s `line` placement: up to a line less one
/// 16-byte vector past its start.
pub(super) const LINE_ROOM: usize = LINE - 16;

/// The mask that takes a span's address to its shift as `flat_copy` returns it: the bytes
/// from its region's start to the span's first element (past the 16-byte boundary, or with
/// `line` past the 128-byte line).
pub(super) fn shift_mask(line: bool) -> usize {
    if line {
        LINE - 1
    } else {
        15
    }
}

/// Decides the staging of each operand under `s.stage` (see [`smallgemm_ir::Staging`]).
pub(crate) fn flat_plan(p: &ColMajorProblem, s: &GpuSchedule, kind: BatchKind, sm: Sm) -> FlatPlan {
    let layout = s.shared_layout(p);
    let elt = p.dtype.size();
    let tba = s.tba as usize;
    // Tensor-core kernels keep A and B in their padded slots (`ldmatrix` needs aligned
    // rows; `Flat` there means `load_realigned`, or `load_flat`, into the slot) and may
    // stage only C flat.
    let mma = s.mma.is_some();
    let usable = kind == BatchKind::Strided && !mma && s.stage != Staging::Padded;
    let tpp = match s.mma {
        None => s.fma_threads(p) as usize,
        Some(_) => 32 * s.warps as usize,
    };
    let threads = tpp * tba;
    let tm = p.m.div_ceil(s.rm as usize).max(1);
    let v = 16 / elt;
    let allowed = |padded: usize| padded.max(2 * elt.div_ceil(4));
    // A: thread (g, tx) reads row tx of problem g; padded slot (a_len + b_len).
    let slot_all = layout.a_len + layout.b_len;
    let (a_lead, a_row, a_col) = match p.trans_a {
        Trans::N => (p.m, 1, p.m),
        Trans::T => (p.k, p.k, 1),
    };
    // An operand of `len` elements per problem, tight and packed, is read flat when its
    // threads' first elements (`flat(i)` of thread i of a problem) conflict in shared memory
    // no more than in the padded slot (`padded(i)`).
    let flat_ok = |tight: bool,
                   len: usize,
                   flat: &dyn Fn(usize) -> usize,
                   padded: &dyn Fn(usize) -> usize| {
        usable
            && tight
            && bank_degree(threads, elt, |t| ((t / tpp) * len + flat(t % tpp)) * elt)
                <= allowed(bank_degree(threads, elt, |t| {
                    ((t / tpp) * slot_all + padded(t % tpp)) * elt
                }))
    };
    // Tensor-core kernels with `flat_fragments`: A and B verbatim wherever tight and packed
    // (their fragments are read with 16-bit loads at any alignment).
    let fragments = kind == BatchKind::Strided && s.flat_fragments_apply();
    let a_len = p.m * p.k;
    let a_tight = p.lda == a_lead && p.stride_a == a_len;
    let a_ok = (fragments && a_tight)
        || flat_ok(a_tight, a_len, &|i| (i % tm) * a_row, &|i| {
            (i % tm) * layout.a_row
        });
    let (b_lead, b_row, b_col) = match p.trans_b {
        Trans::N => (p.k, 1, p.k),
        Trans::T => (p.n, p.n, 1),
    };
    let b_len = p.k * p.n;
    let b_tight = p.ldb == b_lead && p.stride_b == b_len;
    let b_ok = (fragments && b_tight)
        || flat_ok(b_tight, b_len, &|i| (i / tm) * b_col, &|i| {
            layout.a_len + (i / tm) * layout.b_col
        });
    let c_len = p.m * p.n;
    // Tensor-core kernels: where C's columns are whole, aligned vectors of 2, 4 or 8 halves,
    // C goes to a padded copy in the problem's slot (column by column), else, when tight and
    // packed, flat. The padding keeps the epilogue's 16-bit accesses (8 rows x 4 columns two apart
    // per instruction) off each other's banks: two columns are c_ld words apart, an odd
    // multiple of 8 (the tight copy has 4-way conflicts where m is a multiple of 32).
    // The column copy moves 16-, 8- or 4-byte vectors: the widest that m, ldc and the batch
    // stride allow (odd m: none, C goes flat). Measured on the H100 (docs/gpu-notes.md,
    // version 8): with 4- and 8-byte vectors the padded copy beat the flat one at the even
    // sizes from 66 that are no multiple of 8, by up to 19 points of the bound.
    let cv = [8, 4, 2]
        .into_iter()
        .find(|&v| p.m % v == 0 && p.ldc % v == 0 && p.stride_c % v == 0);
    // `c_over_a`: C's copy in A's place (one problem per block whose warps keep their A
    // fragments in registers; `mma_body` copies C in after they are loaded).
    let over_a = mma
        && s.c_over_a
        && kind == BatchKind::Strided
        && s.stage == Staging::FlatC
        && tba == 1
        && !fragments
        && (s.warps as usize) % p.m.div_ceil(16) == 0;
    let c_pad = cv
        .filter(|_| mma && kind == BatchKind::Strided && s.stage == Staging::FlatC)
        .map(|cv| {
            let mm = p.m.next_multiple_of(8);
            let c_ld = if (mm / 8) % 2 == 0 { mm + 8 } else { mm + 16 };
            let matrix = sm == Sm::Sm90
                && !s.element_epilogue_apply()
                && (!s.epilogue_swaps_apply() || epilogue_swap_table(c_ld) == [0; 4]);
            let mut c = CPad {
                // After the padded copies of A and B that are in the slot.
                c_in_slot: (!a_ok as usize) * layout.a_len + (!b_ok as usize) * layout.b_len,
                c_ld,
                cv,
                matrix,
            };
            if over_a && c_ld * c.columns(p) <= layout.a_len {
                c.c_in_slot = 0;
            }
            c
        });
    let c_ok = (usable || (mma && kind == BatchKind::Strided))
        && c_pad.is_none()
        && s.stage == Staging::FlatC
        && p.ldc == p.m
        && p.stride_c == c_len;
    let slot = if a_ok { 0 } else { layout.a_len }
        + if b_ok { 0 } else { layout.b_len }
        // C's padded copy needs room of its own unless it takes A's place.
        + c_pad.map_or(0, |c| {
            if over_a && c.c_in_slot == 0 {
                0
            } else {
                c.c_ld * c.columns(p)
            }
        });
    let b_in_slot = if a_ok { 0 } else { layout.a_len };
    let mut at = (slot * tba * elt).next_multiple_of(16);
    // `over`: elements past the last problem that threads whose tile hangs over the edge
    // of A or B read (values never used, but inside the allocation).
    let mut region = |ok: bool, len: usize, row: usize, col: usize, over: usize| {
        ok.then(|| {
            let vectors = (tba * len + v - 1).div_ceil(v);
            let r = FlatOperand {
                len,
                row,
                col,
                region: at,
                vectors,
            };
            at += vectors * 16 + (over * elt).next_multiple_of(16);
            r
        })
    };
    // Rows (A) and columns (B) of the tile grid past the matrix: FMA tiles of rm x rn, mma
    // tiles of 16 x 8 (whose k padding is never read).
    let (rm, rn) = match s.mma {
        Some(shape) => (shape.m as usize, shape.n as usize),
        None => (s.rm as usize, s.rn as usize),
    };
    let a = region(
        a_ok,
        a_len,
        a_row,
        a_col,
        (p.m.next_multiple_of(rm) - p.m) * a_row,
    );
    let b = region(
        b_ok,
        b_len,
        b_row,
        b_col,
        (p.n.next_multiple_of(rn) - p.n) * b_col,
    );
    // Tensor-core kernels place C's span as its 128-byte lines lie in global memory
    // (`flat_copy`'s `line`): up to 112 bytes more room. Not beside flat fragments, where
    // the placement lost on an H200 (23 and 25, 2 problems a block: 1.7 and 3.2 points of
    // the bound) and gained nowhere (docs/gpu-notes.md, version 36).
    let c_line = mma && !fragments;
    let c_room = if c_line { LINE_ROOM } else { 0 };
    // Flat C over A: the block's span (with its shift) inside A's padded copy.
    let c_vectors = (tba * c_len + v - 1).div_ceil(v);
    let c_flat_over_a = over_a && !a_ok && c_ok && c_vectors * 16 + c_room <= layout.a_len * elt;
    let c = if c_flat_over_a {
        Some(FlatOperand {
            len: c_len,
            row: 1,
            col: p.m,
            region: 0,
            vectors: c_vectors,
        })
    } else {
        region(c_ok, c_len, 1, p.m, c_room / elt)
    };
    FlatPlan {
        a,
        b,
        c,
        slot,
        b_in_slot,
        c_pad,
        c_over_a: c_flat_over_a || (over_a && c_pad.is_some_and(|c| c.c_in_slot == 0)),
        c_line,
        shared_bytes: at,
    }
}

/// Copies one problem's C between global memory (columns `ldc` apart) and its padded copy in
/// shared memory (columns `c_ld` apart) with vectors of `cv` halves (8, 4 or 2), the group's
/// `tpp` threads taking vectors in turn (m, ldc and the batch stride multiples of `cv`; C's
/// base address 16-byte aligned).
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_c_columns(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    global: &str,
    shared: &str,
    p: &ColMajorProblem,
    ldc: usize,
    c_ld: usize,
    cv: usize,
    copy: CopyC,
) {
    let per_col = p.m / cv;
    let total = per_col * p.n;
    for i in 0..total.div_ceil(tpp) {
        let (pred, col, r) = vector_slot(asm, lt, tpp, i, per_col, total, true);
        let goff = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {goff}, {r}, {cv}"));
        asm.op(format!("mad.lo.u32 {goff}, {col}, {ldc}, {goff}"));
        let g64 = asm.reg(Kind::B64);
        asm.op(format!("mul.wide.u32 {g64}, {goff}, 2"));
        let gaddr = asm.reg(Kind::B64);
        asm.op(format!("add.u64 {gaddr}, {global}, {g64}"));
        let saddr = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {saddr}, {r}, {}", cv * 2));
        asm.op(format!("mad.lo.u32 {saddr}, {col}, {}, {saddr}", c_ld * 2));
        asm.op(format!("add.u32 {saddr}, {saddr}, {shared}"));
        let w: Vec<String> = (0..cv / 2).map(|_| asm.reg(Kind::B32)).collect();
        let (ty, list) = match cv {
            8 => ("v4.b32", format!("{{{}}}", w.join(", "))),
            4 => ("v2.b32", format!("{{{}}}", w.join(", "))),
            _ => ("b32", w[0].clone()),
        };
        let g = guard(&pred);
        match copy {
            CopyC::In => {
                asm.op(format!("{g}ld.global.{ty} {list}, [{gaddr}]"));
                asm.op(format!("{g}st.shared.{ty} [{saddr}], {list}"));
            }
            CopyC::Async => asm.cp_async(&g, &saddr, &gaddr, cv * 2, None),
            CopyC::Out => {
                asm.op(format!("{g}ld.shared.{ty} {list}, [{saddr}]"));
                asm.op(format!("{g}st.global.{ty} [{gaddr}], {list}"));
            }
        }
    }
}

/// The vector a thread takes in round `round` when `tpp` threads take `total` vectors of
/// columns of `per_col` vectors in turn: the guard of the last round (None when every
/// thread has one), its column and its place in the column.
pub(super) fn vector_slot(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    round: usize,
    per_col: usize,
    total: usize,
    multiply_high: bool,
) -> (Option<String>, String, String) {
    let q = asm.reg(Kind::B32);
    asm.op(format!("add.u32 {q}, {lt}, {}", round * tpp));
    let pred = ((round + 1) * tpp > total).then(|| asm.lt(&q, &total.to_string()));
    let (col, r) = (asm.reg(Kind::B32), asm.reg(Kind::B32));
    // With `multiply_high` (kernels with C through shared memory), q / per_col and
    // q % per_col by a multiply-high and a multiply-subtract, not `div.u32` and `rem.u32`:
    // ptxas 13.0 (the driver's JIT, 580.159.04) and 13.5 miscompiled those there, where A's
    // and B's loaders divide the same slots, under register pressure (the remainder's
    // fix-up, recomputed for B's stores, compared a register that by then held staged data:
    // B's vectors went to other slots), and the H100 measured the multiply-high at least as
    // fast. The kernels with flat A and B and the C prefetch take it per size
    // (`GpuSchedule::mul_hi_slots`): with the multiply-high, 57..61 lost 5-6 points of the
    // bound and 95 17 (70 registers against 64, one block per SM), 17..55 gained up to 6;
    // docs/gpu-notes.md, versions 12 and 13.
    if !multiply_high {
        asm.op(format!("div.u32 {col}, {q}, {per_col}"));
        asm.op(format!("rem.u32 {r}, {q}, {per_col}"));
        return (pred, col, r);
    }
    match slot_magic(per_col) {
        None => {
            asm.op(format!("mov.u32 {col}, {q}"));
            asm.op(format!("mov.u32 {r}, 0"));
        }
        Some(m) => {
            asm.op(format!("mul.hi.u32 {col}, {q}, {m}"));
            asm.op(format!("mul.lo.u32 {r}, {col}, {per_col}"));
            asm.op(format!("sub.u32 {r}, {q}, {r}"));
        }
    }
    (pred, col, r)
}

/// The multiplier of `vector_slot`'s division by `d`: ceil(2^32 / d), for which the high
/// word of q * m is q / d whenever q * d < 2^32 (slots are far fewer); `None` for d = 1.
pub(super) fn slot_magic(d: usize) -> Option<u32> {
    assert!(d >= 1);
    (d > 1).then(|| (1u64 << 32).div_ceil(d as u64) as u32)
}

/// The 32-bit words of one 16-byte vector, as a PTX vector operand.
pub(super) fn words(asm: &mut Asm) -> (Vec<String>, String) {
    let w: Vec<String> = (0..4).map(|_| asm.reg(Kind::B32)).collect();
    let list = format!("{{{}}}", w.join(", "));
    (w, list)
}

/// Element e of a vector held as words: loads (`store == false`) or stores it at `addr`.
fn element_access(
    asm: &mut Asm,
    dtype: Dtype,
    w: &[String],
    e: usize,
    addr: &str,
    store: bool,
    pred: &str,
) {
    match dtype {
        Dtype::F32 => {
            if store {
                asm.op(format!("@{pred} st.global.b32 [{addr}], {}", w[e]));
            } else {
                asm.op(format!("@{pred} ld.global.b32 {}, [{addr}]", w[e]));
            }
        }
        Dtype::F64 => {
            let d = asm.reg(Kind::B64);
            if store {
                asm.op(format!("mov.b64 {d}, {{{}, {}}}", w[2 * e], w[2 * e + 1]));
                asm.op(format!("@{pred} st.global.b64 [{addr}], {d}"));
            } else {
                asm.op(format!("mov.b64 {d}, 0"));
                asm.op(format!("@{pred} ld.global.b64 {d}, [{addr}]"));
                asm.op(format!("mov.b64 {{{}, {}}}, {d}", w[2 * e], w[2 * e + 1]));
            }
        }
        Dtype::F16 => {
            let (lo, hi) = (asm.reg(Kind::B16), asm.reg(Kind::B16));
            asm.op(format!("mov.b32 {{{lo}, {hi}}}, {}", w[e / 2]));
            let h = if e % 2 == 0 { &lo } else { &hi };
            if store {
                asm.op(format!("@{pred} st.global.b16 [{addr}], {h}"));
            } else {
                asm.op(format!("@{pred} ld.global.b16 {h}, [{addr}]"));
                asm.op(format!("mov.b32 {}, {{{lo}, {hi}}}", w[e / 2]));
            }
        }
    }
}

/// Which way `copy_c_columns` copies C's padded copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyC {
    /// Into shared memory, through registers.
    In,
    /// Into shared memory through `cp.async` (the staging's barrier waits for it).
    Async,
    /// Back to global memory.
    Out,
}

/// Which way `flat_copy` copies, and how it takes the partial vectors at the span's ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FlatCopy {
    /// Into shared memory, the partial vectors element by element (zeros elsewhere).
    In,
    /// Into shared memory, the partial vectors whole: their other elements are whatever
    /// lies in the 16-byte granules of global memory that hold the span's ends.
    WholeEnds,
    /// As `WholeEnds`, through `cp.async` (no registers; the staging's barrier waits).
    Async,
    /// Back to global memory, the partial vectors element by element.
    Out,
}

/// Copies the block's span of one flat operand between global and shared memory with
/// 16-byte vectors: all `threads` threads of the block take part; vector q (thread q %
/// threads) covers bytes [16 q, 16 q + 16) past the 16-byte boundary at or below `span`.
/// Vectors wholly inside the span's `end` elements move in one access; the partial ones at
/// its two ends move element by element (a branch no warp takes but the one at each end),
/// or, with `FlatCopy::WholeEnds` and `FlatCopy::Async`, whole. With `line`, the vectors
/// lie as many bytes past `region` as the boundary lies past a 128-byte line in global
/// memory (up to `LINE_ROOM`, which the region needs), so that each line's bytes land in
/// one 128-byte row of shared memory: `cp.async` writes a line split across two rows as
/// two wavefronts (ncu at f16 113: 10.5 a warp's 16-byte copy instead of 4). Returns the
/// shift (bytes from `region` to the span) as a u32 register: the same for the same span,
/// whichever the direction.
#[allow(clippy::too_many_arguments)]
pub(super) fn flat_copy(
    asm: &mut Asm,
    dtype: Dtype,
    tid: &str,
    threads: usize,
    span: &str,
    end: &str,
    region: &str,
    vectors: usize,
    copy: FlatCopy,
    line: bool,
) -> String {
    let to_shared = copy != FlatCopy::Out;
    let elt = dtype.size();
    let v = 16 / elt;
    let lo = asm.reg(Kind::B32);
    asm.op(format!("cvt.u32.u64 {lo}, {span}"));
    let shift = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {shift}, {lo}, {}", shift_mask(false)));
    let shift64 = asm.reg(Kind::B64);
    asm.op(format!("cvt.u64.u32 {shift64}, {shift}"));
    let aligned = asm.reg(Kind::B64);
    asm.op(format!("sub.u64 {aligned}, {span}, {shift64}"));
    let off64 = asm.reg(Kind::B64);
    asm.op(format!("mul.wide.u32 {off64}, {tid}, 16"));
    let gq = asm.reg(Kind::B64);
    asm.op(format!("add.u64 {gq}, {aligned}, {off64}"));
    let sq = asm.reg(Kind::B32);
    asm.op(format!("mad.lo.u32 {sq}, {tid}, 16, {region}"));
    let placed = line.then(|| {
        let row = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {row}, {lo}, {LINE_ROOM}"));
        asm.op(format!("add.u32 {sq}, {sq}, {row}"));
        let placed = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {placed}, {lo}, {}", shift_mask(true)));
        placed
    });
    // f0: the flat index of this thread's first vector's first element (s32, may be < 0).
    let f0 = asm.reg(Kind::B32);
    let shift_e = asm.reg(Kind::B32);
    asm.op(format!(
        "shr.u32 {shift_e}, {shift}, {}",
        elt.trailing_zeros()
    ));
    asm.op(format!("mul.lo.u32 {f0}, {tid}, {v}"));
    asm.op(format!("sub.s32 {f0}, {f0}, {shift_e}"));
    let end_v = asm.reg(Kind::B32);
    asm.op(format!("sub.s32 {end_v}, {end}, {v}"));
    for i in 0..vectors.div_ceil(threads) {
        let inq = ((i + 1) * threads > vectors)
            .then(|| asm.lt(tid, &(vectors - i * threads).to_string()));
        let fs = asm.reg(Kind::B32);
        asm.op(format!("add.s32 {fs}, {f0}, {}", i * threads * v));
        // The same offset in global and shared memory: the span is copied as it lies.
        let off = i * threads * 16;
        if matches!(copy, FlatCopy::WholeEnds | FlatCopy::Async) {
            // Vectors that start before the span's end (the span stops at the batch's).
            let before_end = asm.reg(Kind::Pred);
            asm.op(format!("setp.lt.s32 {before_end}, {fs}, {end}"));
            let pred = guard(&asm.and(Some(before_end), inq.clone()));
            if copy == FlatCopy::Async {
                asm.cp_async(
                    &pred,
                    &format!("{sq}+{off}"),
                    &format!("{gq}+{off}"),
                    16,
                    None,
                );
            } else {
                let (_, list) = words(asm);
                asm.op(format!("{pred}ld.global.v4.b32 {list}, [{gq}+{off}]"));
                asm.op(format!("{pred}st.shared.v4.b32 [{sq}+{off}], {list}"));
            }
            continue;
        }
        let p1 = asm.reg(Kind::Pred);
        asm.op(format!("setp.ge.s32 {p1}, {fs}, 0"));
        let p2 = asm.reg(Kind::Pred);
        asm.op(format!("setp.le.s32 {p2}, {fs}, {end_v}"));
        let mut full = asm.reg(Kind::Pred);
        asm.op(format!("and.pred {full}, {p1}, {p2}"));
        if let Some(q) = &inq {
            let f = asm.reg(Kind::Pred);
            asm.op(format!("and.pred {f}, {full}, {q}"));
            full = f;
        }
        // Threads with nothing partial to do: full vectors, or beyond the region.
        let skip = match &inq {
            Some(q) => {
                let s = asm.reg(Kind::Pred);
                asm.op(format!("or.pred {s}, {full}, !{q}"));
                s
            }
            None => full.clone(),
        };
        let (w, list) = words(asm);
        let done = asm.label();
        // A partial vector, element by element: those whose index lies in [0, end).
        let partial = |asm: &mut Asm, store: bool| {
            for e in 0..v {
                let f = asm.reg(Kind::B32);
                asm.op(format!("add.s32 {f}, {fs}, {e}"));
                let a = asm.reg(Kind::Pred);
                asm.op(format!("setp.ge.s32 {a}, {f}, 0"));
                let b = asm.reg(Kind::Pred);
                asm.op(format!("setp.lt.s32 {b}, {f}, {end}"));
                let valid = asm.reg(Kind::Pred);
                asm.op(format!("and.pred {valid}, {a}, {b}"));
                let addr = format!("{gq}+{}", off + e * elt);
                element_access(asm, dtype, &w, e, &addr, store, &valid);
            }
        };
        if to_shared {
            for r in &w {
                asm.op(format!("mov.b32 {r}, 0"));
            }
            asm.op(format!("@{full} ld.global.v4.b32 {list}, [{gq}+{off}]"));
            asm.op(format!("@{skip} bra {done}"));
            partial(asm, false);
            asm.place(&done);
            asm.op(format!(
                "{}st.shared.v4.b32 [{sq}+{off}], {list}",
                guard(&inq)
            ));
        } else {
            asm.op(format!(
                "{}ld.shared.v4.b32 {list}, [{sq}+{off}]",
                guard(&inq)
            ));
            asm.op(format!("@{full} st.global.v4.b32 [{gq}+{off}], {list}"));
            asm.op(format!("@{skip} bra {done}"));
            partial(asm, true);
            asm.place(&done);
        }
    }
    placed.unwrap_or(shift)
}
