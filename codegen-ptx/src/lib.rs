//! smallgemm's GPU backend: a [`GemmSpec`] and a [`GpuSchedule`] become the PTX text of one
//! kernel for sm_80 or sm_90.
//!
//! Every kernel computes whole problems in one thread block (papers 000/002): the block's
//! `tba` problems each get a group of threads; the group stages its A and B through padded
//! shared memory, then each thread keeps its part of C in registers over a fully unrolled k
//! loop and writes it once. f32/f64 (and f16 below 16) use FMA with an `rm x rn` register
//! tile per thread; f16 from 16 up uses tensor cores (`mma.sync.m16n8k16`, f32
//! accumulation), each warp owning 16x8 tiles of C. Sizes, transposes, leading dimensions,
//! strides and the kinds of alpha and beta are constants in the code; row-major specs run as
//! their column-major view (A and B swapped inside the kernel, so callers pass them as is).

mod emit;
pub mod ptxas;

use smallgemm_ir::{
    plan_gpu, Accumulate, ColMajorProblem, Dtype, GemmSpec, GpuSchedule, GpuScheduleError,
    GpuTarget, Scalar, Sm, Staging,
};
use thiserror::Error;

/// How the kernel finds the matrices of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchKind {
    /// `a + i * stride_a` etc. (the spec's strides).
    Strided,
    /// Arrays of device pointers, one per matrix; the spec's leading dimensions.
    PointerArray,
    /// Pointer arrays plus, per problem, six u32 `m, n, k, lda, ldb, ldc` (as the caller sees
    /// the problem, not the column-major view); the spec's m, n, k are the maxima. Threads and
    /// blocks without work exit at once (ETM, paper 001).
    VariableSize,
}

impl BatchKind {
    fn suffix(self) -> &'static str {
        match self {
            BatchKind::Strided => "",
            BatchKind::PointerArray => "_ptr",
            BatchKind::VariableSize => "_vbatch",
        }
    }
}

/// Why no kernel could be generated.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PtxError {
    #[error("GPU schedule: {0}")]
    Schedule(#[from] GpuScheduleError),
    #[error("tensor-core kernels accumulate in f32 only")]
    MmaAccumulate,
    #[error("variable-size batches use FMA kernels (no tensor-core schedule)")]
    VariableSizeMma,
    #[error("the kernel would unroll {0} FMAs per thread; smallgemm keeps kernels below 65536")]
    TooLarge(usize),
}

/// The kernel parameters, in order, after the common `a, b, c` and `batch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtraParam {
    /// Pointer to six u32 per problem (variable-size batches), before `batch`.
    Dims,
    /// alpha as the kernel's scalar type (f64 for f64, f32 for f32 and f16).
    Alpha,
    Beta,
}

/// One generated kernel: its PTX and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxKernel {
    pub ptx: String,
    /// The `.entry` name.
    pub entry: String,
    pub sm: Sm,
    pub kind: BatchKind,
    pub schedule: GpuSchedule,
    pub threads_per_block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: usize,
    /// Parameters after `a, b, c` (`u64` each): `[dims (u64)], batch (u32), [alpha], [beta]`.
    pub extra: Vec<ExtraParam>,
}

impl PtxKernel {
    /// Thread blocks for a batch of `batch` problems.
    pub fn blocks(&self, batch: usize) -> usize {
        batch.div_ceil(self.schedule.tba as usize)
    }
}

/// The PTX ISA version emitted for `sm`: the lowest that has every feature used, since the
/// driver that JIT-compiles the PTX at load time may be older than any local ptxas (7.0
/// introduced sm_80 and m16n8k16; 7.8 introduced sm_90).
pub fn ptx_version(sm: Sm) -> (u32, u32) {
    match sm {
        Sm::Sm80 => (7, 0),
        Sm::Sm90 => (7, 8),
    }
}

/// The scalar type of run-time alpha/beta and of the epilogue.
pub fn scalar_dtype(dtype: Dtype) -> Dtype {
    match dtype {
        Dtype::F64 => Dtype::F64,
        Dtype::F32 | Dtype::F16 => Dtype::F32,
    }
}

/// The kernel's entry name for `spec`, `kind` and `schedule` (unique per cache key).
pub fn entry_name(spec: &GemmSpec, kind: BatchKind, s: &GpuSchedule) -> String {
    let mma = match s.mma {
        Some(m) => format!(
            "_mma{}x{}x{}w{}{}{}{}",
            m.m,
            m.n,
            m.k,
            s.warps,
            if s.ldmatrix { "_ldm" } else { "" },
            match s.stage {
                Staging::Padded => "",
                Staging::Flat => "_flat",
                Staging::FlatC => "_flatc",
            },
            if s.prefetch_c { "_pc" } else { "" }
        ),
        None => format!(
            "_r{}x{}{}{}",
            s.rm,
            s.rn,
            match s.stage {
                Staging::Padded => "",
                Staging::Flat => "_flat",
                Staging::FlatC => "_flatc",
            },
            if s.vector_reads { "_vr" } else { "" }
        ),
    };
    let acc = match (spec.dtype(), s.accumulate) {
        (Dtype::F16, Accumulate::Native) => "_acc16",
        _ => "",
    };
    let mb = match s.min_blocks {
        0 => String::new(),
        b => format!("_mb{b}"),
    };
    let group = match (s.mma, s.mma_group) {
        (Some(_), g) if g > 1 => format!("_g{g}"),
        _ => String::new(),
    };
    let ca = if s.mma.is_some() && s.c_over_a {
        "_ca"
    } else {
        ""
    };
    let mh = if s.mul_hi_applies() { "_mh" } else { "" };
    let ff = if s.flat_fragments_apply() { "_ff" } else { "" };
    let cpa = if s.async_copies_apply() || s.async_staging_apply() {
        "_cpa"
    } else {
        ""
    };
    let rsh = if s.realign_in_shared_apply() {
        "_rsh"
    } else {
        ""
    };
    let sw = if s.epilogue_swaps_apply() { "_sw" } else { "" };
    let cs = if s.column_sweep_apply() { "_cs" } else { "" };
    let rg = match (s.mma, s.row_group) {
        (Some(_), g) if g > 1 => format!("_rg{g}"),
        _ => String::new(),
    };
    let sc = if s.slot_copies_apply() { "_sc" } else { "" };
    let ee = if s.element_epilogue_apply() {
        "_ee"
    } else {
        ""
    };
    let lf = if s.epilogue_loads_first_apply() {
        "_lf"
    } else {
        ""
    };
    let fk = if s.full_last_k_step_apply() {
        "_fk"
    } else {
        ""
    };
    let rp = if s.row_pairs_apply() { "_rp" } else { "" };
    let sa = if s.stream_a_apply() { "_sa" } else { "" };
    let rv = if s.realign_vectors_apply() { "_rv" } else { "" };
    format!(
        "{}{}{mma}_tba{}{acc}{mb}{group}{ca}{mh}{ff}{cpa}{rsh}{sw}{cs}{rg}{sc}{ee}{lf}{fk}{rp}{sa}{rv}",
        spec.name(),
        kind.suffix(),
        s.tba
    )
}

/// The default schedule for `spec` (tensor cores only for strided and pointer-array f16).
pub fn plan(spec: &GemmSpec, target: &GpuTarget, kind: BatchKind) -> Result<GpuSchedule, PtxError> {
    let p = spec.col_major();
    let mut s = plan_gpu(&p, target)?;
    if kind == BatchKind::VariableSize && s.mma.is_some() {
        let mut q = p;
        // Plan as if f32 to get an FMA schedule, then keep f16; f32 stages twice the bytes
        // of f16 (tba is fitted to the f16 problem below).
        q.dtype = Dtype::F32;
        let wider = GpuTarget {
            shared_bytes_per_block: 2 * target.shared_bytes_per_block,
            ..target.clone()
        };
        s = plan_gpu(&q, &wider)?;
    }
    if kind != BatchKind::Strided && s.flat_fragments {
        // Verbatim copies of A and B need a packed strided batch: elsewhere `ldmatrix`
        // fragments from the padded slots, as at the neighbouring sizes.
        s.flat_fragments = false;
        s.ldmatrix = true;
    }
    if kind != BatchKind::Strided {
        // Nothing is copied verbatim there.
        s.async_copies = false;
        s.realign_in_shared = false;
    }
    let big = p.m.max(p.n);
    if kind == BatchKind::VariableSize && (25..=32).contains(&big) && p.dtype != Dtype::F16 {
        // Measured (`smallgemm tune --gpu --variable`, H100, sizes uniform in 1..32): 4x4
        // tiles win (75% of the bound for f64 against 65% with 2x2; f32 61% against 45%):
        // a block waits for its largest problem, and small problems leave most of a large
        // slot's threads idle. (The same tiles for the smaller bounds of `bucket_variable`'s
        // buckets measured worse than the strided defaults: 71% against 81% for f64.)
        let mut q = s;
        q.rm = 4;
        q.rn = 4;
        q.tba = if p.dtype == Dtype::F64 { 1 } else { 2 };
        if q.validate(&p, target).is_ok() {
            s = q;
        }
    }
    if kind == BatchKind::VariableSize && s.mma.is_none() && p.dtype == Dtype::F32 {
        // Measured (H100, sizes uniform in 1..32, docs/gpu-notes.md, version 10): 16-byte
        // shared reads of A and B (2 loads per k step instead of 8 at 4x4 tiles) took the
        // bucketed f32 batch from 76-77% of the bound to 78-79%, the one launch from 62% to
        // 64-65%. For f64 the one launch lost 10 points (137 registers against 106 at 4x4
        // tiles) and the bucketed one gained nothing: left off.
        s.vector_reads = true;
    }
    if kind == BatchKind::VariableSize && s.mma.is_none() && p.dtype == Dtype::F64 {
        // Measured (H100, sizes uniform in 1..32, docs/gpu-notes.md, version 20): staging
        // A and B through `cp.async` took the f64 batch in one launch from 75.4-75.6% of
        // the bound to 79.6% (bucketed: 81.7-82.3% either way). f32 lost with it (4-byte
        // copies: bucketed 80.5% -> 75%, one launch 65% -> 61%), as did the strided f32
        // kernels (up to 16 points at 21); the strided f64 kernels gained nothing.
        s.async_copies = true;
    }
    // `vector_reads` pads A and B in shared memory: where the block no longer fits (many
    // problems of long k per block), fewer problems a block, or no `vector_reads`.
    s.shrink_tba_to_fit(&p, target);
    if s.vector_reads && s.validate(&p, target).is_err() {
        s.vector_reads = false;
    }
    s.validate(&p, target)?;
    Ok(s)
}

/// Generates the kernel for `spec` (with the planned schedule unless one is given).
pub fn generate(
    spec: &GemmSpec,
    target: &GpuTarget,
    schedule: Option<&GpuSchedule>,
    kind: BatchKind,
) -> Result<PtxKernel, PtxError> {
    let p = spec.col_major();
    let mut schedule = match schedule {
        Some(s) => s.effective(&p),
        None => plan(spec, target, kind)?,
    };
    let res = schedule.validate(&p, target)?;
    if schedule.mma.is_some() {
        if schedule.accumulate != Accumulate::F32 {
            return Err(PtxError::MmaAccumulate);
        }
        if kind == BatchKind::VariableSize {
            return Err(PtxError::VariableSizeMma);
        }
    }
    let per_thread = match schedule.mma {
        None => (schedule.rm * schedule.rn) as usize * p.k,
        Some(_) => 0,
    };
    if per_thread >= 65536 {
        return Err(PtxError::TooLarge(per_thread));
    }
    let mut extra = Vec::new();
    if kind == BatchKind::VariableSize {
        extra.push(ExtraParam::Dims);
    }
    if p.alpha == Scalar::Runtime {
        extra.push(ExtraParam::Alpha);
    }
    if p.beta == Scalar::Runtime {
        extra.push(ExtraParam::Beta);
    }
    let entry = entry_name(spec, kind, &schedule);
    let (mut ptx, mut shared_bytes) = emit::kernel(&p, target.sm, kind, &schedule, &entry, &extra);
    // Flat staging of C adds a region; fall back when the block would not fit.
    while shared_bytes > target.shared_bytes_per_block && schedule.stage != Staging::Padded {
        schedule.stage = match schedule.stage {
            Staging::FlatC => Staging::Flat,
            _ => Staging::Padded,
        };
        (ptx, shared_bytes) = emit::kernel(&p, target.sm, kind, &schedule, &entry, &extra);
    }
    if shared_bytes > target.shared_bytes_per_block {
        return Err(PtxError::Schedule(GpuScheduleError::Shared {
            bytes: shared_bytes,
            limit: target.shared_bytes_per_block,
        }));
    }
    let _ = res;
    Ok(PtxKernel {
        ptx,
        entry,
        sm: target.sm,
        kind,
        schedule,
        threads_per_block: res.threads_per_block,
        shared_bytes,
        extra,
    })
}

/// One PTX module holding the entries of several kernels for the same `sm` (ptxas checks
/// many kernels in one run this way).
pub fn combine(sm: Sm, kernels: &[&PtxKernel]) -> String {
    let mut out = String::new();
    let (major, minor) = ptx_version(sm);
    out.push_str(&format!(
        ".version {major}.{minor}\n.target {}\n.address_size 64\n\n.extern .shared .align 16 .b8 smem[];\n\n",
        sm.name()
    ));
    for k in kernels {
        if let Some(at) = k.ptx.find(".visible .entry") {
            out.push_str(&k.ptx[at..]);
            out.push('\n');
        }
    }
    out
}

/// The column-major problem a spec's kernel computes (re-exported for the runtime).
pub fn problem(spec: &GemmSpec) -> ColMajorProblem {
    spec.col_major()
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallgemm_ir::{GemmSpec, Sm, Trans};

    /// The tensor-core epilogue moves C's tiles with `ldmatrix` / `stmatrix` where C's copy
    /// in shared memory is padded (m even) on sm_90 only, not where the schedule keeps the
    /// element accesses (`element_epilogue`) nor where C's copy is verbatim (m odd); its
    /// copy then has room for n rounded up to 8 columns.
    #[test]
    fn tile_epilogue_where_c_is_padded_on_sm90() {
        let half = Scalar::fixed(0.5).unwrap();
        let kernel = |m, n, sm, element_epilogue| {
            let spec = GemmSpec::builder(Dtype::F16, m, n, 40)
                .beta(half)
                .build()
                .unwrap();
            let s = GpuSchedule {
                stage: Staging::FlatC,
                element_epilogue,
                ..GpuSchedule::mma(4, 1, true)
            };
            generate(&spec, &GpuTarget::new(sm), Some(&s), BatchKind::Strided).unwrap()
        };
        for (m, n, padded) in [
            (98, 98, true),
            (64, 90, true),
            (40, 40, true),
            (97, 97, false),
        ] {
            let tiles = |k: &PtxKernel| k.ptx.contains("stmatrix") && k.ptx.contains(".trans");
            assert_eq!(tiles(&kernel(m, n, Sm::Sm90, false)), padded, "{m}x{n}");
            assert!(!tiles(&kernel(m, n, Sm::Sm90, true)), "{m}x{n}");
            assert!(!tiles(&kernel(m, n, Sm::Sm80, false)), "{m}x{n}");
        }
        // 98 x 98: C's copy has columns 120 halves apart (98 rounded up to 8, 104, plus 16
        // to an odd multiple of 8), and 104 columns instead of 98.
        let grown = kernel(98, 98, Sm::Sm90, false).shared_bytes
            - kernel(98, 98, Sm::Sm90, true).shared_bytes;
        assert_eq!(grown, 120 * 6 * 2);
    }

    /// The strided kernel of `spec` under `s` for sm_90.
    fn sm90_strided(spec: &GemmSpec, s: &GpuSchedule) -> PtxKernel {
        generate(spec, &GpuTarget::new(Sm::Sm90), Some(s), BatchKind::Strided).unwrap()
    }

    /// Where the last k step holds at most 8 of k, tensor-core kernels run it as
    /// `m16n8k8` with half the fragments (`ldmatrix` .x2 for A, .x1 for B), one such step
    /// a tile; `full_last_k_step` keeps `m16n8k16` there, and k = 16 (a multiple) or 41 (9
    /// left) never narrows.
    #[test]
    fn narrow_last_k_step_where_at_most_8_are_left() {
        let kernel = |k, full_last_k_step| {
            let spec = GemmSpec::builder(Dtype::F16, 32, 24, k).build().unwrap();
            let s = GpuSchedule {
                stage: Staging::FlatC,
                full_last_k_step,
                ..GpuSchedule::mma(2, 1, true)
            };
            let ptx = sm90_strided(&spec, &s).ptx;
            let count = |what: &str| ptx.matches(what).count();
            (
                count("mma.sync.aligned.m16n8k8."),
                count("mma.sync.aligned.m16n8k16."),
                count("ldmatrix.sync.aligned.m8n8.x1."),
            )
        };
        // Each of the 2 warps runs one row tile's 3 column tiles, 3 k steps each (1 at 16).
        assert_eq!(kernel(40, false), (3, 6, 3));
        assert_eq!(kernel(33, false), (3, 6, 3));
        assert_eq!(kernel(40, true), (0, 9, 0));
        assert_eq!(kernel(41, false), (0, 9, 0));
        assert_eq!(kernel(16, false), (0, 3, 0));
    }

    /// `realign_in_shared` reads 4-byte words where their banks allow (f16 75: five a
    /// vector, funnel-shifted); `realign_vectors` keeps the two 16-byte loads a vector
    /// there and says so in the kernel's name; where the bank rule keeps the 16-byte loads
    /// anyway (63) it changes no load.
    #[test]
    fn realign_vectors_keeps_the_16_byte_loads() {
        let kernel = |n, realign_vectors| {
            let spec = GemmSpec::builder(Dtype::F16, n, n, n).build().unwrap();
            let s = GpuSchedule {
                stage: Staging::FlatC,
                async_copies: true,
                realign_in_shared: true,
                realign_vectors,
                ..GpuSchedule::mma(5, 1, true)
            };
            let k = sm90_strided(&spec, &s);
            let count = |what: &str| k.ptx.matches(what).count();
            (
                count("ld.shared.b32"),
                count("shf.r.clamp.b32"),
                count("ld.shared.v4.b32"),
                k.entry.ends_with("_rv"),
            )
        };
        let words = kernel(75, false);
        let vectors = kernel(75, true);
        assert!(words.0 > 0 && words.1 > 0 && !words.3, "{words:?}");
        assert_eq!(vectors.0, 0, "{vectors:?}");
        assert!(vectors.2 > words.2 && vectors.3, "{vectors:?}");
        // 63: the bank rule keeps the 16-byte loads anyway.
        let (plain, asked) = (kernel(63, false), kernel(63, true));
        assert_eq!((plain.0, plain.1, plain.2), (asked.0, asked.1, asked.2));
    }

    /// C's flat span lies in shared memory as its 128-byte lines lie in global memory
    /// (`flat_copy`'s `line`: the shift masked to 127 bytes, 112 bytes more room), except
    /// beside flat fragments.
    #[test]
    fn c_span_placed_by_lines_except_beside_flat_fragments() {
        let spec = GemmSpec::builder(Dtype::F16, 23, 23, 23)
            .alpha(Scalar::fixed(1.5).unwrap())
            .beta(Scalar::fixed(0.5).unwrap())
            .build()
            .unwrap();
        let kernel = |flat_fragments| {
            let s = GpuSchedule {
                stage: Staging::FlatC,
                flat_fragments,
                async_copies: true,
                ..GpuSchedule::mma(2, 2, !flat_fragments)
            };
            sm90_strided(&spec, &s)
        };
        let (ff, ldm) = (kernel(true), kernel(false));
        assert!(
            !ff.ptx.contains(", 127;"),
            "flat fragments: C placed by lines"
        );
        assert!(
            ldm.ptx.contains(", 127;"),
            "ldmatrix: C not placed by lines"
        );
    }

    /// Row pairs (`GpuSchedule::row_pairs`): a warp's two row tiles share each B fragment,
    /// loaded once for both (`ldmatrix .x2`), and hold both rows' A fragments (`.x4`) for
    /// all k steps; with odd row tiles the last pair's second tile reads the last row
    /// tile's A (`min.u32`). Where the warps are no multiple of the pairs the flag takes no
    /// effect.
    #[test]
    fn row_pairs_load_each_b_fragment_once_for_two_row_tiles() {
        let kernel = |m, warps, row_pairs| {
            let spec = GemmSpec::builder(Dtype::F16, m, 24, 32)
                .beta(Scalar::Zero)
                .build()
                .unwrap();
            let s = GpuSchedule {
                stage: Staging::FlatC,
                row_pairs,
                ..GpuSchedule::mma(warps, 1, true)
            };
            let ptx = sm90_strided(&spec, &s).ptx;
            let count = |what: &str| ptx.matches(what).count();
            (
                count("ldmatrix.sync.aligned.m8n8.x4."),
                count("ldmatrix.sync.aligned.m8n8.x2."),
                count("mma.sync.aligned.m16n8k16."),
                count("min.u32"),
            )
        };
        // 4 row tiles, 3 column tiles, 2 k steps. One row tile a warp: A 2 loads, B 6, 6 mma.
        assert_eq!(kernel(64, 4, false), (2, 6, 6, 0));
        // Two a warp, 2 warps: A 4 loads, B still 6 for 12 mma.
        assert_eq!(kernel(64, 2, true), (4, 6, 12, 0));
        // Two a warp, 4 warps (2 a pair): 2 column tiles each.
        assert_eq!(kernel(64, 4, true), (4, 4, 8, 0));
        // 3 row tiles: the second pair's second tile on the third's A.
        assert_eq!(kernel(48, 2, true), (4, 6, 12, 1));
        // 3 warps, 2 pairs: no effect, and the kernel's schedule says so.
        assert_eq!(kernel(64, 3, true), kernel(64, 3, false));
        let spec = GemmSpec::builder(Dtype::F16, 64, 24, 32).build().unwrap();
        let s = GpuSchedule {
            row_pairs: true,
            ..GpuSchedule::mma(3, 1, true)
        };
        let k = sm90_strided(&spec, &s);
        assert!(!k.schedule.row_pairs && !k.entry.ends_with("_rp"));
    }

    /// A loaded at each k step (`GpuSchedule::stream_a`): the same loads as held
    /// fragments where one group takes all of a warp's column tiles, once per group with
    /// smaller groups; nothing held before the first tile. Off with C over A and where the
    /// warps take tiles in turn.
    #[test]
    fn stream_a_loads_a_in_each_group() {
        let kernel = |warps, row_group, row_pairs, stream_a| {
            let spec = GemmSpec::builder(Dtype::F16, 64, 48, 32)
                .beta(Scalar::Zero)
                .build()
                .unwrap();
            let s = GpuSchedule {
                stage: Staging::FlatC,
                row_group,
                row_pairs,
                stream_a,
                ..GpuSchedule::mma(warps, 1, true)
            };
            let k = sm90_strided(&spec, &s);
            let before_tiles = k
                .ptx
                .split("tile 0 of this warp")
                .next()
                .unwrap()
                .to_string();
            (
                k.ptx.matches("ldmatrix.sync.aligned.m8n8.x4.").count(),
                before_tiles
                    .matches("ldmatrix.sync.aligned.m8n8.x4.")
                    .count(),
                k.schedule.stream_a,
            )
        };
        // 4 row tiles, 6 column tiles, 2 k steps; 2 warps of pairs: 6 column tiles each.
        assert_eq!(kernel(2, 6, true, false), (4, 4, false));
        assert_eq!(kernel(2, 6, true, true), (4, 0, true));
        // Groups of 2: A once per group (3 groups).
        assert_eq!(kernel(2, 2, true, true), (12, 0, true));
        // One row tile a warp (4 warps), one group of 6.
        assert_eq!(kernel(4, 6, false, true), (2, 0, true));
        // 3 warps: the tiles in turn, nothing to stream.
        assert!(!kernel(3, 0, false, true).2);
    }

    /// Wherever `plan_gpu` finds a schedule for a problem, `plan` finds one for every batch
    /// kind: its adjustments (f32 `vector_reads` pads A and B in shared memory) keep the
    /// block within the limits. Where none fits, the error says how far to split k.
    #[test]
    fn planned_kernels_fit_wherever_a_schedule_does() {
        let sizes = [1, 2, 3, 7, 14, 22, 31, 32, 33, 64, 100, 128];
        for sm in [Sm::Sm80, Sm::Sm90] {
            let target = GpuTarget::new(sm);
            for dtype in [Dtype::F64, Dtype::F32, Dtype::F16] {
                for (m, n, k) in sizes.iter().flat_map(|&m| {
                    sizes
                        .iter()
                        .flat_map(move |&n| [1, 17, 46, 87, 128].map(|k| (m, n, k)))
                }) {
                    for (ta, tb) in [(Trans::N, Trans::N), (Trans::T, Trans::T)] {
                        let spec = GemmSpec::builder(dtype, m, n, k)
                            .trans_a(ta)
                            .trans_b(tb)
                            .build()
                            .unwrap();
                        let p = spec.col_major();
                        let fits = smallgemm_ir::plan_gpu(&p, &target);
                        for kind in [
                            BatchKind::Strided,
                            BatchKind::PointerArray,
                            BatchKind::VariableSize,
                        ] {
                            let planned = plan(&spec, &target, kind);
                            match (&fits, planned) {
                                (Ok(_), Ok(s)) => assert!(s.validate(&p, &target).is_ok()),
                                (Ok(_), Err(e)) => {
                                    panic!("{} {kind:?} on {sm:?}: {e}", spec.name())
                                }
                                (Err(_), Ok(s)) => {
                                    panic!("{} {kind:?} on {sm:?}: planned {s:?}", spec.name())
                                }
                                (Err(_), Err(_)) => {}
                            }
                        }
                    }
                }
            }
        }
    }
}
