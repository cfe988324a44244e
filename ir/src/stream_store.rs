//! Streaming (non-temporal) stores of C, for batches with beta = 0 that stream from memory.
//!
//! With beta = 0 a kernel only writes C, but an ordinary store first reads the line it
//! writes into the cache (a read for ownership), so C crosses the memory bus twice: the
//! batch moves four arrays' worth of bytes where A, B and C written once are three. A
//! non-temporal store writes whole lines to memory without reading them. Measured on this
//! project's AVX-512 machine, one core, three arrays of ⅓ GiB: x + y → z with `vmovupd`
//! stores ran at 10.7-11.0 GB/s counting three arrays, with `vmovntpd` at 13.9-14.8, the
//! GEMM pattern (z += x·y, four arrays) at 16.0-16.1.
//!
//! This pass turns the program's stores to C into [`Op::StoreStream`] when all of them are
//! whole vectors at addresses aligned to the vector width, given C itself is (no masked or
//! narrowed row tails, columns a multiple of the width apart). Alignment is followed from
//! the C argument register through copies and constant additions, loops included: a
//! register a loop moves by other than a multiple of the width is unknown inside it, so a
//! batch stride or a column stride that is not a multiple of the width leaves the program
//! as it is.

use std::collections::{HashMap, HashSet};

use crate::program::{Addr, Gpr, Op, Program};

/// Turns `program`'s stores to C into streaming stores, assuming the kernel is called with
/// C aligned to the vector width, when every one of them can be: whole vectors at aligned
/// addresses. Returns whether it did; otherwise the program is left as it was. Measured
/// (f64 12 and 20, f32 24, from DRAM, one thread): with only the aligned whole vectors
/// streaming and the rest of C stored as usual, 4-8 points of the bandwidth bound lower
/// than with none.
pub fn apply(program: &mut Program) -> bool {
    let mut walk = Walk {
        width: program.vector_bytes() as i64,
        known: HashMap::from([(Gpr::C, 0)]),
        origin: [Gpr::A, Gpr::B, Gpr::C, Gpr::SCRATCH]
            .map(|g| (g, g))
            .into(),
        changed: false,
        blocked: false,
        unprefetched: HashSet::new(),
    };
    let mut ops = program.ops.clone();
    walk.convert(&mut ops);
    if !walk.changed || walk.blocked {
        return false;
    }
    // The registers that only walked C's lines for the prefetches ([`crate::prefetch`],
    // spread) have nothing left to do.
    let mut read = HashSet::new();
    registers_read(&ops, &mut read);
    let idle: HashSet<Gpr> = walk.unprefetched.difference(&read).copied().collect();
    drop_writes(&mut ops, &idle);
    // C's walk is the last register the prefetch pass took: give it back, so that the
    // kernel does not save a register it no longer uses.
    while program.gprs > 0 && idle.contains(&Gpr((program.gprs - 1) as u8)) {
        program.gprs -= 1;
    }
    program.ops = ops;
    true
}

/// Registers `ops` address memory through (prefetches included), copy or count with.
fn registers_read(ops: &[Op], out: &mut HashSet<Gpr>) {
    for op in ops {
        match op {
            Op::Loop { counter, body, .. } => {
                out.insert(*counter);
                registers_read(body, out);
            }
            Op::Copy { src: g, .. }
            | Op::Prefetch {
                addr: Addr { base: g, .. },
            }
            | Op::LoadAddress {
                addr: Addr { base: g, .. },
                ..
            }
            | Op::StoreStream {
                addr: Addr { base: g, .. },
                ..
            }
            | Op::StoreParam {
                addr: Addr { base: g, .. },
                ..
            }
            | Op::StoreConst {
                addr: Addr { base: g, .. },
                ..
            } => {
                out.insert(*g);
            }
            op => {
                if let Some(addr) = crate::prefetch::memory_operand(op) {
                    out.insert(addr.base);
                }
            }
        }
    }
}

/// `ops` without the copies into and additions to `regs`.
fn drop_writes(ops: &mut Vec<Op>, regs: &HashSet<Gpr>) {
    ops.retain(|op| match op {
        Op::Copy { dst, .. } | Op::AddImm { dst, .. } => !regs.contains(dst),
        _ => true,
    });
    for op in ops.iter_mut() {
        if let Op::Loop { body, .. } = op {
            drop_writes(body, regs);
        }
    }
}

/// The state of the pass as it walks the program in order.
struct Walk {
    /// The vector width in bytes.
    width: i64,
    /// Offsets (mod width) from an aligned address of the registers that point into C.
    known: HashMap<Gpr, i64>,
    /// The argument register (or the scratch base) each register's address derives from.
    origin: HashMap<Gpr, Gpr>,
    /// Whether a store became a streaming store.
    changed: bool,
    /// Whether a store outside the scratch memory could not.
    blocked: bool,
    /// Registers through which a prefetch of C's lines was dropped.
    unprefetched: HashSet<Gpr>,
}

impl Walk {
    fn convert(&mut self, ops: &mut Vec<Op>) {
        let width = self.width;
        let mut out = Vec::with_capacity(ops.len());
        for mut op in std::mem::take(ops) {
            let prefixed = matches!(out.last(), Some(Op::Narrow { .. }));
            match &mut op {
                Op::Store {
                    addr,
                    src,
                    mask: None,
                } if !prefixed
                    && self
                        .known
                        .get(&addr.base)
                        .is_some_and(|&at| (at + addr.offset as i64).rem_euclid(width) == 0) =>
                {
                    op = Op::StoreStream {
                        addr: *addr,
                        src: *src,
                    };
                    self.changed = true;
                }
                // The prefetch pass reads the next matrices' C ahead ([`crate::prefetch`]):
                // where C is stored whole, its lines are better left unread.
                Op::Prefetch { addr } if self.origin.get(&addr.base) == Some(&Gpr::C) => {
                    self.unprefetched.insert(addr.base);
                    continue;
                }
                Op::Store { addr, .. }
                | Op::StorePieces { addr, .. }
                | Op::StoreScalar { addr, .. }
                    if self.origin.get(&addr.base) != Some(&Gpr::SCRATCH) =>
                {
                    self.blocked = true;
                }
                Op::Copy { dst, src } => {
                    match self.known.get(src).copied() {
                        Some(at) => self.known.insert(*dst, at),
                        None => self.known.remove(dst),
                    };
                    match self.origin.get(src).copied() {
                        Some(o) => self.origin.insert(*dst, o),
                        None => self.origin.remove(dst),
                    };
                }
                Op::AddImm { dst, imm } => {
                    if let Some(at) = self.known.get_mut(dst) {
                        *at = (*at + *imm as i64).rem_euclid(width);
                    }
                }
                Op::LoadAddress { dst, .. } => {
                    self.known.remove(dst);
                    self.origin.remove(dst);
                }
                Op::Loop { counter, body, .. } => {
                    self.known.remove(counter);
                    self.origin.remove(counter);
                    // A register is the same (mod width) at the start of every trip when the
                    // body only moves it by a multiple of the width in all; any other write
                    // leaves it unknown at the start of a trip (until the body writes it),
                    // and after the loop.
                    let mut moved = HashMap::new();
                    let mut written = HashSet::new();
                    writes(body, width, &mut moved, &mut written);
                    for g in &written {
                        self.known.remove(g);
                    }
                    // Constants added keep a register in its matrix (the prefetch walks
                    // move by less than a vector); only other writes lose its origin.
                    let mut reassigned = HashSet::new();
                    writes(body, 1, &mut HashMap::new(), &mut reassigned);
                    for g in &reassigned {
                        self.origin.remove(g);
                    }
                    for (g, d) in moved {
                        if d % width != 0 {
                            self.known.remove(&g);
                        }
                    }
                    let (known, origin) = (self.known.clone(), self.origin.clone());
                    self.convert(body);
                    (self.known, self.origin) = (known, origin);
                }
                _ => {}
            }
            out.push(op);
        }
        *ops = out;
    }
}

/// What `ops` do to general registers: the sum of the constants added to each (`moved`),
/// and the registers written any other way, or moved by an inner loop by other than a
/// multiple of `width` (`written`).
fn writes(ops: &[Op], width: i64, moved: &mut HashMap<Gpr, i64>, written: &mut HashSet<Gpr>) {
    for op in ops {
        match op {
            Op::AddImm { dst, imm } => *moved.entry(*dst).or_default() += *imm as i64,
            Op::Copy { dst, .. } | Op::LoadAddress { dst, .. } => {
                written.insert(*dst);
            }
            Op::Loop { counter, body, .. } => {
                written.insert(*counter);
                // An inner loop's additions repeat an unknown number of times here.
                let mut inner = HashMap::new();
                writes(body, width, &mut inner, written);
                written.extend(
                    inner
                        .into_iter()
                        .filter(|&(_, d)| d % width != 0)
                        .map(|(g, _)| g),
                );
            }
            _ => {}
        }
    }
}
