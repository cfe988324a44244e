//! PTX text for one kernel. Registers are virtual (ptxas allocates); every loop is unrolled
//! at generation time so that all addressing inside the loops is immediate offsets.

use std::fmt::Write;

use smallgemm_ir::{
    Accumulate, ColMajorProblem, Dtype, GpuSchedule, Operand, Scalar, SharedLayout, Sm, Staging,
    Trans,
};

use crate::{ptx_version, BatchKind, ExtraParam};

mod flat;
mod fma;
mod mma;
mod staging;

use flat::*;
use fma::*;
use mma::*;
use staging::*;

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
                        flat.c_line,
                    )
                } else {
                    let lo = asm.reg(Kind::B32);
                    asm.op(format!("cvt.u32.u64 {lo}, {span}"));
                    asm.op(format!("and.b32 {lo}, {lo}, {}", shift_mask(flat.c_line)));
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
                    &mut asm, dtype, &tid, threads, &span, &end, &region, op.vectors, copy, false,
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
    // The k padding in the slots that the tensor cores read: none past k rounded up to 8
    // where the last k step is narrow.
    let kzero = if s.mma.is_some() && narrow_last_k_step(s, p, false) {
        p.k.next_multiple_of(8)
    } else {
        kext
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
                    // Realigned there by 4-byte words where their banks allow (unless
                    // the schedule asks for the 16-byte vectors).
                    let words =
                        !s.realign_vectors_apply() && realign_words_pay(lead.max, other.max);
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
                zero_k_padding(&mut asm, &lt, tpp, o.slot, o.op, p, &layout, kzero);
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
            zero_k_padding(&mut asm, &lt, tpp, o.slot, o.op, p, &layout, kzero);
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
                flat.c_line,
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
    /// C's flat span lies in shared memory as its 128-byte lines lie in global memory
    /// (`flat_copy`'s `line`; tensor-core kernels, whose region has room for it).
    c_line: bool,
    pub(crate) shared_bytes: usize,
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
