//! Software prefetch of the batch's next matrices, for batches that stream from memory.
//!
//! A kernel reads its matrices in the order the blocking dictates (a column of A per step
//! of k, a B element per column, C once at the end), in short runs the hardware prefetchers
//! only catch up with late: with matrices of a few KiB each, a core streaming a batch from
//! DRAM spends most of its time waiting for lines it could have asked for a matrix earlier.
//!
//! This pass runs on a lowered strided program and prefetches the matrices one trip of the
//! batch loop ahead, or as many as the target asks for, in one of two ways:
//!
//! - **At first use** (straight-line bodies, and targets without
//!   [`crate::Target::prefetch_spread`]): before the first access to each cache line in a
//!   loop body, a prefetch of the same line that many trips ahead (the address plus what
//!   those trips add to that operand's base register). Operations that reach the same
//!   matrices in later iterations of an inner loop prefetch their own lines. Addresses are
//!   tracked from the argument registers through copies; anything else (scratch memory,
//!   pointers loaded from pointer arrays) is left alone.
//! - **Spread** (bodies with inner loops, where the target spreads): one register per
//!   operand walks the next matrices, the same few prefetches in every trip of every
//!   innermost loop at a stride of at most a line, so that the lines are asked for at an
//!   even rate over the whole matrix. At first use, a matrix whose blocks each span all of
//!   A asks for all of the next A within its first block: a burst of misses (likely more
//!   than the core keeps in flight) that the compute waits behind (docs/perf-notes.md,
//!   twenty-fifth session).

use std::collections::{HashMap, HashSet};

use crate::program::{Addr, Gpr, Op, Trips};

/// Bytes per cache line.
pub(crate) const LINE: i64 = 64;

/// The most trips ahead that [`insert`] reaches to cover its minimum distance.
const MAX_TRIPS: i64 = 64;

/// Inserts prefetches into every batch loop of `ops` (a program's top level), `trips`
/// trips of the batch loop ahead (at least one; [`crate::Target::prefetch_trips`]), or as
/// many more as it takes to reach `min_bytes_ahead` bytes of A, B and C ahead
/// ([`crate::Target::prefetch_min_bytes_ahead`]); `spread` as
/// [`crate::Target::prefetch_spread`] says. `gprs` is the number of general registers
/// `ops` uses; returns the number it uses afterwards (spreading takes one per operand).
pub fn insert(ops: &mut [Op], trips: u8, min_bytes_ahead: u32, spread: bool, gprs: usize) -> usize {
    let mut used = gprs;
    for op in ops.iter_mut() {
        if let Op::Loop { counter, body, .. } = op {
            if *counter == Gpr::BATCH {
                // What one trip adds to the A, B and C registers: the distance to the
                // matrices the next trip works on.
                let mut step: HashMap<Gpr, i64> = HashMap::new();
                for op in body.iter() {
                    if let Op::AddImm { dst, imm } = op {
                        if [Gpr::A, Gpr::B, Gpr::C].contains(dst) {
                            *step.entry(*dst).or_default() += *imm as i64;
                        }
                    }
                }
                let per_trip: i64 = step.values().map(|d| d.abs()).sum();
                let trips = match per_trip {
                    0 => 1,
                    _ => ((i64::from(min_bytes_ahead) + per_trip - 1) / per_trip)
                        .clamp(i64::from(trips.max(1)), MAX_TRIPS.max(i64::from(trips))),
                };
                // Each operand's bytes a trip (the lines to prefetch) and distance ahead,
                // in the order A, B, C; none for an operand the same for every matrix.
                let walks: Vec<(Gpr, i64, i64)> = [Gpr::A, Gpr::B, Gpr::C]
                    .into_iter()
                    .filter_map(|g| step.get(&g).map(|&d| (g, d, d * trips)))
                    .filter(|&(_, d, _)| d != 0)
                    .collect();
                let spreads = spread
                    && has_loop(body)
                    && walks
                        .iter()
                        .all(|&(_, d, ahead)| d > 0 && i32::try_from(ahead).is_ok())
                    && gprs + walks.len() <= Gpr::EVERY_BACKEND;
                if spreads {
                    *body = spread_prefetches(std::mem::take(body), &walks, gprs);
                    used = used.max(gprs + walks.len());
                } else {
                    let ahead: HashMap<Gpr, i64> =
                        walks.iter().map(|&(g, _, ahead)| (g, ahead)).collect();
                    let mut origin: HashMap<Gpr, Gpr> =
                        [Gpr::A, Gpr::B, Gpr::C].map(|g| (g, g)).into();
                    *body = with_prefetches(std::mem::take(body), &ahead, &mut origin);
                }
            }
        }
    }
    used
}

/// `body` (a batch loop's, with inner loops) with the next matrices prefetched by walking
/// registers: for each `(operand, bytes a trip, bytes ahead)` of `walks` a register (from
/// `Gpr(first_free)` on) starts `bytes ahead` past the operand at the top of the body, and
/// every trip of every innermost loop prefetches the same few addresses of each operand, one
/// stride after another, spaced evenly between the loop's operations.
fn spread_prefetches(body: Vec<Op>, walks: &[(Gpr, i64, i64)], first_free: usize) -> Vec<Op> {
    let total = innermost_trips(&body, 1).max(1);
    let steps: Vec<WalkStep> = walks
        .iter()
        .map(|&(_, bytes, _)| WalkStep::over(bytes, total))
        .collect();
    let regs: Vec<Gpr> = (0..walks.len())
        .map(|i| Gpr((first_free + i) as u8))
        .collect();
    // One trip's prefetches, the same in every innermost loop: (register, stride), the
    // walks interleaved.
    let most = steps.iter().map(|s| s.units).max().unwrap_or(0);
    let units: Vec<(Gpr, i32)> = (0..most)
        .flat_map(|u| {
            regs.iter()
                .zip(&steps)
                .filter(move |(_, s)| s.units > u)
                .map(|(&r, s)| (r, s.stride))
        })
        .collect();
    let mut out = Vec::with_capacity(body.len() + 2 * walks.len());
    for (&(operand, _, ahead), &reg) in walks.iter().zip(&regs) {
        out.push(Op::Copy {
            dst: reg,
            src: operand,
        });
        out.push(Op::AddImm {
            dst: reg,
            imm: ahead as i32,
        });
    }
    out.extend(body);
    walk_into_loops(&mut out, &units);
    out
}

/// How one walking register moves through the innermost loops: `units` prefetches a trip,
/// `stride` bytes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WalkStep {
    units: usize,
    stride: i32,
}

impl WalkStep {
    /// The step that covers the lines of `bytes` in `trips` innermost trips at an even
    /// rate: the fewest prefetches a trip that reach a line each, at the shortest stride
    /// (at most a line) that reaches the last line from a line-aligned start. A stride under
    /// a line asks for some lines twice (the second finds the line on its way, at the cost
    /// of an issue slot); whole lines a trip instead left the last loops with none and the
    /// first asking at a higher rate (f64 29: four lines a trip for 28 of its 35 trips,
    /// none in the last 7). Where the matrices start mid-line, the line past the last
    /// whole one may go unasked; in a packed batch it is the next matrix's first line,
    /// which the next trip asks for first.
    fn over(bytes: i64, trips: i64) -> WalkStep {
        let lines = ((bytes + LINE - 1) / LINE).max(1);
        let units = (lines + trips - 1) / trips;
        let gaps = units * trips - 1;
        let stride = match gaps {
            0 => LINE,
            _ => (LINE * (lines - 1) + gaps - 1) / gaps,
        };
        WalkStep {
            units: units as usize,
            stride: stride.clamp(1, LINE) as i32,
        }
    }
}

/// Whether `ops` hold a loop (at their own level).
fn has_loop(ops: &[Op]) -> bool {
    ops.iter().any(|op| matches!(op, Op::Loop { .. }))
}

/// The trips of all innermost loops of `ops` per run of `ops` (times `outer`). A loop
/// whose count is known only at run time counts once.
fn innermost_trips(ops: &[Op], outer: i64) -> i64 {
    ops.iter()
        .map(|op| match op {
            Op::Loop { trips, body, .. } => {
                let t = outer
                    * match trips {
                        Trips::Const(n) => i64::from(*n),
                        Trips::Register | Trips::RegisterBy(_) => 1,
                    };
                if has_loop(body) {
                    innermost_trips(body, t)
                } else {
                    t
                }
            }
            _ => 0,
        })
        .sum()
}

/// Puts `units` (a trip's prefetches: walking register, stride) into every innermost loop
/// of `ops`, spaced evenly through the loop's body.
fn walk_into_loops(ops: &mut [Op], units: &[(Gpr, i32)]) {
    for op in ops.iter_mut() {
        if let Op::Loop { body, .. } = op {
            if has_loop(body) {
                walk_into_loops(body, units);
                continue;
            }
            let n = body.len();
            let mut spaced = Vec::with_capacity(n + 2 * units.len());
            let mut placed = 0;
            for (i, op) in std::mem::take(body).into_iter().enumerate() {
                // Unit u goes before the operation at u * n / units.len().
                while placed < units.len() && placed * n <= i * units.len() {
                    // Before a Narrow prefix: it applies to the operation after it.
                    let at = match spaced.last() {
                        Some(Op::Narrow { .. }) => spaced.len() - 1,
                        _ => spaced.len(),
                    };
                    let (reg, stride) = units[placed];
                    spaced.insert(
                        at,
                        Op::AddImm {
                            dst: reg,
                            imm: stride,
                        },
                    );
                    spaced.insert(
                        at,
                        Op::Prefetch {
                            addr: Addr::new(reg, 0),
                        },
                    );
                    placed += 1;
                }
                spaced.push(op);
            }
            *body = spaced;
        }
    }
}

/// `body` with prefetches inserted; `origin` maps registers to the argument register whose
/// matrix they point into, and is updated by the copies and loads of `body`.
fn with_prefetches(
    body: Vec<Op>,
    ahead: &HashMap<Gpr, i64>,
    origin: &mut HashMap<Gpr, Gpr>,
) -> Vec<Op> {
    let mut out = Vec::with_capacity(body.len() * 5 / 4);
    let mut seen: HashSet<(Gpr, i64)> = HashSet::new();
    for mut op in body {
        if let Some(addr) = memory_operand(&op) {
            let target = origin
                .get(&addr.base)
                .and_then(|base| ahead.get(base))
                .filter(|&&d| d != 0)
                .and_then(|&d| i32::try_from(addr.offset as i64 + d).ok());
            if let Some(offset) = target {
                if seen.insert((addr.base, (addr.offset as i64).div_euclid(LINE))) {
                    let prefetch = Op::Prefetch {
                        addr: Addr::new(addr.base, offset),
                    };
                    // Before op's Narrow prefix, if it has one: the prefix applies to op.
                    match out.last() {
                        Some(Op::Narrow { .. }) => out.insert(out.len() - 1, prefetch),
                        _ => out.push(prefetch),
                    }
                }
            }
        }
        match &mut op {
            Op::Copy { dst, src } => match origin.get(src).copied() {
                Some(base) => {
                    origin.insert(*dst, base);
                }
                None => {
                    origin.remove(dst);
                }
            },
            Op::LoadAddress { dst, .. } => {
                origin.remove(dst);
            }
            // A moved register addresses other lines from now on.
            Op::AddImm { dst, .. } => seen.retain(|(g, _)| g != dst),
            Op::Loop { body, .. } => {
                *body = with_prefetches(std::mem::take(body), ahead, origin);
                seen.clear();
            }
            _ => {}
        }
        out.push(op);
    }
    out
}

/// The memory `op` reads or writes in A, B or C, if any.
pub(crate) fn memory_operand(op: &Op) -> Option<Addr> {
    match op {
        Op::Load { addr, .. }
        | Op::Store { addr, .. }
        | Op::StorePieces { addr, .. }
        | Op::Broadcast { addr, .. }
        | Op::BroadcastGroup { addr, .. }
        | Op::InsertGroup { addr, .. }
        | Op::LoadScalar { addr, .. }
        | Op::StoreScalar { addr, .. }
        | Op::FmaBroadcast { b: addr, .. } => Some(*addr),
        // Scratch memory, pointer arrays, hints, register operations, and C's lines that
        // are written whole without being read.
        Op::StoreStream { .. }
        | Op::StoreParam { .. }
        | Op::StoreConst { .. }
        | Op::LoadAddress { .. }
        | Op::Prefetch { .. }
        | Op::Zero { .. }
        | Op::Fma { .. }
        | Op::Permute { .. }
        | Op::PermuteVar { .. }
        | Op::Indices { .. }
        | Op::TransposeAdd { .. }
        | Op::FmaLane { .. }
        | Op::Add { .. }
        | Op::Sub { .. }
        | Op::Mul { .. }
        | Op::SetMask { .. }
        | Op::Copy { .. }
        | Op::AddImm { .. }
        | Op::Narrow { .. }
        | Op::Loop { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::program::Program;
    use crate::spec::{Dtype, GemmSpec};
    use crate::{lower, plan, plan_streaming, Target};

    /// The streaming variant's program for `spec` on `target`.
    fn streaming_program(spec: &GemmSpec, target: Target) -> Program {
        let problem = spec.col_major();
        let s = plan_streaming(&problem, target, &plan(&problem, target));
        assert!(s.prefetch, "{spec:?}");
        lower(&problem, target, &s).unwrap()
    }

    /// The body of the program's (first) batch loop.
    fn batch_body(ops: &[Op]) -> &[Op] {
        ops.iter()
            .find_map(|op| match op {
                Op::Loop { counter, body, .. } if *counter == Gpr::BATCH => Some(&body[..]),
                _ => None,
            })
            .expect("a batch loop")
    }

    /// Runs one trip of a batch loop's body symbolically (inner loops their constant
    /// number of times), with every register that points into A, B or C known as (operand,
    /// byte offset from the line where the operand's current matrix starts, the matrix
    /// `start` bytes into it); returns the prefetched lines as (operand, line index from
    /// that line).
    fn prefetched_lines(body: &[Op], start: i64) -> Vec<(Gpr, i64)> {
        fn run(ops: &[Op], at: &mut HashMap<Gpr, (Gpr, i64)>, out: &mut Vec<(Gpr, i64)>) {
            for op in ops {
                match op {
                    Op::Copy { dst, src } => match at.get(src).copied() {
                        Some(v) => {
                            at.insert(*dst, v);
                        }
                        None => {
                            at.remove(dst);
                        }
                    },
                    Op::AddImm { dst, imm } => {
                        if let Some(v) = at.get_mut(dst) {
                            v.1 += i64::from(*imm);
                        }
                    }
                    Op::Prefetch { addr } => {
                        let (operand, offset) = at[&addr.base];
                        out.push((operand, (offset + i64::from(addr.offset)).div_euclid(LINE)));
                    }
                    Op::Loop { trips, body, .. } => {
                        let Trips::Const(n) = trips else {
                            panic!("an inner loop of unknown count")
                        };
                        for _ in 0..*n {
                            run(body, at, out);
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut at: HashMap<Gpr, (Gpr, i64)> =
            [Gpr::A, Gpr::B, Gpr::C].map(|g| (g, (g, start))).into();
        let mut out = Vec::new();
        run(body, &mut at, &mut out);
        out
    }

    /// Registers the prefetches of `ops` address through, loops included.
    fn prefetch_bases(ops: &[Op], out: &mut BTreeSet<Gpr>) {
        for op in ops {
            match op {
                Op::Prefetch { addr } => {
                    out.insert(addr.base);
                }
                Op::Loop { body, .. } => prefetch_bases(body, out),
                _ => {}
            }
        }
    }

    /// Counts the prefetches through each of `regs` in every innermost loop of `ops`.
    fn prefetches_per_innermost_loop(ops: &[Op], regs: &[Gpr], out: &mut Vec<Vec<usize>>) {
        for op in ops {
            if let Op::Loop { body, .. } = op {
                if has_loop(body) {
                    prefetches_per_innermost_loop(body, regs, out);
                    continue;
                }
                let count = |g: Gpr| {
                    body.iter()
                        .filter(|op| matches!(op, Op::Prefetch { addr } if addr.base == g))
                        .count()
                };
                out.push(regs.iter().map(|&g| count(g)).collect());
            }
        }
    }

    /// Where the batch loop has inner loops, the walks ask for every line of the next
    /// matrices' A, B and C in one trip, in ascending order, and not much past them; every
    /// trip of every innermost loop asks for the same number of each operand's lines, so
    /// that the requests go out at an even rate over the whole matrix (f64 29's last column
    /// block once asked for none, its first ones for a third more than their share).
    #[test]
    fn spread_prefetches_cover_the_next_matrices_at_an_even_rate() {
        let cases = [
            GemmSpec::builder(Dtype::F64, 32, 32, 32).build().unwrap(),
            GemmSpec::builder(Dtype::F64, 29, 29, 29).build().unwrap(),
            GemmSpec::builder(Dtype::F32, 20, 20, 20).build().unwrap(),
            GemmSpec::builder(Dtype::F64, 24, 9, 40).build().unwrap(),
            GemmSpec::builder(Dtype::F32, 17, 33, 30)
                .trans_a(crate::spec::Trans::T)
                .build()
                .unwrap(),
        ];
        for spec in cases {
            let program = streaming_program(&spec, Target::AVX512);
            let body = batch_body(&program.ops);
            assert!(has_loop(body), "{spec:?}");
            let problem = spec.col_major();
            let elt = problem.dtype.size() as i64;
            let total_trips = innermost_trips(body, 1);
            // Matrices that start at a line, and mid-line (the kernel cannot know which).
            for start in [0, 40] {
                let lines = prefetched_lines(body, start);
                for (operand, stride) in [
                    (Gpr::A, problem.stride_a),
                    (Gpr::B, problem.stride_b),
                    (Gpr::C, problem.stride_c),
                ] {
                    let bytes = stride as i64 * elt;
                    // One trip ahead reaches 4 KiB here: the next matrix.
                    let (first, last) = ((start + bytes) / LINE, (start + 2 * bytes - 1) / LINE);
                    let mine: Vec<i64> = lines
                        .iter()
                        .filter(|(o, _)| *o == operand)
                        .map(|&(_, l)| l)
                        .collect();
                    assert!(
                        mine.windows(2).all(|w| w[0] <= w[1]),
                        "{spec:?} {operand:?} from {start}: not in ascending order"
                    );
                    let distinct: BTreeSet<i64> = mine.iter().copied().collect();
                    // From mid-line, the last line may be left to the next trip, whose walk
                    // starts in it: the matrix after the next begins there.
                    let left_to_next = start % LINE != 0 && (start + 2 * bytes) / LINE == last;
                    assert!(
                        (first..=last)
                            .all(|l| distinct.contains(&l) || (l == last && left_to_next)),
                        "{spec:?} {operand:?} from {start}: not all of {first}..={last}"
                    );
                    assert_eq!(
                        distinct.first(),
                        Some(&first),
                        "{spec:?} {operand:?} from {start}"
                    );
                    // The fewest prefetches a trip that reach a line each: fewer than a
                    // trip's worth more than the lines, and at most a trip's worth past the
                    // last line.
                    let count = mine.len() as i64;
                    let per_trip = count / total_trips;
                    assert_eq!(
                        count,
                        per_trip * total_trips,
                        "{spec:?} {operand:?} from {start}"
                    );
                    assert!(
                        count < (bytes + LINE - 1) / LINE + total_trips,
                        "{spec:?} {operand:?} from {start}: {count}"
                    );
                    assert!(
                        *distinct.last().unwrap() <= last + per_trip,
                        "{spec:?} {operand:?} from {start}: {distinct:?}"
                    );
                }
            }
            // One walking register per operand, past the lowering's; every innermost
            // loop asks for the same number of lines of each operand.
            let mut bases = BTreeSet::new();
            prefetch_bases(&program.ops, &mut bases);
            assert_eq!(bases.len(), 3, "{spec:?}: {bases:?}");
            assert!(program.gprs <= Gpr::EVERY_BACKEND, "{spec:?}");
            assert!(
                bases.iter().all(|g| usize::from(g.0) + 3 >= program.gprs),
                "{spec:?}: {bases:?} of {}",
                program.gprs
            );
            let regs: Vec<Gpr> = bases.into_iter().collect();
            let mut per_loop = Vec::new();
            prefetches_per_innermost_loop(body, &regs, &mut per_loop);
            assert!(
                per_loop.windows(2).all(|w| w[0] == w[1]) && per_loop[0].iter().all(|&c| c > 0),
                "{spec:?}: {per_loop:?}"
            );
        }
    }

    /// The walk's step reaches from the first line to the last in the trips, at most a line
    /// at a time, with the fewest prefetches a trip that can.
    #[test]
    fn walk_steps_cover_their_bytes_without_skipping_a_line() {
        // f64 29x29x29: 6728 bytes an operand over 35 innermost trips (28 of the four full
        // column blocks, 7 of the last).
        assert_eq!(
            WalkStep::over(6728, 35),
            WalkStep {
                units: 4,
                stride: 49
            }
        );
        for bytes in [1, 63, 64, 65, 200, 1000, 4096, 6728, 8192, 40000] {
            for trips in [1, 2, 3, 7, 35, 128, 1000] {
                let WalkStep { units, stride } = WalkStep::over(bytes, trips);
                let (units, stride) = (units as i64, i64::from(stride));
                assert!((1..=LINE).contains(&stride), "{bytes} {trips}");
                // The last prefetch reaches the last line from a line's start.
                let lines = (bytes + LINE - 1) / LINE;
                assert!(
                    (units * trips - 1) * stride >= (lines - 1) * LINE,
                    "{bytes} {trips}"
                );
                assert!(
                    units == 1 || (units - 1) * trips < lines,
                    "{bytes} {trips}: {units} a trip"
                );
            }
        }
    }

    /// Straight-line bodies, targets that do not spread, and operands with gaps between
    /// their matrices keep the prefetches before each line's first use: addressed through
    /// the lowering's own registers, at offsets a trip ahead.
    #[test]
    fn others_prefetch_before_first_use() {
        let f64_32 = GemmSpec::builder(Dtype::F64, 32, 32, 32);
        // (spec, target, all k steps unrolled)
        let cases = [
            (f64_32.build().unwrap(), Target::AVX512, true),
            (
                GemmSpec::builder(Dtype::F32, 9, 9, 9).build().unwrap(),
                Target::AVX512,
                true,
            ),
            (f64_32.build().unwrap(), Target::AVX2_AMD, false),
            (
                f64_32.stride_a(2048).build().unwrap(),
                Target::AVX512,
                false,
            ),
        ];
        for (spec, target, straight) in cases {
            let problem = spec.col_major();
            let s = plan_streaming(&problem, target, &plan(&problem, target));
            let s = crate::Schedule {
                k_unroll: if straight { 0 } else { s.k_unroll },
                unroll_m_blocks: s.unroll_m_blocks || straight,
                unroll_n_blocks: s.unroll_n_blocks || straight,
                ..s
            };
            assert!(s.prefetch, "{spec:?} on {target}");
            let program = lower(&problem, target, &s).unwrap();
            let body = batch_body(&program.ops);
            assert_eq!(has_loop(body), !straight, "{spec:?} on {target}");
            let no = crate::Schedule {
                prefetch: false,
                ..s
            };
            let unprefetched = lower(&problem, target, &no).unwrap();
            assert_eq!(program.gprs, unprefetched.gprs, "{spec:?} on {target}");
            let mut bases = BTreeSet::new();
            prefetch_bases(&program.ops, &mut bases);
            assert!(!bases.is_empty(), "{spec:?} on {target}");
            assert!(
                bases.iter().all(|g| usize::from(g.0) < unprefetched.gprs),
                "{spec:?} on {target}: {bases:?}"
            );
        }
    }
}
