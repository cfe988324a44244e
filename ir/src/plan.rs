//! The planner: a good default `Schedule` for a problem on a target, from a cost model.

use crate::schedule::{BOperand, Schedule};
use crate::spec::{BatchForm, ColMajorProblem, Dtype, Scalar, Trans};
use crate::target::{Isa, MaskSupport, Target};

/// Operations a fully unrolled kernel may have before the planner turns blocks and then k
/// into loops. Compile time grows with the code (lowering and encoding take 15-40 ns per
/// operation), and a loop costs a few instructions per hundreds of FMAs: measured, 600
/// against 1200 at n = 9..32 hot, f64 and f32, three runs each alternated, geomean over
/// LIBXSMM 1.055x-1.061x against 1.049x-1.059x; it halves the compile time of the
/// largest kernels (f64 16x16x16: 950 to ~500 operations).
pub const UNROLL_BUDGET: usize = 600;

/// Latency of a dependent FMA chain, in cycles: a register block with fewer accumulators
/// than latency × FMA ports cannot keep the FMA units busy.
const FMA_LATENCY: f64 = 4.0;

/// Picks the vector width and register blocking with the lowest estimated cycles per
/// matrix, then unrolls as much as [`UNROLL_BUDGET`] allows.
pub fn plan(problem: &ColMajorProblem, target: Target) -> Schedule {
    if let Some(dot) = plan_dot_tail(problem, target) {
        return dot;
    }
    let (block_cost, blocked) = plan_blocks(problem, target);
    match crate::lane_pack::plan(problem, target) {
        Some((cost, packed)) if cost < block_cost => packed,
        _ => blocked,
    }
}

/// The register-blocked schedule [`plan`] weighs against lane packing, and its estimated
/// cycles per matrix.
fn plan_blocks(problem: &ColMajorProblem, target: Target) -> (f64, Schedule) {
    // Narrowest first, and a wider vector only when strictly cheaper: where the cost model
    // cannot tell them apart (m fits the narrow vector as well), the narrow one has fewer
    // masked lanes, or none. The widest is searched first all the same, so that a narrower
    // width that cannot beat it (its FMAs alone cost more) is not searched at all: half to
    // two thirds of the planning time for m above a vector.
    let widths = target.vector_widths();
    let widest = widths.last().map(|&w| (w, best_block(problem, target, w)));
    let mut best: Option<(f64, Schedule)> = None;
    for &width in widths {
        let best_here = match widest {
            Some((w, found)) if w == width => found,
            Some((_, Some((wide_cost, _))))
                if fma_cycles_at_least(problem, target, width) > wide_cost + 1e-9 =>
            {
                None
            }
            _ => best_block(problem, target, width),
        };
        if let Some((cost, s)) = best_here {
            if best.is_none_or(|(c, _)| cost < c - 1e-9) {
                best = Some((cost, s));
            }
        }
    }
    let (cost, mut s) = best.expect("a 1x1 register block always fits");
    choose_unrolling(problem, target, &mut s);
    s.batch_unroll = batch_unroll(problem, target, &s);
    s.interleave = interleave(problem, target, &s);
    (cost, s)
}

/// Full-vector FMAs a dot-product tail must save (those of C's last row as a tail vector,
/// less its own) to be planned: they pay for the tail's gather of A's row, its
/// transpose-adds and its column-by-column epilogue, about 35 (measured on Zen 4, hot, one
/// thread, against the planned blocks, alternated in one process: a saving of 22 lost
/// 8% at f64 9x9x9 and 49% at 1x9x9; from 52 up every shape gained: f32 17x8x17 8%, f64
/// 17 3-6%, 25 7%, 33 7%, 41 5%, f32 17 16%, 33 20%, 17x32x8 11%, f32 1x16x16 47%,
/// 1x32x32 3.2x, f64 1x16x16 26%).
const DOT_TAIL_MIN_SAVING: f64 = 40.0;

/// [`DOT_TAIL_MIN_SAVING`] for one row where 512-bit operations run whole (there a tail
/// vector's FMAs count full, so the same kernels show twice the saving), and the higher bar
/// where no rows lie above it (m = 1). Measured on an Emerald Rapids Xeon (`tune`, the
/// planned dot tail against the best of 48 candidates, hot, one thread): savings of 40-70
/// lost 8-73% (f32 17x5x9 1.73x, f64 9x7x9 1.25x, 33x5x16 1.23x, 9x9x9 8%), 84 and more won
/// or tied (f64 9x12x9, 9x9x16, f32 17x6x17, 17x8x17, 17x12x12); with m = 1, 63-132 lost
/// 1.2-2.2x (f32 and f64 1x9x9, 1x12x12) and 224 and more won (1x16x16 to 1x64x64).
const DOT_TAIL_MIN_SAVING_WHOLE: f64 = 80.0;
const DOT_TAIL_MIN_SAVING_ALONE: f64 = 200.0;

/// The least k for which the planner packs C's tail rows ([`plan_dot_tail`]).
const PACKED_TAIL_MIN_K: usize = 16;

/// The schedule with a dot-product tail ([`Schedule::dot_tail`]) where it applies and
/// saves enough FMAs ([`dot_tail_saves_enough`]), or a packed one where k is long enough
/// ([`PACKED_TAIL_MIN_K`]): the planner's 64-byte
/// blocks for the rows above the tail, fully unrolled or looped as they would be, one
/// matrix a trip.
fn plan_dot_tail(problem: &ColMajorProblem, target: Target) -> Option<Schedule> {
    let lanes = 64 / problem.dtype.size();
    if problem.alpha == Scalar::Zero
        || crate::schedule::dot_tail_unfit(problem, target, 64).is_some()
    {
        return None;
    }
    let tail_rows = problem.m % lanes;
    if let Some(group) = crate::schedule::packed_tail_group(tail_rows, lanes, 64, problem.k) {
        // Packed tails paid from k = 16 on this Xeon (tuned against the best blocks:
        // f64 10x10x40 1.18x, 18x32x16 1.10x, 26x12x26 1.11x, 4x16x16 1.17x; f32 24x24x16
        // 1.09x, 24x24x32 1.23x, 20x9x30 1.18x, 36x20x20 1.20x), not below it (f64 10, 12,
        // 20x20x8; f32 8, 24x24x8, 40x17x12); unmeasured where 512-bit operations run as
        // halves, which narrow the tail vector they replace.
        if target.halves_512 || problem.k < PACKED_TAIL_MIN_K {
            return None;
        }
        // Within the budget of unrolled blocks (f64 100x40x90 would take 3600).
        let ops = crate::schedule::packed_tail_unrolled_ops(problem.n, problem.k, group);
        if ops > UNROLL_BUDGET {
            return None;
        }
        // Lane packing does the 4x4xk it takes better (f32 4x4x16 56 GFLOP/s against 45).
        if problem.m == tail_rows && crate::lane_pack::plan(problem, target).is_some() {
            return None;
        }
    } else if !dot_tail_saves_enough(problem, target) {
        return None;
    }
    let rows = ColMajorProblem {
        m: (problem.m - tail_rows).max(lanes),
        ..*problem
    };
    let (_, mut s) = best_block(&rows, target, target.vector_bytes())?;
    if problem.m == tail_rows {
        // No rows above: the blocks only hand the row's sums to the epilogue.
        s.m_vectors = 1;
    } else {
        choose_unrolling(&rows, target, &mut s);
    }
    // One matrix a trip, not interleaved: `best_block`'s, which these keep.
    let s = Schedule {
        dot_tail: true,
        ..s
    };
    s.validate(problem, target).is_ok().then_some(s)
}

/// Whether C's last rows as dot products ([`Schedule::dot_tail`], one row, or two in f32)
/// save enough FMAs over a tail vector ([`DOT_TAIL_MIN_SAVING`] and the bars after it).
fn dot_tail_saves_enough(problem: &ColMajorProblem, target: Target) -> bool {
    let lanes = 64 / problem.dtype.size();
    let tail_rows = problem.m % lanes;
    // Two rows only in 16 lanes (f32) where 512-bit operations run whole: f32 18x18x18
    // gained 15-19% on an Emerald Rapids Xeon, f64 10, 18 and 26 lost 1-7% (a tree sums
    // half as many columns there; f64's two rows are packed instead where k allows);
    // unmeasured where they run as halves.
    if tail_rows == 2 && (lanes != 16 || target.halves_512) {
        return false;
    }
    // With no rows above, two rows lost where k fits one vector (f32 2x16x16 5%, 2x24x12
    // 16%) and gained past it (2x9x40 27%, 2x32x32 1.97x).
    if problem.m == 2 && problem.k <= lanes {
        return false;
    }
    // A tail's FMAs cost a full vector's, or half of one where 512-bit operations run as
    // halves (the tail is narrowed there, see `Target::narrow_tail_bytes`).
    let tail_cost = if target.halves_512 { 0.5 } else { 1.0 };
    let (n, k) = (problem.n as f64, problem.k as f64);
    let dot_fmas = (tail_rows * problem.n * problem.k.div_ceil(lanes)) as f64;
    // Two rows sum a column's two products in two lanes: twice the transpose-adds, which
    // then count as three FMAs each (their three instructions). Without them f32 18x32x8
    // was planned with two rows, and lost 2-3%.
    let trees = if tail_rows == 2 {
        (3 * (lanes - 1) * (2 * problem.n).div_ceil(lanes)) as f64
    } else {
        0.0
    };
    let saving = n * k * tail_cost - dot_fmas - trees;
    // Two rows count their trees above, and were measured against the first bar.
    let min_saving = match (target.halves_512, tail_rows, problem.m) {
        (false, 1, 1) => DOT_TAIL_MIN_SAVING_ALONE,
        (false, 1, _) => DOT_TAIL_MIN_SAVING_WHOLE,
        _ => DOT_TAIL_MIN_SAVING,
    };
    saving >= min_saving
}

/// The cheapest register block (and its estimated cycles) with vectors of `width` bytes;
/// ties keep the first (smaller) block.
fn best_block(problem: &ColMajorProblem, target: Target, width: usize) -> Option<(f64, Schedule)> {
    let lanes = width / problem.dtype.size();
    let tail = problem.m % lanes;
    // Split tails only where a masked one would stall and the split differs from it.
    let splits: &[bool] = if target.masked_tail(tail * problem.dtype.size())
        && !tail.is_power_of_two()
        && target.masks() != MaskSupport::PartialAccess
    {
        &[false, true]
    } else {
        &[false]
    };
    let vector_bytes = if width == target.vector_bytes() {
        0
    } else {
        width
    };
    // B held in registers fits taller blocks into AVX2's 16 registers (measured there
    // only; the same loads, so the estimate ties it with the A-resident block of a shape,
    // which stays first).
    let b_layouts: &[bool] = if target.isa == Isa::Avx2 {
        &[false, true]
    } else {
        &[false]
    };
    let mut best_here: Option<(f64, Schedule)> = None;
    for (&b_resident, &split_tail) in b_layouts
        .iter()
        .flat_map(|b| splits.iter().map(move |s| (b, s)))
    {
        for m_vectors in 1..=problem.m.div_ceil(lanes) {
            for n_cols in 1..=problem.n {
                let s = Schedule {
                    m_vectors,
                    n_cols,
                    k_unroll: 0,
                    unroll_m_blocks: true,
                    unroll_n_blocks: true,
                    batch_unroll: 0,
                    split_tail,
                    interleave: false,
                    prefetch: false,
                    lane_pack: false,
                    dot_tail: false,
                    b_resident,
                    vector_bytes,
                };
                if s.validate(problem, target).is_err() {
                    // Wider blocks only need more registers.
                    break;
                }
                let a_resident = Schedule {
                    b_resident: false,
                    ..s
                };
                if b_resident && a_resident.validate(problem, target).is_ok() {
                    // The same loads and FMAs as the A-resident block, which comes first.
                    continue;
                }
                // A block that cannot beat the best so far is not costed: its p-norms' chains
                // of square roots were most of the planning time (f32 19x19x19 19-31 µs on an
                // Ice Lake Xeon, 11 µs without them).
                if best_here.is_some_and(|(c, _)| cycles_at_least(problem, target, &s) >= c - 1e-9)
                {
                    continue;
                }
                let cost = estimated_cycles(problem, target, &s);
                // Ties keep the first (smaller) block: measured against the block that
                // loads A and B least, then the larger one, at 9..32 (f64 1.03x vs 0.95x
                // LIBXSMM, f32 1.08x vs 0.93x, hot, one thread).
                if best_here.is_none_or(|(c, _)| cost < c - 1e-9) {
                    best_here = Some((cost, s));
                }
            }
        }
    }
    best_here
}

/// A lower bound of [`estimated_cycles`] for any block of `width`-byte vectors: the FMAs
/// alone, with every vector full.
fn fma_cycles_at_least(problem: &ColMajorProblem, target: Target, width: usize) -> f64 {
    let lanes = (width / problem.dtype.size()) as f64;
    (problem.m as f64 / lanes) * (problem.n * problem.k) as f64 / target.fma_per_cycle()
}

/// Bytes of A, B and C per matrix from which prefetching the next matrices pays when the
/// batch streams from memory (measured with the bandwidth probe timed beside the kernels:
/// the hot schedule plus prefetches gained 1.3 to 7.5 points of it on average at f64 5..9
/// and f32 6..12; 2x2x2..4x4x4 were mixed). Not where prefetches reach a minimum distance
/// ahead ([`Target::prefetch_min_bytes_ahead`]): there every size gained.
const PREFETCH_MIN_BYTES: usize = 400;

/// Where prefetches reach several trips ahead ([`Target::prefetch_trips`]), f64 matrices
/// prefetch only from this many bytes (A, B and C of a 16x16x16 problem): on Zen 3, four
/// trips ahead, f64 2..15 ran 0.89x (geometric mean) of the same kernels without
/// prefetches at one thread, 16..32 1.04x, while f32 gained at every size (1.03-1.14x;
/// docs/perf-notes.md, eighteenth session).
const FAR_PREFETCH_F64_MIN_BYTES: usize = 3 * 16 * 16 * 8;

/// Bytes per matrix from which the streaming variant re-blocks as tall as m (see
/// [`plan_streaming`]); smaller ones keep their tuned hot schedule, which the tall blocks
/// (one matrix a trip, no interleaving) only matched.
const TALL_MIN_BYTES: usize = 2048;

/// Bytes of A, B and C of one matrix, padding included.
fn matrix_bytes(problem: &ColMajorProblem) -> usize {
    let cols = |trans: Trans, normal: usize, transposed: usize| match trans {
        Trans::N => normal,
        Trans::T => transposed,
    };
    problem.dtype.size()
        * (problem.lda * cols(problem.trans_a, problem.k, problem.m)
            + problem.ldb * cols(problem.trans_b, problem.n, problem.k)
            + problem.ldc * problem.n)
}

/// Whether a variant of the kernel for `problem` that prefetches the next matrices
/// (`Schedule::prefetch`) pays for batches that stream from memory: strided batches (the
/// next matrix is a constant distance away) of matrices large enough, on x86 CPUs where
/// prefetching pays at all ([`Target::software_prefetch`]; on AArch64 `prfm`'s offsets do
/// not reach the next matrix). Not for batches that sit in cache: there the prefetches cost
/// about 10% (measured, f64 n = 12..32, batch in L2), so the planner's schedules do not
/// prefetch and the runtime picks the variant by the size of the batch.
pub fn prefetch_pays(problem: &ColMajorProblem, target: Target) -> bool {
    let min_bytes = if target.prefetch_min_bytes_ahead > 0 {
        0
    } else if target.prefetch_trips > 1 && problem.dtype == Dtype::F64 {
        FAR_PREFETCH_F64_MIN_BYTES
    } else {
        PREFETCH_MIN_BYTES
    };
    problem.batch_form == BatchForm::Strided
        && target.isa != Isa::Neon
        && target.software_prefetch
        && matrix_bytes(problem) >= min_bytes
}

/// Whether the streaming variant re-blocks `hot` as tall as m ([`plan_streaming`]):
/// matrices of [`TALL_MIN_BYTES`] or more on x86 (measured there only).
fn reblocks_tall(problem: &ColMajorProblem, target: Target, hot: &Schedule) -> bool {
    !hot.lane_pack && target.isa != Isa::Neon && matrix_bytes(problem) >= TALL_MIN_BYTES
}

/// Whether batches of `problem` that stream from memory may run a variant of the kernel
/// compiled from `hot` ([`plan_streaming`]): where prefetching pays, where the variant
/// re-blocks as tall as m, and for the small matrices that `hot` lane-packs where a plain
/// register block takes over (see [`streaming_block`]), and where `hot` has a dot-product
/// tail (see [`without_dot_tail`]). With `reblock` false (a schedule the
/// caller chose keeps its blocking) only where prefetching pays. The variant's schedule may
/// still come out as `hot` itself (a tall block that is `hot`'s); its caller then runs
/// `hot`'s code.
pub fn streams_differently(
    problem: &ColMajorProblem,
    target: Target,
    hot: &Schedule,
    reblock: bool,
) -> bool {
    prefetch_pays(problem, target)
        || (reblock
            && problem.batch_form == BatchForm::Strided
            && (reblocks_tall(problem, target, hot)
                || hot.dot_tail
                || (hot.lane_pack && streaming_block(problem, target).is_some())))
}

/// Bytes per matrix below which a lane-packed hot schedule streams with a plain register
/// block instead ([`streaming_block`]): 2x2x2 to 4x4x4 (f64 4x4x4 is 384 bytes).
const STREAM_BLOCK_MAX_BYTES: usize = 400;

/// The register block that streams the small matrices a hot schedule lane-packs
/// (below [`STREAM_BLOCK_MAX_BYTES`]): one matrix a trip, its columns read and written whole
/// (a block whose tail needs masked access is none: its masked stores overlap the next
/// matrix's C). Measured from DRAM, one thread, alternated in one process, % of the GEMM
/// pattern's bandwidth in the same rounds, lane-packed → plain block: f64 2x2x2 87-89 →
/// 95-97, 3x3x3 85-89 → 96-97, 4x4x4 85-90 → 103-111; f32 2x2x2 92-94 → 100-101, 4x4x4
/// 80-92 → 96-113; f32 3x3x3 (a masked tail) 96 → 49-66. AVX-512 only: with AVX2 the
/// same change was within the spread (bench, two alternated runs, 2..4).
fn streaming_block(problem: &ColMajorProblem, target: Target) -> Option<Schedule> {
    if matrix_bytes(problem) >= STREAM_BLOCK_MAX_BYTES || target.isa != Isa::Avx512 {
        return None;
    }
    let (_, s) = plan_blocks(problem, target);
    let plain = Schedule {
        batch_unroll: 0,
        interleave: false,
        ..s
    };
    // Judged unsplit even where the planner splits the tail into narrower pieces: only
    // blocks whose columns are whole moves at the block's width were measured to win (f32
    // 3x3x3 with a split tail was not measured).
    let unsplit = Schedule {
        split_tail: false,
        ..plain
    };
    (!unsplit.masked_tail(problem, target)).then_some(plain)
}

/// Columns of the streaming variant's tall blocks on targets with 32 vector registers, among
/// the blocks estimated within [`STREAM_COST_SLACK`] of the fastest: measured with the
/// batch in L2 and prefetching, f64 32x32x32 as 4xN blocks ran at 25.7, 32.7, 34.7, 37.8,
/// 38.8 GFLOP/s for N = 2..6, f32 28x28x28 as 2xN at 52, 58, 60 for N = 3, 4, 6 and 45-47 for
/// N = 8..14; with AVX2's 16 registers the narrow blocks the estimate picks ran as fast.
const STREAM_COLS: usize = 6;

/// The fewest columns of AVX2's streaming blocks: one column as tall as f64 29..32 (8
/// vectors, B in registers) loads 9 vectors a step for 8 FMAs. The tallest blocks two columns
/// wide (6x2, B in registers) streamed faster from 512 MiB, one thread, alternated in one
/// process: f64 25 1.10x, 27 1.04x, 28 1.04x, 29 1.19x, 31 1.13x, 32 1.13x, 30 even.
const STREAM_MIN_COLS_AVX2: usize = 2;

/// How far above the lowest estimate a streaming block may be to be preferred for its width.
const STREAM_COST_SLACK: f64 = 0.10;

/// The schedule of the variant that runs batches streaming from memory (see
/// [`streams_differently`]): `hot`'s, prefetching where that pays ([`prefetch_pays`]), but
/// for matrices of [`TALL_MIN_BYTES`] or more with register blocks as tall as all of m where
/// the registers allow. Such blocks walk B and C once, column block after column block, and
/// A once before its lines sit in L1, each in ascending addresses; blocks a vector tall
/// touch A's lines a few apart in each of several passes and B once per pass, which the
/// hardware prefetchers and the one-trip-ahead prefetches follow less well (measured, f64
/// 32x32x32 from DRAM, one thread: 0.68-0.82x LIBXSMM with the hot schedule's 1x8 blocks,
/// 0.97-1.15x with 4x6 ones). On AVX2's 16 registers the blocks are the tallest that are
/// two columns wide ([`STREAM_MIN_COLS_AVX2`]), with B in registers where that fits a taller
/// one ([`Schedule::b_resident`]): f64 25..32 stream 6x2 blocks. Before, f64 29..32 found no
/// tall block at all and streamed with their hot 2x4 and 2x5 blocks at 0.52-0.69x LIBXSMM
/// (Zen 3, one and two threads); 8x1 blocks ran 1.28-1.74x faster than those, 6x2 ones
/// faster still (alternated in one process, 512 MiB, one thread). Where the target spreads
/// its prefetches over the k loops, small matrices loop over k ([`with_k_loop`]).
pub fn plan_streaming(problem: &ColMajorProblem, target: Target, hot: &Schedule) -> Schedule {
    with_k_loop(problem, target, streaming_blocks(problem, target, hot))
}

/// Matrices under this many bytes (A, B and C) whose streaming variant would unroll every k
/// step loop over k instead ([`with_k_loop`]).
const STREAM_K_LOOP_MAX_BYTES: usize = 4096;

/// `s` looping over k two steps a trip where the target spreads the prefetches of the next
/// matrices over the inner loops ([`Target::prefetch_spread`]) and `s`, prefetching, has
/// none: matrices under [`STREAM_K_LOOP_MAX_BYTES`] with all k steps unrolled. Measured
/// (Intel Xeon, 512 MiB, one thread, alternated twice, % of the bound): f32 10..16 89-93%
/// -> 93-95%, f64 9..12 92-93% -> 94-96%; f32 24 (6.8 KiB, tall blocks) lost 2 points,
/// hence the limit (docs/perf-notes.md, twenty-fifth session).
fn with_k_loop(problem: &ColMajorProblem, target: Target, s: Schedule) -> Schedule {
    let loops = target.prefetch_spread
        && s.prefetch
        && !s.lane_pack
        && s.k_unroll == 0
        && problem.k >= 4
        && matrix_bytes(problem) < STREAM_K_LOOP_MAX_BYTES;
    if loops {
        Schedule { k_unroll: 2, ..s }
    } else {
        s
    }
}

/// [`plan_streaming`]'s register blocks.
fn streaming_blocks(problem: &ColMajorProblem, target: Target, hot: &Schedule) -> Schedule {
    let hot = &without_dot_tail(hot);
    let prefetch = prefetch_pays(problem, target);
    let prefetching = Schedule { prefetch, ..*hot };
    if hot.lane_pack {
        return streaming_block(problem, target)
            .map(|s| Schedule { prefetch, ..s })
            .unwrap_or(prefetching);
    }
    if !reblocks_tall(problem, target, hot) {
        return prefetching;
    }
    let lanes = hot.lanes(target, problem.dtype);
    let tall = Schedule {
        m_vectors: problem.m.div_ceil(lanes),
        k_unroll: 0,
        unroll_m_blocks: true,
        unroll_n_blocks: true,
        batch_unroll: 0,
        interleave: false,
        prefetch,
        ..*hot
    };
    // With AVX2's 16 registers a block as tall as m often fits only with B held in
    // registers, and f64 25..32 (7 or 8 vectors) only one column wide, where a step's
    // loads outnumber its FMAs: there the tallest block two columns wide streams faster.
    let layouts: &[bool] = if target.isa == Isa::Avx2 {
        &[false, true]
    } else {
        &[hot.b_resident]
    };
    let (tall, min_cols) = if target.isa == Isa::Avx2 {
        let fits = |m_vectors| {
            layouts.iter().any(|&b_resident| {
                let s = Schedule {
                    m_vectors,
                    n_cols: STREAM_MIN_COLS_AVX2,
                    b_resident,
                    ..tall
                };
                s.validate(problem, target).is_ok()
            })
        };
        let m_vectors = (1..=tall.m_vectors).rev().find(|&v| fits(v)).unwrap_or(1);
        (
            Schedule { m_vectors, ..tall },
            STREAM_MIN_COLS_AVX2.min(problem.n),
        )
    } else {
        (tall, 1)
    };
    let candidates: Vec<(f64, Schedule)> = layouts
        .iter()
        .flat_map(|&b_resident| {
            (1..=problem.n)
                .map(move |n_cols| Schedule {
                    n_cols,
                    b_resident,
                    ..tall
                })
                .skip(min_cols - 1)
                .take_while(|s| s.validate(problem, target).is_ok())
        })
        .map(|s| (estimated_cycles(problem, target, &s), s))
        .collect();
    let lowest = candidates.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
    // The estimate ties many widths (a block of 8 accumulators is as fast as one of 24 by
    // its FMA-latency term); measured, the widths near STREAM_COLS compute fastest.
    let preference = |s: &Schedule| {
        if target.vector_registers() >= 32 {
            s.n_cols.abs_diff(STREAM_COLS)
        } else {
            0
        }
    };
    let best = candidates
        .into_iter()
        .filter(|(cost, _)| *cost <= lowest * (1.0 + STREAM_COST_SLACK))
        .min_by(|(ca, a), (cb, b)| {
            (preference(a), ca)
                .partial_cmp(&(preference(b), cb))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    match best {
        Some((_, mut s)) => {
            choose_unrolling(problem, target, &mut s);
            s
        }
        None => prefetching,
    }
}

/// `hot` with C's last row as a tail vector again: dot-product tails lost from DRAM
/// (measured on Zen 4, 1 GiB, beta = 1, one thread, alternated in one process: f64 17 the
/// tall streaming blocks 39.4 GFLOP/s without, 30.4 with; f32 17 57.2 against 50.4; the
/// hot dot-tail schedules 23.7-29.5 and 54.3-55.5), so streaming variants leave them out.
fn without_dot_tail(hot: &Schedule) -> Schedule {
    Schedule {
        dot_tail: false,
        ..*hot
    }
}

/// Whether to alternate the operations of pairs of matrices in a trip of the batch loop:
/// measured to help from 4x4 C up (5x5x5: 0.56-0.88x MKL JIT without, 0.84-1.17x with) and
/// to hurt the 2x2 and 3x3 f64 kernels, whose 8 or 4 matrices per trip already keep the core
/// busy. Not on Intel's cores, where it helped only by loading the next matrix's C before the
/// masked store of the last column that held it up: with that store in pieces
/// ([`Target::tail_store_holds_up_loads`]) it gained nothing with C read (twelve tiny
/// rectangular shapes from 3x7x2 to 7x7x2, 0.99x) and cost 1.4-2.2x with beta = 0
/// (docs/perf-notes.md, twenty-third session). AMD's targets keep it (not measured there).
pub fn interleave(problem: &ColMajorProblem, target: Target, s: &Schedule) -> bool {
    s.batch_unroll >= 2 && problem.m * problem.n >= 16 && !target.masked_stores_hold_up_loads()
}

/// Operations of the batch loop's body beyond which it does one matrix per trip.
const BATCH_UNROLL_BODY: usize = 256;

/// Operations of one matrix beyond which the loop overhead is too small a share to pay for
/// compiling (and caching) the matrix again: from about 6x6x6 on, unrolled trips gained
/// nothing measurable and doubled the compile time of 8x8x8 (13 to 25-31 µs).
const BATCH_UNROLL_MATRIX: usize = 64;

/// Matrices per trip of the batch loop: as many (up to 8) as keep the body within
/// [`BATCH_UNROLL_BODY`] operations, so that the loop's 5 or so instructions of pointer
/// increments and branch stop dominating tiny matrices; one for matrices of more than
/// [`BATCH_UNROLL_MATRIX`] operations.
pub fn batch_unroll(problem: &ColMajorProblem, target: Target, s: &Schedule) -> usize {
    let ops = estimated_ops(problem, target, s).max(1);
    if ops > BATCH_UNROLL_MATRIX {
        return 0;
    }
    [8, 4, 2]
        .into_iter()
        .find(|u| u * ops <= BATCH_UNROLL_BODY)
        .unwrap_or(0)
}

/// Replaces full unrolling by loops, outermost first, until the code fits the budget.
pub fn choose_unrolling(problem: &ColMajorProblem, target: Target, s: &mut Schedule) {
    if estimated_ops(problem, target, s) <= UNROLL_BUDGET {
        return;
    }
    s.unroll_n_blocks = false;
    if estimated_ops(problem, target, s) <= UNROLL_BUDGET {
        return;
    }
    s.unroll_m_blocks = false;
    if estimated_ops(problem, target, s) <= UNROLL_BUDGET {
        return;
    }
    for u in [16, 8, 4, 2, 1] {
        s.k_unroll = u;
        if estimated_ops(problem, target, s) <= UNROLL_BUDGET {
            return;
        }
    }
}

/// (size, count) of the blocks that cover `total` in pieces of `block`.
fn pieces(total: usize, block: usize) -> [(usize, usize); 2] {
    [
        (block, total / block),
        (total % block, (total % block != 0) as usize),
    ]
}

/// Estimated cycles per matrix: each register block runs k steps, each bound by FMA or
/// load throughput (full vectors and broadcasts, see [`Target::mixed_loads_per_cycle`];
/// both near saturation cost more, [`Target::saturation_norm`]) or by the FMA latency
/// chain ([`Target::fma_latency_norm`]), plus reading and writing its C once.
pub fn estimated_cycles(problem: &ColMajorProblem, target: Target, s: &Schedule) -> f64 {
    if s.lane_pack {
        return crate::lane_pack::geometry(problem, target, s).map_or(f64::INFINITY, |g| {
            crate::lane_pack::estimated_cycles(problem, target, g)
        });
    }
    let mut cycles = block_cycles::<true>(problem, target, s);
    if problem.trans_a == Trans::T {
        cycles += (problem.m * problem.k) as f64;
    }
    if problem.beta != Scalar::Zero && s.masked_tail(problem, target) {
        cycles += MASKED_STORE_STALL;
    }
    cycles
}

/// A lower bound of [`estimated_cycles`] for a schedule that does not pack lanes: its
/// blocks' cycles with each p-norm replaced by the larger of its two terms, which it never
/// falls below (in floating point too: the norm is the larger term times a factor of at
/// least one, and the sums add the same terms in the same order), without the terms for a
/// transposed A and a masked tail.
fn cycles_at_least(problem: &ColMajorProblem, target: Target, s: &Schedule) -> f64 {
    block_cycles::<false>(problem, target, s)
}

/// The cycles of a schedule's register blocks (not lane-packed), the part of
/// [`estimated_cycles`] that depends on the blocking; `NORMS` costs each step by the
/// target's p-norms, else by the larger of their terms (a lower bound, and no chains of
/// square roots).
fn block_cycles<const NORMS: bool>(problem: &ColMajorProblem, target: Target, s: &Schedule) -> f64 {
    let lanes = s.lanes(target, problem.dtype);
    let c_reads = (problem.beta != Scalar::Zero) as usize as f64;
    let b_operand = BOperand::of(problem, target, s);
    let norm = |a: f64, b: f64, squarings: Option<u32>| match squarings {
        Some(squarings) if NORMS => power_norm(a, b, squarings),
        _ => a.max(b),
    };
    let mut cycles = 0.0;
    for (rows, row_count) in pieces(problem.m, s.m_vectors * lanes) {
        let vectors = s.block_vectors(rows, lanes) as f64;
        for (cols, col_count) in pieces(problem.n, s.n_cols) {
            let b_loads = b_operand.loads_per_step(cols, lanes);
            let cols = cols as f64;
            let fmas = vectors * cols;
            let loads = vectors + b_loads;
            // Broadcasts of B elements are narrow loads; vectors of B are full ones.
            let full_loads = match b_operand {
                BOperand::Memory | BOperand::Broadcast | BOperand::BroadcastColumns => vectors,
                BOperand::VectorsAlongK | BOperand::VectorsAlongN => loads,
            };
            let (fma_cycles, load_cycles) = (
                fmas / target.fma_per_cycle(),
                (loads / target.mixed_loads_per_cycle()).max(full_loads / target.loads_per_cycle()),
            );
            let throughput = norm(fma_cycles, load_cycles, target.saturation_norm());
            let latency = if fmas > 0.0 { FMA_LATENCY } else { 0.0 };
            let step = norm(throughput, latency, target.fma_latency_norm());
            let epilogue = fmas * (1.0 + c_reads);
            cycles += (row_count * col_count) as f64 * (problem.k as f64 * step + epilogue);
        }
    }
    cycles
}

/// The p-norm of (a, b) for p = 2^squarings: squarings and square roots only (`powf` made
/// planning take twice as long).
fn power_norm(a: f64, b: f64, squarings: u32) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if hi <= 0.0 {
        return 0.0;
    }
    let ratio = lo / hi;
    let mut power = ratio;
    for _ in 0..squarings {
        power *= power;
    }
    let mut root = 1.0 + power;
    for _ in 0..squarings {
        root = root.sqrt();
    }
    hi * root
}

/// Cycles a matrix loses when its C has a masked tail and is read: the load of the next
/// matrix's C waits for the last masked store (see [`Target::masked_tail`]).
const MASKED_STORE_STALL: f64 = 12.0;

/// Estimated operations in the lowered program text.
pub fn estimated_ops(problem: &ColMajorProblem, target: Target, s: &Schedule) -> usize {
    if s.lane_pack {
        return crate::lane_pack::geometry(problem, target, s)
            .map_or(0, |g| crate::lane_pack::estimated_ops(g, s.batch_unroll));
    }
    let lanes = s.lanes(target, problem.dtype);
    let k = problem.k;
    let steps = if s.k_unroll == 0 || k / s.k_unroll < 2 {
        k
    } else {
        s.k_unroll + k % s.k_unroll
    };
    let b_operand = BOperand::of(problem, target, s);
    let instances = |count: usize, unroll: bool| if unroll { count } else { count.min(1) };
    let mut ops = 0;
    for (rows, row_count) in pieces(problem.m, s.m_vectors * lanes) {
        let vectors = s.block_vectors(rows, lanes);
        let mut panel = 0;
        if problem.trans_a == Trans::T {
            panel += 2 * rows * steps;
        }
        for (cols, col_count) in pieces(problem.n, s.n_cols) {
            let b_ops = match b_operand {
                BOperand::Memory => 0,
                b => b.loads_per_step(cols, lanes).ceil() as usize,
            };
            let step = vectors + cols * vectors + b_ops;
            panel += instances(col_count, s.unroll_n_blocks) * (steps * step + 4 * vectors * cols);
        }
        ops += instances(row_count, s.unroll_m_blocks) * panel;
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::GemmSpec;

    /// The bound that lets the planner skip blocks never exceeds the estimate it stands
    /// for, or the planner would skip a block that is cheaper than the best so far.
    #[test]
    fn cycles_at_least_never_exceeds_the_estimate() {
        let mut compared = 0;
        for target in [Target::AVX512, Target::AVX512_HALVES, Target::AVX2] {
            for dtype in [Dtype::F64, Dtype::F32] {
                for (m, n, k) in [(1, 1, 1), (3, 5, 7), (9, 9, 9), (17, 19, 23), (31, 8, 40)] {
                    for beta in [Scalar::One, Scalar::Zero] {
                        let problem = GemmSpec::builder(dtype, m, n, k)
                            .beta(beta)
                            .build()
                            .unwrap()
                            .col_major();
                        let lanes = target.vector_bytes() / dtype.size();
                        for m_vectors in 1..=m.div_ceil(lanes) {
                            for n_cols in 1..=n {
                                let s = Schedule {
                                    m_vectors,
                                    n_cols,
                                    lane_pack: false,
                                    ..plan(&problem, target)
                                };
                                let (low, cost) = (
                                    cycles_at_least(&problem, target, &s),
                                    estimated_cycles(&problem, target, &s),
                                );
                                assert!(low <= cost, "{m}x{n}x{k} {s:?} {target}: {low} > {cost}");
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(compared > 500, "{compared}");
    }

    #[test]
    fn intel_avx512_costs_blocks_near_the_fma_latency_and_the_load_ports() {
        // f64 64x48x64 (k long, every block whole, the same FMAs in every blocking): a
        // 1x8 block (8 accumulators, a load per FMA) costs more than a 1x12 one, which
        // costs more than a 4x6 one (fewer loads per FMA) on Intel's AVX-512; Zen 4's
        // halves keep the hard max, which ties all three at the FMA bound.
        let problem = GemmSpec::builder(Dtype::F64, 64, 48, 64)
            .build()
            .unwrap()
            .col_major();
        let cycles = |target: Target, m_vectors: usize, n_cols: usize| {
            let s = Schedule {
                m_vectors,
                n_cols,
                ..plan(&problem, target)
            };
            estimated_cycles(&problem, target, &s)
        };
        let intel = Target::AVX512;
        assert!(cycles(intel, 1, 8) > 1.05 * cycles(intel, 1, 12));
        assert!(cycles(intel, 1, 12) > 1.005 * cycles(intel, 4, 6));
        let halves = Target::AVX512_HALVES;
        let (a, b, c) = (
            cycles(halves, 1, 8),
            cycles(halves, 1, 12),
            cycles(halves, 4, 6),
        );
        assert!((a - b).abs() < 1e-9 && (b - c).abs() < 1e-9, "{a} {b} {c}");
        // So the planner takes blocks past both edges there.
        let planned = plan(&problem, intel);
        assert!(planned.m_vectors * planned.n_cols >= 12, "{planned:?}");
        assert!(planned.m_vectors >= 2, "{planned:?}");
    }

    /// The search without the width pruning: every width, narrowest first.
    fn exhaustive_block(problem: &ColMajorProblem, target: Target) -> Option<(f64, Schedule)> {
        let mut best: Option<(f64, Schedule)> = None;
        for &width in target.vector_widths() {
            if let Some((cost, s)) = best_block(problem, target, width) {
                if best.is_none_or(|(c, _)| cost < c - 1e-9) {
                    best = Some((cost, s));
                }
            }
        }
        best
    }

    /// Where the planner puts C's last rows into dot products: one row wherever it saves
    /// enough FMAs, two rows only in f32 and past the shapes where they were measured to
    /// lose, never four.
    #[test]
    fn dot_tails_are_planned_where_they_were_measured_to_pay() {
        let target = Target::new(Isa::Avx512);
        let halves = Target {
            halves_512: true,
            ..target
        };
        for (dtype, (m, n, k), t, expected) in [
            (Dtype::F32, (17, 17, 17), target, true),
            (Dtype::F64, (17, 17, 17), target, true),
            (Dtype::F32, (18, 18, 18), target, true),
            (Dtype::F32, (34, 9, 21), target, true),
            (Dtype::F32, (2, 32, 32), target, true),
            (Dtype::F32, (1, 16, 16), target, true),
            (Dtype::F64, (9, 12, 9), target, true),
            (Dtype::F32, (1, 12, 12), target, false),
            (Dtype::F64, (1, 9, 9), target, false),
            (Dtype::F32, (17, 5, 9), target, false),
            (Dtype::F64, (9, 9, 9), target, false),
            (Dtype::F32, (2, 16, 16), target, false),
            (Dtype::F32, (18, 32, 8), target, false),
            (Dtype::F32, (18, 18, 18), halves, false),
            // Packed tails from k = 16, where 512-bit operations run whole.
            (Dtype::F64, (18, 18, 18), target, true),
            (Dtype::F64, (26, 12, 26), target, true),
            (Dtype::F64, (10, 10, 40), target, true),
            (Dtype::F64, (4, 16, 16), target, true),
            (Dtype::F32, (20, 20, 20), target, true),
            (Dtype::F32, (24, 24, 16), target, true),
            (Dtype::F64, (12, 12, 12), target, false),
            (Dtype::F64, (20, 20, 8), target, false),
            (Dtype::F32, (24, 24, 8), target, false),
            (Dtype::F64, (20, 20, 20), halves, false),
            (Dtype::F32, (4, 4, 16), target, false),
            (Dtype::F64, (100, 40, 90), target, false),
        ] {
            let spec = GemmSpec::builder(dtype, m, n, k).build().unwrap();
            let planned = plan(&spec.col_major(), t);
            assert_eq!(planned.dot_tail, expected, "{} on {t}", spec.name());
        }
    }

    #[test]
    fn pruning_widths_changes_no_plan() {
        for isa in [Isa::Avx2, Isa::Avx512, Isa::Neon] {
            let target = Target::new(isa);
            for dtype in [Dtype::F64, Dtype::F32] {
                for (m, n, k) in (1..=40).map(|s| (s, s, s)).chain([
                    (3, 17, 5),
                    (17, 3, 9),
                    (33, 8, 16),
                    (9, 64, 8),
                ]) {
                    let beta = if m % 2 == 0 {
                        Scalar::Zero
                    } else {
                        Scalar::One
                    };
                    let spec = GemmSpec::builder(dtype, m, n, k)
                        .beta(beta)
                        .build()
                        .unwrap();
                    let problem = spec.col_major();
                    let mut expected = exhaustive_block(&problem, target).unwrap().1;
                    choose_unrolling(&problem, target, &mut expected);
                    expected.batch_unroll = batch_unroll(&problem, target, &expected);
                    expected.interleave = interleave(&problem, target, &expected);
                    assert_eq!(
                        plan_blocks(&problem, target).1,
                        expected,
                        "{isa:?} {spec:?}"
                    );
                }
            }
        }
    }

    /// On AVX2 every square whose matrices reach TALL_MIN_BYTES streams with the tallest
    /// block two columns wide: as tall as m up to f64 24 and f32 32, 6 vectors with B held
    /// in registers for f64 25..32.
    #[test]
    fn avx2_streams_with_the_tallest_blocks_two_columns_wide() {
        let mut b_resident = 0;
        for target in [Target::AVX2, Target::AVX2_AMD] {
            for dtype in [Dtype::F64, Dtype::F32] {
                for n in 2..=32 {
                    let spec = GemmSpec::builder(dtype, n, n, n)
                        .beta(Scalar::One)
                        .build()
                        .unwrap();
                    let problem = spec.col_major();
                    let hot = plan(&problem, target);
                    if hot.lane_pack || matrix_bytes(&problem) < TALL_MIN_BYTES {
                        continue;
                    }
                    let streaming = plan_streaming(&problem, target, &hot);
                    let lanes = target.lanes(dtype);
                    let tallest = n.div_ceil(lanes).min(6);
                    assert_eq!(streaming.m_vectors, tallest, "{spec:?} {target}");
                    assert!(streaming.n_cols >= 2, "{spec:?} {target}");
                    assert!(streaming.validate(&problem, target).is_ok());
                    b_resident += streaming.b_resident as usize;
                }
            }
        }
        assert!(b_resident >= 4, "{b_resident}");
    }

    /// Where prefetching does not pay (Zen 4), the streaming variants never prefetch, and a
    /// batch streams differently exactly where they re-block: lane-packed small matrices
    /// and tall blocks from TALL_MIN_BYTES; on the other x86 targets, from
    /// PREFETCH_MIN_BYTES (f64 from 16x16x16 where they prefetch four trips ahead; every
    /// size where they reach a minimum distance ahead), with prefetches.
    #[test]
    fn streaming_variants_prefetch_only_where_it_pays() {
        for dtype in [Dtype::F64, Dtype::F32] {
            for n in 2..=32 {
                let spec = GemmSpec::builder(dtype, n, n, n).build().unwrap();
                let problem = spec.col_major();
                let bytes = matrix_bytes(&problem);
                for target in [Target::AVX512, Target::AVX512_HALVES, Target::AVX2_AMD] {
                    let hot = plan(&problem, target);
                    let streaming = plan_streaming(&problem, target, &hot);
                    // Four trips ahead (Zen 3), f64 prefetches from 16x16x16 up only.
                    let min = if target.prefetch_min_bytes_ahead > 0 {
                        0
                    } else if target.prefetch_trips > 1 && dtype == Dtype::F64 {
                        6144
                    } else {
                        PREFETCH_MIN_BYTES
                    };
                    let pays = target.software_prefetch && bytes >= min;
                    assert_eq!(prefetch_pays(&problem, target), pays, "{spec:?} {target}");
                    assert_eq!(streaming.prefetch, pays, "{spec:?} {target}");
                    let reblocks = (hot.lane_pack && streaming_block(&problem, target).is_some())
                        || (!hot.lane_pack && bytes >= TALL_MIN_BYTES)
                        || hot.dot_tail;
                    assert!(!streaming.dot_tail, "{spec:?} {target}");
                    assert_eq!(
                        streams_differently(&problem, target, &hot, true),
                        pays || reblocks,
                        "{spec:?} {target}"
                    );
                    assert_eq!(
                        streams_differently(&problem, target, &hot, false),
                        pays,
                        "{spec:?} {target}"
                    );
                    if !pays && !reblocks {
                        assert_eq!(streaming, hot, "{spec:?} {target}");
                    }
                }
            }
        }
    }

    /// Where the target spreads its prefetches over the k loops, streaming variants of
    /// matrices under 4 KiB whose k steps would all be unrolled loop over k two at a time;
    /// larger ones, and targets that prefetch before first use, keep their unrolling.
    #[test]
    fn small_streaming_matrices_loop_over_k_where_prefetches_spread() {
        for (dtype, n, target, loops) in [
            (Dtype::F32, 12, Target::AVX512, true),
            (Dtype::F64, 9, Target::AVX512, true),
            (Dtype::F32, 24, Target::AVX512, false),
            (Dtype::F32, 12, Target::AVX2_AMD, false),
        ] {
            let spec = GemmSpec::builder(dtype, n, n, n).build().unwrap();
            let problem = spec.col_major();
            let hot = Schedule {
                k_unroll: 0,
                lane_pack: false,
                ..plan(&problem, target)
            };
            let streaming = plan_streaming(&problem, target, &hot);
            let blocks = streaming_blocks(&problem, target, &hot);
            assert!(streaming.prefetch, "{spec:?} {target}");
            if loops {
                assert_eq!(blocks.k_unroll, 0, "{spec:?} {target}");
                assert_eq!(
                    streaming,
                    Schedule {
                        k_unroll: 2,
                        ..blocks
                    },
                    "{spec:?} {target}"
                );
            } else {
                assert_eq!(streaming, blocks, "{spec:?} {target}");
            }
        }
    }

    /// The prefetches of a streaming variant reach `Target::prefetch_trips` trips of the
    /// batch loop ahead: each of the four-trip target's is three matrices further on than
    /// the one-trip target's same prefetch.
    #[test]
    fn prefetches_reach_as_many_trips_ahead_as_the_target_asks() {
        fn offsets(ops: &[crate::program::Op], out: &mut Vec<i32>) {
            for op in ops {
                match op {
                    crate::program::Op::Prefetch { addr } => out.push(addr.offset),
                    crate::program::Op::Loop { body, .. } => offsets(body, out),
                    _ => {}
                }
            }
        }
        for (dtype, n) in [(Dtype::F32, 16), (Dtype::F32, 9), (Dtype::F64, 24)] {
            let spec = GemmSpec::builder(dtype, n, n, n).build().unwrap();
            let problem = spec.col_major();
            let prefetches = |target: Target| {
                let hot = plan(&problem, target);
                let s = plan_streaming(&problem, target, &hot);
                assert!(s.prefetch, "{spec:?} {target}");
                let program = crate::lower::lower(&problem, target, &s).unwrap();
                let mut out = Vec::new();
                offsets(&program.ops, &mut out);
                out
            };
            let near = prefetches(Target {
                prefetch_trips: 1,
                ..Target::AVX2_AMD
            });
            let far = prefetches(Target::AVX2_AMD);
            assert!(!near.is_empty(), "{spec:?}");
            assert_eq!(near.len(), far.len(), "{spec:?}");
            // Packed batch: A, B and C each n * n elements a matrix.
            let matrix = (n * n * dtype.size()) as i32;
            for (a, b) in near.iter().zip(&far) {
                assert_eq!(b - a, 3 * matrix, "{spec:?}");
            }
        }
    }
}
