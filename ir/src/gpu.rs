//! GPU targets and GPU schedules: what an NVIDIA GPU offers and how a batched small GEMM is
//! mapped onto its threads, as plain serde data with validation against hard limits.
//!
//! The mapping (papers 000/002: one thread block computes whole problems):
//! - FMA kernels: each problem gets `ceil(m / rm) * ceil(n / rn)` threads, each owning an
//!   `rm x rn` register tile of C (rm = rn = 2 or 4 is the papers' recursive 2x2 blocking);
//!   `tba` problems share a thread block so tiny sizes still fill it.
//! - Tensor-core kernels (f16): `warps` warps per problem, each computing 16x8 tiles of C with
//!   `mma.sync.m16n8k16`; `tba` problems per block as well.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::spec::{ColMajorProblem, Dtype, Trans};

/// An NVIDIA architecture smallgemm generates PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sm {
    /// Ampere (A100): `mma.sync` f16 m16n8k16.
    Sm80,
    /// Hopper (H100).
    Sm90,
}

impl Sm {
    pub fn name(self) -> &'static str {
        match self {
            Sm::Sm80 => "sm_80",
            Sm::Sm90 => "sm_90",
        }
    }

    /// The compute capability times ten (80, 90).
    pub fn number(self) -> u32 {
        match self {
            Sm::Sm80 => 80,
            Sm::Sm90 => 90,
        }
    }

    /// From a device's compute capability; `None` below 8.0 (no m16n8k16 mma). Newer
    /// architectures run sm_90 PTX through the driver's JIT.
    pub fn from_compute_capability(major: u32, minor: u32) -> Option<Sm> {
        match (major, minor) {
            (8, _) => Some(Sm::Sm80),
            (m, _) if m >= 9 => Some(Sm::Sm90),
            _ => None,
        }
    }
}

impl std::fmt::Display for Sm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Sm {
    type Err = String;
    fn from_str(s: &str) -> Result<Sm, String> {
        match s {
            "sm_80" | "sm80" => Ok(Sm::Sm80),
            "sm_90" | "sm90" => Ok(Sm::Sm90),
            _ => Err(format!("unknown GPU architecture {s:?} (sm_80 or sm_90)")),
        }
    }
}

/// A tensor-core instruction shape (rows x cols x depth of one `mma.sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MmaShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

impl MmaShape {
    /// `mma.sync.aligned.m16n8k16` with f16 inputs (sm_80 and later).
    pub const M16N8K16: MmaShape = MmaShape { m: 16, n: 8, k: 16 };
}

/// What a GPU offers the kernels; the limits a schedule must respect.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuTarget {
    pub sm: Sm,
    /// Dynamic shared memory a block may use (the opt-in maximum; the runtime raises the
    /// function's limit when a kernel needs more than the default 48 KiB).
    pub shared_bytes_per_block: usize,
    pub max_threads_per_block: u32,
    /// Registers a thread may use (255 on sm_80/sm_90).
    pub max_registers_per_thread: u32,
    pub registers_per_sm: u32,
    /// Tensor-core shapes for f16 inputs.
    pub f16_mma_shapes: Vec<MmaShape>,
}

impl GpuTarget {
    pub fn new(sm: Sm) -> GpuTarget {
        GpuTarget {
            sm,
            shared_bytes_per_block: match sm {
                // sm_86/sm_89 allow 99 KiB, the least of the 8.x family (A100: 163 KiB).
                Sm::Sm80 => 99 * 1024,
                Sm::Sm90 => 227 * 1024,
            },
            max_threads_per_block: 1024,
            max_registers_per_thread: 255,
            registers_per_sm: 65536,
            f16_mma_shapes: vec![MmaShape::M16N8K16],
        }
    }
}

/// The precision f16 products are accumulated in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accumulate {
    /// The element type itself (f16 accumulates in f16).
    Native,
    /// f32 accumulation for f16 inputs (the default: k products in f16 lose too much).
    F32,
}

/// How an FMA kernel stages the block's operands in shared memory.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Staging {
    /// Each problem's A and B in its own padded slot, loaded by its own threads; C read and
    /// written by each thread from and to global memory directly.
    #[default]
    Padded,
    /// Where a strided batch is packed (tight matrices back to back), the block's `tba`
    /// A matrices are one contiguous span, as are its B matrices: all threads of the block
    /// copy each span with 16-byte vector loads and stores, verbatim (no index arithmetic),
    /// and read it in memory order. Operands that are not packed, or whose memory order
    /// would cost shared-memory bank conflicts, stay padded.
    Flat,
    /// `Flat`, and C too: read into shared memory with 16-byte loads, updated there, and
    /// written back with 16-byte stores after a second barrier.
    FlatC,
}

/// How a batched GEMM maps onto threads; tunable, serde data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSchedule {
    /// Rows of C per thread (FMA kernels).
    pub rm: u32,
    /// Columns of C per thread (FMA kernels).
    pub rn: u32,
    /// Problems per thread block.
    pub tba: u32,
    /// Tensor-core shape, for f16 only; `None` means FMA kernels.
    pub mma: Option<MmaShape>,
    /// Warps per problem for tensor-core kernels.
    pub warps: u32,
    /// f16 accumulation precision (ignored for f32/f64).
    pub accumulate: Accumulate,
    /// Shared-memory staging. Tensor-core kernels, `Flat`: A and B of a packed strided
    /// batch whose rows are not 16-byte aligned (sizes no multiple of 8) are read with
    /// aligned 16-byte loads and stored to the padded layout 8 halves at a time, shifted
    /// into place in registers (`Padded`: narrower loads there); `FlatC`: that, and C goes
    /// through shared memory: a padded copy, column by column, where m is even (16-, 8- or
    /// 4-byte vectors), else the block's span verbatim; the epilogue reads and writes the
    /// shared copy (`prefetch_c` is then moot).
    #[serde(default)]
    pub stage: Staging,
    /// Tensor-core kernels: load the A and B fragments with `ldmatrix` (one instruction per
    /// fragment, transposing where the operand is stored the other way) instead of 16/32-bit
    /// shared loads. Ignored by FMA kernels.
    #[serde(default)]
    pub ldmatrix: bool,
    /// Tensor-core kernels: load the old values of C (beta != 0) for all of a warp's tiles
    /// before A and B are staged, so that their latency overlaps the staging instead of
    /// following each tile's mma one after another. Ignored by FMA kernels (they always do).
    #[serde(default)]
    pub prefetch_c: bool,
    /// Blocks per SM ptxas must make room for (`.minnctapersm`, capping registers per
    /// thread); 0: the code generator's own rule (as many as shared memory and the warp
    /// slots allow for tensor-core kernels with C in shared memory at sizes that are no
    /// multiple of 8, none elsewhere), 1: none.
    #[serde(default)]
    pub min_blocks: u32,
    /// FMA kernels with padded staging (f32, f64): each thread reads its rows of A and its
    /// columns of B as 8- or 16-byte shared vectors instead of element by element. An
    /// operand whose lead in memory is k is kept k-contiguous and read 16 bytes along k (a
    /// vector serves several k steps); one whose lead is m (n) is kept m- (n-) contiguous
    /// with its rows (columns) permuted so that a thread's `rm` rows (`rn` columns) are
    /// adjacent, read as one vector per k step. Ignored elsewhere.
    #[serde(default)]
    pub vector_reads: bool,
    /// Tensor-core kernels whose warps do not each keep one row of tiles (the warp count
    /// no multiple of the row tiles): a warp computes this many tiles of one row tile
    /// (consecutive column tiles) together, k step by k step, loading each A fragment once
    /// for all of them; 0 or 1: one tile at a time. Ignored elsewhere.
    #[serde(default)]
    pub mma_group: u32,
    /// Tensor-core kernels with C through shared memory (`Staging::FlatC`), one problem per
    /// block, whose warps each keep one row of tiles (the warp count a multiple of the row
    /// tiles: every warp holds its A fragments in registers for all k steps): C's copy
    /// takes A's place in shared memory once every warp has loaded its A fragments (read
    /// from global memory only then, between two barriers), so that the block needs the
    /// bytes of A and B alone and more blocks fit on an SM. Ignored elsewhere, and where
    /// C's copy is larger than A's.
    #[serde(default)]
    pub c_over_a: bool,
    /// Tensor-core kernels with flat A and B (`Staging::Flat`, f16 sizes no multiple of 8):
    /// the realigning loaders find each vector's column and place in it by a multiply-high
    /// instead of `div.u32` / `rem.u32` (`Staging::FlatC` always does). Both are exact; which
    /// one ptxas schedules better depends on the size (docs/gpu-notes.md, version 13).
    /// Ignored elsewhere.
    #[serde(default)]
    pub mul_hi_slots: bool,
    /// Tensor-core kernels without `ldmatrix`, staging other than `Padded`, strided batches:
    /// A and B, where tight and packed, are copied into shared memory verbatim (the block's
    /// span with 16-byte vectors, as C under `FlatC`) instead of realigned into padded
    /// slots, and the fragments are read from that copy with 16-bit loads (whatever its
    /// alignment), the k padding zeroed by predicates. Fewer instructions per problem where
    /// the matrices are small and their rows unaligned (docs/gpu-notes.md, version 14).
    /// Ignored elsewhere.
    #[serde(default)]
    pub flat_fragments: bool,
    /// Tensor-core kernels of strided batches: the copies into shared memory that need no
    /// realigning (C's under `FlatC`, verbatim where m is odd and column by column where it
    /// is even, the latter not beside flat fragments; A's and B's under `flat_fragments`)
    /// go through `cp.async`, global memory to
    /// shared memory without registers, so that all of them are in flight at once beside
    /// the realigning loads; C's partial vectors at a verbatim span's ends come whole, as
    /// A's and B's do (docs/gpu-notes.md, version 15). FMA kernels (any batch form): A
    /// and B are staged element by element (or by aligned vector) through `cp.async`,
    /// zero-filled past the problem's extents by its source size, instead of a load into a
    /// register and a shared store (docs/gpu-notes.md, version 20); their flat spans (and
    /// C's under `FlatC`) in whole 16-byte vectors (version 26). Ignored elsewhere.
    #[serde(default)]
    pub async_copies: bool,
    /// Tensor-core kernels of strided batches with at most 15 problems per block, whose A
    /// and B are realigned into their padded slots (f16 sizes no multiple of 8,
    /// `Staging::Flat` or `FlatC`, `ldmatrix` or not, no flat fragments): each operand is
    /// first copied verbatim into the start of its own slot through `cp.async` (all of it
    /// in flight at once, no registers), then realigned from there, shared memory to shared
    /// memory: every thread reads and shifts its vectors, a barrier of the problem's
    /// threads (named barrier 1 + g for problem g of a block, hence the 15), and the stores
    /// overwrite the copy. The global loads then no longer go out in rounds bounded by the
    /// registers (version 15's limit at the large odd sizes). A vector is read as five
    /// 4-byte words and funnel-shifted (two 16-byte loads and selects where the words'
    /// bank conflicts would cost more; docs/gpu-notes.md, version 31). Ignored elsewhere,
    /// and for an operand whose verbatim copy (with 20 bytes to spare) is larger than its
    /// slot.
    #[serde(default)]
    pub realign_in_shared: bool,
    /// Tensor-core kernels with C through shared memory (`Staging::FlatC`): in the
    /// epilogue, each lane takes its four accumulators of a tile in a lane-dependent order
    /// (conditional swaps), chosen by the code generator for C's copy against bank
    /// conflicts. Where m is odd the copy is verbatim, its columns m halves apart, and a
    /// warp's 16-bit accesses in the plain order fall into few banks (4 words a bank where
    /// m is 1 or 31 mod 32). It costs selects and registers. Ignored elsewhere, and where
    /// the plain order has no conflicts (docs/gpu-notes.md, version 18).
    #[serde(default)]
    pub epilogue_swaps: bool,
    /// Tensor-core kernels: each warp takes whole columns of tiles (column tiles w, w +
    /// warps, ..., every row tile of each), holding the A fragments of every row tile in
    /// registers for all k steps, and loads each B fragment once for all the row tiles of
    /// its column instead of once per tile. Where the row tiles are few (m up to 32) one
    /// warp per problem then reads B once, not once per row tile, and the rows of A past
    /// m are known to the code generator (not loaded where a whole fragment word lies
    /// past m). Ignored elsewhere (docs/gpu-notes.md, version 19).
    #[serde(default)]
    pub column_sweep: bool,
    /// Tensor-core kernels whose warps each keep one row of tiles (the warp count a
    /// multiple of the row tiles: A's fragments held in registers for all k steps; no
    /// column sweep): a warp computes this many of its column tiles together, k step by k
    /// step, so that their accumulator chains interleave and one `mma`'s latency hides
    /// behind the others'. One tile at a time, a tile's k steps wait on each other: in the
    /// SASS of f16 120 on sm_90 (C in shared memory), ptxas does not move the next tile's
    /// shared loads above the epilogue's shared stores before them (eight dependent HMMA
    /// a tile, stalls between them). 0 or 1: one tile at a time. Ignored elsewhere (`mma_group` groups
    /// the other warps' tiles; docs/gpu-notes.md, version 29).
    #[serde(default)]
    pub row_group: u32,
    /// Tensor-core kernels whose copies go through `cp.async` with C through shared memory
    /// (`async_copies_apply`): A and B go straight into their padded slots through
    /// `cp.async`, in the widest vectors their columns allow (4, 8 or 16 bytes), instead
    /// of through registers (whole 16-byte columns) or as 16-byte copies of the whole span
    /// realigned afterwards (columns of other even lengths). An operand whose columns are
    /// an odd number of halves keeps its realigning copy (`cp.async` moves at least 4
    /// bytes). Fewer instructions and registers (f16 114 on sm_90: 1288 -> 1032 SASS
    /// instructions a thread, 64 -> 55 registers), more copies: on an H200 it won at about
    /// a quarter of the sizes 16..128 and lost at most multiples of 8, so it is off unless
    /// a schedule asks for it (docs/gpu-notes.md, version 30). Ignored elsewhere.
    #[serde(default)]
    pub slot_copies: bool,
    /// Tensor-core kernels with C's padded copy in shared memory (`Staging::FlatC`, m even)
    /// on sm_90: the epilogue reads and writes C's copy element by element with 16-bit
    /// accesses, instead of a tile at a time with `ldmatrix` and `stmatrix` (`.trans`:
    /// a lane's accumulators are two pairs of adjacent columns, one instruction moves a
    /// tile's). The tile moves cut a fifth of the instructions of 66 and 120 (928 -> 720,
    /// 1144 -> 912 SASS a thread) and gained up to 10 points of the bound on an H200 at
    /// most even sizes (120 83 -> 88%, 128 95 -> 100%), but lost at 66, 68, 114 and 116
    /// (up to 12 points, not understood), whose entries ask for this
    /// (docs/gpu-notes.md, version 31). Ignored elsewhere.
    #[serde(default)]
    pub element_epilogue: bool,
    /// Tensor-core kernels: the epilogue loads C's old values before it stores results:
    /// each tile's four where it moves elements (C's copy verbatim, m odd;
    /// `element_epilogue`; C in global memory; sm_80), and every tile's `ldmatrix` of a
    /// group before the first `stmatrix` where it moves whole tiles (m even, sm_90). ptxas
    /// does not move a load above a store it cannot tell apart, so otherwise each load
    /// waits for the store before it. On an H200, with everything else as tuned: 97 67 ->
    /// 71% of the bound, 126 78 -> 82%, 122 77 -> 79%, 21 80 -> 83%, a point or two at 18
    /// more sizes (its 22 entries); lost 4 and 8 points at 17 and 29 (docs/gpu-notes.md,
    /// version 32). Off unless a schedule asks for it.
    #[serde(default)]
    pub epilogue_loads_first: bool,
    /// Tensor-core kernels whose last k step holds at most 8 of k (k mod 16 in 1..=8): that
    /// step as a full `mma.m16n8k16` over the zero padding, as before the narrow step
    /// (`m16n8k8`, half the fragment loads). The narrow step gained up to 7 points of the
    /// bound at most such f16 sizes on an H200, but its fewer registers let a fourth block
    /// of 57 KB shared memory onto each SM at 84, which then lost 17 points (the old kernel
    /// with 4 blocks a SM lost as much; docs/gpu-notes.md, version 33). Off unless a
    /// schedule asks for it.
    #[serde(default)]
    pub full_last_k_step: bool,
    /// Tensor-core kernels: each warp keeps two row tiles (where the warp count is a
    /// multiple of the row tiles halved, rounded up; no column sweep), both rows' A
    /// fragments in registers for all k steps, and loads each B fragment once for both
    /// instead of once per row tile: half the B fragment traffic through shared memory,
    /// about 25% of the wavefronts of f16 113 on an H200 (docs/gpu-notes.md, version 34),
    /// for twice A's registers. Where the row tiles are odd the last pair's second tile lies
    /// past m: computed on the last row tile's A, never stored. Ignored elsewhere.
    #[serde(default)]
    pub row_pairs: bool,
    /// Tensor-core kernels whose warps keep their row tiles (one or two,
    /// [`Self::row_tiles_per_warp`]): A's fragments loaded at each k step of each group of
    /// column tiles instead of held in registers for all k steps. Two row tiles' held
    /// fragments take 64 registers at k = 128, which cost f16 113 its second block per SM
    /// with 16 warps; loaded per step they take 8, and where one group holds all of a
    /// warp's column tiles (`row_group`) A is still read once. Not with C over A (which
    /// needs A's fragments in registers before C takes A's place). Ignored elsewhere.
    #[serde(default)]
    pub stream_a: bool,
    /// Tensor-core kernels that realign A and B in shared memory (`realign_in_shared`):
    /// each 16-byte vector of a padded slot rebuilt from the two aligned vectors around it
    /// (16-byte loads and selects) even where the 4-byte words' bank rule would read five
    /// words and funnel-shift them. On an H200 the words lost 2 to 9 points of the bound
    /// at 61, 79, 87, 89 and 91 with the planned schedules, and won at most other sizes
    /// (docs/gpu-notes.md, version 36). Off unless a schedule asks for it; ignored where
    /// the words are not used anyway.
    #[serde(default)]
    pub realign_vectors: bool,
}

/// A schedule that breaks a hard limit of the target or does not fit the problem.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum GpuScheduleError {
    #[error("register tile {rm}x{rn}: each side must be 1, 2, 4 or 8")]
    Tile { rm: u32, rn: u32 },
    #[error("tba = {0}: at least one problem per block")]
    Tba(u32),
    #[error("{threads} threads per block exceed the limit of {limit}")]
    Threads { threads: u32, limit: u32 },
    #[error("{bytes} bytes of shared memory per block exceed the limit of {limit}")]
    Shared { bytes: usize, limit: usize },
    #[error("about {estimate} registers per thread exceed the limit of {limit}")]
    Registers { estimate: u32, limit: u32 },
    #[error("tensor cores need f16 inputs (got {0:?})")]
    MmaDtype(Dtype),
    #[error("the target has no {0:?} tensor-core shape")]
    MmaShape(MmaShape),
    #[error("warps = {0}: tensor-core kernels need 1..=32 warps per problem")]
    Warps(u32),
    #[error("no schedule fits: one problem's A and B need {bytes} bytes of shared memory, more than a block's {limit} on this GPU (the kernels stage whole problems); split k into parts of at most {max_k} and accumulate them with beta = 1")]
    ProblemTooLarge {
        bytes: usize,
        limit: usize,
        /// The largest k with which the same m and n fit.
        max_k: usize,
    },
}

/// Resource use of a schedule on a problem: what validation compares with the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuResources {
    pub threads_per_problem: u32,
    pub threads_per_block: u32,
    pub shared_bytes: usize,
    pub registers_estimate: u32,
}

/// Padded shared-memory geometry of one problem's A and B, in elements. A is stored as op(A)
/// (m x k) at `i * a_row + p * a_col`; B as op(B) (k x n) at `p * b_row + j * b_col`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedLayout {
    pub a_row: usize,
    pub a_col: usize,
    pub a_len: usize,
    pub b_row: usize,
    pub b_col: usize,
    pub b_len: usize,
    /// Rows of A permuted (`GpuSchedule::vector_reads`): row i at `(i % a_perm) * rm + i /
    /// a_perm` instead of i, so that the `rm` rows `tx + a * a_perm` of thread tx are
    /// adjacent; 0: not permuted.
    pub a_perm: usize,
    /// Columns of B permuted likewise (`(j % b_perm) * rn + j / b_perm`); 0: not permuted.
    pub b_perm: usize,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl GpuSchedule {
    /// An FMA (no tensor cores) schedule: `rm x rn` tiles of C per thread, `tba` problems
    /// per block, A and B staged as `stage` says.
    pub fn fma(rm: u32, rn: u32, tba: u32, stage: Staging) -> GpuSchedule {
        GpuSchedule {
            rm,
            rn,
            tba,
            mma: None,
            warps: 1,
            accumulate: Accumulate::F32,
            stage,
            ldmatrix: false,
            prefetch_c: false,
            min_blocks: 0,
            vector_reads: false,
            mma_group: 0,
            c_over_a: false,
            mul_hi_slots: false,
            flat_fragments: false,
            async_copies: false,
            realign_in_shared: false,
            epilogue_swaps: false,
            column_sweep: false,
            row_group: 0,
            slot_copies: false,
            element_epilogue: false,
            epilogue_loads_first: false,
            full_last_k_step: false,
            row_pairs: false,
            stream_a: false,
            realign_vectors: false,
        }
    }

    /// A tensor-core schedule (`mma.sync.m16n8k16`, f32 accumulation): `warps` warps per
    /// problem, `tba` problems per block, padded staging, no C prefetch.
    pub fn mma(warps: u32, tba: u32, ldmatrix: bool) -> GpuSchedule {
        GpuSchedule {
            mma: Some(MmaShape::M16N8K16),
            warps,
            ldmatrix,
            // Every other field as for FMA kernels: off.
            ..GpuSchedule::fma(1, 1, tba, Staging::Padded)
        }
    }

    /// A short human-readable summary (`mma w8 tba1 ldm pc`, `r4x4 tba2 flat`) for tables.
    pub fn label(&self) -> String {
        let stage = match self.stage {
            Staging::Padded => "",
            Staging::Flat => " flat",
            Staging::FlatC => " flatc",
        };
        match self.mma {
            Some(_) => format!(
                "mma w{} tba{}{}{stage}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}{}",
                self.warps,
                self.tba,
                if self.ldmatrix { " ldm" } else { "" },
                if self.prefetch_c { " pc" } else { "" },
                match self.min_blocks {
                    0 => String::new(),
                    b => format!(" mb{b}"),
                },
                match self.mma_group {
                    0 | 1 => String::new(),
                    g => format!(" g{g}"),
                },
                if self.c_over_a { " ca" } else { "" },
                if self.mul_hi_applies() { " mh" } else { "" },
                if self.flat_fragments_apply() {
                    " ff"
                } else {
                    ""
                },
                if self.async_copies_apply() {
                    " cpa"
                } else {
                    ""
                },
                if self.realign_in_shared_apply() {
                    " rsh"
                } else {
                    ""
                },
                if self.epilogue_swaps_apply() {
                    " sw"
                } else {
                    ""
                },
                if self.column_sweep_apply() { " cs" } else { "" },
                match self.row_group {
                    0 | 1 => String::new(),
                    g => format!(" rg{g}"),
                },
                if self.slot_copies_apply() { " sc" } else { "" },
                if self.element_epilogue_apply() {
                    " ee"
                } else {
                    ""
                },
                if self.epilogue_loads_first_apply() {
                    " lf"
                } else {
                    ""
                },
                if self.full_last_k_step_apply() {
                    " fk"
                } else {
                    ""
                },
                if self.row_pairs_apply() { " rp" } else { "" },
                if self.stream_a_apply() { " sa" } else { "" },
                if self.realign_vectors_apply() {
                    " rv"
                } else {
                    ""
                }
            ),
            None => format!(
                "r{}x{} tba{}{stage}{}{}",
                self.rm,
                self.rn,
                self.tba,
                if self.vector_reads { " vr" } else { "" },
                if self.async_staging_apply() {
                    " cpa"
                } else {
                    ""
                }
            ),
        }
    }

    /// Whether `mul_hi_slots` takes effect: tensor-core kernels with flat A and B.
    pub fn mul_hi_applies(&self) -> bool {
        self.mul_hi_slots && self.mma.is_some() && self.stage == Staging::Flat
    }

    /// Whether `flat_fragments` takes effect (the batch form aside): tensor-core kernels
    /// without `ldmatrix` and with flat staging.
    pub fn flat_fragments_apply(&self) -> bool {
        self.flat_fragments && self.mma.is_some() && !self.ldmatrix && self.stage != Staging::Padded
    }

    /// Whether `async_copies` takes effect (the batch form and m aside): tensor-core kernels
    /// with C through shared memory or with flat fragments.
    pub fn async_copies_apply(&self) -> bool {
        self.async_copies
            && self.mma.is_some()
            && (self.stage == Staging::FlatC || self.flat_fragments_apply())
    }

    /// Whether `element_epilogue` may take effect (where C's copy is padded, on sm_90):
    /// tensor-core kernels with C through shared memory.
    pub fn element_epilogue_apply(&self) -> bool {
        self.element_epilogue && self.mma.is_some() && self.stage == Staging::FlatC
    }

    /// Whether `epilogue_loads_first` may take effect (where beta reads C): tensor-core
    /// kernels, whether their epilogue moves elements or whole tiles.
    pub fn epilogue_loads_first_apply(&self) -> bool {
        self.epilogue_loads_first && self.mma.is_some()
    }

    /// Whether `full_last_k_step` may take effect (where k mod 16 is 1..=8): tensor-core
    /// kernels.
    pub fn full_last_k_step_apply(&self) -> bool {
        self.full_last_k_step && self.mma.is_some()
    }

    /// Whether `row_pairs` may take effect (where the warp count suits it, see
    /// [`Self::row_tiles_per_warp`]): tensor-core kernels without column sweep.
    pub fn row_pairs_apply(&self) -> bool {
        self.row_pairs && self.mma.is_some() && !self.column_sweep_apply()
    }

    /// Whether `stream_a` may take effect (where the warps keep their row tiles, see
    /// [`Self::effective`]): tensor-core kernels.
    pub fn stream_a_apply(&self) -> bool {
        self.stream_a && self.mma.is_some()
    }

    /// Whether `realign_vectors` may take effect (where the words' bank rule would choose
    /// them): kernels that realign A and B in shared memory.
    pub fn realign_vectors_apply(&self) -> bool {
        self.realign_vectors && self.realign_in_shared_apply()
    }

    /// This schedule as it takes effect on `p`, so that names, labels and stored entries
    /// say what the kernel does: `row_pairs` off where the warps do not suit it and
    /// `stream_a` off where the warps do not keep their row tiles (the code is the same
    /// either way), and `stream_a` off where the schedule asks for C over A (which needs A's
    /// fragments held; the code generator relies on this).
    pub fn effective(mut self, p: &ColMajorProblem) -> GpuSchedule {
        if self.row_pairs && self.row_tiles_per_warp(p) != Some(2) {
            self.row_pairs = false;
        }
        if self.stream_a && (self.row_tiles_per_warp(p).is_none() || self.c_over_a) {
            self.stream_a = false;
        }
        self
    }

    /// Tensor-core kernels whose warps each keep the same row tiles for all their tiles
    /// (A's fragments in registers for all k steps): how many, 2 with `row_pairs` where the
    /// warp count is a multiple of the row tiles halved (rounded up), 1 where it is a
    /// multiple of the row tiles; None elsewhere (the warps take tiles in turn) and with
    /// column sweep.
    pub fn row_tiles_per_warp(&self, p: &ColMajorProblem) -> Option<usize> {
        let shape = self.mma?;
        if self.column_sweep_apply() {
            return None;
        }
        let mt = p.m.div_ceil(shape.m as usize);
        let w = self.warps as usize;
        if self.row_pairs_apply() && mt >= 2 && w % mt.div_ceil(2) == 0 {
            Some(2)
        } else {
            (w % mt == 0).then_some(1)
        }
    }

    /// Whether `slot_copies` takes effect (the batch form and the column lengths aside):
    /// tensor-core kernels whose copies go through `cp.async`, without flat fragments.
    pub fn slot_copies_apply(&self) -> bool {
        self.slot_copies && self.async_copies_apply() && !self.flat_fragments_apply()
    }

    /// Whether `async_copies` takes effect on an FMA kernel: its element-wise (and aligned
    /// vector) staging of A and B goes through `cp.async`, zero-filled past the problem.
    pub fn async_staging_apply(&self) -> bool {
        self.async_copies && self.mma.is_none()
    }

    /// Whether `epilogue_swaps` takes effect (the table aside): tensor-core kernels with C
    /// through shared memory.
    pub fn epilogue_swaps_apply(&self) -> bool {
        self.epilogue_swaps && self.mma.is_some() && self.stage == Staging::FlatC
    }

    /// Whether `column_sweep` takes effect: tensor-core kernels.
    pub fn column_sweep_apply(&self) -> bool {
        self.column_sweep && self.mma.is_some()
    }

    /// Whether `realign_in_shared` takes effect (the batch form, the sizes and the slots
    /// aside): tensor-core kernels with flat staging, at most 15 problems per block (one
    /// named barrier each), without flat fragments.
    pub fn realign_in_shared_apply(&self) -> bool {
        self.realign_in_shared
            && self.mma.is_some()
            && self.stage != Staging::Padded
            && self.tba <= 15
            && !self.flat_fragments_apply()
    }

    /// Threads per problem of an FMA schedule: one per `rm x rn` tile of C.
    pub fn fma_threads(&self, p: &ColMajorProblem) -> u32 {
        (p.m.div_ceil(self.rm as usize) * p.n.div_ceil(self.rn as usize)) as u32
    }

    /// Whether `vector_reads` takes effect for `p`: FMA kernels of f32 or f64 with padded
    /// staging.
    pub fn vectors_apply(&self, p: &ColMajorProblem) -> bool {
        self.vector_reads
            && self.mma.is_none()
            && self.stage == Staging::Padded
            && p.dtype != Dtype::F16
    }

    /// The shared-memory layout the kernels use for `p` under this schedule.
    pub fn shared_layout(&self, p: &ColMajorProblem) -> SharedLayout {
        match self.mma {
            None if self.vectors_apply(p) => {
                // `vector_reads`: each operand keeps the order it has in memory. Lead k:
                // k-contiguous, 16-byte aligned columns (rows) whose leading dimension is an
                // odd number of 16-byte vectors, so that the vectors of 8 threads with
                // consecutive rows (columns) fall in different banks. Lead m (n): m- (n-)
                // contiguous, permuted so that a thread's rows (columns) are one vector.
                let rows = round_up(p.m, self.rm as usize);
                let cols = round_up(p.n, self.rn as usize);
                let vec = 16 / p.dtype.size();
                let k_ld = {
                    let ld = round_up(p.k, vec);
                    if (ld / vec) % 2 == 0 {
                        ld + vec
                    } else {
                        ld
                    }
                };
                // (No permutation for one row or column per thread.)
                let period = |n: usize, r: u32| if r > 1 { n / r as usize } else { 0 };
                let (a_row, a_col, a_perm) = match p.trans_a {
                    Trans::N => (1, round_up(rows, vec), period(rows, self.rm)),
                    Trans::T => (k_ld, 1, 0),
                };
                let (b_row, b_col, b_perm) = match p.trans_b {
                    Trans::N => (1, k_ld, 0),
                    Trans::T => (round_up(cols, vec), 1, period(cols, self.rn)),
                };
                SharedLayout {
                    a_row,
                    a_col,
                    a_len: round_up((a_row * rows).max(a_col * p.k), 8),
                    b_row,
                    b_col,
                    b_len: round_up((b_row * p.k).max(b_col * cols), 8),
                    a_perm,
                    b_perm,
                }
            }
            None => {
                // A column-major: threads of a warp read consecutive rows (no conflict).
                // Its leading dimension is odd when A is transposed in memory (the loads
                // then write along rows of the shared copy, spread over all banks), else a
                // multiple of 16 bytes so that whole vectors are stored. B is read along
                // columns by threads of different column groups: odd leading dimension.
                // Padded to the tile grid so that threads whose tile hangs over the edge
                // read (unused) values inside the allocation.
                let rows = round_up(p.m, self.rm as usize);
                let cols = round_up(p.n, self.rn as usize);
                let vec = 16 / p.dtype.size();
                let lda = match p.trans_a {
                    Trans::T => rows | 1,
                    Trans::N => round_up(rows, vec),
                };
                let ldb = p.k | 1;
                SharedLayout {
                    a_row: 1,
                    a_col: lda,
                    a_len: round_up(lda * p.k, 8),
                    b_row: 1,
                    b_col: ldb,
                    b_len: round_up(ldb * cols, 8),
                    a_perm: 0,
                    b_perm: 0,
                }
            }
            Some(s) => {
                // Each operand keeps the order it has in memory (whole vectors stored), its
                // leading dimension padded by 8 halves past the mma tile: then the 8 rows
                // or 4 column pairs one fragment load touches fall in different banks.
                let kp = round_up(p.k, s.k as usize);
                let rows = round_up(p.m, s.m as usize);
                let cols = round_up(p.n, s.n as usize);
                let (a_row, a_col, a_len) = match p.trans_a {
                    Trans::N => (1, rows + 8, (rows + 8) * kp),
                    Trans::T => (kp + 8, 1, (kp + 8) * rows),
                };
                let (b_row, b_col, b_len) = match p.trans_b {
                    Trans::N => (1, kp + 8, (kp + 8) * cols),
                    Trans::T => (cols + 8, 1, (cols + 8) * kp),
                };
                SharedLayout {
                    a_row,
                    a_col,
                    a_len,
                    b_row,
                    b_col,
                    b_len,
                    a_perm: 0,
                    b_perm: 0,
                }
            }
        }
    }

    /// Threads, shared memory and an estimate of registers for `p`.
    pub fn resources(&self, p: &ColMajorProblem) -> GpuResources {
        let elt = p.dtype.size();
        let shared = self.shared_layout(p);
        let (tpp, regs) = match self.mma {
            None => {
                let words = if p.dtype == Dtype::F64 { 2 } else { 1 };
                let tile = self.rm * self.rn * words;
                // Accumulators, one column of A and one row of B in flight, addressing.
                (
                    self.fma_threads(p),
                    tile + (self.rm + self.rn) * words * 2 + 24,
                )
            }
            Some(s) => {
                let tiles = (p.m.div_ceil(s.m as usize) * p.n.div_ceil(s.n as usize)) as u32;
                let per_warp = tiles.div_ceil(self.warps.max(1));
                // 4 f32 accumulators per 16x8 tile, 4 + 2 fragment words, addressing; a
                // prefetch of C holds 4 halves per tile of the warp.
                let prefetched = if self.prefetch_c { per_warp * 4 } else { 0 };
                (32 * self.warps, per_warp * 4 + prefetched + 12 + 24)
            }
        };
        GpuResources {
            threads_per_problem: tpp,
            threads_per_block: tpp.saturating_mul(self.tba),
            shared_bytes: (shared.a_len + shared.b_len) * elt * self.tba as usize,
            registers_estimate: regs,
        }
    }

    /// Fewer problems a block until the block fits `target` (shared memory grows with them
    /// and with k), down to one.
    pub fn shrink_tba_to_fit(&mut self, p: &ColMajorProblem, target: &GpuTarget) {
        while self.tba > 1 && self.validate(p, target).is_err() {
            self.tba -= 1;
        }
    }

    /// Checks the hard constraints of `target` for problem `p`.
    pub fn validate(
        &self,
        p: &ColMajorProblem,
        target: &GpuTarget,
    ) -> Result<GpuResources, GpuScheduleError> {
        let side = |x: u32| matches!(x, 1 | 2 | 4 | 8);
        if !side(self.rm) || !side(self.rn) {
            return Err(GpuScheduleError::Tile {
                rm: self.rm,
                rn: self.rn,
            });
        }
        if self.tba == 0 {
            return Err(GpuScheduleError::Tba(0));
        }
        if let Some(shape) = self.mma {
            if p.dtype != Dtype::F16 {
                return Err(GpuScheduleError::MmaDtype(p.dtype));
            }
            if !target.f16_mma_shapes.contains(&shape) {
                return Err(GpuScheduleError::MmaShape(shape));
            }
            if self.warps == 0 || self.warps > 32 {
                return Err(GpuScheduleError::Warps(self.warps));
            }
        }
        let r = self.resources(p);
        if r.threads_per_block > target.max_threads_per_block {
            return Err(GpuScheduleError::Threads {
                threads: r.threads_per_block,
                limit: target.max_threads_per_block,
            });
        }
        if r.shared_bytes > target.shared_bytes_per_block {
            return Err(GpuScheduleError::Shared {
                bytes: r.shared_bytes,
                limit: target.shared_bytes_per_block,
            });
        }
        if r.registers_estimate > target.max_registers_per_thread {
            return Err(GpuScheduleError::Registers {
                estimate: r.registers_estimate,
                limit: target.max_registers_per_thread,
            });
        }
        Ok(r)
    }
}

use Staging::{Flat as F, FlatC as FC, Padded as P};

/// f64 winners for n = 2..=32 on an H100: (rm, rn, tba, staging).
#[rustfmt::skip]
const H100_F64: [(u32, u32, u32, Staging); 31] = [
    (2, 1, 64, F), (1, 1, 28, P), (1, 1, 4, F), (1, 1, 10, P), (2, 1, 14, F), // 2..6
    (2, 1, 18, P), (2, 1, 8, P), (2, 1, 5, P), (2, 1, 2, P), (2, 1, 7, P), // 7..11
    (2, 2, 1, P), (2, 1, 1, P), (2, 1, 2, P), (2, 1, 1, P), (2, 1, 4, P), // 12..16
    (2, 2, 3, P), (2, 2, 1, P), (2, 2, 2, P), (2, 2, 2, P), (4, 2, 3, P), // 17..21
    (2, 2, 2, P), (2, 2, 3, P), (2, 2, 1, P), (4, 2, 2, P), (4, 2, 2, P), // 22..26
    (2, 2, 1, P), (2, 2, 1, P), (4, 2, 2, P), (4, 2, 1, P), (2, 2, 1, P), // 27..31
    (2, 2, 1, P), // 32
];

/// f32 winners for n = 2..=32 on an H100: (rm, rn, tba, staging); 19 and 21 from a second
/// sweep with 8x4 tiles (bench, same H100: 98.6% / 99.7% of the bound against 93.4% / 94.1%).
#[rustfmt::skip]
const H100_F32: [(u32, u32, u32, Staging); 31] = [
    (2, 1, 32, F), (4, 4, 128, FC), (2, 1, 8, F), (2, 1, 17, P), (4, 4, 16, F), // 2..6
    (2, 1, 9, P), (2, 2, 8, P), (2, 1, 2, P), (2, 1, 5, P), (4, 2, 7, FC), // 7..11
    (2, 2, 7, P), (2, 1, 1, P), (2, 2, 10, P), (4, 2, 4, FC), (2, 2, 2, P), // 12..16
    (4, 4, 5, F), (2, 2, 1, P), (8, 4, 8, P), (2, 2, 2, P), (8, 4, 3, P), // 17..21
    (2, 2, 2, P), (4, 4, 3, P), (2, 2, 1, P), (4, 4, 5, P), (4, 4, 5, P), // 22..26
    (4, 4, 1, P), (4, 4, 2, P), (4, 4, 1, P), (4, 4, 2, P), (4, 4, 2, F), // 27..31
    (4, 2, 2, P), // 32
];

/// f16 FMA winners for n = 2..=15 on an H100: (rm, rn, tba, staging); from 13 to 15 they
/// beat the tensor-core kernels by 30 points of the bound.
#[rustfmt::skip]
const H100_F16: [(u32, u32, u32, Staging); 14] = [
    (2, 2, 64, F), (4, 4, 128, FC), (2, 2, 16, P), (4, 4, 32, FC), (4, 4, 32, FC), // 2..6
    (4, 4, 16, FC), (4, 2, 8, F), (4, 4, 7, F), (4, 4, 14, FC), (4, 4, 14, FC), // 7..11
    (4, 2, 7, FC), (4, 4, 8, FC), (4, 4, 8, FC), (4, 4, 16, FC), // 12..15
];

/// FMA defaults of version 26 (docs/gpu-notes.md): flat spans copied into shared memory
/// through `cp.async` (`async_copies`: every vector of A, B and C in flight at once, no
/// registers, no element-by-element ends), which replace the entries above at these square
/// sizes. From `smallgemm tune --gpu --schedules` on an H100 (the planned schedule, then
/// `cp.async` with flat or `FlatC` staging and 8 to 64 problems a block), then the bench
/// with the tuned database against the planner, alternated, twice (% of the bound): f16 3
/// 99.0-99.9 -> 103.2-104.0, 5 99.9-100.8 -> 102.1-102.5, 8 93.9-94.4 -> 95.3-97.7, 9
/// 85.6-85.8 -> 100.0-100.9, 11 96.4-96.6 -> 98.1-100.3, 12 98.4-99.0 -> 103.1-103.4, 13
/// 90.3-96.4 -> 97.1-102.4, 14 99.7-100.6 -> 101.3-102.3, 15 93.8-94.0 -> 99.4-100.3; f32
/// 17 92.0-92.5 -> 96.7-97.2. (dtype, n, rm, rn, tba of the square problem, staging.)
#[rustfmt::skip]
const H100_FMA_ASYNC: [(Dtype, usize, u32, u32, u32, Staging); 10] = [
    (Dtype::F16, 3, 4, 4, 128, FC), (Dtype::F16, 5, 4, 4, 64, FC),
    (Dtype::F16, 8, 4, 2, 16, FC), (Dtype::F16, 9, 4, 4, 32, FC),
    (Dtype::F16, 11, 4, 4, 16, FC), (Dtype::F16, 12, 4, 2, 8, FC),
    (Dtype::F16, 13, 4, 4, 16, FC), (Dtype::F16, 14, 4, 4, 16, FC),
    (Dtype::F16, 15, 4, 4, 16, FC), (Dtype::F32, 17, 4, 4, 5, FC),
];

/// f16 tensor-core winners for n = 16..=128 on an H100 (`smallgemm tune --gpu --dtype f16
/// --mma-only`: a full sweep of the `ldmatrix` candidates over 33 sizes, then `--quick-mma`
/// over the other 80, then `--quick-mma` with 16 warps over 65..128; docs/gpu-notes.md,
/// version 6; then `--flatc-only` over 48..113, `FlatC` where the bench confirmed it, and
/// 120 and 128 as the other multiples of 16: version 7; then, with whole-vector stores of
/// flat A and B, `--quick-mma` over the non-multiples of 8 in 17..31 and `--flatc-only`
/// over those in 33..127, the winners taken where the bench did not lose, then
/// `--flatc-only` over the even ones from 66 with C's padded copy: version 8; then
/// `--groups` over 65..112 with tiles in groups, the winners all ahead of the old defaults
/// in both bench runs: version 11; 49 flat with the multiply-high slots, from `--mma-only
/// --ldmatrix-only`: version 13): (warps, tba, variant).
#[rustfmt::skip]
const H100_F16_MMA: [(u32, u32, Mma); 113] = [
    (1, 1, Pre), (2, 1, FlatPre), (2, 2, Pre), (2, 1, FlatPre), (2, 2, Pre), (2, 1, FlatPre), // 16..21
    (4, 1, Pre), (2, 1, FlatPre), (4, 1, Pre), (2, 1, FlatPre), (8, 1, Pre), (2, 2, FlatPre), // 22..27
    (2, 2, Pre), (2, 2, FlatPre), (2, 2, FlatPre), (2, 1, FlatPre), (4, 1, Ldm), (4, 1, FlatPre), // 28..33
    (4, 1, Pre), (4, 1, FlatPre), (4, 1, Pre), (4, 1, FlatPre), (4, 1, Pre), (4, 1, FlatPre), // 34..39
    (4, 1, Pre), (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, Pre), (4, 1, FlatPre), // 40..45
    (4, 1, FlatPre), (4, 1, FlatPre), (8, 1, FlatC), (4, 1, FlatPre), (8, 1, Pre), (4, 1, FlatPre), // 46..51
    (4, 1, Pre), (4, 1, FlatPre), (8, 1, Pre), (8, 1, FlatPre), (8, 1, FlatC), (4, 1, FlatPre), // 52..57
    (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, FlatPre), (4, 1, FlatPre), // 58..63
    (8, 1, FlatC), (16, 1, FlatC), (8, 1, FlatC), (8, 1, FlatC), (8, 1, FlatC), (8, 1, FlatC), // 64..69
    (8, 1, FlatC), (8, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (8, 1, FlatC), (16, 1, FlatC), // 70..75
    (8, 1, FlatC), (16, 1, FlatC), (4, 1, Pre), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 76..81
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 82..87
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatPre), (16, 1, FlatC), (16, 1, FlatC), // 88..93
    (16, 1, FlatC), (16, 1, FlatPre), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 94..99
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 100..105
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 106..111
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 112..117
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 118..123
    (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), (16, 1, FlatC), // 124..128
];

/// Blocks per SM ptxas must make room for (`GpuSchedule::min_blocks`) where the H100 sweep
/// (`smallgemm tune --gpu --dtype f16 --min-blocks` over the multiples of 8 from 96;
/// docs/gpu-notes.md, version 9) found a count better than the code generator's rule:
/// (n, blocks).
const H100_F16_MIN_BLOCKS: [(usize, u32); 2] = [(104, 3), (112, 2)];

/// Tiles per warp group (`GpuSchedule::mma_group`) for n = 65..=112 on an H100 (`smallgemm
/// tune --gpu --dtype f16 --groups`; docs/gpu-notes.md, version 11): the A fragment of a k
/// step loaded once for 2 or 3 tiles took 3-9 points of the bound at most sizes; 0: one
/// tile at a time (the winner kept it, or the warps keep one row of tiles each).
#[rustfmt::skip]
const H100_F16_GROUP: [u32; 48] = [
    3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, // 65..76
    2, 0, 2, 0, 2, 2, 3, 2, 3, 2, 2, 3, // 77..88
    3, 3, 0, 3, 2, 2, 0, 3, 0, 2, 2, 2, // 89..100
    2, 0, 2, 3, 3, 2, 3, 2, 2, 2, 2, 3, // 101..112
];

/// Tensor-core defaults of version 12 (docs/gpu-notes.md): `FlatC` with `ldmatrix`, one
/// problem per block, whose warp count is a multiple of the row tiles (5, 10 or 15 at
/// 65..80, 12 at 81..96, 7 or 14 at 97..112: every warp keeps one row of tiles and loads
/// its A fragments once) or C's copy in A's place (`c_over_a`, 8 and 16 warps at 113..128:
/// A and B alone in shared memory), from `smallgemm tune --gpu --dtype f16 --c-over-a` on
/// an H100 and the bench against the version 11 defaults: (n, warps, blocks per SM for
/// ptxas, C over A). They replace the entries above at those sizes; those of the sizes
/// that realign A and B went to `H100_F16_REALIGNED` (version 16).
#[rustfmt::skip]
const H100_F16_V12: [(usize, u32, u32, bool); 6] = [
    (92, 12, 2, false), (96, 12, 2, false), (104, 14, 2, false), (112, 14, 2, false),
    (120, 8, 2, true), (128, 16, 2, true),
];

/// Tensor-core defaults of versions 14 and 15 (docs/gpu-notes.md): A and B copied verbatim
/// and fragments read with 16-bit loads (`flat_fragments`), C through shared memory
/// (`FlatC`), the verbatim copies through `cp.async` (`async_copies`) where it won: from
/// `smallgemm tune --gpu --dtype f16 --flat-fragments` (version 14) and `--async-copies`
/// (version 15) on an H100 and the bench against the previous defaults, alternated, twice
/// (% of the bound, version 15): 17 73.0 -> 76.1, 18 85.5 -> 86.5-86.9, 19 92.3-93.0 ->
/// 97.7-98.0, 20 91.2-91.6 -> 99.2-99.6, 23 97.6-97.9 -> 99.2-99.8, 25 93.1-94.1 ->
/// 98.5-98.8, 26 91.7-92.0 -> 99.8, 28 99.7-100.3 -> 102.1-102.7, 45 93.7-94.4 ->
/// 97.0-97.6, 52 93.2-93.5 -> 97.6-98.4, 57 93.9 -> 97.3-98.0, 58 96.0 -> 98.2-98.5; 27
/// (version 14's) tied with `cp.async`; 29 and 59 lost, the other sizes to 64 kept their
/// kernels (45, 52, 57 and 58 went to `H100_F16_REALIGNED` in version 16). (n, warps,
/// problems per block, `async_copies`); they replace the entries above at those sizes.
#[rustfmt::skip]
const H100_F16_FLAT_FRAGMENTS: [(usize, u32, u32, bool); 9] = [
    (17, 2, 2, true), (18, 2, 1, true), (19, 2, 1, true), (20, 2, 2, true), (23, 2, 2, true),
    (25, 2, 2, true), (26, 2, 2, true), (27, 4, 1, false), (28, 4, 1, true),
];

/// Tensor-core defaults of version 16 (docs/gpu-notes.md) at the sizes from 21 whose A and
/// B are realigned (no multiples of 8): `ldmatrix`, one problem per block, A and B copied
/// verbatim into their slots through `cp.async` and realigned there (`realign_in_shared`),
/// C through shared memory (`FlatC`; 31: flat A and B with the C prefetch), C's copy
/// through `cp.async` where that won (`async_copies`). From `smallgemm tune --gpu --dtype
/// f16 --realign-in-shared` on an H100 (the planned schedule with the flag, then `FlatC`
/// at 8, 16 and each multiple of the row tiles from 4 to 16 warps, in groups or with C
/// over A, C's copy either way; 65..127 first with the planned schedules alone, then the
/// wide sweep at the 19 sizes still under about 92% of the bound); the bench, the
/// version 15 defaults against the tuned database, alternated, twice: every size ahead in
/// both runs (% of the bound: 43 90.1-90.9 -> 99.2-99.3, 49 84.3-84.5 -> 98.6-98.7, 67
/// 80.6-80.8 -> 96.3-97.3, 73 77.8-77.9 -> 97.6-99.9, 97 63.5-64.3 -> 80.1-80.5, 99
/// 66.6-67.3 -> 89.6-90.8, 113 67.1-67.4 -> 93.8-94.6, 127 74.6-75.4 -> 91.2-91.3); 92
/// kept its kernel. Then 17..47 with 2 and 4 warps and 1, 2, 4 problems per block offered
/// too: 2 warps in groups of 3 won at 33, 34, 35, 37 and `FlatC` at 21, ahead in both
/// bench runs (21 93.3-93.8 -> 95.0-97.3, 33 75.3-76.9 -> 81.0-81.1, 34 89.1 ->
/// 96.5-97.3, 35 89.5-90.1 -> 98.3-99.0, 37 96.2-97.1 -> 100.4-100.6); the flat-fragment
/// kernels below 29 kept theirs. Version 17: 97 takes 98's kernel (14 warps, 2 blocks per
/// SM for ptxas; from `tune --schedules`), 80.6-80.8 -> 85.4-85.5% in two alternated bench
/// runs. Version 18: 33 on 3 warps, one tile at a time (with the epilogue swaps; `tune
/// --schedules`), 90.1 / 89.0 -> 90.6 / 91.8%. (n, warps, variant, blocks per SM for
/// ptxas, tiles per group, `async_copies`);
/// they replace the entries above at those sizes.
#[rustfmt::skip]
const H100_F16_REALIGNED: [(usize, u32, Mma, u32, u32, bool); 87] = [
    (21, 2, FlatC, 0, 0, true), (29, 4, FlatC, 0, 0, true), (30, 4, FlatC, 0, 0, true), (31, 2, FlatPre, 0, 0, false),
    (33, 3, FlatC, 0, 0, true),
    (34, 2, FlatC, 0, 3, true), (35, 2, FlatC, 0, 3, true), (36, 6, FlatC, 0, 0, true),
    (37, 2, FlatC, 0, 3, false), (38, 6, FlatC, 0, 0, true), (39, 6, FlatC, 0, 0, true),
    (41, 6, FlatC, 0, 0, true), (42, 8, FlatC, 0, 3, true), (43, 6, FlatC, 0, 0, true),
    (44, 9, FlatC, 0, 0, true), (45, 8, FlatC, 0, 2, true), (46, 9, FlatC, 0, 0, true),
    (47, 9, FlatC, 0, 0, true), (49, 4, FlatC, 0, 0, true), (50, 4, FlatC, 0, 0, true),
    (51, 4, FlatC, 0, 0, false), (52, 8, FlatC, 0, 0, true), (53, 4, FlatC, 0, 0, false),
    (54, 4, FlatC, 0, 0, false), (55, 4, FlatC, 0, 0, false), (57, 4, FlatC, 0, 0, true),
    (58, 4, FlatC, 0, 0, false), (59, 4, FlatC, 0, 0, false), (60, 16, FlatC, 0, 0, true),
    (61, 4, FlatC, 0, 0, false), (62, 16, FlatC, 0, 0, true), (63, 4, FlatC, 0, 0, false),
    (65, 5, FlatC, 0, 0, true), (66, 8, FlatC, 0, 3, true), (67, 10, FlatC, 2, 0, true),
    (68, 8, FlatC, 0, 3, true), (69, 10, FlatC, 2, 0, true), (70, 10, FlatC, 3, 0, true),
    (71, 8, FlatC, 0, 3, true), (73, 16, FlatC, 0, 2, true), (74, 8, FlatC, 0, 2, false),
    (75, 16, FlatC, 0, 2, true), (76, 8, FlatC, 0, 2, false), (77, 16, FlatC, 0, 2, true),
    (78, 16, FlatC, 0, 2, true), (79, 16, FlatC, 0, 2, true), (81, 6, FlatC, 0, 0, true),
    (82, 12, FlatC, 0, 0, true), (83, 6, FlatC, 0, 0, true), (84, 16, FlatC, 0, 2, true),
    (85, 8, FlatC, 0, 3, true), (86, 12, FlatC, 0, 0, true), (87, 16, FlatC, 0, 2, true),
    (89, 12, FlatC, 0, 0, false), (90, 12, FlatC, 0, 0, true), (91, 12, FlatC, 0, 0, false),
    (93, 12, FlatC, 0, 0, false), (94, 12, FlatC, 2, 0, true), (95, 12, FlatC, 0, 0, true),
    (97, 14, FlatC, 2, 0, true), (98, 14, FlatC, 2, 0, true), (99, 7, FlatC, 0, 0, true),
    (100, 14, FlatC, 2, 0, true), (101, 7, FlatC, 0, 0, true), (102, 14, FlatC, 2, 0, true),
    (103, 7, FlatC, 0, 0, true), (105, 8, FlatC, 0, 2, true), (106, 14, FlatC, 0, 0, true),
    (107, 8, FlatC, 0, 2, true), (108, 14, FlatC, 0, 0, true), (109, 16, FlatC, 0, 2, true),
    (110, 14, FlatC, 0, 0, true), (111, 14, FlatC, 0, 0, true), (113, 16, FlatC, 0, 0, true),
    (114, 16, FlatC, 0, 0, false), (115, 8, FlatC, 0, 0, true), (116, 16, FlatC, 0, 0, true),
    (117, 8, FlatC, 0, 0, true), (118, 16, FlatC, 0, 0, false), (119, 8, FlatC, 3, 0, true),
    (121, 16, FlatC, 0, 0, true), (122, 16, FlatC, 0, 0, false), (123, 16, FlatC, 0, 0, true),
    (124, 16, FlatC, 0, 0, true), (125, 16, FlatC, 0, 0, true), (126, 16, FlatC, 0, 0, false),
    (127, 8, FlatC, 0, 0, true),
];

/// Tensor-core defaults of version 19 (docs/gpu-notes.md): one warp a problem sweeping
/// whole columns of tiles (`column_sweep`: B's fragments read once for both row tiles,
/// A's held for every k step), the rest of the schedule as planned above. From `tune
/// --schedules` on an H100 (GFLOP/s, planned -> swept): 17 10444 -> 11605 (8 problems a
/// block) -> 12089 (and no register cap: 1 block per SM for ptxas), 18 11344 -> 12336 ->
/// 12963 (8 problems, no cap), 21 14588 -> 15139 (8 problems); at 19, 20 and 23 within
/// 2%, at 25 and 33 it lost (2 warps, 2 problems: 17700 -> 11460; 3 warps: 21600 ->
/// 5253). (n, problems per block, blocks per SM for ptxas).
const H100_F16_COLUMN_SWEEP: [(usize, u32, u32); 3] = [(17, 8, 1), (18, 8, 1), (21, 8, 0)];

/// Sizes whose planned tensor-core kernels realign A and B with 16-byte vectors
/// (`GpuSchedule::realign_vectors`) rather than the 4-byte words of version 31. The code
/// generator's changes since version 26 (the last measured on an H100) were measured on
/// an H200 with its own tuned entries; the planned kernels, what an H100 runs, against
/// version 26's (`bench --gpu --f16-only`, alternated, two runs each) won at 96 of the 113
/// sizes 16..128 and lost at 23, 25, 61, 79, 89, 91 and 128. With the words off, 89, 91,
/// 61, 79, 87, 81, 84 and 125 gained 1.5 to 9 points of the bound (51 other sizes lost up
/// to 12); with these sizes so, the planned kernels against the previous ones, two runs
/// each: 89 68.4/68.7 -> 75.7/75.8%, 91 68.9/69.3 -> 77.4/76.4%, 61, 79, 87 +1.9 to +2.7
/// points, 81, 84, 125 +1.2 to +1.4, no size lost (docs/gpu-notes.md, version 36). At 128
/// the tile epilogue lost 2.4 points: it keeps the element one (`element_epilogue`).
const PLANNED_REALIGN_VECTORS: [usize; 8] = [61, 79, 81, 84, 87, 89, 91, 125];

/// How a tensor-core default loads its operands: `ldmatrix` fragments (`Ldm`), and the C
/// prefetch (`Pre`), and flat staging of A and B as well (`FlatPre`); or `ldmatrix` with C
/// through shared memory and flat A and B (`FlatC`: `Staging::FlatC`, no prefetch).
#[derive(Clone, Copy)]
enum Mma {
    Ldm,
    Pre,
    FlatPre,
    FlatC,
}
use Mma::{FlatC, FlatPre, Ldm, Pre};

impl Mma {
    /// How A and B (and C, under `FlatC`) are staged.
    fn stage(self) -> Staging {
        match self {
            FlatPre => Staging::Flat,
            FlatC => Staging::FlatC,
            Ldm | Pre => Staging::Padded,
        }
    }

    /// Whether C's old values are prefetched into registers.
    fn prefetch_c(self) -> bool {
        matches!(self, Pre | FlatPre)
    }
}

/// Warp counts for tensor-core kernels of `p` with C through shared memory that the GPU
/// tuner's sweeps and tests try: 8, 16, and each multiple of the row tiles (16 rows each)
/// from 4 to 16, where every warp keeps one row of tiles (its A fragments loaded once).
pub fn row_tile_warps(p: &ColMajorProblem) -> Vec<u32> {
    let mt = p.m.div_ceil(16) as u32;
    let mut warps = vec![8, 16];
    warps.extend((1..=16).map(|j| j * mt).filter(|w| (4..=16).contains(w)));
    warps.sort_unstable();
    warps.dedup();
    warps
}

/// The default schedule for `p` on `target`: lightweight blocks (paper 001) of about 128-256
/// threads; a register tile grows with the size so that a thread does enough FMAs per
/// shared-memory load; tensor cores for f16 from 16 up (below, FMA kernels with flat
/// staging win: measured on an H100 up to 15, by 30 points of the bound at 13-15). Fails only
/// when no schedule fits: where A and B of one problem exceed shared memory, with
/// [`GpuScheduleError::ProblemTooLarge`], which says how far k must be split.
pub fn plan_gpu(p: &ColMajorProblem, target: &GpuTarget) -> Result<GpuSchedule, GpuScheduleError> {
    match plan_within_limits(p, target) {
        Err(GpuScheduleError::Shared { bytes, limit }) => {
            // Staging grows with k: the largest k that fits, by bisection (lo fits, hi not).
            let fits = |k| plan_within_limits(&ColMajorProblem { k, ..*p }, target).is_ok();
            let (mut lo, mut hi) = (0, p.k);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            Err(if lo == 0 {
                // m and n alone are too large.
                GpuScheduleError::Shared { bytes, limit }
            } else {
                GpuScheduleError::ProblemTooLarge {
                    bytes,
                    limit,
                    max_k: lo,
                }
            })
        }
        planned => planned,
    }
}

/// [`plan_gpu`] without the advice on k.
fn plan_within_limits(
    p: &ColMajorProblem,
    target: &GpuTarget,
) -> Result<GpuSchedule, GpuScheduleError> {
    let big = p.m.max(p.n);
    let mut s = if p.dtype == Dtype::F16 && big >= 16 {
        // Tensor cores; warps per problem, problems per block, staging and C prefetch
        // from the H100 sweep (2 warps up to about 31, 4 to 64, then 8 or 16).
        let tiles = (p.m.div_ceil(16) * p.n.div_ceil(8)) as u32;
        // No more warps than tiles.
        let mma =
            |warps: u32, tba, ldmatrix| GpuSchedule::mma(warps.min(tiles).max(1), tba, ldmatrix);
        let (warps, tba, variant) = match big {
            16..=128 => H100_F16_MMA[big - 16],
            _ => (8, 1, Pre),
        };
        let min_blocks = H100_F16_MIN_BLOCKS
            .iter()
            .find(|(n, _)| *n == big)
            .map_or(0, |(_, b)| *b);
        let mma_group = match big {
            65..=112 => H100_F16_GROUP[big - 65],
            _ => 0,
        };
        let flat_fragments = H100_F16_FLAT_FRAGMENTS.iter().find(|e| e.0 == big);
        if let Some(&(_, warps, tba, async_copies)) = flat_fragments {
            GpuSchedule {
                stage: Staging::FlatC,
                flat_fragments: true,
                async_copies,
                ..mma(warps, tba, false)
            }
        } else if let Some(&(_, warps, variant, min_blocks, mma_group, async_copies)) =
            H100_F16_REALIGNED.iter().find(|e| e.0 == big)
        {
            GpuSchedule {
                min_blocks,
                mma_group,
                stage: variant.stage(),
                prefetch_c: variant.prefetch_c(),
                async_copies,
                realign_in_shared: true,
                ..mma(warps, 1, true)
            }
        } else if let Some(&(_, warps, min_blocks, c_over_a)) =
            H100_F16_V12.iter().find(|e| e.0 == big)
        {
            GpuSchedule {
                min_blocks,
                c_over_a,
                stage: Staging::FlatC,
                ..mma(warps, 1, true)
            }
        } else {
            GpuSchedule {
                min_blocks,
                mma_group,
                stage: variant.stage(),
                prefetch_c: variant.prefetch_c(),
                ..mma(warps, tba, true)
            }
        }
    } else {
        // f64/f32 2..32: the winners of a `smallgemm tune --gpu` sweep on an H100 (every
        // tile, block size and staging; docs/gpu-notes.md, version 4), as (rm, rn, tba of
        // the square problem, staging); other shapes keep the winner's threads per block.
        // f16 FMA kernels (2..15) likewise; `H100_FMA_ASYNC` replaces some of both. Above
        // those: wide tiles.
        let n = big.max(2);
        let async_entry = H100_FMA_ASYNC.iter().find(|e| e.0 == p.dtype && e.1 == n);
        let tuned = match (async_entry, p.dtype, big) {
            (Some(&(_, _, rm, rn, tba, stage)), _, _) => Some((rm, rn, tba, stage)),
            (None, Dtype::F64, 0..=32) => Some(H100_F64[n - 2]),
            (None, Dtype::F32, 0..=32) => Some(H100_F32[n - 2]),
            (None, Dtype::F16, 0..=15) => Some(H100_F16[n - 2]),
            _ => None,
        };
        let (rm, rn, want, stage) = match (tuned, p.dtype) {
            (Some((rm, rn, tba, stage)), _) => {
                let square = (n.div_ceil(rm as usize) * n.div_ceil(rn as usize)) as u32;
                (rm, rn, tba * square, stage)
            }
            (None, Dtype::F64) => (4, 4, 128, Staging::Padded),
            (None, Dtype::F32) => (4, 4, 64, Staging::Padded),
            (None, Dtype::F16) => (4, 4, 64, Staging::FlatC),
        };
        let s = GpuSchedule::fma(rm, rn, 1, stage);
        let tpp = s.resources(p).threads_per_problem.max(1);
        GpuSchedule {
            tba: (want / tpp).max(1),
            async_copies: async_entry.is_some(),
            ..s
        }
    };
    if let Some(&(_, tba, min_blocks)) = H100_F16_COLUMN_SWEEP.iter().find(|e| e.0 == big) {
        if s.mma.is_some() {
            s.warps = 1;
            s.tba = tba;
            s.min_blocks = min_blocks;
            s.column_sweep = true;
        }
    }
    if s.mma.is_some() {
        // Measured on an H200 against each other, the planned schedules alone: the 16-byte
        // realigning where the words lost, and 128's element epilogue.
        s.realign_vectors = s.realign_in_shared && PLANNED_REALIGN_VECTORS.contains(&big);
        s.element_epilogue = big == 128;
    }
    s.shrink_tba_to_fit(p, target);
    if s.prefetch_c && s.validate(p, target).is_err() {
        // Too many tiles per warp (a long, thin shape) to hold C's old values too.
        s.prefetch_c = false;
    }
    // The epilogue's lanes in swapped order where C's verbatim copy has the most bank
    // conflicts (m 1 or 31 mod 32: 4 words a bank) or where the epilogue weighs most (m up
    // to 32, few k steps). Measured on an H100 (docs/gpu-notes.md, version 18): 17 76 ->
    // 82%, 33 80 -> 90%, 65 96 -> 99-100%, 97 86 -> 91%, 127 91 -> 94-95%; where the
    // plain order has 2 words a bank above 32 the selects and registers cost more than
    // the conflicts (93 93 -> 88%, 113 94 -> 85%, 117 95 -> 91%).
    s.epilogue_swaps = p.dtype == Dtype::F16
        && s.mma.is_some()
        && p.m % 2 == 1
        && (p.m <= 32 || matches!(p.m % 32, 1 | 31));
    if s.mma.is_none() && s.validate(p, target).is_err() {
        // Too many threads for one-element tiles: grow the tile.
        for (rm, rn) in [(2, 2), (4, 2), (4, 4), (8, 4), (8, 8)] {
            s.rm = rm;
            s.rn = rn;
            if s.validate(p, target).is_ok() {
                break;
            }
        }
    }
    s.validate(p, target)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::GemmSpec;

    fn problem(dtype: Dtype, n: usize) -> ColMajorProblem {
        GemmSpec::builder(dtype, n, n, n)
            .build()
            .unwrap()
            .col_major()
    }

    #[test]
    fn planned_schedules_are_valid() {
        for sm in [Sm::Sm80, Sm::Sm90] {
            let t = GpuTarget::new(sm);
            for dtype in [Dtype::F64, Dtype::F32, Dtype::F16] {
                // Up to the sizes whose A and B fit in shared memory on both.
                let top = match dtype {
                    Dtype::F64 => 64,
                    Dtype::F32 => 96,
                    Dtype::F16 => 128,
                };
                for n in 1..=top {
                    let p = problem(dtype, n);
                    let s = plan_gpu(&p, &t).unwrap();
                    assert!(s.validate(&p, &t).is_ok(), "{dtype:?} n={n}: {s:?}");
                }
            }
        }
    }

    #[test]
    fn limits_are_enforced() {
        let t = GpuTarget::new(Sm::Sm90);
        let p = problem(Dtype::F64, 32);
        let mut s = plan_gpu(&p, &t).unwrap();
        s.rm = 1;
        s.rn = 1;
        s.tba = 2; // 2048 threads
        assert!(matches!(
            s.validate(&p, &t),
            Err(GpuScheduleError::Threads { .. })
        ));
        s.rm = 3;
        assert!(matches!(
            s.validate(&p, &t),
            Err(GpuScheduleError::Tile { .. })
        ));
        let mut s = plan_gpu(&p, &t).unwrap();
        s.mma = Some(MmaShape::M16N8K16);
        assert_eq!(
            s.validate(&p, &t),
            Err(GpuScheduleError::MmaDtype(Dtype::F64))
        );
        let big = problem(Dtype::F64, 128);
        let Err(GpuScheduleError::ProblemTooLarge { max_k, .. }) = plan_gpu(&big, &t) else {
            panic!("f64 128^3 fits in shared memory");
        };
        // The advice holds: k = max_k fits, one more does not.
        assert!((1..128).contains(&max_k));
        assert!(plan_gpu(&ColMajorProblem { k: max_k, ..big }, &t).is_ok());
        assert!(plan_gpu(
            &ColMajorProblem {
                k: max_k + 1,
                ..big
            },
            &t
        )
        .is_err());
        let s = GpuSchedule::fma(8, 8, 4, Staging::Padded);
        assert!(matches!(
            s.validate(&big, &t),
            Err(GpuScheduleError::Shared { .. })
        ));
    }

    #[test]
    fn f16_uses_tensor_cores_from_sixteen() {
        let t = GpuTarget::new(Sm::Sm80);
        assert!(plan_gpu(&problem(Dtype::F16, 15), &t)
            .unwrap()
            .mma
            .is_none());
        assert!(plan_gpu(&problem(Dtype::F16, 16), &t)
            .unwrap()
            .mma
            .is_some());
        assert!(plan_gpu(&problem(Dtype::F16, 12), &t)
            .unwrap()
            .mma
            .is_none());
        assert!(plan_gpu(&problem(Dtype::F16, 4), &t).unwrap().mma.is_none());
        assert!(plan_gpu(&problem(Dtype::F64, 16), &t)
            .unwrap()
            .mma
            .is_none());
    }

    #[test]
    fn schedules_round_trip_through_serde() {
        let s = plan_gpu(&problem(Dtype::F16, 32), &GpuTarget::new(Sm::Sm90)).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<GpuSchedule>(&text).unwrap(), s);
        let t = GpuTarget::new(Sm::Sm80);
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<GpuTarget>(&text).unwrap(), t);
    }
}
