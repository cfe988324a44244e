//! The FMA kernels' body: each thread an `rm x rn` tile of C from A and B in shared memory.

use super::*;

/// FMA kernels: thread (tx, ty) of its problem owns rows tx + a * TM and columns
/// ty + b * TN of C (a < rm, b < rn), so a warp reads consecutive rows of A (no bank
/// conflict) and a broadcast or odd-strided element of B.
#[allow(clippy::too_many_arguments)]
pub(super) fn fma_body(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    layout: &SharedLayout,
    sa: &str,
    sb: &str,
    problem: &ProblemRegs,
    epi: &Epilogue,
    exit: &str,
    tile: &CTile,
) {
    let dtype = p.dtype;
    let elt = dtype.size();
    let (rm, rn) = (s.rm as usize, s.rn as usize);
    let (tm, tn) = (tile.tm, tile.tn);
    let (tx, ty) = (tile.tx.clone(), tile.ty.clone());
    if let (Some(m), Some(n)) = (&problem.m.runtime, &problem.n.runtime) {
        // ETM: a thread whose first row or column is outside its problem has nothing to do.
        let pm = asm.reg(Kind::Pred);
        asm.op(format!("setp.ge.u32 {pm}, {tx}, {m}"));
        asm.op(format!("@{pm} bra {exit}"));
        let pn = asm.reg(Kind::Pred);
        asm.op(format!("setp.ge.u32 {pn}, {ty}, {n}"));
        asm.op(format!("@{pn} bra {exit}"));
    }
    // How each operand is read (`GpuSchedule::vector_reads`): element by element, one
    // vector of the thread's adjacent (permuted) rows or columns per k step (`across`), or
    // vectors along k (a k-contiguous copy, `along_k`).
    let vectors = s.vectors_apply(p);
    let a_across = vectors && layout.a_perm > 0;
    let b_across = vectors && layout.b_perm > 0;
    let a_along_k = vectors && layout.a_col == 1;
    let b_along_k = vectors && layout.b_row == 1;
    let abase = asm.reg(Kind::B32);
    asm.op(format!(
        "mad.lo.u32 {abase}, {tx}, {}, {sa}",
        if a_across { rm } else { layout.a_row } * elt
    ));
    let bbase = asm.reg(Kind::B32);
    asm.op(format!(
        "mad.lo.u32 {bbase}, {ty}, {}, {sb}",
        if b_across { rn } else { layout.b_col } * elt
    ));
    // Element offsets from the thread's base: A's (a, k) and B's (k, b).
    let a_off = |a: usize, k: usize| {
        if a_across {
            a + k * layout.a_col
        } else {
            a * tm * layout.a_row + k * layout.a_col
        }
    };
    let b_off = |k: usize, b: usize| {
        if b_across {
            k * layout.b_row + b
        } else {
            k * layout.b_row + b * tn * layout.b_col
        }
    };

    // Accumulator type and how a shared element becomes an operand.
    let (ld_ty, ld_kind) = match dtype {
        Dtype::F64 => ("f64", Kind::F64),
        Dtype::F32 => ("f32", Kind::F32),
        Dtype::F16 => ("b16", Kind::B16),
    };
    let (acc_kind, acc_ty) = match (dtype, s.accumulate) {
        (Dtype::F64, _) => (Kind::F64, "f64"),
        (Dtype::F16, Accumulate::Native) => (Kind::B16, "f16"),
        _ => (Kind::F32, "f32"),
    };
    let widen = dtype == Dtype::F16 && acc_kind == Kind::F32;
    asm.comment(&format!(
        "C tile {rm}x{rn} per thread, k = {} unrolled",
        p.k
    ));
    let mut acc: Vec<Vec<String>> = (0..rm)
        .map(|_| (0..rn).map(|_| asm.reg(acc_kind)).collect())
        .collect();
    let fetch = |asm: &mut Asm, base: &str, off: usize| {
        let v = asm.reg(ld_kind);
        asm.op(format!("ld.shared.{ld_ty} {v}, [{base}+{}]", off * elt));
        if widen {
            let w = asm.reg(Kind::F32);
            asm.op(format!("cvt.f32.f16 {w}, {v}"));
            w
        } else {
            v
        }
    };
    // Variable sizes: leave the k loop once past this problem's own k (checked every 4
    // steps; the zero-filled shared tail makes any extra steps harmless).
    let k_done = asm.label();
    let mut k_exit_used = false;
    // Vector reads: elements per 16-byte vector, and the registers loaded so far by
    // element offset.
    let per = 16 / elt;
    let mut a_cache = std::collections::HashMap::new();
    let mut b_cache = std::collections::HashMap::new();
    let vector_fetch = |asm: &mut Asm,
                        cache: &mut std::collections::HashMap<usize, String>,
                        base: &str,
                        first: usize,
                        count: usize,
                        want: usize| {
        if !cache.contains_key(&want) {
            // `count` elements from `first` (aligned to the vector), in aligned pieces of
            // 4, 2 or 1 elements.
            let mut at = first;
            let mut left = count;
            while left > 0 {
                let w = [4, 2, 1].into_iter().find(|&w| w <= left).unwrap_or(1);
                let regs: Vec<String> = (0..w).map(|_| asm.reg(ld_kind)).collect();
                if w == 1 {
                    asm.op(format!(
                        "ld.shared.{ld_ty} {}, [{base}+{}]",
                        regs[0],
                        at * elt
                    ));
                } else {
                    asm.op(format!(
                        "ld.shared.v{w}.{ld_ty} {{{}}}, [{base}+{}]",
                        regs.join(", "),
                        at * elt
                    ));
                }
                for (i, r) in regs.into_iter().enumerate() {
                    cache.insert(at + i, r);
                }
                at += w;
                left -= w;
            }
        }
        cache[&want].clone()
    };
    // One operand's `count` registers for step k, `off(i, k)` the element offset of its
    // i-th row (column): element by element, or from the vectors across its rows or along k.
    let read = |asm: &mut Asm,
                cache: &mut std::collections::HashMap<usize, String>,
                base: &str,
                count: usize,
                (across, along_k): (bool, bool),
                k: usize,
                off: &dyn Fn(usize, usize) -> usize|
     -> Vec<String> {
        (0..count)
            .map(|i| {
                let (first, n) = if across {
                    (off(i - i % per, k), count.min(per))
                } else if along_k {
                    let k0 = k - k % per;
                    (off(i, k0), per.min(p.k - k0))
                } else {
                    return fetch(asm, base, off(i, k));
                };
                vector_fetch(asm, cache, base, first, n, off(i, k))
            })
            .collect()
    };
    for k in 0..p.k {
        if let Some(krt) = &problem.k.runtime {
            if k > 0 && k % 4 == 0 {
                let pk = asm.reg(Kind::Pred);
                asm.op(format!("setp.le.u32 {pk}, {krt}, {k}"));
                asm.op(format!("@{pk} bra {k_done}"));
                k_exit_used = true;
            }
        }
        let av = read(
            asm,
            &mut a_cache,
            &abase,
            rm,
            (a_across, a_along_k),
            k,
            &a_off,
        );
        let bv = read(
            asm,
            &mut b_cache,
            &bbase,
            rn,
            (b_across, b_along_k),
            k,
            &|b, k| b_off(k, b),
        );
        for a in 0..rm {
            for b in 0..rn {
                let (x, y) = (&av[a], &bv[b]);
                let d = &acc[a][b];
                if k == 0 {
                    asm.op(format!("mul.rn.{acc_ty} {d}, {x}, {y}"));
                } else {
                    asm.op(format!("fma.rn.{acc_ty} {d}, {x}, {y}, {d}"));
                }
            }
        }
    }
    if k_exit_used {
        asm.place(&k_done);
    }
    if acc_kind == Kind::B16 {
        // f16 accumulators: the epilogue runs in f32 and rounds once.
        for row in acc.iter_mut() {
            for v in row.iter_mut() {
                let w = asm.reg(Kind::F32);
                asm.op(format!("cvt.f32.f16 {w}, {v}"));
                *v = w;
            }
        }
    }

    asm.comment("epilogue");
    for (a, b, addr, pred, old) in &tile.slots {
        let space = if tile.shared { "shared" } else { "global" };
        epi.store(asm, &acc[*a][*b], addr, pred, old.as_deref(), space);
    }
}

/// A thread's part of C in an FMA kernel: its position, and per register (a, b) the
/// address, guard and (for beta != 0) the prefetched old value.
pub(super) struct CTile {
    tx: String,
    ty: String,
    tm: usize,
    tn: usize,
    /// C staged flat in shared memory: the slots address it there.
    shared: bool,
    #[allow(clippy::type_complexity)]
    slots: Vec<(usize, usize, String, Option<String>, Option<String>)>,
}

/// Thread (tx, ty) of its problem owns rows tx + a * TM and columns ty + b * TN of C.
/// Computes the addresses and guards and loads C early.
// a and b are tile coordinates used in the address arithmetic, not just indices.
#[allow(clippy::needless_range_loop)]
pub(super) fn fma_c_tile(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    lt: &str,
    problem: &ProblemRegs,
    epi: &Epilogue,
    sc: Option<&str>,
) -> CTile {
    let elt = p.dtype.size();
    let (rm, rn) = (s.rm as usize, s.rn as usize);
    let tm = p.m.div_ceil(rm);
    let tn = p.n.div_ceil(rn);
    let tx = asm.reg(Kind::B32);
    let ty = asm.reg(Kind::B32);
    asm.op(format!("rem.u32 {tx}, {lt}, {tm}"));
    asm.op(format!("div.u32 {ty}, {lt}, {tm}"));
    let mut slots = Vec::new();
    let elt64 = elt as u64;
    // Row and column guards: needed when the tile grid overhangs C or sizes vary.
    let row_pred = |asm: &mut Asm, a: usize| -> Option<String> {
        match &problem.m.runtime {
            Some(m) => {
                let r = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {r}, {tx}, {}", a * tm));
                Some(asm.lt(&r, m))
            }
            None if p.m % rm != 0 && (a + 1) * tm > p.m && a * tm < p.m => {
                Some(asm.lt(&tx, &(p.m - a * tm).to_string()))
            }
            None => None,
        }
    };
    let col_pred = |asm: &mut Asm, b: usize| -> Option<String> {
        match &problem.n.runtime {
            Some(n) => {
                let r = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {r}, {ty}, {}", b * tn));
                Some(asm.lt(&r, n))
            }
            None if p.n % rn != 0 && (b + 1) * tn > p.n && b * tn < p.n => {
                Some(asm.lt(&ty, &(p.n - b * tn).to_string()))
            }
            None => None,
        }
    };
    let rows: Vec<Option<String>> = (0..rm).map(|a| row_pred(asm, a)).collect();
    let cols: Vec<Option<String>> = (0..rn).map(|b| col_pred(asm, b)).collect();
    if let Some(sc) = sc {
        // C packed and staged flat: element (i, j) of the group's copy at (i + j m) elt.
        let off = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {off}, {ty}, {}, {tx}", p.m));
        let base = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {base}, {off}, {elt}, {sc}"));
        for b in 0..rn {
            for a in 0..rm {
                if a * tm >= p.m || b * tn >= p.n {
                    continue;
                }
                let pred = asm.and(rows[a].clone(), cols[b].clone());
                let addr = format!("{base}+{}", (a * tm + b * tn * p.m) * elt);
                slots.push((a, b, addr, pred, None));
            }
        }
        return CTile {
            tx,
            ty,
            tm,
            tn,
            shared: true,
            slots,
        };
    }
    // Thread base address in C: c + (tx + ty * ldc) * elt.
    let ldc = match &problem.ldc.runtime {
        Some(r) => r.clone(),
        None => problem.ldc.max.to_string(),
    };
    let off = asm.reg(Kind::B32);
    asm.op(format!("mad.lo.u32 {off}, {ty}, {ldc}, {tx}"));
    let off64 = asm.reg(Kind::B64);
    asm.op(format!("mul.wide.u32 {off64}, {off}, {elt64}"));
    let cbase = asm.reg(Kind::B64);
    asm.op(format!("add.u64 {cbase}, {}, {off64}", problem.c));
    let col_step = problem.ldc.runtime.as_ref().map(|r| {
        let st = asm.reg(Kind::B64);
        asm.op(format!("mul.wide.u32 {st}, {r}, {}", tn * elt));
        st
    });
    for b in 0..rn {
        // Column b's base: an immediate offset, or a run-time step per column block.
        let colbase = match &col_step {
            Some(step) if b > 0 => {
                let r = asm.reg(Kind::B64);
                let prev = asm.reg(Kind::B64);
                asm.op(format!("mul.lo.u64 {prev}, {step}, {b}"));
                asm.op(format!("add.u64 {r}, {cbase}, {prev}"));
                r
            }
            _ => cbase.clone(),
        };
        for a in 0..rm {
            // Tiles wholly outside C (rm or rn larger than the side) store nothing.
            if a * tm >= p.m || b * tn >= p.n {
                continue;
            }
            let pred = asm.and(rows[a].clone(), cols[b].clone());
            let imm = match &col_step {
                Some(_) => a * tm * elt,
                None => (a * tm + b * tn * p.ldc) * elt,
            };
            let addr = format!("{colbase}+{imm}");
            // Prefetched before the operands are staged: its latency overlaps theirs.
            let old = (epi.beta != Scalar::Zero).then(|| epi.load(asm, &addr, &pred, "global"));
            slots.push((a, b, addr, pred, old));
        }
    }
    CTile {
        tx,
        ty,
        tm,
        tn,
        shared: false,
        slots,
    }
}
