//! Software prefetch of the batch's next matrices, for batches that stream from memory.
//!
//! A kernel reads its matrices in the order the blocking dictates (a column of A per step
//! of k, a B element per column, C once at the end), in short runs the hardware prefetchers
//! only catch up with late: with matrices of a few KiB each, a core streaming a batch from
//! DRAM spends most of its time waiting for lines it could have asked for a matrix earlier.
//!
//! This pass runs on a lowered strided program: before the first access to each cache line
//! in a loop body it inserts a prefetch of the same line one trip of the batch loop ahead,
//! or as many as the target asks for (the address plus what that many trips add to that
//! operand's base register). Operations that
//! reach the same matrices in later iterations of an inner loop prefetch their own lines,
//! so the next matrix arrives while the current one is computed. Addresses are tracked from
//! the argument registers through copies; anything else (scratch memory, pointers loaded
//! from pointer arrays) is left alone.

use std::collections::{HashMap, HashSet};

use crate::program::{Addr, Gpr, Op};

/// Bytes per cache line.
const LINE: i64 = 64;

/// The most trips ahead that [`insert`] reaches to cover its minimum distance.
const MAX_TRIPS: i64 = 64;

/// Inserts prefetches into every batch loop of `ops` (a program's top level), `trips`
/// trips of the batch loop ahead (at least one; [`crate::Target::prefetch_trips`]), or as
/// many more as it takes to reach `min_bytes_ahead` bytes of A, B and C ahead
/// ([`crate::Target::prefetch_min_bytes_ahead`]).
pub fn insert(ops: &mut [Op], trips: u8, min_bytes_ahead: u32) {
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
                let ahead: HashMap<Gpr, i64> =
                    step.into_iter().map(|(g, d)| (g, d * trips)).collect();
                let mut origin: HashMap<Gpr, Gpr> = [Gpr::A, Gpr::B, Gpr::C].map(|g| (g, g)).into();
                *body = with_prefetches(std::mem::take(body), &ahead, &mut origin);
            }
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
fn memory_operand(op: &Op) -> Option<Addr> {
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
