//! Operands from global to shared memory: element and vector copies, verbatim copies of
//! whole spans and their realigning into padded slots, the zeros of the k padding.

use super::*;

/// Copies one operand of one problem from global to shared memory. The stored matrix is
/// `lead x other` (lead contiguous in memory, leading dimension `ld`); the group's threads
/// form a `tl x to` grid over it so that every address inside the unrolled loop is the
/// thread's base plus an immediate. Elements of the padded extents (`lead_ext x
/// other_ext`) outside the actual ones are written as zeros (tensor-core padding, and the
/// unused part of variable-size problems). With `async_copy`, an element (or a vector
/// stored whole) goes through `cp.async`, its source size 0 where it lies outside the
/// actual extents (the copy then writes zeros): no register holds it, so every copy of the
/// thread is in flight at once.
#[allow(clippy::too_many_arguments)]
pub(super) fn load_operand(
    asm: &mut Asm,
    dtype: Dtype,
    lt: &str,
    tpp: usize,
    global: &str,
    shared: &str,
    lead: &Extent,
    other: &Extent,
    ld: &Extent,
    lead_ext: usize,
    other_ext: usize,
    sl: usize,
    so: usize,
    v: usize,
    perm: Option<(usize, usize)>,
    async_copy: bool,
) {
    let elt = dtype.size();
    let (kind, ty) = elt_kind(dtype);
    // Permuted lead (`SharedLayout::a_perm`): lead index l stored at (l % t) * r + l / t,
    // element by element.
    let v = if perm.is_some() { 1 } else { v };
    // Work in units of `v` elements along the lead (whole vectors; v = 1 when the extents,
    // leading dimension or alignment do not allow wider accesses).
    let lead_ext = lead_ext / v;
    let lead_max = lead.max / v;
    let tl = lead_ext.min(tpp);
    let to = (tpp / tl).min(other_ext);
    let l0 = asm.reg(Kind::B32);
    let o0 = asm.reg(Kind::B32);
    asm.op(format!("rem.u32 {l0}, {lt}, {tl}"));
    asm.op(format!("div.u32 {o0}, {lt}, {tl}"));
    // Threads beyond the grid take no part.
    let active = if tl * to < tpp {
        Some(asm.lt(lt, &(tl * to).to_string()))
    } else {
        None
    };
    // Thread bases: global + (l0 + o0 * ld) * elt, shared + (l0 * sl + o0 * so) * elt.
    let lv = if v > 1 {
        let r = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {r}, {l0}, {v}"));
        r
    } else {
        l0.clone()
    };
    let off = asm.reg(Kind::B32);
    match &ld.runtime {
        Some(r) => asm.op(format!("mad.lo.u32 {off}, {o0}, {r}, {lv}")),
        None => asm.op(format!("mad.lo.u32 {off}, {o0}, {}, {lv}", ld.max)),
    }
    let off64 = asm.reg(Kind::B64);
    asm.op(format!("mul.wide.u32 {off64}, {off}, {elt}"));
    let gbase = asm.reg(Kind::B64);
    asm.op(format!("add.u64 {gbase}, {global}, {off64}"));
    // The shared base of lead index l (a register of the thread's l0 + an offset in
    // elements along the lead): without a permutation, l0's plus (l - l0) * sl.
    let pos_base = |asm: &mut Asm, l: &str| -> String {
        let pos = match perm {
            Some((t, r)) => {
                let (q, rr) = (asm.reg(Kind::B32), asm.reg(Kind::B32));
                asm.op(format!("div.u32 {q}, {l}, {t}"));
                asm.op(format!("rem.u32 {rr}, {l}, {t}"));
                asm.op(format!("mad.lo.u32 {q}, {rr}, {r}, {q}"));
                q
            }
            None => l.to_string(),
        };
        let b = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {b}, {pos}, {}, {shared}", v * sl * elt));
        asm.op(format!("mad.lo.u32 {b}, {o0}, {}, {b}", so * elt));
        b
    };
    let sbase = pos_base(asm, &l0);
    // Per-thread row/column step of the runtime leading dimension (variable sizes).
    let gstep = ld.runtime.as_ref().map(|r| {
        let s = asm.reg(Kind::B64);
        asm.op(format!("mul.wide.u32 {s}, {r}, {}", to * elt));
        s
    });
    let zero = zero_literal(dtype);
    let lcount = lead_ext.div_ceil(tl);
    let ocount = other_ext.div_ceil(to);
    // Per lead step: its shared base and offset. A permutation keeps the step an offset
    // where the step is a multiple of its period, else each step gets its own base.
    let lbases: Vec<(String, usize)> = (0..lcount)
        .map(|li| match perm {
            None => (sbase.clone(), li * tl * v * sl * elt),
            Some((t, _)) if tl % t == 0 => (sbase.clone(), li * tl / t * sl * elt),
            Some(_) if li == 0 => (sbase.clone(), 0),
            Some(_) => {
                let l = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {l}, {l0}, {}", li * tl));
                (pos_base(asm, &l), 0)
            }
        })
        .collect();
    // Predicates per lead step (constant over other steps).
    let mut lpreds = Vec::new();
    for li in 0..lcount {
        let start = li * tl;
        let mut p = active.clone();
        if start + tl > lead_ext {
            let q = asm.lt(&l0, &(lead_ext - start).to_string());
            p = asm.and(p, Some(q));
        }
        // Data guard: inside the actual extent, else zero.
        let data = match &lead.runtime {
            Some(r) => {
                let l = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {l}, {l0}, {start}"));
                Some(asm.lt(&l, r))
            }
            None if start + tl > lead_max => {
                if start >= lead_max {
                    Some("0".to_string())
                } else {
                    Some(asm.lt(&l0, &(lead_max - start).to_string()))
                }
            }
            None => None,
        };
        lpreds.push((p, data));
    }
    let mut grow = gbase.clone();
    for oi in 0..ocount {
        let start = oi * to;
        let mut op = None;
        if start + to > other_ext {
            op = Some(asm.lt(&o0, &(other_ext - start).to_string()));
        }
        let odata = match &other.runtime {
            Some(r) => {
                let o = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {o}, {o0}, {start}"));
                Some(asm.lt(&o, r))
            }
            None if start + to > other.max => {
                if start >= other.max {
                    Some("0".to_string())
                } else {
                    Some(asm.lt(&o0, &(other.max - start).to_string()))
                }
            }
            None => None,
        };
        if oi > 0 {
            if let Some(step) = &gstep {
                let g = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {g}, {grow}, {step}"));
                grow = g;
            }
        }
        for (li, (lp, ldata)) in lpreds.clone().into_iter().enumerate() {
            let store_p = asm.and(lp.clone(), op.clone());
            let data = match (&ldata, &odata) {
                (Some(a), _) | (_, Some(a)) if a == "0" => Some("0".to_string()),
                _ => asm.and(ldata.clone(), odata.clone()),
            };
            let goff = match &gstep {
                Some(_) => li * tl * v * elt,
                None => (li * tl * v + oi * to * ld.max) * elt,
            };
            let (sbase, lofs) = &lbases[li];
            let soff = lofs + oi * to * so * elt;
            // (`cp.async` copies 4, 8 or 16 bytes: not a single f16.)
            let whole = (v == 1 || (sl == 1 && so % v == 0)) && v * elt >= 4;
            if async_copy && whole && data.as_deref() != Some("0") {
                let bytes = v * elt;
                let src_size = data.as_ref().map(|d| {
                    let r = asm.reg(Kind::B32);
                    asm.op(format!("selp.b32 {r}, {bytes}, 0, {d}"));
                    r
                });
                asm.cp_async(
                    &guard(&store_p),
                    &format!("{sbase}+{soff}"),
                    &format!("{grow}+{goff}"),
                    bytes,
                    src_size.as_deref(),
                );
                continue;
            }
            if v > 1 {
                store_vector(
                    asm, dtype, v, &grow, goff, sbase, soff, sl, so, &store_p, data,
                );
                continue;
            }
            let v = asm.reg(kind);
            match data.as_deref() {
                Some("0") => asm.op(format!("mov.{ty} {v}, {zero}")),
                Some(_) | None => {
                    let load_p = asm.and(store_p.clone(), data.clone());
                    if data.is_some() {
                        asm.op(format!("mov.{ty} {v}, {zero}"));
                    }
                    asm.op(format!(
                        "{}ld.global.{ty} {v}, [{grow}+{goff}]",
                        guard(&load_p)
                    ));
                }
            }
            asm.op(format!(
                "{}st.shared.{ty} [{sbase}+{soff}], {v}",
                guard(&store_p)
            ));
        }
    }
}

/// One vector of `v` elements (4, 8 or 16 bytes) from global to shared memory: a single
/// wide load, then one wide store where the shared copy is contiguous and aligned along the
/// lead, else one store per element.
#[allow(clippy::too_many_arguments)]
fn store_vector(
    asm: &mut Asm,
    dtype: Dtype,
    v: usize,
    global: &str,
    goff: usize,
    shared: &str,
    soff: usize,
    sl: usize,
    so: usize,
    store_p: &Option<String>,
    data: Option<String>,
) {
    let elt = dtype.size();
    let words = v * elt / 4;
    let w: Vec<String> = (0..words).map(|_| asm.reg(Kind::B32)).collect();
    let list = if words == 1 {
        w[0].clone()
    } else {
        format!("{{{}}}", w.join(", "))
    };
    let vty = if words == 1 {
        "b32".to_string()
    } else {
        format!("v{words}.b32")
    };
    match data.as_deref() {
        Some("0") => {
            for r in &w {
                asm.op(format!("mov.b32 {r}, 0"));
            }
        }
        _ => {
            let load_p = asm.and(store_p.clone(), data.clone());
            if data.is_some() {
                for r in &w {
                    asm.op(format!("mov.b32 {r}, 0"));
                }
            }
            asm.op(format!(
                "{}ld.global.{vty} {list}, [{global}+{goff}]",
                guard(&load_p)
            ));
        }
    }
    if sl == 1 && so % v == 0 {
        asm.op(format!(
            "{}st.shared.{vty} [{shared}+{soff}], {list}",
            guard(store_p)
        ));
        return;
    }
    for e in 0..v {
        let at = soff + e * sl * elt;
        match dtype {
            Dtype::F32 => asm.op(format!(
                "{}st.shared.b32 [{shared}+{at}], {}",
                guard(store_p),
                w[e]
            )),
            Dtype::F64 => {
                let d = asm.reg(Kind::B64);
                asm.op(format!("mov.b64 {d}, {{{}, {}}}", w[2 * e], w[2 * e + 1]));
                asm.op(format!(
                    "{}st.shared.b64 [{shared}+{at}], {d}",
                    guard(store_p)
                ));
            }
            Dtype::F16 => {
                if e % 2 == 0 {
                    let (lo, hi) = (asm.reg(Kind::B16), asm.reg(Kind::B16));
                    asm.op(format!("mov.b32 {{{lo}, {hi}}}, {}", w[e / 2]));
                    asm.op(format!(
                        "{}st.shared.b16 [{shared}+{at}], {lo}",
                        guard(store_p)
                    ));
                    let at2 = at + sl * elt;
                    asm.op(format!(
                        "{}st.shared.b16 [{shared}+{at2}], {hi}",
                        guard(store_p)
                    ));
                }
            }
        }
    }
}

/// Copies one operand of a packed, tight problem (its `len` elements contiguous) to shared
/// memory as a flat array with 16-byte loads, whatever the problem's alignment: vectors
/// start at the 16-byte boundary at or below the matrix; a vector wholly inside the matrix
/// is one load, the (at most two) partial ones at its ends load element by element. Each
/// element then goes to its place (l, o) = (f % lead, f / lead) in the shared copy.
#[allow(clippy::too_many_arguments)]
pub(super) fn load_flat(
    asm: &mut Asm,
    dtype: Dtype,
    lt: &str,
    tpp: usize,
    global: &str,
    shared: &str,
    lead: usize,
    len: usize,
    sl: usize,
    so: usize,
) {
    let elt = dtype.size();
    let v = 16 / elt;
    let (kind, ty) = elt_kind(dtype);
    // Shift s: elements between the 16-byte boundary below the matrix and its start.
    let lo = asm.reg(Kind::B32);
    asm.op(format!("cvt.u32.u64 {lo}, {global}"));
    let shift = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {shift}, {lo}, 15"));
    let aligned = asm.reg(Kind::B64);
    let shift64 = asm.reg(Kind::B64);
    asm.op(format!("cvt.u64.u32 {shift64}, {shift}"));
    asm.op(format!("sub.u64 {aligned}, {global}, {shift64}"));
    asm.op(format!(
        "shr.u32 {shift}, {shift}, {}",
        elt.trailing_zeros()
    ));
    // This thread's first vector: bytes lt * 16 past the boundary; flat index lt * v - s.
    let off64 = asm.reg(Kind::B64);
    asm.op(format!("mul.wide.u32 {off64}, {lt}, 16"));
    let gbase = asm.reg(Kind::B64);
    asm.op(format!("add.u64 {gbase}, {aligned}, {off64}"));
    let f0 = asm.reg(Kind::B32);
    asm.op(format!("mul.lo.u32 {f0}, {lt}, {v}"));
    asm.op(format!("sub.u32 {f0}, {f0}, {shift}"));
    let vectors = (len + v - 1).div_ceil(v);
    for i in 0..vectors.div_ceil(tpp) {
        // fs = flat index of the vector's first element (wraps below 0 for the first).
        let fs = asm.reg(Kind::B32);
        asm.op(format!("add.u32 {fs}, {f0}, {}", i * tpp * v));
        let full = asm.reg(Kind::Pred);
        asm.op(format!("setp.le.u32 {full}, {fs}, {}", len - v));
        let not_full = asm.reg(Kind::Pred);
        asm.op(format!("not.pred {not_full}, {full}"));
        let goff = i * tpp * 16;
        let x: Vec<String> = (0..v).map(|_| asm.reg(kind)).collect();
        match dtype {
            Dtype::F16 => {
                let w: Vec<String> = (0..4).map(|_| asm.reg(Kind::B32)).collect();
                asm.op(format!(
                    "@{full} ld.global.v4.b32 {{{}}}, [{gbase}+{goff}]",
                    w.join(", ")
                ));
                for (j, word) in w.iter().enumerate() {
                    asm.op(format!(
                        "@{full} mov.b32 {{{}, {}}}, {word}",
                        x[2 * j],
                        x[2 * j + 1]
                    ));
                }
            }
            _ => asm.op(format!(
                "@{full} ld.global.v{v}.{ty} {{{}}}, [{gbase}+{goff}]",
                x.join(", ")
            )),
        }
        for (e, xe) in x.iter().enumerate() {
            let f = asm.reg(Kind::B32);
            asm.op(format!("add.u32 {f}, {fs}, {e}"));
            let valid = asm.lt(&f, &len.to_string());
            let partial = asm.reg(Kind::Pred);
            asm.op(format!("and.pred {partial}, {valid}, {not_full}"));
            asm.op(format!(
                "@{partial} ld.global.{ty} {xe}, [{gbase}+{}]",
                goff + e * elt
            ));
            let (l, o) = (asm.reg(Kind::B32), asm.reg(Kind::B32));
            asm.op(format!("rem.u32 {l}, {f}, {lead}"));
            asm.op(format!("div.u32 {o}, {f}, {lead}"));
            let at = asm.reg(Kind::B32);
            asm.op(format!("mad.lo.u32 {at}, {l}, {}, {shared}", sl * elt));
            asm.op(format!("mad.lo.u32 {at}, {o}, {}, {at}", so * elt));
            asm.op(format!("@{valid} st.shared.{ty} [{at}], {xe}"));
        }
    }
}

/// Copies one f16 operand of a packed, tight problem (`others` columns of `lead` halves,
/// contiguous) to its padded slot (`so` halves between columns, a multiple of 8) with
/// whole 16-byte vectors at both ends: vector (column o, r) holds halves 8r..8r+8 of
/// column o, read as the two aligned 16-byte global vectors around it (the second only
/// when the halves reach into it; it mostly hits L1, the neighbour thread having read it)
/// and shifted into place in registers. Where `load_flat` stores each half on its own
/// (and computes its place), this stores 8 at once: odd and non-multiple-of-8 sizes then
/// stage like the multiples of 8, `ldmatrix` fragments unchanged. Halves past `lead` in a
/// column's last vector are zeros (the k padding, where lead is k). A vector's loads come
/// before its shifts and store; ptxas schedules loads of later vectors early by itself.
/// Reading from a verbatim copy in the slot itself (`RealignFrom::Shared`), it returns the
/// stores instead of emitting them: they may follow only a barrier after every thread's
/// reads (`store_realigned`).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_realigned(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    from: RealignFrom,
    shared: &str,
    lead: usize,
    others: usize,
    so: usize,
    multiply_high: bool,
) -> Vec<RealignedStore> {
    debug_assert!(so % 8 == 0);
    let per_col = lead.div_ceil(8);
    let total = per_col * others;
    // Halves of a column's last vector inside the column (0: all eight).
    let tail = lead % 8;
    // The low word of the first element's address: its low 4 bits, the misalignment, are
    // the same in the verbatim copy (copied vector by vector) as in global memory.
    let glo = match from {
        RealignFrom::Global(global) => {
            let glo = asm.reg(Kind::B32);
            asm.op(format!("cvt.u32.u64 {glo}, {global}"));
            glo
        }
        RealignFrom::Shared(first) => first.to_string(),
    };
    let mut stores = Vec::new();
    // One vector at a time: emitting the loads of two vectors before their stores gave the
    // same registers under `ptxas -v` (81..90 at 8 and 16 warps).
    for i in 0..total.div_ceil(tpp) {
        let (pred, col, r) = vector_slot(asm, lt, tpp, i, per_col, total, multiply_high);
        // Byte offset of the vector's first half in the matrix, and its misalignment.
        let off = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {off}, {r}, 16"));
        asm.op(format!("mad.lo.u32 {off}, {col}, {}, {off}", 2 * lead));
        let shift = asm.reg(Kind::B32);
        asm.op(format!("add.u32 {shift}, {glo}, {off}"));
        asm.op(format!("and.b32 {shift}, {shift}, 15"));
        asm.op(format!("sub.u32 {off}, {off}, {shift}"));
        let (addr, space) = match from {
            RealignFrom::Global(global) => {
                let off64 = asm.reg(Kind::B64);
                // Signed: the first vector's boundary may lie below the matrix.
                asm.op(format!("cvt.s64.s32 {off64}, {off}"));
                let addr = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {addr}, {global}, {off64}"));
                (addr, "global")
            }
            RealignFrom::Shared(first) => {
                // The copy starts at the slot's 16-byte boundary: no boundary below it.
                let addr = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {addr}, {first}, {off}"));
                (addr, "shared")
            }
        };
        // The second vector is needed when the halves run past the first.
        let second = asm.reg(Kind::Pred);
        asm.op(format!("setp.ne.u32 {second}, {shift}, 0"));
        let last = (tail != 0).then(|| {
            let last = asm.reg(Kind::Pred);
            asm.op(format!("setp.eq.u32 {last}, {r}, {}", per_col - 1));
            let fits = asm.reg(Kind::Pred);
            asm.op(format!("setp.le.u32 {fits}, {shift}, {}", 16 - 2 * tail));
            let both = asm.reg(Kind::Pred);
            asm.op(format!("and.pred {both}, {last}, {fits}"));
            asm.op(format!("and.pred {second}, {second}, !{both}"));
            last
        });
        if let Some(p) = &pred {
            asm.op(format!("and.pred {second}, {second}, {p}"));
        }
        let w: Vec<String> = (0..8).map(|_| asm.reg(Kind::B32)).collect();
        for x in &w[4..] {
            asm.op(format!("mov.b32 {x}, 0"));
        }
        asm.op(format!(
            "{}ld.{space}.v4.b32 {{{}}}, [{addr}]",
            guard(&pred),
            w[..4].join(", ")
        ));
        asm.op(format!(
            "@{second} ld.{space}.v4.b32 {{{}}}, [{addr}+16]",
            w[4..].join(", ")
        ));
        // Word j of the result: bytes shift + 4j.. of w; select by the shift's word
        // bits, then a funnel shift by its half bit.
        let (b4, b8) = (asm.reg(Kind::Pred), asm.reg(Kind::Pred));
        let t = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {t}, {shift}, 4"));
        asm.op(format!("setp.ne.u32 {b4}, {t}, 0"));
        asm.op(format!("and.b32 {t}, {shift}, 8"));
        asm.op(format!("setp.ne.u32 {b8}, {t}, 0"));
        let half = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {half}, {shift}, 2"));
        asm.op(format!("shl.b32 {half}, {half}, 3"));
        let x: Vec<String> = (0..7)
            .map(|j| {
                let x = asm.reg(Kind::B32);
                asm.op(format!("selp.b32 {x}, {}, {}, {b4}", w[j + 1], w[j]));
                x
            })
            .collect();
        let u: Vec<String> = (0..5)
            .map(|j| {
                let u = asm.reg(Kind::B32);
                asm.op(format!("selp.b32 {u}, {}, {}, {b8}", x[j + 2], x[j]));
                u
            })
            .collect();
        let o: Vec<String> = (0..4)
            .map(|j| {
                let o = asm.reg(Kind::B32);
                asm.op(format!(
                    "shf.r.clamp.b32 {o}, {}, {}, {half}",
                    u[j],
                    u[j + 1]
                ));
                o
            })
            .collect();
        if let Some(last) = &last {
            zero_past_tail(asm, &o, tail, last);
        }
        let at = slot_vector(asm, shared, so, &col, &r);
        let store = RealignedStore { pred, at, words: o };
        match from {
            RealignFrom::Global(_) => store_realigned(asm, &[store]),
            RealignFrom::Shared(_) => stores.push(store),
        }
    }
    stores
}

/// `load_realigned` from the operand's verbatim copy at the start of its own slot (`first`:
/// the shared address of its first element; `GpuSchedule::realign_in_shared`), with fewer
/// instructions: shared memory takes 4-byte loads wherever they fall, so each vector is
/// the five words from its first half's word on, funnel-shifted by its half-word offset
/// (5 loads and 4 shifts, where two aligned 16-byte loads need 12 selects by the vector's
/// misalignment and 4 shifts). Consecutive threads take consecutive columns at the same
/// place in them (not consecutive places in one column): their words, `lead` halves
/// apart, then mostly fall in different banks, where 16 bytes apart four threads would
/// share a bank; where they do not, `realign_words_pay` keeps `load_realigned`.
/// Returns the stores, which may follow only a barrier after every thread's reads
/// (`store_realigned`).
#[allow(clippy::too_many_arguments)]
pub(super) fn realign_in_shared(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    first: &str,
    shared: &str,
    lead: usize,
    others: usize,
    so: usize,
    multiply_high: bool,
) -> Vec<RealignedStore> {
    debug_assert!(so % 8 == 0);
    let per_col = lead.div_ceil(8);
    let total = per_col * others;
    let tail = lead % 8;
    let mut stores = Vec::new();
    for i in 0..total.div_ceil(tpp) {
        // Vector q: column q % others, place q / others in it.
        let (pred, r, col) = vector_slot(asm, lt, tpp, i, others, total, multiply_high);
        let at = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {at}, {r}, 16"));
        asm.op(format!("mad.lo.u32 {at}, {col}, {}, {at}", 2 * lead));
        asm.op(format!("add.u32 {at}, {at}, {first}"));
        let half = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {half}, {at}, 2"));
        asm.op(format!("shl.b32 {half}, {half}, 3"));
        asm.op(format!("and.b32 {at}, {at}, -4"));
        let w: Vec<String> = (0..5).map(|_| asm.reg(Kind::B32)).collect();
        for (j, x) in w.iter().enumerate() {
            asm.op(format!(
                "{}ld.shared.b32 {x}, [{at}+{}]",
                guard(&pred),
                4 * j
            ));
        }
        let o: Vec<String> = (0..4)
            .map(|j| {
                let o = asm.reg(Kind::B32);
                asm.op(format!(
                    "shf.r.clamp.b32 {o}, {}, {}, {half}",
                    w[j],
                    w[j + 1]
                ));
                o
            })
            .collect();
        if tail != 0 {
            let last = asm.reg(Kind::Pred);
            asm.op(format!("setp.eq.u32 {last}, {r}, {}", per_col - 1));
            zero_past_tail(asm, &o, tail, &last);
        }
        let at = slot_vector(asm, shared, so, &col, &r);
        stores.push(RealignedStore { pred, at, words: o });
    }
    stores
}

/// Bytes past a verbatim copy's 16-byte vectors that `realign_in_shared` may read (at
/// most 18: the last vector's fifth word), which its slot must hold.
pub(super) const REALIGN_WORDS_SLACK: usize = 20;

/// Whether `realign_in_shared` should realign an operand of `others` columns of `lead`
/// halves (rather than `load_realigned` from shared memory): where a warp's five 4-byte
/// loads take fewer than 12 shared-memory wavefronts a vector on average (over the
/// vectors and the copy's 8 possible misalignments), 1.5 times the 8 of the two
/// 16-byte loads. Measured on the H200 (f16 squares with the shipped schedules, two runs
/// of each kernel alternated, docs/gpu-notes.md version 31): below 12 the words gained
/// up to 8 points of the bound (75 84 -> 92%, 70 83 -> 89%), 5 of 76 sizes lost 0.3 to
/// 1.5 (and 81 none); from 12 on (35, 36, 43, 63, 71, 107, 127) none gained more than
/// 0.2, and 43 and 63 lost 5.6 and 6.2.
pub(super) fn realign_words_pay(lead: usize, others: usize) -> bool {
    let per_col = lead.div_ceil(8);
    let total = per_col * others;
    let (mut wavefronts, mut warps) = (0, 0);
    for shift in (0..16).step_by(2) {
        // The first 64 warps' vectors (every vector up to 128 x 128): a sample that
        // bounds the code generator's work at larger operands.
        for first in (0..total).step_by(32).take(64) {
            // Word of each lane's first load (vector q: column q % others, place q / others).
            let word = |lane: usize| {
                let q = first + lane;
                (shift + 2 * lead * (q % others) + 16 * (q / others)) / 4
            };
            let lanes = 32.min(total - first);
            wavefronts += (0..5)
                .map(|j| bank_degree(lanes, 4, |lane| 4 * (word(lane) + j)))
                .sum::<usize>();
            warps += 1;
        }
    }
    wavefronts < 12 * warps
}

/// The shared address of vector `r` of column `col` in a padded slot at `shared` whose
/// columns are `so` halves apart.
fn slot_vector(asm: &mut Asm, shared: &str, so: usize, col: &str, r: &str) -> String {
    let at = asm.reg(Kind::B32);
    asm.op(format!("mad.lo.u32 {at}, {col}, {}, {shared}", 2 * so));
    asm.op(format!("mad.lo.u32 {at}, {r}, 16, {at}"));
    at
}

/// Zeros in the halves of a column's last vector (held as 4 words) past its `tail`
/// halves inside the column, where `last` says the vector is one.
fn zero_past_tail(asm: &mut Asm, o: &[String], tail: usize, last: &str) {
    for (j, oj) in o.iter().enumerate() {
        if 2 * j >= tail {
            asm.op(format!("selp.b32 {oj}, 0, {oj}, {last}"));
        } else if 2 * j + 1 == tail {
            let m = asm.reg(Kind::B32);
            asm.op(format!("and.b32 {m}, {oj}, 65535"));
            asm.op(format!("selp.b32 {oj}, {m}, {oj}, {last}"));
        }
    }
}

/// Copies one problem's tight, packed f16 operand (`len` halves at `global`) verbatim into
/// the start of its padded slot at `slot` (16-byte aligned) through `cp.async`, in 16-byte
/// vectors from the boundary at or below its first element; returns the shared address of
/// that element, or `None` (nothing emitted) where the copy, and `slack` bytes past it that
/// its realigning reads, is larger than the slot's `slot_bytes`.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_verbatim(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    global: &str,
    slot: &str,
    len: usize,
    slot_bytes: usize,
    slack: usize,
) -> Option<String> {
    let vectors = (len + 7).div_ceil(8);
    if vectors * 16 + slack > slot_bytes {
        return None;
    }
    // Placed as its global 128-byte lines lie where the slot has room for it.
    let line = vectors * 16 + slack + LINE_ROOM <= slot_bytes;
    let end = asm.imm32(len as u64);
    let shift = flat_copy(
        asm,
        Dtype::F16,
        lt,
        tpp,
        global,
        &end,
        slot,
        vectors,
        FlatCopy::Async,
        line,
    );
    let first = asm.reg(Kind::B32);
    asm.op(format!("add.u32 {first}, {slot}, {shift}"));
    Some(first)
}

/// Where `load_realigned` reads an operand.
#[derive(Clone, Copy, Debug)]
pub(super) enum RealignFrom<'a> {
    /// Global memory: the 64-bit address of the problem's first element.
    Global(&'a str),
    /// The operand's verbatim copy at the start of its own padded slot (`GpuSchedule::
    /// realign_in_shared`): the 32-bit shared address of its first element.
    Shared(&'a str),
}

/// One realigned 16-byte vector, ready to be stored into the padded slot.
pub(super) struct RealignedStore {
    pred: Option<String>,
    at: String,
    words: Vec<String>,
}

pub(super) fn store_realigned(asm: &mut Asm, stores: &[RealignedStore]) {
    for s in stores {
        asm.op(format!(
            "{}st.shared.v4.b32 [{}], {{{}}}",
            guard(&s.pred),
            s.at,
            s.words.join(", ")
        ));
    }
}

/// Writes zeros into the k padding (k..kp) of one problem's padded copy of A or B (C has
/// none), the elements a loader that copies only the matrix leaves alone (`load_flat`; past
/// the matrix `load_realigned` writes zeros only up to its last vector).
/// The rows or columns past m or n need no zeros: they only reach rows or columns of the
/// product that are never stored. Where k is the strided direction the padding is one block (16-byte
/// stores), else a short run per row or column (32-bit stores where k is even).
#[allow(clippy::too_many_arguments)]
pub(super) fn zero_k_padding(
    asm: &mut Asm,
    lt: &str,
    tpp: usize,
    base: &str,
    op: Operand,
    p: &ColMajorProblem,
    layout: &SharedLayout,
    kp: usize,
) {
    let k = p.k;
    if k == kp {
        return;
    }
    // Element (x, kk) of the operand at x * x_stride + kk * k_stride; x < others.
    let (k_stride, x_stride, others) = match op {
        Operand::A => (layout.a_col, layout.a_row, p.m),
        Operand::B => (layout.b_row, layout.b_col, p.n),
        Operand::C => return,
    };
    asm.comment("zeros in the k padding");
    if k_stride != 1 {
        let vectors = (kp - k) * k_stride * 2 / 16;
        let zero = asm.reg(Kind::B32);
        asm.op(format!("mov.b32 {zero}, 0"));
        let at = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {at}, {lt}, 16, {base}"));
        for i in 0..vectors.div_ceil(tpp) {
            let pred =
                ((i + 1) * tpp > vectors).then(|| asm.lt(lt, &(vectors - i * tpp).to_string()));
            asm.op(format!(
                "{}st.shared.v4.b32 [{at}+{}], {{{zero}, {zero}, {zero}, {zero}}}",
                guard(&pred),
                k * k_stride * 2 + i * tpp * 16
            ));
        }
        return;
    }
    // Runs of kp - k elements, `unit` elements per store.
    let unit = if k % 2 == 0 { 2 } else { 1 };
    let run = (kp - k) / unit;
    let count = others * run;
    let ty = if unit == 2 { "b32" } else { "b16" };
    let zero = asm.reg(if unit == 2 { Kind::B32 } else { Kind::B16 });
    asm.op(format!("mov.{ty} {zero}, 0"));
    for i in 0..count.div_ceil(tpp) {
        let e = asm.reg(Kind::B32);
        asm.op(format!("add.u32 {e}, {lt}, {}", i * tpp));
        let pred = ((i + 1) * tpp > count).then(|| asm.lt(&e, &count.to_string()));
        let (x, j) = (asm.reg(Kind::B32), asm.reg(Kind::B32));
        asm.op(format!("div.u32 {x}, {e}, {run}"));
        asm.op(format!("rem.u32 {j}, {e}, {run}"));
        let at = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {at}, {x}, {}, {base}", x_stride * 2));
        asm.op(format!("mad.lo.u32 {at}, {j}, {}, {at}", unit * 2));
        asm.op(format!(
            "{}st.shared.{ty} [{at}+{}], {zero}",
            guard(&pred),
            k * 2
        ));
    }
}

/// The widest vector (in elements, at most 16 bytes) a loader may use: the lead extents,
/// the leading dimension and the batch stride must be multiples of it, and the matrix
/// addresses known aligned (strided batches; pointer arrays may point anywhere).
pub(super) fn vector_width(
    kind: BatchKind,
    dtype: Dtype,
    lead: &Extent,
    ld: &Extent,
    lead_ext: usize,
    stride: usize,
) -> usize {
    if kind != BatchKind::Strided || lead.runtime.is_some() || ld.runtime.is_some() {
        return 1;
    }
    let mut v = 16 / dtype.size();
    while v > 1 {
        if lead.max % v == 0 && lead_ext % v == 0 && ld.max % v == 0 && stride % v == 0 {
            // f16 pairs (4 bytes) are the narrowest vector.
            if v * dtype.size() >= 4 {
                return v;
            }
        }
        v /= 2;
    }
    1
}
