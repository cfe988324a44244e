//! `Program`: a lowered CPU kernel as a short tree of vector operations on numbered
//! registers. Every CPU backend turns each `Op` into one or a few instructions.
//!
//! The kernel's arguments are the pointers to A, B and C of the first matrix of the batch
//! (general registers 0, 1, 2) — or, for pointer-array batches, the addresses of the three
//! arrays of pointers — the batch length (general register 3), then the run-time scalars
//! listed in [`Program::params`], in that order.

use std::fmt;

use crate::spec::Dtype;

/// A vector register (lanes of the program's dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VReg(pub u8);

/// A general-purpose register holding a byte address or a loop count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gpr(pub u8);

impl Gpr {
    /// Address of the first A of the batch; advanced by the batch loop.
    pub const A: Gpr = Gpr(0);
    /// Address of the first B of the batch; advanced by the batch loop.
    pub const B: Gpr = Gpr(1);
    /// Address of the first C of the batch; advanced by the batch loop.
    pub const C: Gpr = Gpr(2);
    /// Number of matrices; counted down by the batch loop.
    pub const BATCH: Gpr = Gpr(3);
    /// Base of the kernel's scratch memory (`Program::scratch_bytes`, 64-byte aligned).
    pub const SCRATCH: Gpr = Gpr(u8::MAX);
    /// First register the lowering may allocate.
    pub const FIRST_FREE: u8 = 4;
    /// General registers every backend gives a program (x86-64's 13: sixteen less the
    /// stack pointer, the frame pointer and the backend's temporary). Passes that add
    /// registers after the lowering stay within it.
    pub const EVERY_BACKEND: usize = 13;
}

/// A tail mask: enables the first `lanes` lanes of a vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mask(pub u8);

/// A run-time scalar argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    Alpha,
    Beta,
}

/// A memory operand: a general register plus a constant byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    pub base: Gpr,
    pub offset: i32,
}

impl Addr {
    pub fn new(base: Gpr, offset: i32) -> Addr {
        Addr { base, offset }
    }
}

/// How many times a loop body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trips {
    /// A constant count (at least 2: the lowering inlines single iterations).
    Const(u32),
    /// The value of the counter register on entry, counted down to zero; 0 skips the body.
    Register,
    /// The counter register on entry divided by the step (at least 2), rounded down: each
    /// trip subtracts the step, and the loop leaves the remainder (counter mod step) in the
    /// counter for a `Register` loop after it. Batch loops that do several matrices a trip.
    RegisterBy(u32),
}

/// One operation. Vector operations act on all lanes; masked lanes of loads read as zero
/// and masked lanes of stores are not written (nor is their memory touched).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// dst = 0.
    Zero { dst: VReg },
    /// dst = memory (lanes beyond the mask read as zero and are not accessed).
    Load {
        dst: VReg,
        addr: Addr,
        mask: Option<Mask>,
    },
    /// memory = src (lanes beyond the mask are not written).
    Store {
        addr: Addr,
        src: VReg,
        mask: Option<Mask>,
    },
    /// memory = the first `lanes` lanes of src (fewer than a vector), written by plain
    /// moves of whole pieces instead of a masked store (x86: 16, 8 and 4 bytes from the
    /// low 128 bits, after moving the upper 128 bits of a 256-bit src down into its low
    /// half where lanes reach them). For targets whose masked stores are slow
    /// ([`crate::Target::masked_stores_slow`]). src is clobbered: its value is undefined
    /// afterwards.
    StorePieces { addr: Addr, src: VReg, lanes: u8 },
    /// memory = src, all lanes, bypassing the caches (x86 `vmovntps` / `vmovntpd`): a
    /// whole vector at an address aligned to its width, in C only. Such stores are weakly
    /// ordered; a program that has them ends with a store fence. The kernel's caller must
    /// pass C aligned to the vector width (see `Program::stores_streaming`); the pass that
    /// makes them ([`crate::stream_store`]) checks that every such store is then aligned.
    StoreStream { addr: Addr, src: VReg },
    /// Every lane of dst = the scalar at addr.
    Broadcast { dst: VReg, addr: Addr },
    /// Every group of `lanes` lanes of dst = the `lanes` consecutive scalars at addr (a
    /// vector of `lanes` lanes is a plain load). Lane-packed kernels (`Schedule::lane_pack`,
    /// groups of four) and packed tails (`Schedule::dot_tail`: several steps of k of B's
    /// column against as many of A's rows).
    BroadcastGroup { dst: VReg, addr: Addr, lanes: u8 },
    /// Within every group of four lanes, lane t of dst = lane `select[t]` of the same group
    /// of src (an in-register permute; lane-packed kernels).
    Permute {
        dst: VReg,
        src: VReg,
        select: [u8; 4],
    },
    /// Lane i of dst = the index `indices[i]`, for `PermuteVar` (a constant of the kernel;
    /// lanes beyond the vector's are ignored).
    Indices { dst: VReg, indices: [u8; 16] },
    /// Lane i of dst = lane `index[i]` of src, across the whole vector (lane-packed 3x3x3).
    PermuteVar { dst: VReg, index: VReg, src: VReg },
    /// Group `group` of `lanes` lanes of dst = the `lanes` consecutive scalars at addr;
    /// dst's other lanes keep their values (lane-packed kernels gather B's columns this way,
    /// four lanes a group; packed tails op(A)'s rows, as many lanes as rows).
    InsertGroup {
        dst: VReg,
        addr: Addr,
        group: u8,
        lanes: u8,
    },
    /// Lane 0 of dst = the scalar at addr (the other lanes become zero).
    LoadScalar { dst: VReg, addr: Addr },
    /// The scalar at addr = lane 0 of src.
    StoreScalar { addr: Addr, src: VReg },
    /// One level of several horizontal sums at once (dot-product tails, see
    /// `Schedule::dot_tail`): dst = lo + hi, where lo and hi are the two shuffles of a and b
    /// that [`transpose_add_shuffles`] gives for chunks of `width` lanes; `tmp` is
    /// clobbered. Folding `lanes` vectors in neighbouring pairs at widths lanes/2, lanes/4,
    /// .., 1 (each result in the first of its pair) leaves one vector whose every lane sums
    /// all lanes of one input ([`transpose_add_order`] says which). 64-byte vectors, or
    /// 32-byte ones on AVX2.
    TransposeAdd {
        dst: VReg,
        a: VReg,
        b: VReg,
        tmp: VReg,
        width: u8,
    },
    /// acc = acc + a * b, or acc - a * b when `negate` (one rounding).
    Fma {
        acc: VReg,
        a: VReg,
        b: VReg,
        negate: bool,
    },
    /// acc = acc ± a * broadcast(scalar at addr); only on targets with
    /// `fma_broadcast_operand`.
    FmaBroadcast {
        acc: VReg,
        a: VReg,
        b: Addr,
        negate: bool,
    },
    /// acc = acc ± a * (lane `lane` of b), one rounding; only on targets with
    /// `fma_by_element`.
    FmaLane {
        acc: VReg,
        a: VReg,
        b: VReg,
        lane: u8,
        negate: bool,
    },
    /// dst = a + b.
    Add { dst: VReg, a: VReg, b: VReg },
    /// dst = a - b.
    Sub { dst: VReg, a: VReg, b: VReg },
    /// dst = a * b.
    Mul { dst: VReg, a: VReg, b: VReg },
    /// Enable the first `lanes` lanes of `mask`.
    SetMask { mask: Mask, lanes: u32 },
    /// Store the run-time scalar argument `param` at addr.
    StoreParam { param: Param, addr: Addr },
    /// Store the constant scalar `value` (rounded to the program's dtype) at addr.
    StoreConst { value: f64, addr: Addr },
    /// dst = the 64-bit address stored at addr (pointer-array batches).
    LoadAddress { dst: Gpr, addr: Addr },
    /// A prefix: the next operation (arithmetic: Fma, FmaBroadcast, Add, Sub, Mul; or a Load
    /// or Store, masked or not) works on the low `bytes` of its registers only (x86: an xmm
    /// or ymm instruction in a zmm or ymm kernel): the vectors of a row block's tail, whose
    /// upper lanes hold nothing the kernel stores. Lanes of a destination above `bytes` are
    /// undefined afterwards, except that a Load reads at most `bytes` (its mask's lanes, if
    /// it has one) and clears the lanes above (lane-packed kernels gather B this way). A
    /// prefix rather than a container: tail kernels narrow every other operation, and a body
    /// per operation made compiling them a third slower. It must be followed by an operation in the same body, not by a Loop or
    /// another Narrow.
    Narrow { bytes: u32 },
    /// A hint: start bringing the cache line at addr into the core's caches (x86
    /// `prefetcht0`). No effect on any value; never faults, even past the end of the batch.
    Prefetch { addr: Addr },
    /// dst = src.
    Copy { dst: Gpr, src: Gpr },
    /// dst = dst + imm.
    AddImm { dst: Gpr, imm: i32 },
    /// Run `body` `trips` times, counting down `counter` (for `Trips::Register`, the counter
    /// holds the trip count on entry).
    Loop {
        counter: Gpr,
        trips: Trips,
        body: Vec<Op>,
    },
}

/// Where a tail mask lives, when the target keeps masks in vector registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskDecl {
    pub mask: Mask,
    pub lanes: u32,
    /// The vector register holding it (AVX2), or None for dedicated mask registers.
    pub vreg: Option<VReg>,
}

/// A lowered kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub dtype: Dtype,
    /// Lanes per vector register.
    pub lanes: usize,
    /// Run-time scalar arguments, in argument order.
    pub params: Vec<Param>,
    /// Bytes of 64-byte aligned scratch memory the kernel addresses through `Gpr::SCRATCH`.
    pub scratch_bytes: u32,
    /// Vector registers used: VReg(0) .. VReg(vregs - 1).
    pub vregs: usize,
    /// General registers used: Gpr(0) .. Gpr(gprs - 1), besides `Gpr::SCRATCH`.
    pub gprs: usize,
    pub masks: Vec<MaskDecl>,
    pub ops: Vec<Op>,
}

/// The operations of a body, each with the width of its `Narrow` prefix if it has one: the
/// prefix rule read in one place for the interpreter and the encoders. A prefix with no
/// operation after it in the body, or before a Loop or another prefix, is an `Err` holding
/// the prefix.
pub fn narrowed_ops(ops: &[Op]) -> impl Iterator<Item = Result<(Option<u32>, &Op), &Op>> {
    let mut ops = ops.iter();
    std::iter::from_fn(move || {
        let op = ops.next()?;
        let &Op::Narrow { bytes } = op else {
            return Some(Ok((None, op)));
        };
        Some(match ops.next() {
            Some(next) if !matches!(next, Op::Narrow { .. } | Op::Loop { .. }) => {
                Ok((Some(bytes), next))
            }
            _ => Err(op),
        })
    })
}

impl Program {
    /// Whether the program stores with `Op::StoreStream`: its caller must then pass C
    /// aligned to the vector width (`lanes` elements), and the program ends with a store
    /// fence.
    pub fn stores_streaming(&self) -> bool {
        fn any(ops: &[Op]) -> bool {
            ops.iter().any(|op| match op {
                Op::StoreStream { .. } => true,
                Op::Loop { body, .. } => any(body),
                _ => false,
            })
        }
        any(&self.ops)
    }

    /// Bytes of one whole vector register of the program.
    pub fn vector_bytes(&self) -> usize {
        self.lanes * self.dtype.size()
    }

    /// The vector register that holds `mask`, if masks live in vector registers.
    pub fn mask_vreg(&self, mask: Mask) -> Option<VReg> {
        self.masks
            .iter()
            .find(|d| d.mask == mask)
            .and_then(|d| d.vreg)
    }

    /// Counts of each operation kind with loops expanded by their trip counts (the batch loop
    /// counted once): what one matrix costs.
    pub fn op_counts(&self) -> OpCounts {
        fn walk(ops: &[Op], times: u64, c: &mut OpCounts) {
            for op in ops {
                match op {
                    Op::Load { .. } | Op::LoadScalar { .. } | Op::InsertGroup { .. } => {
                        c.loads += times
                    }
                    Op::Broadcast { .. } | Op::BroadcastGroup { .. } => c.broadcasts += times,
                    Op::Store { .. }
                    | Op::StorePieces { .. }
                    | Op::StoreStream { .. }
                    | Op::StoreScalar { .. } => c.stores += times,
                    Op::Fma { .. } | Op::FmaLane { .. } => c.fmas += times,
                    Op::FmaBroadcast { .. } => {
                        c.fmas += times;
                        c.broadcasts += times
                    }
                    // A prefix of the next operation, which counts itself.
                    Op::Narrow { .. } => {}
                    Op::Loop { trips, body, .. } => {
                        let n = match trips {
                            Trips::Const(n) => *n as u64,
                            Trips::Register => 1,
                            // A batch loop: one trip does `step` matrices.
                            Trips::RegisterBy(_) => 0,
                        };
                        walk(body, times * n, c)
                    }
                    _ => c.other += times,
                }
                c.static_ops += 1;
            }
        }
        let mut c = OpCounts::default();
        walk(&self.ops, 1, &mut c);
        c
    }
}

/// A shuffle of two vectors a and b (64 or 32 bytes), as x86 encodes it (the halves of an
/// [`Op::TransposeAdd`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// Whole 128-bit blocks of 64-byte vectors (vshuff32x4, vshuff64x2): blocks 0 and 1 of
    /// the result from a, 2 and 3 from b, block i the one that bits 2i..2i+1 of the
    /// immediate number.
    Blocks(u8),
    /// The 128-bit halves of 32-byte vectors (vperm2f128): half i of the result is half
    /// `s & 1` of a (s < 2) or of b (s >= 2), s = bits 4i..4i+1 of the immediate number.
    Halves(u8),
    /// Elements within each 128-bit block (vshufps, vshufpd): f32 lanes 0 and 1 of a block
    /// from a's block and 2 and 3 from b's, lane i the one bits 2i..2i+1 number; f64 lane 0
    /// from a and lane 1 from b, the element that immediate bit (lane of the vector) picks.
    Elements(u8),
}

impl Shuffle {
    /// Where lane `lane` of the result comes from: (from b, lane of that source), for
    /// elements of `elt` bytes.
    pub fn source(self, elt: usize, lane: usize) -> (bool, usize) {
        let per_block = 16 / elt;
        let (block, i) = (lane / per_block, lane % per_block);
        match self {
            Shuffle::Blocks(imm) => {
                let pick = (imm >> (2 * block)) & 3;
                (block >= 2, pick as usize * per_block + i)
            }
            Shuffle::Halves(imm) => {
                let pick = (imm >> (4 * block)) & 3;
                (pick >= 2, (pick & 1) as usize * per_block + i)
            }
            Shuffle::Elements(imm) if elt == 4 => {
                let pick = (imm >> (2 * i)) & 3;
                (i >= 2, block * 4 + pick as usize)
            }
            Shuffle::Elements(imm) => {
                let pick = (imm >> lane) & 1;
                (i == 1, block * 2 + pick as usize)
            }
        }
    }
}

/// The (lo, hi) shuffles of an [`Op::TransposeAdd`] of chunks of `width` lanes of
/// `elt`-byte elements in `vector_bytes`-byte vectors (64, or 32 on AVX2): each pairs chunk
/// 2c of a vector with chunk 2c + 1, lo taking the first of every pair and hi the second.
/// None for other widths.
pub fn transpose_add_shuffles(
    elt: usize,
    width: usize,
    vector_bytes: usize,
) -> Option<[Shuffle; 2]> {
    Some(match (vector_bytes, elt, width * elt) {
        (64, 4 | 8, 32) => [Shuffle::Blocks(0x44), Shuffle::Blocks(0xEE)],
        (64, 4 | 8, 16) => [Shuffle::Blocks(0x88), Shuffle::Blocks(0xDD)],
        (32, 4 | 8, 16) => [Shuffle::Halves(0x20), Shuffle::Halves(0x31)],
        (32 | 64, 4, 8) => [Shuffle::Elements(0x44), Shuffle::Elements(0xEE)],
        (32 | 64, 4, 4) => [Shuffle::Elements(0x88), Shuffle::Elements(0xDD)],
        (32 | 64, 8, 8) => [Shuffle::Elements(0x00), Shuffle::Elements(0xFF)],
        _ => return None,
    })
}

/// The shuffles of an [`Op::TransposeAdd`] with these operands, in a program of
/// `elt`-byte elements and `vector_bytes`-byte vectors, where it is defined: 64- or 32-byte
/// vectors, a chunk width the shuffles pair, and a temporary apart from the other
/// registers (the second shuffle reads the sources after the first wrote it). The
/// interpreter and both x86 encoders ask here.
pub fn transpose_add_operands(
    elt: usize,
    vector_bytes: usize,
    [dst, a, b, tmp]: [VReg; 4],
    width: u8,
) -> Option<[Shuffle; 2]> {
    let apart = tmp != a && tmp != b && tmp != dst;
    transpose_add_shuffles(elt, width as usize, vector_bytes).filter(|_| apart)
}

/// The input whose lanes each lane of a full [`Op::TransposeAdd`] tree sums: `lanes`
/// vectors of `elt`-byte elements folded in neighbouring pairs at widths lanes/2 .. 1.
/// Every input appears once. None unless the vectors are 64 or 32 bytes.
pub fn transpose_add_order(elt: usize, lanes: usize) -> Option<Vec<usize>> {
    grouped_transpose_add_order(elt, lanes, lanes)
}

/// The pair each lane of a tree of [`Op::TransposeAdd`] over `group` vectors sums, where
/// each vector holds `lanes / group` pairs in groups of `group` neighbouring lanes (a
/// packed tail's sums: pair = row, `group` steps of k each): `group` vectors folded in
/// neighbouring pairs at widths group/2 .. 1 leave one vector whose every lane sums the
/// `group` lanes of one pair. Pair `c * (lanes / group) + i` is vector c's pair i. Every
/// pair appears once. None unless the vectors are 64 or 32 bytes and `group` divides
/// `lanes`.
pub fn grouped_transpose_add_order(elt: usize, lanes: usize, group: usize) -> Option<Vec<usize>> {
    if !matches!(elt * lanes, 32 | 64) || group == 0 || lanes % group != 0 {
        return None;
    }
    let pairs = lanes / group;
    // Each lane of each vector: (the pair it belongs to, how many of its lanes it sums).
    let mut vectors: Vec<Vec<(usize, usize)>> = (0..group)
        .map(|c| (0..lanes).map(|l| (c * pairs + l / group, 1)).collect())
        .collect();
    let mut width = group / 2;
    while width >= 1 {
        let [lo, hi] = transpose_add_shuffles(elt, width, elt * lanes)?;
        let mut next = Vec::new();
        for pair in vectors.chunks(2) {
            let mut folded = Vec::with_capacity(lanes);
            for lane in 0..lanes {
                let pick = |s: Shuffle| {
                    let (from_b, l) = s.source(elt, lane);
                    pair[from_b as usize][l]
                };
                let ((q, n), (q_hi, n_hi)) = (pick(lo), pick(hi));
                if q != q_hi {
                    return None;
                }
                folded.push((q, n + n_hi));
            }
            next.push(folded);
        }
        vectors = next;
        width /= 2;
    }
    let order: Vec<usize> = vectors[0].iter().map(|&(q, _)| q).collect();
    let whole = vectors[0].iter().all(|&(_, n)| n == group);
    let mut seen = order.clone();
    seen.sort_unstable();
    (whole && seen.iter().copied().eq(0..lanes)).then_some(order)
}

/// Machine code of one kernel, as a backend emits it: position-independent instructions
/// followed by the constants they address (tail masks), the entry point at offset 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineCode {
    pub bytes: Vec<u8>,
    /// Bytes of instructions; the rest are constants.
    pub code_len: usize,
}

/// Dynamic operation counts per matrix (see [`Program::op_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub loads: u64,
    pub broadcasts: u64,
    pub stores: u64,
    pub fmas: u64,
    pub other: u64,
    /// Operations in the program text (loops not expanded).
    pub static_ops: u64,
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = match self.base {
            Gpr::A => "a".to_string(),
            Gpr::B => "b".to_string(),
            Gpr::C => "c".to_string(),
            Gpr::SCRATCH => "scratch".to_string(),
            Gpr(i) => format!("g{i}"),
        };
        write!(f, "[{base}{:+}]", self.offset)
    }
}

impl fmt::Display for Gpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Gpr::A => f.write_str("a"),
            Gpr::B => f.write_str("b"),
            Gpr::C => f.write_str("c"),
            Gpr::BATCH => f.write_str("batch"),
            Gpr::SCRATCH => f.write_str("scratch"),
            Gpr(i) => write!(f, "g{i}"),
        }
    }
}

impl fmt::Display for Program {
    /// A readable listing, one operation per line, loops indented.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list(ops: &[Op], depth: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let indent = "  ".repeat(depth);
            // A narrowed operation shares the line of its prefix.
            let mut narrowed = false;
            let m = |mask: &Option<Mask>| match mask {
                Some(Mask(i)) => format!(" {{m{i}}}"),
                None => String::new(),
            };
            let neg = |n: &bool| if *n { "fnma" } else { "fma" };
            for op in ops {
                let pad = if std::mem::take(&mut narrowed) {
                    ""
                } else {
                    &indent
                };
                match op {
                    Op::Zero { dst } => writeln!(f, "{pad}v{} = 0", dst.0)?,
                    Op::Load { dst, addr, mask } => {
                        writeln!(f, "{pad}v{} = load {addr}{}", dst.0, m(mask))?
                    }
                    Op::Store { addr, src, mask } => {
                        writeln!(f, "{pad}store {addr}{} = v{}", m(mask), src.0)?
                    }
                    Op::StorePieces { addr, src, lanes } => {
                        writeln!(f, "{pad}store.pieces{lanes} {addr} = v{}", src.0)?
                    }
                    Op::StoreStream { addr, src } => {
                        writeln!(f, "{pad}store.stream {addr} = v{}", src.0)?
                    }
                    Op::Broadcast { dst, addr } => {
                        writeln!(f, "{pad}v{} = broadcast {addr}", dst.0)?
                    }
                    Op::BroadcastGroup { dst, addr, lanes } => {
                        writeln!(f, "{pad}v{} = broadcast.group{lanes} {addr}", dst.0)?
                    }
                    Op::Permute { dst, src, select } => {
                        writeln!(f, "{pad}v{} = permute4 v{} {select:?}", dst.0, src.0)?
                    }
                    Op::InsertGroup {
                        dst,
                        addr,
                        group,
                        lanes,
                    } => writeln!(f, "{pad}v{}.group{lanes}[{group}] = load {addr}", dst.0)?,
                    Op::Indices { dst, indices } => {
                        writeln!(f, "{pad}v{} = indices {indices:?}", dst.0)?
                    }
                    Op::PermuteVar { dst, index, src } => {
                        writeln!(f, "{pad}v{} = v{}[v{}]", dst.0, src.0, index.0)?
                    }
                    Op::LoadScalar { dst, addr } => {
                        writeln!(f, "{pad}v{} = load.scalar {addr}", dst.0)?
                    }
                    Op::StoreScalar { addr, src } => {
                        writeln!(f, "{pad}store.scalar {addr} = v{}", src.0)?
                    }
                    Op::TransposeAdd {
                        dst,
                        a,
                        b,
                        tmp,
                        width,
                    } => writeln!(
                        f,
                        "{pad}v{} = transpose.add{width} v{} v{} (v{})",
                        dst.0, a.0, b.0, tmp.0
                    )?,
                    Op::Fma { acc, a, b, negate } => {
                        writeln!(f, "{pad}v{} {} v{} * v{}", acc.0, neg(negate), a.0, b.0)?
                    }
                    Op::FmaBroadcast { acc, a, b, negate } => writeln!(
                        f,
                        "{pad}v{} {} v{} * broadcast {b}",
                        acc.0,
                        neg(negate),
                        a.0
                    )?,
                    Op::FmaLane {
                        acc,
                        a,
                        b,
                        lane,
                        negate,
                    } => writeln!(
                        f,
                        "{pad}v{} {} v{} * v{}[{lane}]",
                        acc.0,
                        neg(negate),
                        a.0,
                        b.0
                    )?,
                    Op::Add { dst, a, b } => writeln!(f, "{pad}v{} = v{} + v{}", dst.0, a.0, b.0)?,
                    Op::Sub { dst, a, b } => writeln!(f, "{pad}v{} = v{} - v{}", dst.0, a.0, b.0)?,
                    Op::Mul { dst, a, b } => writeln!(f, "{pad}v{} = v{} * v{}", dst.0, a.0, b.0)?,
                    Op::SetMask { mask, lanes } => {
                        writeln!(f, "{pad}m{} = first {lanes} lanes", mask.0)?
                    }
                    Op::StoreParam { param, addr } => {
                        writeln!(f, "{pad}store.scalar {addr} = {param:?}")?
                    }
                    Op::StoreConst { value, addr } => {
                        writeln!(f, "{pad}store.scalar {addr} = {value}")?
                    }
                    Op::LoadAddress { dst, addr } => {
                        writeln!(f, "{pad}{dst} = load.address {addr}")?
                    }
                    Op::Prefetch { addr } => writeln!(f, "{pad}prefetch {addr}")?,
                    Op::Narrow { bytes } => {
                        write!(f, "{pad}narrow {bytes} bytes: ")?;
                        narrowed = true;
                    }
                    Op::Copy { dst, src } => writeln!(f, "{pad}{dst} = {src}")?,
                    Op::AddImm { dst, imm } => writeln!(f, "{pad}{dst} += {imm}")?,
                    Op::Loop {
                        counter,
                        trips,
                        body,
                    } => {
                        match trips {
                            Trips::Const(n) => writeln!(f, "{pad}loop {counter} = {n} {{")?,
                            Trips::Register => writeln!(f, "{pad}loop {counter} {{")?,
                            Trips::RegisterBy(step) => {
                                writeln!(f, "{pad}loop {counter} by {step} {{")?
                            }
                        }
                        list(body, depth + 1, f)?;
                        writeln!(f, "{pad}}}")?;
                    }
                }
            }
            Ok(())
        }
        list(&self.ops, 0, f)
    }
}
