//! PTX text for one kernel. Registers are virtual (ptxas allocates); every loop is unrolled
//! at generation time so that all addressing inside the loops is immediate offsets.

use std::fmt::Write;

use smallgemm_ir::{
    Accumulate, ColMajorProblem, Dtype, GpuSchedule, Operand, Scalar, SharedLayout, Sm, Staging,
    Trans,
};

use crate::{ptx_version, BatchKind, ExtraParam};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pred,
    B16,
    B32,
    B64,
    F32,
    F64,
}

const KINDS: [(Kind, &str, &str); 6] = [
    (Kind::Pred, ".pred", "%p"),
    (Kind::B16, ".b16", "%h"),
    (Kind::B32, ".b32", "%r"),
    (Kind::B64, ".b64", "%rd"),
    (Kind::F32, ".f32", "%f"),
    (Kind::F64, ".f64", "%fd"),
];

/// The body under construction and its register counters.
struct Asm {
    body: String,
    counts: [usize; 6],
    labels: usize,
    /// `cp.async` copies were issued: the staging's barrier waits for them.
    async_copies: bool,
}

impl Asm {
    fn new() -> Asm {
        Asm {
            body: String::new(),
            counts: [0; 6],
            labels: 0,
            async_copies: false,
        }
    }

    fn reg(&mut self, kind: Kind) -> String {
        let i = KINDS.iter().position(|(k, _, _)| *k == kind).unwrap_or(0);
        let n = self.counts[i];
        self.counts[i] += 1;
        format!("{}{}", KINDS[i].2, n)
    }

    fn op(&mut self, text: impl AsRef<str>) {
        self.body.push('\t');
        self.body.push_str(text.as_ref());
        self.body.push_str(";\n");
    }

    fn label(&mut self) -> String {
        self.labels += 1;
        format!("$L{}", self.labels)
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    fn comment(&mut self, text: &str) {
        let _ = writeln!(self.body, "\t// {text}");
    }

    /// `bytes` (4, 8 or 16) from global memory at `src` to shared memory at `dst` through
    /// `cp.async` under `guard` (a `guard()` prefix); `src_size` (a register) copies that
    /// many bytes and zero-fills the rest. The staging's barrier then waits for it.
    fn cp_async(
        &mut self,
        guard: &str,
        dst: &str,
        src: &str,
        bytes: usize,
        src_size: Option<&str>,
    ) {
        // (.cg, past L1, takes 16-byte copies only.)
        let cache = if bytes == 16 { "cg" } else { "ca" };
        let size = src_size.map_or(String::new(), |r| format!(", {r}"));
        self.op(format!(
            "{guard}cp.async.{cache}.shared.global [{dst}], [{src}], {bytes}{size}"
        ));
        self.async_copies = true;
    }

    /// Moves the shared-memory stores emitted since `start` (a length of `body`) later, in
    /// their order, the other lines keeping theirs: a staging loop emitted as load, store,
    /// load, store... becomes groups of global loads, each followed by their stores. ptxas
    /// keeps a store where it is, and a store waits for its load's data, so the interleaved
    /// order leaves one global load in flight per thread at a time (one DRAM round trip per
    /// vector); sunk, a group's loads are in flight together. A group holds loads of at most
    /// `cap` 32-bit words (each word a register live until its store): more registers
    /// than that cost blocks per SM where a thread stages many vectors.
    /// Valid for stretches whose stores run on every path through it (the stretch may hold
    /// forward branches around loads, as `flat_copy`'s partial vectors: stores are only
    /// placed where no such branch is open) and that read no shared memory.
    fn sink_shared_stores(&mut self, start: usize, cap: usize) {
        if cap == 0 {
            return;
        }
        let tail = self.body.split_off(start);
        debug_assert!(!tail.contains("ld.shared") && !tail.contains("bar.sync"));
        let op_of = |l: &str| -> String {
            let op = l.trim_start();
            match op.strip_prefix('@') {
                Some(rest) => rest.split_once(' ').map_or("", |(_, o)| o).to_string(),
                None => op.to_string(),
            }
        };
        let words = |op: &str| -> usize {
            if op.starts_with("ld.global.v4") {
                4
            } else if op.starts_with("ld.global.v2") || op.starts_with("ld.global.b64") {
                2
            } else {
                1
            }
        };
        let mut pending: Vec<&str> = Vec::new();
        let mut in_flight = 0;
        let mut open: Vec<String> = Vec::new();
        for l in tail.split_inclusive('\n') {
            let op = op_of(l);
            if op.starts_with("st.shared") {
                pending.push(l);
                continue;
            }
            if op.starts_with("ld.global") {
                let w = words(&op);
                if open.is_empty() && in_flight + w > cap && !pending.is_empty() {
                    for s in pending.drain(..) {
                        self.body.push_str(s);
                    }
                    in_flight = 0;
                }
                in_flight += w;
            }
            if let Some(target) = op
                .strip_prefix("bra ")
                .or_else(|| op.strip_prefix("bra.uni "))
            {
                open.push(target.trim_end().trim_end_matches(';').to_string());
            }
            if let Some(label) = l.trim_end().strip_suffix(':') {
                open.retain(|t| t != label);
            }
            self.body.push_str(l);
        }
        for s in pending {
            self.body.push_str(s);
        }
    }

    fn declarations(&self) -> String {
        let mut out = String::new();
        for (i, (_, ty, prefix)) in KINDS.iter().enumerate() {
            if self.counts[i] > 0 {
                let _ = writeln!(out, "\t.reg {ty} {prefix}<{}>;", self.counts[i]);
            }
        }
        out
    }

    /// A u32 register holding `value`.
    fn imm32(&mut self, value: u64) -> String {
        let r = self.reg(Kind::B32);
        self.op(format!("mov.u32 {r}, {value}"));
        r
    }

    /// `pred = a < b` (unsigned), b a register or an immediate.
    fn lt(&mut self, a: &str, b: &str) -> String {
        let p = self.reg(Kind::Pred);
        self.op(format!("setp.lt.u32 {p}, {a}, {b}"));
        p
    }

    /// `base + offset < limit` for each offset, as predicates; None for every offset (true)
    /// where the caller knows they are all in bounds (`needed` false).
    fn offsets_below(
        &mut self,
        base: &str,
        offsets: [u32; 2],
        limit: usize,
        needed: bool,
    ) -> [Option<String>; 2] {
        offsets.map(|d| {
            needed.then(|| {
                let r = self.reg(Kind::B32);
                self.op(format!("add.u32 {r}, {base}, {d}"));
                self.lt(&r, &limit.to_string())
            })
        })
    }

    /// `a && b` over optional predicates (None = true).
    fn and(&mut self, a: Option<String>, b: Option<String>) -> Option<String> {
        match (a, b) {
            (None, x) | (x, None) => x,
            (Some(a), Some(b)) => {
                let p = self.reg(Kind::Pred);
                self.op(format!("and.pred {p}, {a}, {b}"));
                Some(p)
            }
        }
    }
}

fn guard(p: &Option<String>) -> String {
    match p {
        Some(p) => format!("@{p} "),
        None => String::new(),
    }
}

/// An extent known at generation time, or per problem at run time (variable-size batches).
#[derive(Clone)]
struct Extent {
    max: usize,
    runtime: Option<String>,
}

/// Per-problem facts the loaders and epilogues read.
struct ProblemRegs {
    a: String,
    b: String,
    c: String,
    m: Extent,
    n: Extent,
    k: Extent,
    lda: Extent,
    ldb: Extent,
    ldc: Extent,
}

fn elt_kind(dtype: Dtype) -> (Kind, &'static str) {
    match dtype {
        Dtype::F64 => (Kind::F64, "f64"),
        Dtype::F32 => (Kind::F32, "f32"),
        Dtype::F16 => (Kind::B16, "b16"),
    }
}

fn zero_literal(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F64 => "0d0000000000000000",
        Dtype::F32 => "0f00000000",
        Dtype::F16 => "0x0000",
    }
}

/// A constant as a PTX literal of the epilogue type (f64 or f32 bit pattern).
fn literal(dtype: Dtype, value: f64) -> String {
    match dtype {
        Dtype::F64 => format!("0d{:016X}", value.to_bits()),
        _ => format!("0f{:08X}", (value as f32).to_bits()),
    }
}

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
fn load_operand(
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
fn load_flat(
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
fn load_realigned(
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
fn realign_in_shared(
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
const REALIGN_WORDS_SLACK: usize = 20;

/// Whether `realign_in_shared` should realign an operand of `others` columns of `lead`
/// halves (rather than `load_realigned` from shared memory): where a warp's five 4-byte
/// loads take fewer than 12 shared-memory wavefronts a vector on average (over the
/// vectors and the copy's 8 possible misalignments), 1.5 times the 8 of the two
/// 16-byte loads. Measured on the H200 (f16 squares with the shipped schedules, two runs
/// of each kernel alternated, docs/gpu-notes.md version 31): below 12 the words gained
/// up to 8 points of the bound (75 84 -> 92%, 70 83 -> 89%), 5 of 76 sizes lost 0.3 to
/// 1.5 (and 81 none); from 12 on (35, 36, 43, 63, 71, 107, 127) none gained more than
/// 0.2, and 43 and 63 lost 5.6 and 6.2.
fn realign_words_pay(lead: usize, others: usize) -> bool {
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

/// A or B as the staging into its padded slot sees it: its stored lead (`lead`, extent
/// `lext` in the slot, `sl` elements apart) and other side (`oext`, `so` apart).
struct StagedOperand<'a> {
    op: Operand,
    global: &'a str,
    slot: &'a str,
    /// Elements of the slot (a multiple of 8 for tensor-core kernels: 16-byte aligned).
    slot_len: usize,
    /// Copied flat (verbatim, with the block's span) before.
    flat_staged: bool,
    lead: &'a Extent,
    other: &'a Extent,
    ld: &'a Extent,
    lext: usize,
    oext: usize,
    sl: usize,
    so: usize,
    /// The batch stride.
    stride: usize,
    /// Rows (A) or columns (B) permuted for vector reads: (period, tile side).
    perm: Option<(usize, usize)>,
}

/// Copies one problem's tight, packed f16 operand (`len` halves at `global`) verbatim into
/// the start of its padded slot at `slot` (16-byte aligned) through `cp.async`, in 16-byte
/// vectors from the boundary at or below its first element; returns the shared address of
/// that element, or `None` (nothing emitted) where the copy, and `slack` bytes past it that
/// its realigning reads, is larger than the slot's `slot_bytes`.
#[allow(clippy::too_many_arguments)]
fn copy_verbatim(
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
    );
    let first = asm.reg(Kind::B32);
    asm.op(format!("add.u32 {first}, {slot}, {shift}"));
    Some(first)
}

/// Where `load_realigned` reads an operand.
#[derive(Clone, Copy, Debug)]
enum RealignFrom<'a> {
    /// Global memory: the 64-bit address of the problem's first element.
    Global(&'a str),
    /// The operand's verbatim copy at the start of its own padded slot (`GpuSchedule::
    /// realign_in_shared`): the 32-bit shared address of its first element.
    Shared(&'a str),
}

/// One realigned 16-byte vector, ready to be stored into the padded slot.
struct RealignedStore {
    pred: Option<String>,
    at: String,
    words: Vec<String>,
}

fn store_realigned(asm: &mut Asm, stores: &[RealignedStore]) {
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
fn zero_k_padding(
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
fn vector_width(
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

/// Generates the complete PTX module text.
pub(crate) fn kernel(
    p: &ColMajorProblem,
    sm: Sm,
    kind: BatchKind,
    s: &GpuSchedule,
    entry: &str,
    extra: &[ExtraParam],
) -> (String, usize) {
    let mut asm = Asm::new();
    let dtype = p.dtype;
    let elt = dtype.size();
    let sdt = crate::scalar_dtype(dtype);
    let (skind, sty) = match sdt {
        Dtype::F64 => (Kind::F64, "f64"),
        _ => (Kind::F32, "f32"),
    };
    let layout = s.shared_layout(p);
    let res = s.resources(p);
    let tpp = res.threads_per_problem as usize;
    let tba = s.tba as usize;

    // Parameters.
    let mut params = vec![
        ".param .u64 param_a".to_string(),
        ".param .u64 param_b".to_string(),
        ".param .u64 param_c".to_string(),
    ];
    if extra.contains(&ExtraParam::Dims) {
        params.push(".param .u64 param_dims".into());
    }
    params.push(".param .u32 param_batch".into());
    if extra.contains(&ExtraParam::Alpha) {
        params.push(format!(".param .{sty} param_alpha"));
    }
    if extra.contains(&ExtraParam::Beta) {
        params.push(format!(".param .{sty} param_beta"));
    }

    asm.comment(&format!(
        "{} {}x{}x{} trans {:?}{:?} alpha {} beta {} schedule {:?}",
        dtype.name(),
        p.m,
        p.n,
        p.k,
        p.trans_a,
        p.trans_b,
        p.alpha,
        p.beta,
        s
    ));
    let ptr = |asm: &mut Asm, name: &str| {
        let raw = asm.reg(Kind::B64);
        asm.op(format!("ld.param.u64 {raw}, [{name}]"));
        let g = asm.reg(Kind::B64);
        asm.op(format!("cvta.to.global.u64 {g}, {raw}"));
        g
    };
    let (pa, pb) = if p.swap_operands {
        ("param_b", "param_a")
    } else {
        ("param_a", "param_b")
    };
    let ga = ptr(&mut asm, pa);
    let gb = ptr(&mut asm, pb);
    let gc = ptr(&mut asm, "param_c");
    let gdims = extra
        .contains(&ExtraParam::Dims)
        .then(|| ptr(&mut asm, "param_dims"));
    let batch = asm.reg(Kind::B32);
    asm.op(format!("ld.param.u32 {batch}, [param_batch]"));
    let alpha = extra.contains(&ExtraParam::Alpha).then(|| {
        let r = asm.reg(skind);
        asm.op(format!("ld.param.{sty} {r}, [param_alpha]"));
        r
    });
    let beta = extra.contains(&ExtraParam::Beta).then(|| {
        let r = asm.reg(skind);
        asm.op(format!("ld.param.{sty} {r}, [param_beta]"));
        r
    });

    let tid = asm.reg(Kind::B32);
    asm.op(format!("mov.u32 {tid}, %tid.x"));
    let bid = asm.reg(Kind::B32);
    asm.op(format!("mov.u32 {bid}, %ctaid.x"));
    let (g, lt) = if tba > 1 {
        let g = asm.reg(Kind::B32);
        let lt = asm.reg(Kind::B32);
        asm.op(format!("div.u32 {g}, {tid}, {tpp}"));
        asm.op(format!("rem.u32 {lt}, {tid}, {tpp}"));
        (g, lt)
    } else {
        (asm.imm32(0), tid.clone())
    };
    let pi = asm.reg(Kind::B32);
    asm.op(format!("mad.lo.u32 {pi}, {bid}, {tba}, {g}"));
    let out = asm.reg(Kind::Pred);
    asm.op(format!("setp.ge.u32 {out}, {pi}, {batch}"));
    let sbase = asm.reg(Kind::B32);
    asm.op(format!("mov.u32 {sbase}, smem"));
    let flat = flat_plan(p, s, kind, sm);
    // Tensor-core kernels with C through shared memory also stage with their global loads
    // grouped (`Asm::sink_shared_stores`): without C's prefetched values and global
    // addresses in registers, the loads' registers fit. 16 words (four 16-byte vectors) a
    // group: ptxas -v on sm_90 shows about the registers of the interleaved order at every
    // warp count for 48..128, and the H100 bench measured it best against 32 words and
    // unbounded groups (docs/gpu-notes.md, version 7). With the C prefetch the grouping
    // raised registers past the occupancy steps (80: 77 -> 126) and lost at most sizes
    // from 65; for variable-size batches it measured within noise. Other kernels keep each
    // store right after its load (cap 0: nothing moves).
    let sink = if s.mma.is_some() && s.stage == Staging::FlatC {
        16
    } else {
        0
    };
    // Flat operands: the whole block copies the spans of its problems (all threads, also
    // those of groups past the batch end; `end` stops at the batch end).
    let mut flat_shift = [None, None, None];
    let mut cflat_region = None;
    // Flat spans through `cp.async`: tensor-core kernels' (`async_copies_apply`) and FMA
    // kernels' (`async_staging_apply`).
    let async_spans = s.async_copies_apply() || s.async_staging_apply();
    if flat.a.is_some() || flat.b.is_some() || flat.c.is_some() {
        asm.comment("flat staging: the block's spans of packed operands");
        let staging = asm.body.len();
        let pi0 = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {pi0}, {bid}, {tba}"));
        let cnt = asm.reg(Kind::B32);
        asm.op(format!("sub.u32 {cnt}, {batch}, {pi0}"));
        asm.op(format!("min.u32 {cnt}, {cnt}, {tba}"));
        let threads = tpp * tba;
        let ops = [
            (flat.a, &ga, p.stride_a),
            (flat.b, &gb, p.stride_b),
            (flat.c, &gc, p.stride_c),
        ];
        for (i, (op, base, stride)) in ops.into_iter().enumerate() {
            let Some(op) = op else { continue };
            let off = asm.reg(Kind::B64);
            asm.op(format!("mul.wide.u32 {off}, {pi0}, {}", stride * elt));
            let span = asm.reg(Kind::B64);
            asm.op(format!("add.u64 {span}, {base}, {off}"));
            let end = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {end}, {cnt}, {}", op.len));
            let region = asm.reg(Kind::B32);
            asm.op(format!("add.u32 {region}, {sbase}, {}", op.region));
            if i == 2 {
                // C: read only when beta needs it (over A: later, in `mma_body`); its
                // shift is the span's either way.
                let shift = if p.beta != Scalar::Zero && !flat.c_over_a {
                    flat_copy(
                        &mut asm,
                        dtype,
                        &tid,
                        threads,
                        &span,
                        &end,
                        &region,
                        op.vectors,
                        if async_spans {
                            FlatCopy::Async
                        } else {
                            FlatCopy::In
                        },
                    )
                } else {
                    let lo = asm.reg(Kind::B32);
                    asm.op(format!("cvt.u32.u64 {lo}, {span}"));
                    asm.op(format!("and.b32 {lo}, {lo}, 15"));
                    lo
                };
                cflat_region = Some((span, end, region, op.vectors));
                flat_shift[i] = Some(shift);
            } else {
                // Both kernels read only the problems' elements of the copy (and rows or
                // columns past them whose results are never stored): the partial vectors
                // at the span's ends may come whole, from the 16-byte granules that hold
                // them. FMA kernels without `cp.async` keep them element by element:
                // whole, f16 7, 10 and 13 lost 1.6 to 6 points of the bound (H100,
                // docs/gpu-notes.md, version 26).
                let copy = if async_spans {
                    FlatCopy::Async
                } else if s.mma.is_some() {
                    FlatCopy::WholeEnds
                } else {
                    FlatCopy::In
                };
                flat_shift[i] = Some(flat_copy(
                    &mut asm, dtype, &tid, threads, &span, &end, &region, op.vectors, copy,
                ));
            }
        }
        asm.sink_shared_stores(staging, sink);
    }
    // Group g's copies: padded slots first, then the flat regions.
    let group_base =
        |asm: &mut Asm, op: &Option<FlatOperand>, shift: &Option<String>, in_slot: usize| {
            let r = asm.reg(Kind::B32);
            match (op, shift) {
                (Some(op), Some(sh)) => {
                    asm.op(format!("add.u32 {r}, {sbase}, {sh}"));
                    asm.op(format!("add.u32 {r}, {r}, {}", op.region));
                    asm.op(format!("mad.lo.u32 {r}, {g}, {}, {r}", op.len * elt));
                }
                _ => {
                    asm.op(format!("mad.lo.u32 {r}, {g}, {}, {sbase}", flat.slot * elt));
                    if in_slot > 0 {
                        asm.op(format!("add.u32 {r}, {r}, {}", in_slot * elt));
                    }
                }
            }
            r
        };
    let sa = group_base(&mut asm, &flat.a, &flat_shift[0], 0);
    let sb = group_base(&mut asm, &flat.b, &flat_shift[1], flat.b_in_slot);
    let sc = match flat.c_pad {
        Some(c) => Some(group_base(&mut asm, &None, &None, c.c_in_slot)),
        None => flat
            .c
            .is_some()
            .then(|| group_base(&mut asm, &flat.c, &flat_shift[2], 0)),
    };
    let mut layout = layout;
    if let Some(a) = &flat.a {
        layout.a_row = a.row;
        layout.a_col = a.col;
    }
    if let Some(b) = &flat.b {
        layout.b_row = b.row;
        layout.b_col = b.col;
    }

    let skip_load = asm.label();
    asm.op(format!("@{out} bra {skip_load}"));
    // Problem pointers (and sizes, for variable-size batches).
    let problem = problem_regs(&mut asm, p, kind, &ga, &gb, &gc, gdims.as_deref(), &pi);
    // C's copy between global memory and its padded slot in shared memory (`to_shared`: in).
    // C's padded copy; `copy` says which way (and `CopyC::Async`: in, through `cp.async`).
    let copy_c_pad = |asm: &mut Asm, c: CPad, sc: &str, copy: CopyC| {
        copy_c_columns(
            asm,
            &lt,
            tpp,
            &problem.c,
            sc,
            p,
            problem.ldc.max,
            c.c_ld,
            c.cv,
            copy,
        )
    };
    // C's copy-in during the staging (before its barrier) may go through `cp.async`; not
    // beside flat fragments, where it lost (H100: 18 86 -> 83%, 20 99 -> 97% of the bound;
    // docs/gpu-notes.md, version 15).
    let c_in_staging = if s.async_copies_apply() && !s.flat_fragments_apply() {
        CopyC::Async
    } else {
        CopyC::In
    };
    let epi = Epilogue {
        dtype,
        sdt,
        skind,
        sty,
        alpha: p.alpha,
        beta: p.beta,
        alpha_reg: alpha,
        beta_reg: beta,
    };
    let tile = match s.mma {
        None => Some(fma_c_tile(
            &mut asm,
            p,
            s,
            &lt,
            &problem,
            &epi,
            sc.as_deref(),
        )),
        Some(_) => None,
    };
    // Tensor-core kernels with a C prefetch: C's loads go out before A's and B's.
    // (With C staged flat, its old values are read from shared memory in the epilogue.)
    let mut mma_warp_early = (s.mma.is_some() && s.prefetch_c && sc.is_none())
        .then(|| mma_warp(&mut asm, p, s, &lt, &problem, &epi, true, None, false));
    asm.comment("stage A and B in shared memory");
    let staging = asm.body.len();
    let (mext, kext, next) = match s.mma {
        Some(shape) => (
            p.m.next_multiple_of(shape.m as usize),
            p.k.next_multiple_of(shape.k as usize),
            p.n.next_multiple_of(shape.n as usize),
        ),
        None => (p.m, p.k, p.n),
    };
    // Operands copied verbatim into their slots (with the shared address of their first
    // element), realigned there once all copies are in.
    let mut deferred: Vec<(&StagedOperand, String, bool)> = Vec::new();
    // The realigning loaders' slot division: by a multiply-high (`mul_hi_slots`, and under
    // `FlatC`) or not.
    let multiply_high = s.stage == Staging::FlatC || s.mul_hi_applies();
    // op(A)[i, p] at i * a_row + p * a_col, stored lead i (N) or p (T); op(B)[p, j] at
    // p * b_row + j * b_col, stored lead p (N) or j (T).
    let (a_lead, a_other, a_lext, a_oext, a_sl, a_so) = match p.trans_a {
        Trans::N => (
            &problem.m,
            &problem.k,
            mext,
            kext,
            layout.a_row,
            layout.a_col,
        ),
        Trans::T => (
            &problem.k,
            &problem.m,
            kext,
            mext,
            layout.a_col,
            layout.a_row,
        ),
    };
    let (b_lead, b_other, b_lext, b_oext, b_sl, b_so) = match p.trans_b {
        Trans::N => (
            &problem.k,
            &problem.n,
            kext,
            next,
            layout.b_row,
            layout.b_col,
        ),
        Trans::T => (
            &problem.n,
            &problem.k,
            next,
            kext,
            layout.b_col,
            layout.b_row,
        ),
    };
    let operands = [
        StagedOperand {
            op: Operand::A,
            global: &problem.a,
            slot: &sa,
            slot_len: layout.a_len,
            flat_staged: flat.a.is_some(),
            lead: a_lead,
            other: a_other,
            ld: &problem.lda,
            lext: a_lext,
            oext: a_oext,
            sl: a_sl,
            so: a_so,
            stride: p.stride_a,
            perm: (layout.a_perm > 0).then_some((layout.a_perm, s.rm as usize)),
        },
        StagedOperand {
            op: Operand::B,
            global: &problem.b,
            slot: &sb,
            slot_len: layout.b_len,
            flat_staged: flat.b.is_some(),
            lead: b_lead,
            other: b_other,
            ld: &problem.ldb,
            lext: b_lext,
            oext: b_oext,
            sl: b_sl,
            so: b_so,
            stride: p.stride_b,
            perm: (layout.b_perm > 0).then_some((layout.b_perm, s.rn as usize)),
        },
    ];
    for o in &operands {
        let (lead, other, sl, so) = (o.lead, o.other, o.sl, o.so);
        let v = vector_width(kind, dtype, lead, o.ld, o.lext, o.stride);
        let packed = lead.max * other.max;
        // Straight into the slot through `cp.async` (`slot_copies`): columns of whole pairs.
        let slot_copy = s.slot_copies_apply() && v * elt >= 4;
        let flat_ok = !slot_copy
            && v < 16 / elt
            && kind == BatchKind::Strided
            && lead.runtime.is_none()
            && o.ld.max == lead.max
            && o.stride == packed
            && o.perm.is_none();
        if o.flat_staged {
            // Staged flat above.
        } else if flat_ok
            && (o.lext, o.oext) == (lead.max, other.max)
            // Measured: a win from about 2 KiB per matrix, a loss on tiny ones.
            && packed * elt >= 2048
        {
            load_flat(
                &mut asm, dtype, &lt, tpp, o.global, o.slot, lead.max, packed, sl, so,
            );
        } else if flat_ok && s.mma.is_some() && s.stage != Staging::Padded {
            let realign = dtype == Dtype::F16 && sl == 1 && so % 8 == 0;
            let verbatim = (realign && s.realign_in_shared_apply())
                .then(|| {
                    // Realigned there by 4-byte words where their banks allow.
                    let words = realign_words_pay(lead.max, other.max);
                    let slack = if words { REALIGN_WORDS_SLACK } else { 0 };
                    let first = copy_verbatim(
                        &mut asm,
                        &lt,
                        tpp,
                        o.global,
                        o.slot,
                        packed,
                        o.slot_len * elt,
                        slack,
                    )?;
                    Some((first, words))
                })
                .flatten();
            if let Some((first, words)) = verbatim {
                deferred.push((o, first, words));
            } else {
                if realign {
                    load_realigned(
                        &mut asm,
                        &lt,
                        tpp,
                        RealignFrom::Global(o.global),
                        o.slot,
                        lead.max,
                        other.max,
                        so,
                        multiply_high,
                    );
                } else {
                    load_flat(
                        &mut asm, dtype, &lt, tpp, o.global, o.slot, lead.max, packed, sl, so,
                    );
                }
                zero_k_padding(&mut asm, &lt, tpp, o.slot, o.op, p, &layout, kext);
            }
        } else {
            load_operand(
                &mut asm,
                dtype,
                &lt,
                tpp,
                o.global,
                o.slot,
                lead,
                other,
                o.ld,
                o.lext,
                o.oext,
                sl,
                so,
                v,
                o.perm,
                s.async_staging_apply() || slot_copy,
            );
        }
    }
    if let (Some(c), Some(sc), true) = (flat.c_pad, &sc, p.beta != Scalar::Zero && !flat.c_over_a) {
        copy_c_pad(&mut asm, c, sc, c_in_staging);
    }
    if !deferred.is_empty() {
        // Every thread reads its vectors of every copy, then all store over the copies.
        asm.comment("realign the verbatim copies in their slots");
        // The problem's threads alone: with several problems a block, named barrier 1 + g
        // (groups past the batch end are not here).
        let barrier = if tba == 1 {
            "bar.sync 0".to_string()
        } else {
            let id = asm.reg(Kind::B32);
            asm.op(format!("add.u32 {id}, {g}, 1"));
            format!("bar.sync {id}, {tpp}")
        };
        asm.op("cp.async.wait_all");
        asm.op(&barrier);
        let stores: Vec<Vec<RealignedStore>> = deferred
            .iter()
            .map(|(o, first, words)| {
                let (lead, others) = (o.lead.max, o.other.max);
                if *words {
                    realign_in_shared(
                        &mut asm,
                        &lt,
                        tpp,
                        first,
                        o.slot,
                        lead,
                        others,
                        o.so,
                        multiply_high,
                    )
                } else {
                    load_realigned(
                        &mut asm,
                        &lt,
                        tpp,
                        RealignFrom::Shared(first),
                        o.slot,
                        lead,
                        others,
                        o.so,
                        multiply_high,
                    )
                }
            })
            .collect();
        asm.op(&barrier);
        for ((o, ..), stores) in deferred.iter().zip(&stores) {
            store_realigned(&mut asm, stores);
            zero_k_padding(&mut asm, &lt, tpp, o.slot, o.op, p, &layout, kext);
        }
    } else {
        asm.sink_shared_stores(staging, sink);
    }
    asm.place(&skip_load);
    if asm.async_copies {
        asm.op("cp.async.wait_all");
    }
    asm.op("bar.sync 0");
    let exit = asm.label();
    // With C staged flat, every thread must reach the barrier before C's copy back.
    let cdone = asm.label();
    let leave = if cflat_region.is_some() || flat.c_pad.is_some() {
        &cdone
    } else {
        &exit
    };
    // Groups past the end of the batch leave now that the block's barrier is behind them
    // (a divergent branch: groups of one warp may differ, so not bra.uni).
    asm.op(format!("@{out} bra {leave}"));
    // The block's span of flat C between shared and global memory (where C is staged flat).
    let copy_c_flat = |asm: &mut Asm, to_shared: bool| {
        if let Some((span, end, region, vectors)) = &cflat_region {
            flat_copy(
                asm,
                dtype,
                &tid,
                tpp * tba,
                span,
                end,
                region,
                *vectors,
                if to_shared {
                    FlatCopy::In
                } else {
                    FlatCopy::Out
                },
            );
        }
    };

    match &tile {
        Some(tile) => fma_body(
            &mut asm, p, s, &layout, &sa, &sb, &problem, &epi, &exit, tile,
        ),
        None => {
            let mw = match mma_warp_early.take() {
                Some(mw) => mw,
                None => {
                    let c_ld = flat.c_pad.map_or(p.m, |c| c.c_ld);
                    let sc = sc.as_deref().map(|r| (r, c_ld));
                    let matrix = flat.c_pad.is_some_and(|c| c.matrix);
                    mma_warp(&mut asm, p, s, &lt, &problem, &epi, false, sc, matrix)
                }
            };
            // C over A: once every warp holds its A fragments, C's copy takes A's place
            // (read from global memory now where beta needs it).
            let mut c_in = |asm: &mut Asm| {
                asm.op("bar.sync 0");
                if p.beta == Scalar::Zero {
                    return;
                }
                asm.comment("C into A's place in shared memory");
                if let (Some(c), Some(sc)) = (flat.c_pad, &sc) {
                    copy_c_pad(asm, c, sc, CopyC::In);
                } else {
                    copy_c_flat(asm, true);
                }
                asm.op("bar.sync 0");
            };
            let hook: Option<&mut dyn FnMut(&mut Asm)> =
                if flat.c_over_a { Some(&mut c_in) } else { None };
            let flat_ab = [flat.a.is_some(), flat.b.is_some()];
            mma_body(
                &mut asm,
                p,
                s,
                &layout,
                [&sa, &sb],
                flat_ab,
                &epi,
                &mw,
                hook,
            );
        }
    }
    if let (Some(c), Some(sc)) = (flat.c_pad, &sc) {
        asm.place(&cdone);
        asm.op("bar.sync 0");
        asm.op(format!("@{out} bra {exit}"));
        asm.comment("C back to global memory, column by column");
        copy_c_pad(&mut asm, c, sc, CopyC::Out);
    }
    if cflat_region.is_some() {
        asm.place(&cdone);
        asm.op("bar.sync 0");
        asm.comment("C back to global memory, flat");
        copy_c_flat(&mut asm, false);
    }
    asm.place(&exit);
    asm.op("ret");

    let (major, minor) = ptx_version(sm);
    let mut out = String::new();
    let _ = writeln!(out, "//\n// Generated by smallgemm-codegen-ptx\n//");
    let _ = writeln!(out, ".version {major}.{minor}");
    let _ = writeln!(out, ".target {}", sm.name());
    let _ = writeln!(out, ".address_size 64\n");
    let _ = writeln!(out, ".extern .shared .align 16 .b8 smem[];\n");
    let _ = writeln!(out, ".visible .entry {entry}(");
    let _ = writeln!(out, "\t{}\n)", params.join(",\n\t"));
    let flat_any = flat.a.is_some() || flat.b.is_some() || flat.c.is_some();
    let shared = if s.mma.is_none() || flat_any || flat.c_pad.is_some() {
        flat.shared_bytes
    } else {
        res.shared_bytes
    };
    let _ = writeln!(out, ".maxntid {}, 1, 1", res.threads_per_block);
    let narrow_c = flat.c_pad.is_some_and(|c| c.cv < 8);
    if s.min_blocks > 0 || (s.mma.is_some() && (flat.c.is_some() || narrow_c)) {
        // Tensor-core kernels with C in shared memory at sizes that are no multiple of 8
        // (C flat, or padded with 4- or 8-byte column copies): ask ptxas for as many blocks
        // per SM as shared memory and the warp slots allow. Left alone it spent registers
        // past that (89 at 16 warps: 63 against 32, 2 blocks instead of 4; 122: 72, one
        // block instead of 2) and lost up to 14 points of the bound on the H100; with the
        // cap, at most 20 bytes of spills, and 67..126 gained up to 16 points. The kernels
        // with 16-byte C copies (multiples of 8) measured mixed (112 +9, 96 -5, 120 -3):
        // left alone there, but a schedule may ask for its own count (`min_blocks`, a
        // tuner dimension): at 112 and 104, 2 and 3 blocks let ptxas take 56 and 40
        // registers against 40 and 32, the blocks per SM unchanged (shared memory allows
        // 2 and 3), and gained 8-11 and 0-2 points (docs/gpu-notes.md, version 9).
        let smem = match sm {
            Sm::Sm80 => 164 * 1024,
            Sm::Sm90 => 228 * 1024,
        };
        // 1 KiB of shared memory per block is the system's.
        let mut blocks = (smem / (shared + 1024))
            .min(2048 / res.threads_per_block as usize)
            .min(32);
        if s.min_blocks > 0 {
            blocks = blocks.min(s.min_blocks as usize);
        }
        if blocks > 1 {
            let _ = writeln!(out, ".minnctapersm {blocks}");
        }
    }
    out.push_str("{\n");
    out.push_str(&asm.declarations());
    out.push('\n');
    out.push_str(&asm.body);
    out.push_str("}\n");
    (out, shared)
}

#[allow(clippy::too_many_arguments)]
fn problem_regs(
    asm: &mut Asm,
    p: &ColMajorProblem,
    kind: BatchKind,
    ga: &str,
    gb: &str,
    gc: &str,
    gdims: Option<&str>,
    pi: &str,
) -> ProblemRegs {
    let fixed = |v: usize| Extent {
        max: v,
        runtime: None,
    };
    let elt = p.dtype.size();
    match kind {
        BatchKind::Strided => {
            let mut at = |base: &str, stride: usize| {
                let off = asm.reg(Kind::B64);
                asm.op(format!("mul.wide.u32 {off}, {pi}, {}", stride * elt));
                let r = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {r}, {base}, {off}"));
                r
            };
            ProblemRegs {
                a: at(ga, p.stride_a),
                b: at(gb, p.stride_b),
                c: at(gc, p.stride_c),
                m: fixed(p.m),
                n: fixed(p.n),
                k: fixed(p.k),
                lda: fixed(p.lda),
                ldb: fixed(p.ldb),
                ldc: fixed(p.ldc),
            }
        }
        BatchKind::PointerArray | BatchKind::VariableSize => {
            let off = asm.reg(Kind::B64);
            asm.op(format!("mul.wide.u32 {off}, {pi}, 8"));
            let mut at = |base: &str| {
                let slot = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {slot}, {base}, {off}"));
                let raw = asm.reg(Kind::B64);
                asm.op(format!("ld.global.nc.u64 {raw}, [{slot}]"));
                let r = asm.reg(Kind::B64);
                asm.op(format!("cvta.to.global.u64 {r}, {raw}"));
                r
            };
            let (a, b, c) = (at(ga), at(gb), at(gc));
            let mut regs = ProblemRegs {
                a,
                b,
                c,
                m: fixed(p.m),
                n: fixed(p.n),
                k: fixed(p.k),
                lda: fixed(p.lda),
                ldb: fixed(p.ldb),
                ldc: fixed(p.ldc),
            };
            if let Some(dims) = gdims {
                let off = asm.reg(Kind::B64);
                asm.op(format!("mul.wide.u32 {off}, {pi}, 24"));
                let base = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {base}, {dims}, {off}"));
                let mut field = |i: usize| {
                    let r = asm.reg(Kind::B32);
                    asm.op(format!("ld.global.nc.u32 {r}, [{base}+{}]", 4 * i));
                    r
                };
                // The caller's (m, n, k, lda, ldb, ldc); row-major problems swap A and B.
                let (um, un, uk, ulda, uldb, uldc) =
                    (field(0), field(1), field(2), field(3), field(4), field(5));
                let (km, kn, klda, kldb) = if p.swap_operands {
                    (un, um, uldb, ulda)
                } else {
                    (um, un, ulda, uldb)
                };
                let rt = |max: usize, r: String| Extent {
                    max,
                    runtime: Some(r),
                };
                regs.m = rt(p.m, km);
                regs.n = rt(p.n, kn);
                regs.k = rt(p.k, uk);
                regs.lda = rt(p.lda, klda);
                regs.ldb = rt(p.ldb, kldb);
                regs.ldc = rt(p.ldc, uldc);
            }
            regs
        }
    }
}

/// How accumulators become C: alpha, beta and the conversions.
struct Epilogue {
    dtype: Dtype,
    sdt: Dtype,
    skind: Kind,
    sty: &'static str,
    alpha: Scalar,
    beta: Scalar,
    alpha_reg: Option<String>,
    beta_reg: Option<String>,
}

impl Epilogue {
    /// C[addr] = alpha * v + beta * C[addr], with `v` in the epilogue type; `pred` guards.
    fn store(
        &self,
        asm: &mut Asm,
        v: &str,
        addr: &str,
        pred: &Option<String>,
        old: Option<&str>,
        space: &str,
    ) {
        let result = self.combine(asm, v, |asm| match old {
            Some(o) => o.to_string(),
            None => self.load(asm, addr, pred, space),
        });
        let sty = self.sty;
        match self.dtype {
            Dtype::F16 => {
                let h = asm.reg(Kind::B16);
                asm.op(format!("cvt.rn.f16.f32 {h}, {result}"));
                asm.op(format!("{}st.{space}.b16 [{addr}], {h}", guard(pred)));
            }
            _ => asm.op(format!(
                "{}st.{space}.{sty} [{addr}], {result}",
                guard(pred)
            )),
        }
    }

    /// alpha * v + beta * old in the epilogue type, `old` (C's old value in that type)
    /// asked for only where beta needs it.
    fn combine(&self, asm: &mut Asm, v: &str, old: impl FnOnce(&mut Asm) -> String) -> String {
        let sty = self.sty;
        let scaled = match self.alpha {
            Scalar::One => v.to_string(),
            Scalar::MinusOne => {
                let r = asm.reg(self.skind);
                asm.op(format!("neg.{sty} {r}, {v}"));
                r
            }
            Scalar::Zero => {
                let r = asm.reg(self.skind);
                asm.op(format!("mov.{sty} {r}, {}", literal(self.sdt, 0.0)));
                r
            }
            Scalar::Runtime | Scalar::Fixed(_) => {
                let a = match &self.alpha_reg {
                    Some(r) => r.clone(),
                    None => literal(self.sdt, self.alpha.value().unwrap_or(1.0)),
                };
                let r = asm.reg(self.skind);
                asm.op(format!("mul.rn.{sty} {r}, {v}, {a}"));
                r
            }
        };
        if self.beta == Scalar::Zero {
            scaled
        } else {
            let old = old(asm);
            let r = asm.reg(self.skind);
            match self.beta {
                Scalar::One => asm.op(format!("add.rn.{sty} {r}, {scaled}, {old}")),
                Scalar::MinusOne => asm.op(format!("sub.rn.{sty} {r}, {scaled}, {old}")),
                _ => {
                    let b = match &self.beta_reg {
                        Some(reg) => reg.clone(),
                        None => literal(self.sdt, self.beta.value().unwrap_or(0.0)),
                    };
                    asm.op(format!("fma.rn.{sty} {r}, {b}, {old}, {scaled}"));
                }
            }
            r
        }
    }

    fn load(&self, asm: &mut Asm, addr: &str, pred: &Option<String>, space: &str) -> String {
        match self.dtype {
            Dtype::F16 => {
                let h = asm.reg(Kind::B16);
                asm.op(format!("mov.b16 {h}, 0x0000"));
                asm.op(format!("{}ld.{space}.b16 {h}, [{addr}]", guard(pred)));
                let r = asm.reg(Kind::F32);
                asm.op(format!("cvt.f32.f16 {r}, {h}"));
                r
            }
            _ => {
                let r = asm.reg(self.skind);
                asm.op(format!("mov.{} {r}, {}", self.sty, literal(self.sdt, 0.0)));
                asm.op(format!(
                    "{}ld.{space}.{} {r}, [{addr}]",
                    guard(pred),
                    self.sty
                ));
                r
            }
        }
    }
}

/// FMA kernels: thread (tx, ty) of its problem owns rows tx + a * TM and columns
/// ty + b * TN of C (a < rm, b < rn), so a warp reads consecutive rows of A (no bank
/// conflict) and a broadcast or odd-strided element of B.
#[allow(clippy::too_many_arguments)]
fn fma_body(
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
struct CTile {
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
fn fma_c_tile(
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

/// A warp's place in a tensor-core kernel and its tiles of C.
struct MmaWarp {
    lane: String,
    gid: String,
    tig: String,
    tiles: Vec<MmaTile>,
    /// Tiles per group: consecutive tiles of one row tile that share A's fragments.
    group: usize,
    /// Where the slots' addresses point: "global", or "shared" with C staged flat.
    space: &'static str,
    /// Per lane, whether slot e of each tile holds accumulator e ^ 1 (first) and e ^ 2
    /// (second) instead of e: see [`epilogue_swap_table`]. None: not swapped.
    swaps: [Option<String>; 2],
    /// `GpuSchedule::column_sweep`: each group is every row tile of one column tile, row
    /// tile i its i-th tile; A's fragments of every row tile are loaded once.
    sweep: bool,
    /// Where the tiles' slots come in `mma_body`, before each epilogue (column sweep
    /// without the C prefetch): what they need.
    gen: Option<SlotGen>,
    /// C's padded copy in shared memory moved a tile at a time by `ldmatrix` and
    /// `stmatrix` (`CPad::matrix`; the tiles then have no slots): the copy's address and
    /// this lane's byte offset of the row it gives them (lane l: column l % 8, rows 8
    /// (l / 8 % 2) on, of the tile), and the copy's column stride in elements.
    matrix: Option<(String, String, usize)>,
}

/// The lane-dependent order in which a warp's lanes visit the four accumulators of a tile
/// in the epilogue through shared memory, as a table over the lane's column pair `tig`:
/// lane (gid, tig) takes accumulator `e ^ table[tig]` at its e-th access. Where C's copy
/// has columns `ld` halves apart with `ld` odd, the lanes' elements of one accumulator fall
/// into few banks (4 distinct words a bank where `ld` is 1 or 31 mod 32: 33, 97), so
/// lanes of different `tig` take different accumulators at once. The table is the one
/// with the fewest bank conflicts over the copy's possible alignments (then the fewest
/// swaps); all zeros (the plain order) unless another is strictly better.
fn epilogue_swap_table(ld: usize) -> [usize; 4] {
    let cost = |table: [usize; 4]| -> usize { epilogue_degrees(ld, table).sum() };
    let swaps = |t: [usize; 4]| t.iter().fold(0, |bits, h| bits | h).count_ones();
    let mut best = [0; 4];
    let mut best_cost = cost(best);
    for code in 1..256usize {
        let table = std::array::from_fn(|t| (code >> (2 * t)) & 3);
        let c = cost(table);
        if c < best_cost || (c == best_cost && best != [0; 4] && swaps(table) < swaps(best)) {
            best = table;
            best_cost = c;
        }
    }
    best
}

/// The bank conflict degree of each of a warp's four epilogue accesses to C's copy
/// (columns `ld` halves apart) under `table` (see [`epilogue_swap_table`]), for each of the
/// copy's eight alignments (halves past a 16-byte boundary).
fn epilogue_degrees(ld: usize, table: [usize; 4]) -> impl Iterator<Item = usize> {
    (0..8)
        .flat_map(|base| (0..4).map(move |e| (base, e)))
        .map(move |(base, e)| {
            bank_degree(32, 2, |lane| {
                let (gid, tig) = (lane / 4, lane % 4);
                let x = e ^ table[tig];
                2 * (base + ld * (2 * tig + (x & 1)) + gid + 8 * (x >> 1))
            })
        })
}

/// Tiles a warp computes together, at most the row's tiles: where the warps do not keep one
/// row of tiles each, `GpuSchedule::mma_group` consecutive column tiles of one row tile
/// that share each k step's A fragment; where they do, `GpuSchedule::row_group` of the
/// warp's own column tiles, their accumulator chains interleaved.
fn mma_group(s: &GpuSchedule, p: &ColMajorProblem) -> usize {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let mt = p.m.div_ceil(shape.m as usize);
    let nt = p.n.div_ceil(shape.n as usize);
    // Warps that keep one row of tiles each group their column tiles by `row_group`.
    let group = if (s.warps as usize) % mt == 0 {
        s.row_group
    } else {
        s.mma_group
    };
    (group as usize).clamp(1, nt.max(1))
}

/// One 16x8 tile of C a warp computes: its row and column tile, whether it exists (the
/// last round of tiles may be short), and per accumulator c0..c3 the address in C, the
/// guard and (when prefetched) the old value.
struct MmaTile {
    tmr: String,
    tnr: String,
    /// The largest column tile `tnr` can be (in any warp).
    tn_max: usize,
    valid: Option<String>,
    /// Grouped tiles: whether this one lies past the last column tile (None: never).
    hangs: Option<String>,
    /// Per accumulator slot: its address, its guard, and C's old value where prefetched
    /// (empty where `MmaWarp::gen` makes them later).
    slots: Vec<Slot>,
}

/// A byte offset from a slot's base: an immediate, or (swapped slots,
/// [`epilogue_swap_table`]) a lane-dependent register.
#[derive(Clone)]
enum Offset {
    Imm(usize),
    Reg(String),
}

impl Offset {
    /// `self + other`: an immediate where both are, else a register (emitted here).
    fn add(&self, asm: &mut Asm, other: &Offset) -> Offset {
        let (x, y) = match (self, other) {
            (Offset::Imm(x), Offset::Imm(y)) => return Offset::Imm(x + y),
            (Offset::Reg(x), Offset::Imm(y)) | (Offset::Imm(y), Offset::Reg(x)) => {
                (x.clone(), y.to_string())
            }
            (Offset::Reg(x), Offset::Reg(y)) => (x.clone(), y.clone()),
        };
        let r = asm.reg(Kind::B32);
        asm.op(format!("add.u32 {r}, {x}, {y}"));
        Offset::Reg(r)
    }
}

/// A slot's address: a base register plus an offset; a register offset is added only at
/// the access, so that the tiles' addresses do not all hold registers through the k loop.
struct SlotAddr {
    base: String,
    offset: Offset,
}

impl SlotAddr {
    /// The address as an operand (emits the add of a register offset).
    fn operand(&self, asm: &mut Asm) -> String {
        match &self.offset {
            Offset::Imm(d) => format!("{}+{d}", self.base),
            Offset::Reg(r) => {
                let a = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {a}, {}, {r}", self.base));
                a
            }
        }
    }
}

/// The tiles of C of this thread's warp, with their addresses in C; with `prefetch`, the
/// old values of C (beta != 0) are loaded here, all before any is stored. When the warp
/// count is a multiple of the row tiles, a warp keeps one row of tiles (its A fragments are
/// loaded once). With `sc` (C staged in shared memory: this problem's copy starts at the
/// register, columns the given number of elements apart) the slots address that copy
/// instead of global C.
#[allow(clippy::too_many_arguments)]
fn mma_warp(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    lt: &str,
    problem: &ProblemRegs,
    epi: &Epilogue,
    prefetch: bool,
    sc: Option<(&str, usize)>,
    matrix: bool,
) -> MmaWarp {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let w = s.warps as usize;
    let mt = p.m.div_ceil(shape.m as usize);
    let nt = p.n.div_ceil(shape.n as usize);
    let tiles = mt * nt;
    let reuse = w % mt == 0;
    let warp = asm.reg(Kind::B32);
    asm.op(format!("shr.u32 {warp}, {lt}, 5"));
    let lane = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {lane}, {lt}, 31"));
    let gid = asm.reg(Kind::B32);
    asm.op(format!("shr.u32 {gid}, {lane}, 2"));
    let tig = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {tig}, {lane}, 3"));
    let fixed_row = (reuse && !s.column_sweep_apply()).then(|| {
        let tmr = asm.reg(Kind::B32);
        asm.op(format!("rem.u32 {tmr}, {warp}, {mt}"));
        tmr
    });
    let ldc = match sc {
        Some((_, ld)) => ld,
        None => problem.ldc.max,
    };
    // Swapped accumulators (`GpuSchedule::epilogue_swaps`, C in shared memory): this
    // lane's slot e is accumulator e ^ h, h = table[tig]: row and column of slot 0 move by
    // 8 h1 and h0, slots 1..3 lie (1 - 2 h0) columns and (1 - 2 h1) * 8 rows from it
    // (`steps`, bytes).
    let table = match sc {
        Some(_) if s.epilogue_swaps_apply() => epilogue_swap_table(ldc),
        _ => [0; 4],
    };
    let mut swaps: [Option<String>; 2] = Default::default();
    let mut shifts: [Option<String>; 2] = Default::default();
    let mut steps = [Offset::Imm(0), Offset::Imm(2 * ldc), Offset::Imm(16)];
    if table != [0; 4] {
        let code: usize = table.iter().enumerate().map(|(t, h)| h << (2 * t)).sum();
        let h = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {h}, {tig}, 1"));
        asm.op(format!("shr.u32 {h}, {code}, {h}"));
        let used = table.iter().fold(0, |bits, h| bits | h);
        for (bit, (swap, shift)) in swaps.iter_mut().zip(&mut shifts).enumerate() {
            if used & (1 << bit) == 0 {
                continue;
            }
            // The bit, as a predicate and as the shift of slot 0 (1 column, 8 rows).
            let b = asm.reg(Kind::B32);
            asm.op(format!("bfe.u32 {b}, {h}, {bit}, 1"));
            let pr = asm.reg(Kind::Pred);
            asm.op(format!("setp.ne.u32 {pr}, {b}, 0"));
            let unit = [1, 8][bit];
            let sh = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {sh}, {b}, {unit}"));
            // Bytes from slot 0 to the slot one step along this bit: +-(2 ldc) or +-16.
            let bytes = [2 * ldc, 16][bit];
            let st = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {st}, {b}, {}", 2 * bytes));
            asm.op(format!("sub.u32 {st}, {bytes}, {st}"));
            steps[1 + bit] = Offset::Reg(st);
            *swap = Some(pr);
            *shift = Some(sh);
        }
    }
    // Slot 3: one step along each bit.
    let both = steps[1].add(asm, &steps[2]);
    let steps = [steps[0].clone(), steps[1].clone(), steps[2].clone(), both];
    let sweep = s.column_sweep_apply();
    let group = if sweep { mt } else { mma_group(s, p) };
    // Groups of `group` tiles of one row tile (consecutive column tiles) in turn: a
    // group's tiles share their A fragments (`mma_body`). Column sweep: every row tile of
    // column tiles warp, warp + w, ... (a group each, sharing its B fragments).
    let groups = mt * nt.div_ceil(group);
    let rounds = match (&fixed_row, sweep) {
        (_, true) => nt.div_ceil(w),
        (Some(_), false) => tiles.div_ceil(w),
        (None, false) => groups.div_ceil(w),
    };
    let row_tiles: Vec<String> = if sweep {
        (0..mt).map(|i| asm.imm32(i as u64)).collect()
    } else {
        Vec::new()
    };
    let gen = SlotGen {
        gid: gid.clone(),
        tig: tig.clone(),
        shifts,
        steps,
        swaps: swaps.clone(),
        ldc,
        sc: sc.map(|(r, _)| r.to_string()),
        c: problem.c.clone(),
    };
    let deferred = sweep && !prefetch;
    let matrix = sc.filter(|_| matrix).map(|(base, ldc)| {
        let (l7, l8, off) = (asm.reg(Kind::B32), asm.reg(Kind::B32), asm.reg(Kind::B32));
        asm.op(format!("and.b32 {l7}, {lane}, 7"));
        asm.op(format!("and.b32 {l8}, {lane}, 8"));
        asm.op(format!("mad.lo.u32 {off}, {l7}, {ldc}, {l8}"));
        asm.op(format!("shl.b32 {off}, {off}, 1"));
        (base.to_string(), off, ldc)
    });
    let mut out = Vec::new();
    for q in 0..rounds {
        let mut coords = Vec::new();
        match &fixed_row {
            _ if sweep => {
                let tnr = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {tnr}, {warp}, {}", q * w));
                let valid = ((q + 1) * w > nt).then(|| asm.lt(&tnr, &nt.to_string()));
                for tmr in &row_tiles {
                    coords.push((
                        tmr.clone(),
                        tnr.clone(),
                        (q + 1) * w - 1,
                        valid.clone(),
                        None,
                    ));
                }
            }
            Some(tmr) => {
                // Row tile w % mt, column tiles w / mt + q * (w / mt).
                let step = w / mt;
                let tnr = asm.reg(Kind::B32);
                asm.op(format!("div.u32 {tnr}, {warp}, {mt}"));
                if q > 0 {
                    asm.op(format!("add.u32 {tnr}, {tnr}, {}", q * step));
                }
                let valid = ((q + 1) * step > nt).then(|| asm.lt(&tnr, &nt.to_string()));
                // In groups (`row_group`), a tile past the last column tile after the
                // group's first is computed (on clamped B) and never stored.
                let hangs = if group > 1 { valid.clone() } else { None };
                coords.push((tmr.clone(), tnr, (q + 1) * step - 1, valid, hangs));
            }
            None => {
                let t = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {t}, {warp}, {}", q * w));
                let valid = ((q + 1) * w > groups).then(|| asm.lt(&t, &groups.to_string()));
                let tmr = asm.reg(Kind::B32);
                let tn0 = asm.reg(Kind::B32);
                asm.op(format!("rem.u32 {tmr}, {t}, {mt}"));
                asm.op(format!("div.u32 {tn0}, {t}, {mt}"));
                let tn0_max = ((q + 1) * w - 1) / mt;
                if group == 1 {
                    coords.push((tmr, tn0, tn0_max, valid, None));
                } else {
                    asm.op(format!("mul.lo.u32 {tn0}, {tn0}, {group}"));
                    for j in 0..group {
                        let tnr = asm.reg(Kind::B32);
                        asm.op(format!("add.u32 {tnr}, {tn0}, {j}"));
                        // The last group of a row may hang over the last column tile.
                        let inside =
                            (j > 0 && nt % group != 0).then(|| asm.lt(&tnr, &nt.to_string()));
                        let hangs = asm.and(valid.clone(), inside.clone());
                        let guard = inside.and(hangs.clone());
                        coords.push((tmr.clone(), tnr, tn0_max * group + j, hangs, guard));
                    }
                }
            }
        }
        for (tmr, tnr, tn_max, valid, hangs) in coords {
            // Column sweep: the slots of each tile come in `mma_body`, just before its
            // epilogue (fewer registers and predicates live through the mma).
            let slots = if deferred || matrix.is_some() {
                Vec::new()
            } else {
                gen.slots(asm, p, epi, &tmr, &tnr, &valid, &hangs, prefetch, None)
            };
            out.push(MmaTile {
                tmr,
                tnr,
                tn_max,
                valid,
                hangs,
                slots,
            });
        }
    }
    MmaWarp {
        lane,
        gid,
        tig,
        tiles: out,
        group,
        space: if sc.is_some() { "shared" } else { "global" },
        swaps,
        sweep,
        gen: (deferred && matrix.is_none()).then_some(gen),
        matrix,
    }
}

/// What the slots of a tile of C need: the lane's place, the epilogue swaps
/// ([`epilogue_swap_table`]: the shifts of slot 0, the steps to slots 1..3), and where C
/// (or its copy in shared memory, columns `ldc` apart) is.
struct SlotGen {
    gid: String,
    tig: String,
    shifts: [Option<String>; 2],
    steps: [Offset; 4],
    swaps: [Option<String>; 2],
    ldc: usize,
    sc: Option<String>,
    c: String,
}

impl SlotGen {
    /// A tile's four slots: address, guard and (`prefetch`) C's old value. `fixed`: the
    /// row tile and (where known) the column tile, known here (column sweep): the guards
    /// then only where the tile reaches past m or n, and a slot whose rows lie past m for
    /// every lane is dead (None).
    #[allow(clippy::too_many_arguments)]
    fn slots(
        &self,
        asm: &mut Asm,
        p: &ColMajorProblem,
        epi: &Epilogue,
        tmr: &str,
        tnr: &str,
        valid: &Option<String>,
        hangs: &Option<String>,
        prefetch: bool,
        fixed: Option<(usize, Option<usize>)>,
    ) -> Vec<Slot> {
        let (gid, tig, ldc) = (&self.gid, &self.tig, self.ldc);
        // c0, c1 at (row, col), (row, col + 1); c2, c3 eight rows down (slot 0 swapped
        // to accumulator h: `shifts`).
        let row = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {row}, {tmr}, 16, {gid}"));
        let col = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {col}, {tig}, 1"));
        asm.op(format!("mad.lo.u32 {col}, {tnr}, 8, {col}"));
        if let Some(sh) = &self.shifts[0] {
            asm.op(format!("add.u32 {col}, {col}, {sh}"));
        }
        if let Some(sh) = &self.shifts[1] {
            asm.op(format!("add.u32 {row}, {row}, {sh}"));
        }
        let off = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {off}, {col}, {ldc}, {row}"));
        let cbase = match &self.sc {
            Some(sc) => {
                let r = asm.reg(Kind::B32);
                asm.op(format!("mad.lo.u32 {r}, {off}, 2, {sc}"));
                r
            }
            None => {
                let off64 = asm.reg(Kind::B64);
                asm.op(format!("mul.wide.u32 {off64}, {off}, 2"));
                let cbase = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {cbase}, {}, {off64}", self.c));
                cbase
            }
        };
        let (rows_needed, cols_needed) = match fixed {
            None => (p.m % 16 != 0, p.n % 8 != 0),
            Some((tm, tn)) => (
                16 * tm + 16 > p.m,
                tn.map_or(p.n % 8 != 0, |tn| 8 * tn + 8 > p.n),
            ),
        };
        let rp = swapped_below(asm, &row, 8, &self.swaps[1], p.m, rows_needed);
        let cp = swapped_below(asm, &col, 1, &self.swaps[0], p.n, cols_needed);
        let mut slots = Vec::new();
        // A grouped tile past the last column tile: computed (on clamped B), never stored.
        for i in 0..4 {
            // Rows 8 (i / 2) on, in every lane where rows are not swapped.
            let dead = fixed
                .is_some_and(|(tm, _)| self.swaps[1].is_none() && 16 * tm + 8 * (i / 2) >= p.m);
            if dead {
                slots.push(None);
                continue;
            }
            let pred = asm.and(rp[i / 2].clone(), cp[i % 2].clone());
            let pred = asm.and(pred, hangs.clone());
            let addr = SlotAddr {
                base: cbase.clone(),
                offset: self.steps[i].clone(),
            };
            let old = (prefetch && epi.beta != Scalar::Zero).then(|| {
                // A tile past the last one must not read: its address may lie outside C.
                let lp = asm.and(pred.clone(), valid.clone());
                let addr = addr.operand(asm);
                epi.load(asm, &addr, &lp, "global")
            });
            slots.push(Some((addr, pred, old)));
        }
        slots
    }
}

/// A slot of a tile of C: its address, its guard and C's old value where prefetched; None
/// where no lane stores it.
type Slot = Option<(SlotAddr, Option<String>, Option<String>)>;

/// `base + d < limit` and `base + delta < limit` with d = 0 (as predicates; None where
/// not `needed`), in the other order where `swapped` holds: `base` is then already
/// `delta` further on, and the other lies `delta` back.
fn swapped_below(
    asm: &mut Asm,
    base: &str,
    delta: u32,
    swapped: &Option<String>,
    limit: usize,
    needed: bool,
) -> [Option<String>; 2] {
    let Some(sw) = swapped else {
        return asm.offsets_below(base, [0, delta], limit, needed);
    };
    if !needed {
        return [None, None];
    }
    let other = asm.reg(Kind::B32);
    let back = asm.reg(Kind::B32);
    asm.op(format!("sub.u32 {back}, {base}, {delta}"));
    asm.op(format!("add.u32 {other}, {base}, {delta}"));
    asm.op(format!("selp.b32 {other}, {back}, {other}, {sw}"));
    [
        Some(asm.lt(base, &limit.to_string())),
        Some(asm.lt(&other, &limit.to_string())),
    ]
}

/// Tensor-core kernels: `warps` warps per problem; warp w takes 16x8 tiles of C in turn
/// (`MmaWarp`) and runs `mma.sync.m16n8k16` over the k padded to 16 (the padding is zeros
/// in shared memory; in the verbatim copies of `flat`, A and B under `flat_fragments`,
/// the loads of the padding are predicated off, their registers zero).
#[allow(clippy::too_many_arguments)]
fn mma_body(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    layout: &SharedLayout,
    [sa, sb]: [&str; 2],
    flat: [bool; 2],
    epi: &Epilogue,
    mw: &MmaWarp,
    after_a: Option<&mut dyn FnMut(&mut Asm)>,
) {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let w = s.warps as usize;
    let mt = p.m.div_ceil(shape.m as usize);
    let ks = p.k.div_ceil(shape.k as usize);
    let reuse = w % mt == 0 && !mw.sweep;
    let (lane, gid, tig) = (&mw.lane, &mw.gid, &mw.tig);
    // Verbatim copies (`flat`): per operand, the order in which each lane loads the two
    // halves of a fragment word (`fragment_swap_table`: against bank conflicts where k
    // pairs are not adjacent), as a bit per lane, the byte offsets of the two loads and
    // the `prmt` selector that puts the halves in k order.
    let k_steps = [layout.a_col, layout.b_row];
    let tables: [[usize; 4]; 2] = std::array::from_fn(|op| {
        let (row, rows) = [(layout.a_row, &[0, 8][..]), (layout.b_col, &[0][..])][op];
        if flat[op] {
            fragment_swap_table(row, k_steps[op], rows)
        } else {
            [0; 4]
        }
    });
    let swap_bits: [Option<String>; 2] = std::array::from_fn(|op| {
        let table = tables[op];
        (table != [0; 4]).then(|| {
            let code: usize = table.iter().enumerate().map(|(t, h)| h << t).sum();
            let x = asm.reg(Kind::B32);
            asm.op(format!("shr.u32 {x}, {code}, {tig}"));
            asm.op(format!("and.b32 {x}, {x}, 1"));
            x
        })
    });
    let sels: [Option<String>; 2] = std::array::from_fn(|op| {
        swap_bits[op].as_ref().map(|x| {
            // k first: bytes 0, 1 of the first load, then of the second (0x5410); k + 1
            // first: the other way round (0x1054).
            let sel = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {sel}, {x}, {}", 0x5410 ^ 0x1054));
            asm.op(format!("xor.b32 {sel}, {sel}, {}", 0x5410));
            sel
        })
    });
    // The k padding of a verbatim copy (`flat`): in the last k step, for each operand, the
    // first and the second eight halves of k (h) and each of a fragment word's two loads
    // (j: the half k = 2 tig + 8 h + (j ^ table[tig])), which lanes load it: a prefix of
    // the tigs (`Lanes::Some`: 2 tig below a limit), all or none.
    let mut padding: [[[Lanes; 2]; 2]; 2] = Default::default();
    if flat.contains(&true) && p.k % 16 != 0 {
        let tig2 = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {tig2}, {tig}, 1"));
        let last_k = 16 * (ks - 1);
        let mut preds: Vec<(usize, String)> = Vec::new();
        for (table, per_op) in tables.iter().zip(padding.iter_mut()) {
            for (h, per_half) in per_op.iter_mut().enumerate() {
                for (j, lanes) in per_half.iter_mut().enumerate() {
                    let limit = p.k.saturating_sub(last_k + 8 * h);
                    // Lane t loads half 2 t + (0 or 1): the live lanes are a prefix.
                    let live = (0..4).filter(|&t| 2 * t + (j ^ table[t]) < limit).count();
                    *lanes = match live {
                        0 => Lanes::None,
                        4 => Lanes::All,
                        _ => {
                            let pred = match preds.iter().find(|(l, _)| *l == live) {
                                Some((_, pred)) => pred.clone(),
                                None => {
                                    let pred = asm.lt(&tig2, &(2 * live).to_string());
                                    preds.push((live, pred.clone()));
                                    pred
                                }
                            };
                            Lanes::Some(pred)
                        }
                    };
                }
            }
        }
    }
    // The two loads of a word of operand `op` at k step k, half h of k, under the guard
    // `edge` (the word's row of A or column of B inside m or n; None: everywhere).
    let halves_at = |asm: &mut Asm, op: usize, k: usize, h: usize, edge: &Lanes| {
        let edge = match edge {
            Lanes::None => return [HalfLoad::Zero, HalfLoad::Zero],
            Lanes::All => None,
            Lanes::Some(pred) => Some(pred.clone()),
        };
        let kpad = if flat[op] && k + 1 == ks {
            padding[op][h].clone()
        } else {
            [Lanes::All, Lanes::All]
        };
        kpad.map(|lanes| match lanes {
            Lanes::None => HalfLoad::Zero,
            Lanes::All => HalfLoad::Load {
                pred: edge.clone(),
                zero: false,
            },
            Lanes::Some(pred) => HalfLoad::Load {
                pred: asm.and(Some(pred), edge.clone()),
                zero: true,
            },
        })
    };
    // A fragment word holds two halves adjacent in k: one 32-bit load where k is the
    // contiguous direction in shared memory, else two 16-bit loads packed. A verbatim copy
    // (`flat`) may leave the pair unaligned: two 16-bit loads (`halves`: each under its
    // guard, or zero past k), the first from `bases[0]`, the second from `bases[1]` (in
    // the order of the lane's `sel` where it has one: [`fragment_swap_table`]).
    let pair = |asm: &mut Asm,
                bases: &[String; 2],
                off: usize,
                step: usize,
                flat: bool,
                halves: [HalfLoad; 2],
                sel: &Option<String>|
     -> String {
        let r = asm.reg(Kind::B32);
        if step == 1 && !flat {
            asm.op(format!("ld.shared.b32 {r}, [{}+{off}]", bases[0]));
        } else if halves.iter().all(|h| matches!(h, HalfLoad::Zero)) {
            asm.op(format!("mov.b32 {r}, 0"));
        } else {
            let (kind, ty) = match sel {
                Some(_) => (Kind::B32, "u16"),
                None => (Kind::B16, "b16"),
            };
            let x = [asm.reg(kind), asm.reg(kind)];
            let mov = match sel {
                Some(_) => "mov.b32",
                None => "mov.b16",
            };
            for (i, (x, half)) in x.iter().zip(&halves).enumerate() {
                match half {
                    HalfLoad::Zero => asm.op(format!("{mov} {x}, 0")),
                    HalfLoad::Load { pred, zero } => {
                        if *zero {
                            asm.op(format!("{mov} {x}, 0"));
                        }
                        asm.op(format!(
                            "{}ld.shared.{ty} {x}, [{}+{}]",
                            guard(pred),
                            bases[i],
                            off + 2 * step * i
                        ));
                    }
                }
            }
            match sel {
                Some(sel) => asm.op(format!("prmt.b32 {r}, {}, {}, {sel}", x[0], x[1])),
                None => asm.op(format!("mov.b32 {r}, {{{}, {}}}", x[0], x[1])),
            }
        }
        r
    };
    // Lane offsets in bytes: A at (row gid, k 2 tig), B at (k 2 tig, column gid).
    let lane_off = |asm: &mut Asm, row_stride: usize, k_stride: usize| -> String {
        let r = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {r}, {tig}, {}", 4 * k_stride));
        asm.op(format!("mad.lo.u32 {r}, {gid}, {}, {r}", 2 * row_stride));
        r
    };
    let (a_row, a_col, b_row, b_col) = (layout.a_row, layout.a_col, layout.b_row, layout.b_col);
    let ldm = s.ldmatrix;
    let (a_lane, b_lane) = if ldm {
        // ldmatrix: lane l gives the address of row l % 8 of 8x8 matrix l / 8, a row being
        // 8 halves contiguous in shared memory (16-byte aligned: the padded leading
        // dimensions are multiples of 8 halves, tiles start at multiples of 8). A's four
        // matrices are (rows, k) = (0, 0), (8, 0), (0, 8), (8, 8); B's two are k = 0, 8.
        // Stored with rows contiguous (A not transposed, B transposed) the matrices are
        // read with `.trans`, which hands each lane the same elements as the mma layout.
        let a_step = if a_row == 1 { a_col } else { a_row };
        let b_step = if b_row == 1 { b_col } else { b_row };
        let r = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {r}, {lane}, 7"));
        let j0 = asm.reg(Kind::B32);
        asm.op(format!("bfe.u32 {j0}, {lane}, 3, 1"));
        let j1 = asm.reg(Kind::B32);
        asm.op(format!("bfe.u32 {j1}, {lane}, 4, 1"));
        let a = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {a}, {r}, {}", 2 * a_step));
        asm.op(format!("mad.lo.u32 {a}, {j0}, {}, {a}", 16 * a_row));
        asm.op(format!("mad.lo.u32 {a}, {j1}, {}, {a}", 16 * a_col));
        let b = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {b}, {r}, {}", 2 * b_step));
        asm.op(format!("mad.lo.u32 {b}, {j0}, {}, {b}", 16 * b_row));
        (a, b)
    } else {
        (
            lane_off(asm, layout.a_row, layout.a_col),
            lane_off(asm, layout.b_col, layout.b_row),
        )
    };
    // A lane's offsets for the first and the second load of a word: with its halves in
    // the other order (`swap_bits`), k + 1 first and k second.
    let lane_pair = |asm: &mut Asm, lane: String, op: usize| -> [String; 2] {
        match &swap_bits[op] {
            None => [lane.clone(), lane],
            Some(x) => {
                let d = 2 * k_steps[op];
                let first = asm.reg(Kind::B32);
                asm.op(format!("mad.lo.u32 {first}, {x}, {d}, {lane}"));
                let second = asm.reg(Kind::B32);
                asm.op(format!("mul.lo.u32 {second}, {x}, {d}"));
                asm.op(format!("sub.u32 {second}, {lane}, {second}"));
                [first, second]
            }
        }
    };
    let a_lanes = lane_pair(asm, a_lane, 0);
    let b_lanes = lane_pair(asm, b_lane, 1);
    let a_trans = if a_row == 1 { ".trans" } else { "" };
    let b_trans = if b_row == 1 { "" } else { ".trans" };
    // Rows of A past m (columns of B past n) in a verbatim copy: not loaded (what they
    // would give reaches only rows (columns) of the product that are never stored). A:
    // where the words of row tile `tm` (its least, where the warp's row tile is not known
    // here) rows 8 r on lie past m; B: the lanes of a column tile that may reach past n.
    let a_edge = |tm: usize| -> [Lanes; 2] {
        std::array::from_fn(|r| {
            if flat[0] && 16 * tm + 8 * r >= p.m {
                Lanes::None
            } else {
                Lanes::All
            }
        })
    };
    let b_edge = |asm: &mut Asm, tile: &MmaTile| -> Lanes {
        if !flat[1] || 8 * (tile.tn_max + 1) <= p.n {
            return Lanes::All;
        }
        let col = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {col}, {}, 8, {gid}", tile.tnr));
        Lanes::Some(asm.lt(&col, &p.n.to_string()))
    };
    // A last k step of at most 8 in verbatim copies: `mma.m16n8k8`, the fragments' first
    // halves of k alone.
    let narrow = |k: usize| flat.contains(&true) && k + 1 == ks && (1..=8).contains(&(p.k % 16));
    let load_a = |asm: &mut Asm, abase: &[String; 2], edge: &[Lanes; 2], k: usize| -> Vec<String> {
        let kb = k * 16 * a_col * 2;
        if ldm {
            let r: Vec<String> = (0..4).map(|_| asm.reg(Kind::B32)).collect();
            asm.op(format!(
                "ldmatrix.sync.aligned.m8n8.x4{a_trans}.shared.b16 {{{}}}, [{}+{kb}]",
                r.join(", "),
                abase[0]
            ));
            return r;
        }
        // {a0 a1}: (gid, 2tig), {a2 a3}: row + 8, {a4 a5}: k + 8, {a6 a7}: both.
        let offs = [
            (kb, 0, 0),
            (kb + 8 * a_row * 2, 1, 0),
            (kb + 8 * a_col * 2, 0, 1),
            (kb + 8 * a_row * 2 + 8 * a_col * 2, 1, 1),
        ];
        let words = if narrow(k) { &offs[..2] } else { &offs[..] };
        words
            .iter()
            .map(|&(o, r, h)| {
                let halves = halves_at(asm, 0, k, h, &edge[r]);
                pair(asm, abase, o, a_col, flat[0], halves, &sels[0])
            })
            .collect()
    };
    let load_b = |asm: &mut Asm, bbase: &[String; 2], edge: &Lanes, k: usize| -> Vec<String> {
        let kb = k * 16 * b_row * 2;
        if ldm {
            let r: Vec<String> = (0..2).map(|_| asm.reg(Kind::B32)).collect();
            asm.op(format!(
                "ldmatrix.sync.aligned.m8n8.x2{b_trans}.shared.b16 {{{}}}, [{}+{kb}]",
                r.join(", "),
                bbase[0]
            ));
            return r;
        }
        // {b0 b1}: (2tig, gid), {b2 b3}: k + 8.
        let words = if narrow(k) { 1 } else { 2 };
        [(kb, 0), (kb + 8 * b_row * 2, 1)][..words]
            .iter()
            .map(|&(o, h)| {
                let halves = halves_at(asm, 1, k, h, edge);
                pair(asm, bbase, o, b_row, flat[1], halves, &sels[1])
            })
            .collect()
    };
    let tile_base =
        |asm: &mut Asm, base: &str, t: &str, bytes: usize, lanes: &[String; 2]| -> [String; 2] {
            let r = asm.reg(Kind::B32);
            asm.op(format!("mad.lo.u32 {r}, {t}, {bytes}, {base}"));
            if lanes[0] == lanes[1] {
                asm.op(format!("add.u32 {r}, {r}, {}", lanes[0]));
                return [r.clone(), r];
            }
            let second = asm.reg(Kind::B32);
            asm.op(format!("add.u32 {second}, {r}, {}", lanes[1]));
            asm.op(format!("add.u32 {r}, {r}, {}", lanes[0]));
            [r, second]
        };
    let mut fixed_a: Option<Vec<Vec<String>>> = None;
    if reuse {
        let tmr = &mw.tiles[0].tmr;
        let abase = tile_base(asm, sa, tmr, 16 * a_row * 2, &a_lanes);
        let edge = a_edge(0);
        fixed_a = Some((0..ks).map(|k| load_a(asm, &abase, &edge, k)).collect());
    }
    // Column sweep: the A fragments of every row tile (tile i of the first group is row
    // tile i), all loaded before any tile.
    let rows_a: Vec<Vec<Vec<String>>> = if mw.sweep {
        mw.tiles[..mt]
            .iter()
            .enumerate()
            .map(|(i, tile)| {
                let abase = tile_base(asm, sa, &tile.tmr, 16 * a_row * 2, &a_lanes);
                let edge = a_edge(i);
                (0..ks).map(|k| load_a(asm, &abase, &edge, k)).collect()
            })
            .collect()
    } else {
        Vec::new()
    };
    // (`c_over_a`: only with every warp's A fragments in registers.)
    assert!(after_a.is_none() || reuse || mw.sweep);
    if let Some(f) = after_a {
        f(asm);
    }
    let nt = p.n.div_ceil(shape.n as usize);
    for (q, tiles) in mw.tiles.chunks(mw.group).enumerate() {
        asm.comment(&format!("tile {q} of this warp"));
        let skip = asm.label();
        if let Some(v) = &tiles[0].valid {
            // Warp-uniform: every lane of the warp has the same tiles.
            asm.op(format!("@!{v} bra.uni {skip}"));
        }
        // B's bases: one per tile, or one for the whole group (column sweep).
        let b_tiles = if mw.sweep { &tiles[..1] } else { tiles };
        let bbases: Vec<([String; 2], Lanes)> = b_tiles
            .iter()
            .enumerate()
            .map(|(j, tile)| {
                // A tile after the group's first may lie past the last column tile: in
                // `mma_group`'s groups (consecutive column tiles) where they do not divide
                // the row, in `row_group`'s (each warp's own row) where the tile has a
                // validity guard.
                let may_hang = if reuse {
                    tile.valid.is_some()
                } else {
                    nt % mw.group != 0
                };
                let base = if j > 0 && may_hang {
                    // Past the last column tile: B clamped inside its copy (never stored).
                    let t = asm.reg(Kind::B32);
                    asm.op(format!("min.u32 {t}, {}, {}", tile.tnr, nt - 1));
                    tile_base(asm, sb, &t, 8 * b_col * 2, &b_lanes)
                } else {
                    tile_base(asm, sb, &tile.tnr, 8 * b_col * 2, &b_lanes)
                };
                (base, b_edge(asm, tile))
            })
            .collect();
        let abase = (!reuse && !mw.sweep).then(|| {
            let base = tile_base(asm, sa, &tiles[0].tmr, 16 * a_row * 2, &a_lanes);
            (base, a_edge(0))
        });
        let accs: Vec<[String; 4]> = tiles
            .iter()
            .map(|_| std::array::from_fn(|_| asm.reg(Kind::F32)))
            .collect();
        for r in accs.iter().flatten() {
            asm.op(format!("mov.f32 {r}, 0f00000000"));
        }
        let mma = |asm: &mut Asm, acc: &[String; 4], a: &[String], b: &[String]| {
            let d = acc.join(", ");
            let kk = 8 * b.len();
            asm.op(format!(
                "mma.sync.aligned.m16n8k{kk}.row.col.f32.f16.f16.f32 {{{d}}}, {{{}}}, {{{}}}, {{{d}}}",
                a.join(", "),
                b.join(", ")
            ));
        };
        for k in 0..ks {
            if mw.sweep {
                let (bbase, edge) = &bbases[0];
                let b = load_b(asm, bbase, edge, k);
                for (acc, a) in accs.iter().zip(&rows_a) {
                    mma(asm, acc, &a[k], &b);
                }
                continue;
            }
            let a = match (&abase, &fixed_a) {
                (Some((base, edge)), _) => load_a(asm, base, edge, k),
                (None, Some(frags)) => frags[k].clone(),
                (None, None) => unreachable!("A's fragments: loaded per tile or per warp"),
            };
            for (acc, (bbase, edge)) in accs.iter().zip(&bbases) {
                let b = load_b(asm, bbase, edge, k);
                mma(asm, acc, &a, &b);
            }
        }
        if let Some((base, off, ldc)) = &mw.matrix {
            // `epilogue_loads_first`: every tile's `ldmatrix` of the group before the
            // first `stmatrix` (ptxas keeps a shared load after a store it cannot tell
            // apart).
            let mut olds = Vec::new();
            for (acc, tile) in accs.iter().zip(tiles) {
                let old = matrix_load(asm, epi, tile, base, off, *ldc);
                if s.epilogue_loads_first_apply() {
                    olds.push(old);
                } else {
                    matrix_store(asm, epi, acc, tile, old);
                }
            }
            for ((acc, tile), old) in accs.iter().zip(tiles).zip(olds) {
                matrix_store(asm, epi, acc, tile, old);
            }
        } else {
            for (i, (acc, tile)) in accs.iter().zip(tiles).enumerate() {
                let late;
                let slots = match &mw.gen {
                    // Column sweep: row tile i, column tile q where one warp takes them all.
                    Some(gen) => {
                        let tn = (w == 1).then_some(q);
                        let fixed = Some((i, tn));
                        let (tmr, tnr) = (&tile.tmr, &tile.tnr);
                        late = gen.slots(
                            asm,
                            p,
                            epi,
                            tmr,
                            tnr,
                            &tile.valid,
                            &tile.hangs,
                            false,
                            fixed,
                        );
                        &late
                    }
                    None => &tile.slots,
                };
                let acc = swapped(asm, acc, &mw.swaps);
                // `epilogue_loads_first`: the tile's old values of C all loaded before any
                // result is stored (ptxas does not move a load above a store it cannot tell
                // apart). Not across the tiles of a group: on an H200 that spilled or cost
                // occupancy at most sizes with groups (docs/gpu-notes.md, version 32).
                let first = s.epilogue_loads_first_apply() && epi.beta != Scalar::Zero;
                let mut stores = Vec::new();
                for (v, slot) in acc.iter().zip(slots) {
                    let Some((addr, pred, old)) = slot else {
                        continue;
                    };
                    let addr = addr.operand(asm);
                    if !first {
                        epi.store(asm, v, &addr, pred, old.as_deref(), mw.space);
                        continue;
                    }
                    let old = match old {
                        Some(old) => old.clone(),
                        None => epi.load(asm, &addr, pred, mw.space),
                    };
                    stores.push((v, addr, pred, old));
                }
                for (v, addr, pred, old) in stores {
                    epi.store(asm, v, &addr, pred, Some(&old), mw.space);
                }
            }
        }
        if tiles[0].valid.is_some() {
            asm.place(&skip);
        }
    }
}

/// The first half of a tile's epilogue on C's padded copy in shared memory
/// (`MmaWarp::matrix`): its old values (beta != 0) come in one `ldmatrix .trans` (two 8x8
/// matrices, rows 0-7 and 8-15 of the tile's 8 columns: lane (g, t) gets (g, 2t) and
/// (g, 2t + 1), and the same 8 rows down, its accumulators' places), where the 16-bit
/// loads take four; [`matrix_store`] writes the results back. Rows past m and columns past
/// n (up to the tile's) lie in the copy's padding, never copied out; a tile that hangs past
/// the last column tile neither reads nor writes.
fn matrix_load(
    asm: &mut Asm,
    epi: &Epilogue,
    tile: &MmaTile,
    base: &str,
    lane_off: &str,
    ldc: usize,
) -> TileOld {
    let addr = asm.reg(Kind::B32);
    asm.op(format!(
        "mad.lo.u32 {addr}, {}, {}, {base}",
        tile.tnr,
        16 * ldc
    ));
    asm.op(format!("mad.lo.u32 {addr}, {}, 32, {addr}", tile.tmr));
    asm.op(format!("add.u32 {addr}, {addr}, {lane_off}"));
    let g = guard(&tile.hangs);
    let words = (epi.beta != Scalar::Zero).then(|| {
        let w: [String; 2] = std::array::from_fn(|_| asm.reg(Kind::B32));
        if tile.hangs.is_some() {
            // Defined in the lanes of a tile that does not read.
            for x in &w {
                asm.op(format!("mov.b32 {x}, 0"));
            }
        }
        asm.op(format!(
            "{g}ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{{}}}, [{addr}]",
            w.join(", ")
        ));
        w
    });
    TileOld { addr, words }
}

/// A tile's place in C's padded copy and, where beta needs them, its old values as
/// `ldmatrix` gave them (two words of two halves: the accumulators' order).
struct TileOld {
    addr: String,
    words: Option<[String; 2]>,
}

/// The second half of a tile's epilogue ([`matrix_load`]): alpha * acc + beta * old, the
/// pairs packed by `cvt.rn.f16x2.f32`, stored back in one `stmatrix .trans` (where the
/// 16-bit stores take four).
fn matrix_store(asm: &mut Asm, epi: &Epilogue, acc: &[String; 4], tile: &MmaTile, old: TileOld) {
    let olds: Option<Vec<String>> = old.words.map(|w| {
        w.iter()
            .flat_map(|x| {
                let h = [asm.reg(Kind::B16), asm.reg(Kind::B16)];
                asm.op(format!("mov.b32 {{{}, {}}}, {x}", h[0], h[1]));
                h.map(|h| {
                    let f = asm.reg(Kind::F32);
                    asm.op(format!("cvt.f32.f16 {f}, {h}"));
                    f
                })
            })
            .collect()
    });
    let results: Vec<String> = acc
        .iter()
        .enumerate()
        .map(|(e, v)| {
            // (Asked for only where beta needs it: `olds` is there then.)
            epi.combine(asm, v, |_| {
                olds.as_ref().map(|o| o[e].clone()).unwrap_or_default()
            })
        })
        .collect();
    let words: Vec<String> = results
        .chunks(2)
        .map(|pair| {
            let d = asm.reg(Kind::B32);
            // The first of the pair (lower column) in the low half.
            asm.op(format!("cvt.rn.f16x2.f32 {d}, {}, {}", pair[1], pair[0]));
            d
        })
        .collect();
    asm.op(format!(
        "{}stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [{}], {{{}}}",
        guard(&tile.hangs),
        old.addr,
        words.join(", ")
    ));
}

/// Which lanes of a warp load one half of a fragment word in the last k step: those of
/// `tig` below a limit (the predicate), all, or none (the half is past k for every lane).
#[derive(Clone, Default)]
enum Lanes {
    #[default]
    All,
    Some(String),
    None,
}

/// One of the two 16-bit loads of a fragment word from a verbatim copy: zero (past k in
/// every lane), or a load under `pred`, zero first where `zero` (past k in some lanes).
enum HalfLoad {
    Zero,
    Load { pred: Option<String>, zero: bool },
}

/// The order in which lane (gid, tig) loads the two halves of each fragment word from a
/// verbatim copy (`flat_fragments`) whose k pairs lie `step` halves apart and whose rows
/// (A) or columns (B) lie `row` halves apart, at the row offsets `rows` (A: 0 and 8; B:
/// 0): with `table[tig]` 1, k + 1 first. Where the pairs are not adjacent (A not
/// transposed: `step` = m) the lanes of one load fall into few banks: m = 17, 4 tigs' k
/// 34 halves (17 words) apart, two words a bank, where tigs 1 and 2 taking k + 1 first
/// spread them over distinct banks. The table with the fewest bank conflicts over the
/// copy's eight alignments (tig 0 in the plain order: the reverse of a table conflicts
/// alike); all zeros unless another is strictly better.
fn fragment_swap_table(row: usize, step: usize, rows: &[usize]) -> [usize; 4] {
    let cost = |table: [usize; 4]| -> usize { fragment_degrees(row, step, rows, table).sum() };
    let mut best = [0; 4];
    let mut best_cost = cost(best);
    for code in 1..8usize {
        let table = [0, code & 1, (code >> 1) & 1, code >> 2];
        let c = cost(table);
        if c < best_cost {
            best = table;
            best_cost = c;
        }
    }
    best
}

/// The bank conflict degree of each 16-bit fragment load of a full k step (rows `rows`,
/// the two halves of k, both loads of a word) under `table` ([`fragment_swap_table`]),
/// for each of the verbatim copy's eight alignments.
fn fragment_degrees<'a>(
    row: usize,
    step: usize,
    rows: &'a [usize],
    table: [usize; 4],
) -> impl Iterator<Item = usize> + 'a {
    (0..8).flat_map(move |base| {
        rows.iter().flat_map(move |&r| {
            (0..4).map(move |hj| {
                let (h, j) = (hj >> 1, hj & 1);
                bank_degree(32, 2, |lane| {
                    let (gid, tig) = (lane / 4, lane % 4);
                    let k = 2 * tig + 8 * h + (j ^ table[tig]);
                    2 * (base + row * (gid + r) + step * k)
                })
            })
        })
    })
}

/// A tile's accumulators in this lane's slot order ([`MmaWarp::swaps`]): slot e holds
/// accumulator e ^ h, by conditional swaps (columns, then rows).
fn swapped(asm: &mut Asm, acc: &[String; 4], swaps: &[Option<String>; 2]) -> [String; 4] {
    let mut v = acc.clone();
    for (bit, swap) in swaps.iter().enumerate() {
        let Some(p) = swap else { continue };
        let d = 1 << bit;
        let prev = v.clone();
        for (e, slot) in v.iter_mut().enumerate() {
            let r = asm.reg(Kind::F32);
            asm.op(format!("selp.f32 {r}, {}, {}, {p}", prev[e ^ d], prev[e]));
            *slot = r;
        }
    }
    v
}

/// Where one operand of the block's problems lives in shared memory under flat staging:
/// problem g's copy starts at `region + shift + g * len * elt` (the shift, 0..16 bytes, is
/// how far the block's span in global memory starts past a 16-byte boundary: the span is
/// copied verbatim, vector by vector), element (r, c) of it at `r * row + c * col`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlatOperand {
    len: usize,
    row: usize,
    col: usize,
    /// Byte offset of the region from the start of shared memory.
    region: usize,
    /// 16-byte vectors in the region.
    vectors: usize,
}

/// A padded copy of C in a problem's slot (elements).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CPad {
    c_in_slot: usize,
    c_ld: usize,
    /// Halves per vector of the column copy (8, 4 or 2: what m, ldc and the stride allow).
    cv: usize,
    /// The epilogue moves whole tiles with `ldmatrix` / `stmatrix` (sm_90, no epilogue
    /// swaps): the copy then has room for n rounded up to 8 columns (`MmaWarp::matrix`).
    matrix: bool,
}

impl CPad {
    /// Columns of C's copy: n, or with the `ldmatrix` epilogue n rounded up to whole tiles.
    fn columns(&self, p: &ColMajorProblem) -> usize {
        if self.matrix {
            p.n.next_multiple_of(8)
        } else {
            p.n
        }
    }
}

/// The shared-memory plan of a kernel: which operands are staged flat, and the bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlatPlan {
    a: Option<FlatOperand>,
    b: Option<FlatOperand>,
    c: Option<FlatOperand>,
    /// Elements of one problem's padded slot (the operands not staged flat).
    slot: usize,
    /// Where operand B's padded copy starts inside the slot (elements).
    b_in_slot: usize,
    /// Tensor-core kernels with C through shared memory where C's columns are whole
    /// 16-byte vectors: C's copy is in the slot, at `c_in_slot`, columns `c_ld` apart.
    c_pad: Option<CPad>,
    /// C's copy (flat or padded) lies in A's place: it is read from global memory in
    /// `mma_body`, after every warp has loaded its A fragments (`GpuSchedule::c_over_a`).
    c_over_a: bool,
    pub(crate) shared_bytes: usize,
}

/// The worst number of distinct 4-byte words one bank serves for one shared load of a
/// whole warp, over the block's warps; `addr(t)` is thread t's byte address.
fn bank_degree(threads: usize, elt: usize, addr: impl Fn(usize) -> usize) -> usize {
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
    // Flat C over A: the block's span (with its shift) inside A's padded copy.
    let c_vectors = (tba * c_len + v - 1).div_ceil(v);
    let c_flat_over_a = over_a && !a_ok && c_ok && c_vectors * 16 <= layout.a_len * elt;
    let c = if c_flat_over_a {
        Some(FlatOperand {
            len: c_len,
            row: 1,
            col: p.m,
            region: 0,
            vectors: c_vectors,
        })
    } else {
        region(c_ok, c_len, 1, p.m, 0)
    };
    FlatPlan {
        a,
        b,
        c,
        slot,
        b_in_slot,
        c_pad,
        c_over_a: c_flat_over_a || (over_a && c_pad.is_some_and(|c| c.c_in_slot == 0)),
        shared_bytes: at,
    }
}

/// Copies one problem's C between global memory (columns `ldc` apart) and its padded copy in
/// shared memory (columns `c_ld` apart) with vectors of `cv` halves (8, 4 or 2), the group's
/// `tpp` threads taking vectors in turn (m, ldc and the batch stride multiples of `cv`; C's
/// base address 16-byte aligned).
#[allow(clippy::too_many_arguments)]
fn copy_c_columns(
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
fn vector_slot(
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
fn slot_magic(d: usize) -> Option<u32> {
    assert!(d >= 1);
    (d > 1).then(|| (1u64 << 32).div_ceil(d as u64) as u32)
}

/// The 32-bit words of one 16-byte vector, as a PTX vector operand.
fn words(asm: &mut Asm) -> (Vec<String>, String) {
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
enum CopyC {
    /// Into shared memory, through registers.
    In,
    /// Into shared memory through `cp.async` (the staging's barrier waits for it).
    Async,
    /// Back to global memory.
    Out,
}

/// Which way `flat_copy` copies, and how it takes the partial vectors at the span's ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlatCopy {
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
/// or, with `FlatCopy::WholeEnds` and `FlatCopy::Async`, whole. Returns the shift (bytes
/// from the boundary to the span) as a u32 register.
#[allow(clippy::too_many_arguments)]
fn flat_copy(
    asm: &mut Asm,
    dtype: Dtype,
    tid: &str,
    threads: usize,
    span: &str,
    end: &str,
    region: &str,
    vectors: usize,
    copy: FlatCopy,
) -> String {
    let to_shared = copy != FlatCopy::Out;
    let elt = dtype.size();
    let v = 16 / elt;
    let lo = asm.reg(Kind::B32);
    asm.op(format!("cvt.u32.u64 {lo}, {span}"));
    let shift = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {shift}, {lo}, 15"));
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
    shift
}

#[cfg(test)]
mod tests {
    use super::{epilogue_degrees, epilogue_swap_table, realign_words_pay, slot_magic};

    /// The square f16 sizes whose realigning in shared memory keeps the 16-byte loads: the
    /// ones the H200 measured without a gain from the 4-byte words (43 and 63 lost 6 points).
    #[test]
    fn realign_words_where_the_banks_allow() {
        let kept: Vec<usize> = (17..128)
            .filter(|n| n % 8 != 0 && !realign_words_pay(*n, *n))
            .collect();
        assert_eq!(kept, [17, 20, 28, 35, 36, 43, 60, 63, 71, 107, 127]);
        assert!(realign_words_pay(75, 75) && realign_words_pay(113, 113));
    }

    /// The epilogue's lane order: a permutation of each lane's four accumulators, plain
    /// where the plain order has no conflicts (padded copies: ld a multiple of 8 plus 4 or
    /// so), and at 33 and 97 (4 words a bank in the plain order) at most 2 words a bank.
    #[test]
    fn epilogue_swaps_spread_the_banks() {
        let worst = |ld: usize, table: [usize; 4]| epilogue_degrees(ld, table).max().unwrap();
        for ld in [24, 40, 104, 136] {
            assert_eq!(worst(ld, [0; 4]), 1, "ld = {ld}");
            assert_eq!(epilogue_swap_table(ld), [0; 4], "ld = {ld}");
        }
        for ld in [33, 97] {
            assert_eq!(worst(ld, [0; 4]), 4, "ld = {ld}");
            let table = epilogue_swap_table(ld);
            assert!(worst(ld, table) <= 2, "ld = {ld}: {table:?}");
        }
        for ld in 17..=128 {
            let table = epilogue_swap_table(ld);
            assert!(table.iter().all(|&h| h < 4), "ld = {ld}");
            assert!(worst(ld, table) <= worst(ld, [0; 4]), "ld = {ld}");
        }
    }

    /// `vector_slot`'s multiply-high division is exact for every slot a loader can have.
    #[test]
    fn slot_division_is_exact() {
        for d in 1..=64usize {
            for q in 0..(1usize << 16) {
                let (col, r) = match slot_magic(d) {
                    None => (q, 0),
                    Some(m) => {
                        let col = ((q as u64 * m as u64) >> 32) as usize;
                        (col, q - col * d)
                    }
                };
                assert_eq!((col, r), (q / d, q % d), "q = {q}, d = {d}");
            }
        }
    }
}
