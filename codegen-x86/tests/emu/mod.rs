//! A small x86-64 emulator for exactly the instructions smallgemm's x86 backend emits (the
//! forms of `src/encode.rs`), so that AVX-512 kernels run, and are checked, on machines
//! without AVX-512: neither QEMU's nor unicorn's TCG does AVX-512.
//!
//! The machine code is decoded once by iced-x86 and translated into a few operation kinds;
//! anything else — an instruction, an operand form, a prefix, a masked memory operand whose
//! fault suppression is not modelled — is an error at translation, never skipped. The
//! semantics follow the Intel SDM: 32 registers of 512 bits, every VEX/EVEX write of an
//! xmm or ymm zeroing the bits above it, 8 opmask registers with merge or zeroing masking,
//! embedded broadcasts, fused multiply-adds rounded once (`mul_add`), masked loads and stores
//! that touch only their enabled lanes, non-temporal stores that must be aligned and fenced.
//!
//! Memory is a list of regions (code, stack, each operand), each at a fake address: every
//! access must lie wholly inside one region, and writes inside a writable one. No `unsafe`.
//!
//! Not modelled: NaN payloads follow the host's arithmetic, not x86's choice of the first
//! NaN operand (the kernels never compute on NaN: C's NaNs when beta = 0 are never read);
//! MXCSR stays at its default (round to nearest, no flush to zero), as the kernels leave it.

#![allow(dead_code)]

use std::collections::BTreeMap;

use iced_x86::{
    Code, Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, Mnemonic, OpKind,
    Register, RoundingControl,
};

/// The conditions of `jcc` (iced's `ConditionCode` needs its `instr_info` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cond {
    O,
    No,
    B,
    Ae,
    E,
    Ne,
    Be,
    A,
    S,
    Ns,
    L,
    Ge,
    Le,
    G,
}

fn condition(m: Mnemonic) -> Option<Cond> {
    use Mnemonic as M;
    Some(match m {
        M::Jo => Cond::O,
        M::Jno => Cond::No,
        M::Jb => Cond::B,
        M::Jae => Cond::Ae,
        M::Je => Cond::E,
        M::Jne => Cond::Ne,
        M::Jbe => Cond::Be,
        M::Ja => Cond::A,
        M::Js => Cond::S,
        M::Jns => Cond::Ns,
        M::Jl => Cond::L,
        M::Jge => Cond::Ge,
        M::Jle => Cond::Le,
        M::Jg => Cond::G,
        _ => return None,
    })
}

/// The number of a general (0 = rax … 15 = r15), vector (0–31) or opmask register, and its
/// size in bytes (derived here: iced's `Register::number` needs `instr_info`).
fn number(r: Register) -> Option<(u8, u8)> {
    let from = |first: Register, size: u8| Some(((r as u32 - first as u32) as u8, size));
    if r.is_gpr64() {
        from(Register::RAX, 8)
    } else if r.is_gpr32() {
        from(Register::EAX, 4)
    } else if r.is_xmm() {
        from(Register::XMM0, 16)
    } else if r.is_ymm() {
        from(Register::YMM0, 32)
    } else if r.is_zmm() {
        from(Register::ZMM0, 64)
    } else if r.is_k() {
        from(Register::K0, 8)
    } else {
        None
    }
}

/// A piece of the address space: `bytes` at `base`.
#[derive(Clone, Debug)]
pub struct Region {
    pub name: &'static str,
    pub base: u64,
    pub bytes: Vec<u8>,
    pub writable: bool,
}

impl Region {
    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }
}

/// The address space: every access is checked against the regions.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    pub regions: Vec<Region>,
    /// The region of the last access, tried first (accesses come in runs).
    last: std::cell::Cell<usize>,
}

impl Memory {
    pub fn new(regions: Vec<Region>) -> Memory {
        Memory {
            regions,
            last: Default::default(),
        }
    }

    pub fn region(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// The region and offset of `len` bytes at `addr`, or why there are none. (Plain
    /// loops: the tests' opt-level 1 leaves iterator adapters slow, and this runs for every
    /// access.)
    fn locate(&self, addr: u64, len: usize, write: bool) -> Result<(usize, usize), String> {
        // (No sums that a wild address could overflow.)
        let inside = |r: &Region| {
            let size = r.bytes.len() as u64;
            addr >= r.base && addr - r.base <= size && size - (addr - r.base) >= len as u64
        };
        let mut i = self.last.get();
        if i >= self.regions.len() || !inside(&self.regions[i]) {
            i = 0;
            while i < self.regions.len() && !inside(&self.regions[i]) {
                i += 1;
            }
        }
        let Some(r) = self.regions.get(i) else {
            return Err(self.outside(addr, len, write));
        };
        if write && !r.writable {
            return Err(format!("a {len}-byte write to read-only {}", r.name));
        }
        self.last.set(i);
        Ok((i, (addr - r.base) as usize))
    }

    /// Why `len` bytes at `addr` are in no region.
    fn outside(&self, addr: u64, len: usize, write: bool) -> String {
        let what = if write { "write" } else { "read" };
        let end = addr.wrapping_add(len as u64);
        // Name the nearest region, and how far outside it the access reaches.
        let nearest = self
            .regions
            .iter()
            .map(|r| {
                let distance = if end <= r.base {
                    r.base - end
                } else {
                    addr.saturating_sub(r.end())
                };
                (distance, r)
            })
            .min_by_key(|&(d, _)| d);
        match nearest {
            Some((_, r)) if addr < r.base => format!(
                "a {len}-byte {what} at {addr:#x} starts {} bytes before {} ({:#x}..{:#x})",
                r.base - addr,
                r.name,
                r.base,
                r.end()
            ),
            Some((_, r)) => format!(
                "a {len}-byte {what} at {addr:#x} ends {} bytes past the end of {} ({:#x}..{:#x})",
                end - r.end(),
                r.name,
                r.base,
                r.end()
            ),
            None => format!("a {len}-byte {what} at {addr:#x}: no memory"),
        }
    }

    /// `len` bytes (a multiple of 4, at most 64) at `addr` into the low part of `out`, the
    /// rest zero.
    fn load(&self, addr: u64, len: usize, out: &mut Zmm) -> Result<(), String> {
        let (i, at) = self.locate(addr, len, false)?;
        let bytes = &self.regions[i].bytes[at..at + len];
        *out = [0; 8];
        let mut q = 0;
        while 8 * q + 8 <= len {
            let b = &bytes[8 * q..8 * q + 8];
            out[q] = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            q += 1;
        }
        if 8 * q < len {
            let b = &bytes[8 * q..8 * q + 4];
            out[q] = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
        }
        Ok(())
    }

    pub fn read(&self, addr: u64, len: usize) -> Result<&[u8], String> {
        let (i, at) = self.locate(addr, len, false)?;
        Ok(&self.regions[i].bytes[at..at + len])
    }

    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        let (i, at) = self.locate(addr, data.len(), true)?;
        self.regions[i].bytes[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// [`Memory::load`] by value, for the accesses that are not hot.
    fn zmm(&self, addr: u64, len: usize) -> Result<Zmm, String> {
        let mut out = [0; 8];
        self.load(addr, len, &mut out)?;
        Ok(out)
    }

    fn read_u64(&self, addr: u64) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.read(addr, 8)?.try_into().unwrap()))
    }

    fn read_u32(&self, addr: u64) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.read(addr, 4)?.try_into().unwrap()))
    }
}

/// A 512-bit register as eight little-endian quadwords.
pub type Zmm = [u64; 8];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    pub cf: bool,
    pub zf: bool,
    pub sf: bool,
    pub of: bool,
}

/// The architectural state the kernels use.
#[derive(Clone, Debug, Default)]
pub struct Cpu {
    /// rax … r15 in encoding order.
    pub gpr: [u64; 16],
    pub zmm: [Zmm; 32],
    pub k: [u64; 8],
    pub flags: Flags,
}

pub const RSP: usize = 4;

/// 32-bit lane `i` of `v`.
#[inline(always)]
fn get32(v: &Zmm, i: usize) -> u32 {
    (v[i / 2] >> (32 * (i % 2))) as u32
}

#[inline(always)]
fn set32(v: &mut Zmm, i: usize, x: u32) {
    let shift = 32 * (i % 2);
    v[i / 2] = (v[i / 2] & !(0xFFFF_FFFF << shift)) | (x as u64) << shift;
}

/// Lane `i` of `elt` bytes (4 or 8).
#[inline(always)]
fn lane(v: &Zmm, elt: usize, i: usize) -> u64 {
    if elt == 8 {
        v[i]
    } else {
        get32(v, i) as u64
    }
}

#[inline(always)]
fn set_lane(v: &mut Zmm, elt: usize, i: usize, x: u64) {
    if elt == 8 {
        v[i] = x
    } else {
        set32(v, i, x as u32)
    }
}

fn from_zmm(v: &Zmm, len: usize) -> Vec<u8> {
    v.iter().flat_map(|q| q.to_le_bytes()).take(len).collect()
}

/// `[base + disp]`, or an absolute address (RIP-relative operands, resolved at decoding).
#[derive(Clone, Copy, Debug)]
struct Mem {
    base: Option<u8>,
    disp: u64,
}

/// A vector operand.
#[derive(Clone, Copy, Debug)]
enum Loc {
    Reg(u8),
    Gpr32(u8),
    Mem(Mem),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alu {
    Add,
    Sub,
    And,
}

/// What a vector instruction does; the operands are in [`V`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// dst = src2: loads, stores, register moves (vmovupd/ps, vmovdqu).
    Move,
    /// A non-temporal store (vmovntpd/ps): a plain store, aligned to its width.
    StoreNt,
    /// vmaskmovpd/ps: src1 holds the mask (the sign bit of each lane).
    MaskMove,
    /// Every lane = lane 0 of src2 (vbroadcastss/sd, vmovddup xmm).
    Broadcast,
    /// Every `n`-byte block = the block at src2 (vbroadcastf128/f32x4/f64x4).
    BroadcastBlock(u8),
    /// dst = src1 with block `imm` of `n` bytes = src2 (vinsertf128/f32x4/f64x4).
    Insert(u8),
    /// dst = the `n`-byte block `imm` of src2 (vextractf128/f32x4/f64x4).
    Extract(u8),
    /// dst = 32-bit lane `imm` of src2 (vextractps).
    ExtractPs,
    Fma {
        negate: bool,
    },
    Add,
    Sub,
    Mul,
    Xor,
    /// vmovss/vmovsd: load (upper lanes zeroed), store, or the register merge form.
    ScalarMove,
    /// vpermilps imm8: four dwords within each 128-bit block.
    PermInLane,
    /// vpermpd imm8: four qwords within each 256-bit block.
    PermPdImm,
    /// vpermps/vpermpd by the index vector src1 over the table src2.
    PermVar,
    /// vpmovzxbd/vpmovzxbq: bytes zero-extended into lanes.
    ZeroExtendBytes,
    /// vshuff32x4/vshuff64x2: 128-bit blocks of src1 (low half) and src2 (high half).
    ShufBlocks,
    /// vperm2f128: each 128-bit half any half of src1 or src2 (or zero).
    Perm2f128,
    Shufps,
    Shufpd,
}

/// A decoded vector instruction.
#[derive(Clone, Copy, Debug)]
struct V {
    kind: Kind,
    dst: Loc,
    src1: u8,
    src2: Loc,
    imm: u8,
    /// The operation's vector length in bytes (16, 32, 64).
    bytes: u8,
    /// Element size in bytes: the masking granularity.
    elt: u8,
    /// Opmask register, 0 for none.
    mask: u8,
    zeroing: bool,
    broadcast: bool,
}

#[derive(Clone, Copy, Debug)]
enum Inst {
    Push(u8),
    Pop(u8),
    MovRR(u8, u8),
    /// A 4- or 8-byte load into a general register (zero-extended).
    Load {
        dst: u8,
        mem: Mem,
        bytes: u8,
    },
    Store {
        mem: Mem,
        src: u8,
        bytes: u8,
    },
    /// `mov r32, imm32`: zero-extended.
    MovImm {
        dst: u8,
        imm: u64,
    },
    StoreImm32 {
        mem: Mem,
        imm: u32,
    },
    AluImm {
        op: Alu,
        dst: u8,
        imm: u64,
    },
    Test(u8, u8),
    Dec(u8),
    Jcc {
        cond: Cond,
        target: usize,
    },
    Jmp(usize),
    Ret,
    /// A hint: no access, no fault.
    Prefetch,
    Sfence,
    Vzeroupper,
    Kmovw {
        k: u8,
        src: u8,
    },
    Vector(V),
}

/// Decoded machine code, ready to run.
pub struct Machine {
    base: u64,
    insts: Vec<Inst>,
    /// The decoded instructions, for messages.
    decoded: Vec<Instruction>,
    /// Index into `insts` of the instruction at each byte offset (u32::MAX: none starts there).
    index: Vec<u32>,
    /// A short name of each instruction's form, for coverage.
    forms: Vec<String>,
}

/// What a run executed.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub steps: u64,
    /// Instruction forms executed ("vfmadd231pd zmm {1to8}", "vmovupd store zmm {k}", …),
    /// with how often.
    pub forms: BTreeMap<String, u64>,
}

fn text(i: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(i, &mut out);
    out
}

fn gpr(r: Register) -> Result<u8, String> {
    if r.is_gpr64() || r.is_gpr32() {
        Ok(number(r).unwrap().0)
    } else {
        Err(format!("{r:?} is not a general register"))
    }
}

fn mem(i: &Instruction) -> Result<Mem, String> {
    if i.memory_index() != Register::None {
        return Err("index registers are not modelled".into());
    }
    if i.segment_prefix() != Register::None {
        return Err("segment prefixes are not modelled".into());
    }
    match i.memory_base() {
        // iced resolves RIP-relative displacements to the absolute address.
        Register::RIP => Ok(Mem {
            base: None,
            disp: i.memory_displacement64(),
        }),
        r if r.is_gpr64() => Ok(Mem {
            base: Some(number(r).unwrap().0),
            disp: i.memory_displacement64(),
        }),
        r => Err(format!("a memory operand based on {r:?}")),
    }
}

fn vloc(i: &Instruction, n: u32) -> Result<Loc, String> {
    match i.op_kind(n) {
        OpKind::Register => {
            let r = i.op_register(n);
            if r.is_xmm() || r.is_ymm() || r.is_zmm() {
                Ok(Loc::Reg(number(r).unwrap().0))
            } else if r.is_gpr32() {
                Ok(Loc::Gpr32(number(r).unwrap().0))
            } else {
                Err(format!("operand {n} is {r:?}"))
            }
        }
        OpKind::Memory => Ok(Loc::Mem(mem(i)?)),
        k => Err(format!("operand {n} is {k:?}")),
    }
}

/// Kind and element size of a vector mnemonic.
fn classify(i: &Instruction) -> Option<(Kind, u8)> {
    use Mnemonic as M;
    let imm_last = i.op_kind(i.op_count() - 1) == OpKind::Immediate8;
    Some(match i.mnemonic() {
        M::Vmovupd | M::Vmovdqu => (Kind::Move, 8),
        M::Vmovups => (Kind::Move, 4),
        M::Vmovntpd => (Kind::StoreNt, 8),
        M::Vmovntps => (Kind::StoreNt, 4),
        M::Vmaskmovpd => (Kind::MaskMove, 8),
        M::Vmaskmovps => (Kind::MaskMove, 4),
        M::Vbroadcastsd => (Kind::Broadcast, 8),
        M::Vbroadcastss => (Kind::Broadcast, 4),
        // Only the xmm form duplicates one element; wider ones duplicate even lanes.
        M::Vmovddup if i.op_register(0).is_xmm() => (Kind::Broadcast, 8),
        M::Vbroadcastf128 => (Kind::BroadcastBlock(16), 8),
        M::Vbroadcastf32x4 => (Kind::BroadcastBlock(16), 4),
        M::Vbroadcastf64x4 => (Kind::BroadcastBlock(32), 8),
        M::Vbroadcastf64x2 => (Kind::BroadcastBlock(16), 8),
        M::Vbroadcastf32x8 => (Kind::BroadcastBlock(32), 4),
        M::Vinsertf128 => (Kind::Insert(16), 8),
        M::Vinsertf32x4 => (Kind::Insert(16), 4),
        M::Vinsertf64x4 => (Kind::Insert(32), 8),
        M::Vinsertf32x8 => (Kind::Insert(32), 4),
        M::Vinsertf64x2 => (Kind::Insert(16), 8),
        M::Vextractf128 => (Kind::Extract(16), 8),
        M::Vextractf32x4 => (Kind::Extract(16), 4),
        M::Vextractf64x4 => (Kind::Extract(32), 8),
        M::Vextractps => (Kind::ExtractPs, 4),
        M::Vfmadd231pd => (Kind::Fma { negate: false }, 8),
        M::Vfmadd231ps => (Kind::Fma { negate: false }, 4),
        M::Vfnmadd231pd => (Kind::Fma { negate: true }, 8),
        M::Vfnmadd231ps => (Kind::Fma { negate: true }, 4),
        M::Vaddpd => (Kind::Add, 8),
        M::Vaddps => (Kind::Add, 4),
        M::Vsubpd => (Kind::Sub, 8),
        M::Vsubps => (Kind::Sub, 4),
        M::Vmulpd => (Kind::Mul, 8),
        M::Vmulps => (Kind::Mul, 4),
        M::Vxorps | M::Vpxord => (Kind::Xor, 4),
        M::Vmovsd => (Kind::ScalarMove, 8),
        M::Vmovss => (Kind::ScalarMove, 4),
        // The immediate forms; vpermilps by a vector of indices is another instruction.
        M::Vpermilps if imm_last => (Kind::PermInLane, 4),
        M::Vpermpd if imm_last => (Kind::PermPdImm, 8),
        M::Vpermpd => (Kind::PermVar, 8),
        M::Vpermps => (Kind::PermVar, 4),
        M::Vpmovzxbd => (Kind::ZeroExtendBytes, 4),
        M::Vpmovzxbq => (Kind::ZeroExtendBytes, 8),
        M::Vshuff32x4 => (Kind::ShufBlocks, 4),
        M::Vshuff64x2 => (Kind::ShufBlocks, 8),
        M::Vperm2f128 => (Kind::Perm2f128, 8),
        M::Vshufps => (Kind::Shufps, 4),
        M::Vshufpd => (Kind::Shufpd, 8),
        _ => return None,
    })
}

fn reg_bytes(i: &Instruction, n: u32) -> Option<u8> {
    match i.op_kind(n) {
        OpKind::Register => number(i.op_register(n)).map(|(_, size)| size),
        _ => None,
    }
}

/// Translates one vector instruction.
fn vector(i: &Instruction) -> Result<(V, String), String> {
    let (kind, elt) = classify(i).ok_or("not an instruction the backend emits")?;
    // Only VEX and EVEX forms zero the bits above their destination (iced's
    // `Code::encoding` needs `instr_info`; its names say it too).
    let name = format!("{:?}", i.code());
    if !name.starts_with("VEX_") && !name.starts_with("EVEX_") {
        return Err("a legacy SSE form".into());
    }
    if i.suppress_all_exceptions() || i.rounding_control() != RoundingControl::None {
        return Err("embedded rounding is not modelled".into());
    }
    let mut locs = Vec::new();
    let mut imm = None;
    for n in 0..i.op_count() {
        match i.op_kind(n) {
            OpKind::Immediate8 => imm = Some(i.immediate8()),
            _ => locs.push((vloc(i, n)?, reg_bytes(i, n))),
        }
    }
    let mask = match i.op_mask() {
        Register::None => 0,
        k => number(k).ok_or("a mask that is not an opmask register")?.0,
    };
    let (zeroing, broadcast) = (i.zeroing_masking(), i.is_broadcast());
    let needs_imm = matches!(
        kind,
        Kind::Insert(_)
            | Kind::Extract(_)
            | Kind::ExtractPs
            | Kind::PermInLane
            | Kind::PermPdImm
            | Kind::ShufBlocks
            | Kind::Perm2f128
            | Kind::Shufps
            | Kind::Shufpd
    );
    if needs_imm != imm.is_some() {
        return Err("unexpected immediate operand".into());
    }
    // Operands: dst, [src1 (a register)], src2.
    let (dst, src1, src2) = match *locs.as_slice() {
        [(d, _), (s, _)] => (d, None, s),
        [(d, _), (Loc::Reg(s1), _), (s, _)] => (d, Some(s1), s),
        _ => return Err("unexpected operands".into()),
    };
    let three = matches!(
        kind,
        Kind::MaskMove
            | Kind::Insert(_)
            | Kind::Fma { .. }
            | Kind::Add
            | Kind::Sub
            | Kind::Mul
            | Kind::Xor
            | Kind::PermVar
            | Kind::ShufBlocks
            | Kind::Perm2f128
            | Kind::Shufps
            | Kind::Shufpd
    );
    // The scalar moves have both forms: memory, and the three-register merge.
    if kind != Kind::ScalarMove && three != src1.is_some() {
        return Err("unexpected number of operands".into());
    }
    if kind == Kind::ScalarMove
        && src1.is_some() != (matches!(dst, Loc::Reg(_)) && matches!(src2, Loc::Reg(_)))
    {
        return Err("unexpected scalar move form".into());
    }
    // Which operand may be memory: the destination of a store form, else src2.
    let store = matches!(dst, Loc::Mem(_));
    if store
        && !matches!(
            kind,
            Kind::Move
                | Kind::StoreNt
                | Kind::MaskMove
                | Kind::ScalarMove
                | Kind::Extract(_)
                | Kind::ExtractPs
        )
    {
        return Err("a memory destination".into());
    }
    if store && !matches!(src2, Loc::Reg(_)) {
        return Err("a store from memory".into());
    }
    if kind == Kind::StoreNt && !store {
        return Err("a non-temporal load".into());
    }
    if matches!(kind, Kind::BroadcastBlock(_)) && !matches!(src2, Loc::Mem(_)) {
        return Err("a block broadcast from a register".into());
    }
    if matches!(dst, Loc::Gpr32(_)) != (kind == Kind::ExtractPs && !store) {
        return Err("a general register operand".into());
    }
    if matches!(src2, Loc::Gpr32(_)) {
        return Err("a general register source".into());
    }
    // The vector length: the destination register's, or the source's for stores and
    // extracts (whose destination is narrower).
    let bytes = match kind {
        Kind::Extract(_) => locs[1].1,
        Kind::ExtractPs => Some(16),
        _ if store => locs.last().unwrap().1,
        _ => locs[0].1,
    }
    .ok_or("no register gives the vector length")?;
    if let Kind::Extract(n) = kind {
        // vextractf128 from a ymm; vextractf32x4 from a ymm or zmm; vextractf64x4 from a zmm.
        if bytes <= n || (n == 16 && elt == 8 && bytes != 32) {
            return Err("an extract from a vector no wider than its block".into());
        }
    }
    let v = V {
        kind,
        dst,
        src1: src1.unwrap_or(0),
        src2,
        imm: imm.unwrap_or(0),
        bytes,
        elt,
        mask,
        zeroing,
        broadcast,
    };
    if zeroing && (mask == 0 || store) {
        return Err("zeroing without a mask, or of a store".into());
    }
    if let Loc::Mem(_) = if store { dst } else { src2 } {
        // The access size as this model sees it must be iced's (a check of the model).
        let expected = match kind {
            _ if broadcast => elt as usize,
            Kind::Broadcast | Kind::ScalarMove => elt as usize,
            Kind::BroadcastBlock(n) | Kind::Insert(n) => n as usize,
            Kind::Extract(n) => n as usize,
            Kind::ExtractPs => 4,
            Kind::ZeroExtendBytes => (bytes / elt) as usize,
            _ => bytes as usize,
        };
        if i.memory_size().size() != expected {
            return Err(format!(
                "the model reads {expected} bytes, iced says {:?}",
                i.memory_size()
            ));
        }
        if broadcast
            && !matches!(
                kind,
                Kind::Fma { .. } | Kind::Add | Kind::Sub | Kind::Mul | Kind::Xor
            )
        {
            return Err("an embedded broadcast of this instruction".into());
        }
        // Fault suppression is modelled where lanes of memory are lanes of the result.
        if mask != 0
            && !matches!(
                kind,
                Kind::Move
                    | Kind::ScalarMove
                    | Kind::Fma { .. }
                    | Kind::Add
                    | Kind::Sub
                    | Kind::Mul
                    | Kind::Xor
            )
        {
            return Err("a masked memory operand of this instruction".into());
        }
    } else if broadcast {
        return Err("a broadcast without memory".into());
    }
    let width = match bytes {
        16 => "xmm",
        32 => "ymm",
        _ => "zmm",
    };
    let mut form = format!("{:?}", i.mnemonic()).to_lowercase();
    form += if store { " store " } else { " " };
    form += width;
    if mask != 0 {
        form += if zeroing { " {k}{z}" } else { " {k}" };
    }
    if broadcast {
        form += " {1toN}";
    }
    Ok((v, form))
}

impl Machine {
    /// Decodes `code[..code_len]` (constants may follow) as loaded at `base`.
    pub fn new(code: &[u8], code_len: usize, base: u64) -> Result<Machine, String> {
        let mut decoder = Decoder::with_ip(64, &code[..code_len], base, DecoderOptions::NONE);
        let mut decoded = Vec::new();
        let mut index = vec![u32::MAX; code_len];
        while decoder.can_decode() {
            let i = decoder.decode();
            let at = (i.ip() - base) as usize;
            if i.code() == Code::INVALID {
                return Err(format!("invalid instruction at +{at:#x}"));
            }
            index[at] = decoded.len() as u32;
            decoded.push(i);
        }
        let target = |i: &Instruction| -> Result<usize, String> {
            let to = i.near_branch_target().wrapping_sub(base);
            match index.get(to as usize) {
                Some(&n) if n != u32::MAX => Ok(n as usize),
                _ => Err(format!("a branch to +{to:#x}, not an instruction")),
            }
        };
        let mut insts = Vec::with_capacity(decoded.len());
        let mut forms = Vec::with_capacity(decoded.len());
        for i in &decoded {
            let translated = Machine::translate(i, &target).and_then(|inst| {
                if i.has_lock_prefix() || i.has_rep_prefix() || i.has_repne_prefix() {
                    return Err("a lock or rep prefix".into());
                }
                Ok(inst)
            });
            let (inst, form) = translated.map_err(|e| {
                format!("+{:#x} `{}` ({:?}): {e}", i.ip() - base, text(i), i.code())
            })?;
            insts.push(inst);
            forms.push(form);
        }
        Ok(Machine {
            base,
            insts,
            decoded,
            index,
            forms,
        })
    }

    fn translate(
        i: &Instruction,
        target: &dyn Fn(&Instruction) -> Result<usize, String>,
    ) -> Result<(Inst, String), String> {
        let reg = |n: u32| -> Result<u8, String> {
            match i.op_kind(n) {
                OpKind::Register => gpr(i.op_register(n)),
                k => Err(format!("operand {n} is {k:?}, not a register")),
            }
        };
        let is_mem = |n: u32| i.op_kind(n) == OpKind::Memory;
        let plain = format!("{:?}", i.mnemonic()).to_lowercase();
        let inst = match i.code() {
            Code::Push_r64 => Inst::Push(reg(0)?),
            Code::Pop_r64 => Inst::Pop(reg(0)?),
            Code::Mov_r64_rm64 | Code::Mov_rm64_r64 | Code::Mov_r32_rm32 | Code::Mov_rm32_r32 => {
                let r = i.op_register(if is_mem(0) { 1 } else { 0 });
                let bytes = number(r).ok_or("not a general register")?.1;
                match (is_mem(0), is_mem(1)) {
                    (false, false) if bytes == 8 => Inst::MovRR(reg(0)?, reg(1)?),
                    (false, true) => Inst::Load {
                        dst: reg(0)?,
                        mem: mem(i)?,
                        bytes,
                    },
                    (true, false) => Inst::Store {
                        mem: mem(i)?,
                        src: reg(1)?,
                        bytes,
                    },
                    _ => return Err("a 32-bit register move".into()),
                }
            }
            Code::Mov_r32_imm32 => Inst::MovImm {
                dst: reg(0)?,
                imm: i.immediate32() as u64,
            },
            Code::Mov_rm32_imm32 if is_mem(0) => Inst::StoreImm32 {
                mem: mem(i)?,
                imm: i.immediate32(),
            },
            Code::Add_rm64_imm8
            | Code::Add_rm64_imm32
            | Code::Sub_rm64_imm8
            | Code::Sub_rm64_imm32
            | Code::And_rm64_imm8
            | Code::And_rm64_imm32 => Inst::AluImm {
                op: match i.mnemonic() {
                    Mnemonic::Add => Alu::Add,
                    Mnemonic::Sub => Alu::Sub,
                    _ => Alu::And,
                },
                dst: reg(0)?,
                // Sign-extended to 64 bits by iced.
                imm: i.immediate(1),
            },
            Code::Test_rm64_r64 => Inst::Test(reg(0)?, reg(1)?),
            Code::Dec_rm64 => Inst::Dec(reg(0)?),
            _ if condition(i.mnemonic()).is_some() => Inst::Jcc {
                cond: condition(i.mnemonic()).unwrap(),
                target: target(i)?,
            },
            Code::Jmp_rel8_64 | Code::Jmp_rel32_64 => Inst::Jmp(target(i)?),
            Code::Retnq => Inst::Ret,
            Code::Prefetcht0_m8 => {
                mem(i)?;
                Inst::Prefetch
            }
            Code::Sfence => Inst::Sfence,
            Code::VEX_Vzeroupper => Inst::Vzeroupper,
            Code::VEX_Kmovw_kr_r32 => Inst::Kmovw {
                k: number(i.op_register(0)).ok_or("not an opmask register")?.0,
                src: reg(1)?,
            },
            _ => {
                let (v, form) = vector(i)?;
                return Ok((Inst::Vector(v), form));
            }
        };
        Ok((inst, plain))
    }

    /// The listing of instruction `n`, for messages.
    fn describe(&self, n: usize) -> String {
        let i = &self.decoded[n];
        format!("+{:#x} `{}`", i.ip() - self.base, text(i))
    }

    /// Runs from the first instruction until a `ret` to `return_to`, at most `limit`
    /// instructions.
    pub fn run(
        &self,
        cpu: &mut Cpu,
        memory: &mut Memory,
        return_to: u64,
        limit: u64,
    ) -> Result<Trace, String> {
        let mut counts = vec![0u64; self.insts.len()];
        let mut exec = Exec {
            cpu,
            memory,
            unfenced: false,
        };
        let mut pc = 0;
        let mut steps = 0u64;
        loop {
            let Some(inst) = self.insts.get(pc) else {
                return Err("ran past the end of the code".into());
            };
            steps += 1;
            if steps > limit {
                return Err(format!("no return within {limit} instructions"));
            }
            counts[pc] += 1;
            let step = exec
                .step(inst)
                .map_err(|e| format!("{}: {e}", self.describe(pc)))?;
            pc = match step {
                Next::Fall => pc + 1,
                Next::Jump(to) => to,
                Next::Return(addr) if addr == return_to => break,
                // Kernels call nothing: any other return address is a corrupted stack.
                Next::Return(addr) => {
                    return Err(format!(
                        "{}: return to {addr:#x}, not to the caller",
                        self.describe(pc)
                    ))
                }
            };
        }
        if exec.unfenced {
            return Err("non-temporal stores not followed by sfence before returning".into());
        }
        let mut forms = BTreeMap::new();
        for (n, &count) in counts.iter().enumerate() {
            if count > 0 {
                *forms.entry(self.forms[n].clone()).or_insert(0) += count;
            }
        }
        Ok(Trace { steps, forms })
    }
}

enum Next {
    Fall,
    Jump(usize),
    Return(u64),
}

struct Exec<'a> {
    cpu: &'a mut Cpu,
    memory: &'a mut Memory,
    /// Non-temporal stores since the last sfence.
    unfenced: bool,
}

impl Exec<'_> {
    fn addr(&self, m: Mem) -> u64 {
        m.base
            .map_or(0, |b| self.cpu.gpr[b as usize])
            .wrapping_add(m.disp)
    }

    fn push(&mut self, x: u64) -> Result<(), String> {
        let sp = self.cpu.gpr[RSP].wrapping_sub(8);
        self.memory.write(sp, &x.to_le_bytes())?;
        self.cpu.gpr[RSP] = sp;
        Ok(())
    }

    fn pop(&mut self) -> Result<u64, String> {
        let sp = self.cpu.gpr[RSP];
        let x = self.memory.read_u64(sp)?;
        self.cpu.gpr[RSP] = sp.wrapping_add(8);
        Ok(x)
    }

    fn set_logic_flags(&mut self, r: u64) {
        self.cpu.flags = Flags {
            cf: false,
            of: false,
            zf: r == 0,
            sf: (r as i64) < 0,
        };
    }

    fn condition(&self, cond: Cond) -> bool {
        let f = self.cpu.flags;
        match cond {
            Cond::O => f.of,
            Cond::No => !f.of,
            Cond::B => f.cf,
            Cond::Ae => !f.cf,
            Cond::E => f.zf,
            Cond::Ne => !f.zf,
            Cond::Be => f.cf || f.zf,
            Cond::A => !f.cf && !f.zf,
            Cond::S => f.sf,
            Cond::Ns => !f.sf,
            Cond::L => f.sf != f.of,
            Cond::Ge => f.sf == f.of,
            Cond::Le => f.zf || f.sf != f.of,
            Cond::G => !f.zf && f.sf == f.of,
        }
    }

    fn step(&mut self, inst: &Inst) -> Result<Next, String> {
        let g = &mut self.cpu.gpr;
        match *inst {
            Inst::Push(r) => {
                let x = g[r as usize];
                self.push(x)?
            }
            Inst::Pop(r) => {
                let x = self.pop()?;
                self.cpu.gpr[r as usize] = x;
            }
            Inst::MovRR(d, s) => g[d as usize] = g[s as usize],
            Inst::Load { dst, mem, bytes } => {
                let at = self.addr(mem);
                let x = match bytes {
                    8 => self.memory.read_u64(at)?,
                    _ => self.memory.read_u32(at)? as u64,
                };
                self.cpu.gpr[dst as usize] = x;
            }
            Inst::Store { mem, src, bytes } => {
                let at = self.addr(mem);
                let x = self.cpu.gpr[src as usize].to_le_bytes();
                self.memory.write(at, &x[..bytes as usize])?;
            }
            Inst::MovImm { dst, imm } => g[dst as usize] = imm,
            Inst::StoreImm32 { mem, imm } => {
                let at = self.addr(mem);
                self.memory.write(at, &imm.to_le_bytes())?;
            }
            Inst::AluImm { op, dst, imm } => {
                let a = g[dst as usize];
                let r = match op {
                    Alu::Add => {
                        let r = a.wrapping_add(imm);
                        self.cpu.flags = Flags {
                            cf: r < a,
                            zf: r == 0,
                            sf: (r as i64) < 0,
                            of: ((a ^ r) & (imm ^ r)) >> 63 == 1,
                        };
                        r
                    }
                    Alu::Sub => {
                        let r = a.wrapping_sub(imm);
                        self.cpu.flags = Flags {
                            cf: a < imm,
                            zf: r == 0,
                            sf: (r as i64) < 0,
                            of: ((a ^ imm) & (a ^ r)) >> 63 == 1,
                        };
                        r
                    }
                    Alu::And => {
                        let r = a & imm;
                        self.set_logic_flags(r);
                        r
                    }
                };
                self.cpu.gpr[dst as usize] = r;
            }
            Inst::Test(a, b) => {
                let r = g[a as usize] & g[b as usize];
                self.set_logic_flags(r);
            }
            Inst::Dec(r) => {
                let a = g[r as usize];
                let x = a.wrapping_sub(1);
                g[r as usize] = x;
                // dec leaves CF as it was.
                let cf = self.cpu.flags.cf;
                self.cpu.flags = Flags {
                    cf,
                    zf: x == 0,
                    sf: (x as i64) < 0,
                    of: a == 1 << 63,
                };
            }
            Inst::Jcc { cond, target } => {
                if self.condition(cond) {
                    return Ok(Next::Jump(target));
                }
            }
            Inst::Jmp(target) => return Ok(Next::Jump(target)),
            Inst::Ret => return Ok(Next::Return(self.pop()?)),
            Inst::Prefetch => {}
            Inst::Sfence => self.unfenced = false,
            Inst::Vzeroupper => {
                for z in &mut self.cpu.zmm[..16] {
                    z[2..].fill(0);
                }
            }
            Inst::Kmovw { k, src } => self.cpu.k[k as usize] = g[src as usize] & 0xFFFF,
            Inst::Vector(ref v) => self.vector(v)?,
        }
        Ok(Next::Fall)
    }

    /// The lanes of a `bytes`-byte vector of `elt`-byte lanes that `v`'s mask enables.
    fn enabled(&self, v: &V) -> u64 {
        let lanes = (v.bytes / v.elt) as u32;
        let all = if lanes == 64 { !0 } else { (1u64 << lanes) - 1 };
        match v.mask {
            0 => all,
            k => self.cpu.k[k as usize] & all,
        }
    }

    /// A source operand of `v.bytes` bytes into `out` (zero above them); from memory only
    /// the enabled lanes are read (EVEX fault suppression), one element under a broadcast.
    /// (An out-parameter: returning 64 bytes through a Result cost a third of the time.)
    fn source(&self, v: &V, loc: Loc, out: &mut Zmm) -> Result<(), String> {
        let m = match loc {
            Loc::Reg(r) => {
                *out = self.cpu.zmm[r as usize];
                return Ok(());
            }
            Loc::Mem(m) => m,
            Loc::Gpr32(_) => unreachable!("refused at translation"),
        };
        let (at, elt, lanes) = (self.addr(m), v.elt as usize, (v.bytes / v.elt) as usize);
        *out = [0; 8];
        if v.broadcast {
            if self.enabled(v) != 0 {
                self.memory.load(at, elt, out)?;
                let x = out[0];
                // The element in every lane: 8 bytes a quadword, or 4 twice.
                let q = if elt == 8 { x } else { x | x << 32 };
                out[..v.bytes as usize / 8].fill(q);
            }
            return Ok(());
        }
        if v.mask == 0 {
            return self.memory.load(at, v.bytes as usize, out);
        }
        let enabled = self.enabled(v);
        for i in (0..lanes).filter(|&i| enabled >> i & 1 == 1) {
            let x = self.memory.zmm(at + (i * elt) as u64, elt)?;
            set_lane(out, elt, i, lane(&x, elt, 0));
        }
        Ok(())
    }

    /// src2 by value, for the operations that are not hot.
    fn operand(&self, v: &V) -> Result<Zmm, String> {
        let mut x = [0; 8];
        self.source(v, v.src2, &mut x)?;
        Ok(x)
    }

    /// An unmasked FMA, in place (most of what kernels run).
    fn fma(&mut self, v: &V, dst: u8, negate: bool) -> Result<(), String> {
        let mut b = [0; 8];
        self.source(v, v.src2, &mut b)?;
        let a = self.cpu.zmm[v.src1 as usize];
        let quads = v.bytes as usize / 8;
        let out = &mut self.cpu.zmm[dst as usize];
        // vfmadd231: dst = src1 * src2 + dst, rounded once; vfnmadd231 negates the product
        // (exactly, before the rounding).
        if v.elt == 8 {
            for i in 0..quads {
                let x = f64::from_bits(a[i]);
                let x = if negate { -x } else { x };
                out[i] = x
                    .mul_add(f64::from_bits(b[i]), f64::from_bits(out[i]))
                    .to_bits();
            }
        } else {
            // Two f32 lanes a quadword.
            let sign = if negate { 1 << 31 | 1 << 63 } else { 0 };
            for i in 0..quads {
                let (x, y, z) = (a[i] ^ sign, b[i], out[i]);
                let lo = f32::from_bits(x as u32)
                    .mul_add(f32::from_bits(y as u32), f32::from_bits(z as u32));
                let hi = f32::from_bits((x >> 32) as u32).mul_add(
                    f32::from_bits((y >> 32) as u32),
                    f32::from_bits((z >> 32) as u32),
                );
                out[i] = lo.to_bits() as u64 | (hi.to_bits() as u64) << 32;
            }
        }
        out[quads..].fill(0);
        Ok(())
    }

    /// Writes `new` to register `dst` as a VEX/EVEX instruction of `bytes` bytes does: lanes
    /// the mask disables merged or zeroed, everything above `bytes` zeroed. With `scalar`
    /// the mask applies to lane 0 alone.
    fn write(&mut self, v: &V, dst: u8, new: Zmm, bytes: u8, scalar: bool) {
        let quads = bytes as usize / 8;
        let out = &mut self.cpu.zmm[dst as usize];
        if v.mask == 0 {
            out[..quads].copy_from_slice(&new[..quads]);
            out[quads..].fill(0);
            return;
        }
        let (elt, lanes) = (v.elt as usize, (bytes / v.elt) as usize);
        let k = self.cpu.k[v.mask as usize];
        for i in 0..lanes {
            let on = k >> i & 1 == 1 || (scalar && i > 0);
            let x = if on {
                lane(&new, elt, i)
            } else if v.zeroing {
                0
            } else {
                lane(out, elt, i)
            };
            set_lane(out, elt, i, x);
        }
        out[quads..].fill(0);
    }

    fn store(&mut self, at: u64, x: &Zmm, len: usize) -> Result<(), String> {
        self.memory.write(at, &from_zmm(x, len))
    }

    /// Stores the lanes of `x` that `enabled` has, each on its own.
    fn store_lanes(
        &mut self,
        at: u64,
        x: &Zmm,
        elt: usize,
        lanes: usize,
        enabled: u64,
    ) -> Result<(), String> {
        for i in (0..lanes).filter(|&i| enabled >> i & 1 == 1) {
            let bytes = lane(x, elt, i).to_le_bytes();
            self.memory.write(at + (i * elt) as u64, &bytes[..elt])?;
        }
        Ok(())
    }

    fn vector(&mut self, v: &V) -> Result<(), String> {
        if let (Kind::Fma { negate }, Loc::Reg(dst), 0) = (v.kind, v.dst, v.mask) {
            return self.fma(v, dst, negate);
        }
        let (elt, bytes) = (v.elt as usize, v.bytes as usize);
        let lanes = bytes / elt;
        let dst_reg = match v.dst {
            Loc::Reg(r) => Some(r),
            _ => None,
        };
        let new: Zmm = match v.kind {
            Kind::Move => match v.dst {
                Loc::Mem(m) => {
                    let x = self.cpu.zmm[reg(v.src2)];
                    let at = self.addr(m);
                    return match v.mask {
                        0 => self.store(at, &x, bytes),
                        _ => self.store_lanes(at, &x, elt, lanes, self.enabled(v)),
                    };
                }
                _ => {
                    let mut x = [0; 8];
                    self.source(v, v.src2, &mut x)?;
                    x
                }
            },
            Kind::StoreNt => {
                let (Loc::Mem(m), Loc::Reg(r)) = (v.dst, v.src2) else {
                    unreachable!("checked at translation")
                };
                let at = self.addr(m);
                if at % bytes as u64 != 0 {
                    return Err(format!(
                        "#GP: a {bytes}-byte non-temporal store at {at:#x}, not aligned to {bytes}"
                    ));
                }
                self.unfenced = true;
                let x = self.cpu.zmm[r as usize];
                return self.store(at, &x, bytes);
            }
            Kind::MaskMove => {
                // The mask is the sign bit of each lane of src1; masked-off lanes are not
                // accessed (and do not fault).
                let m = self.cpu.zmm[v.src1 as usize];
                let enabled = (0..lanes)
                    .filter(|&i| lane(&m, elt, i) >> (8 * elt - 1) == 1)
                    .fold(0u64, |b, i| b | 1 << i);
                match (v.dst, v.src2) {
                    (Loc::Mem(to), Loc::Reg(r)) => {
                        let x = self.cpu.zmm[r as usize];
                        let at = self.addr(to);
                        return self.store_lanes(at, &x, elt, lanes, enabled);
                    }
                    (Loc::Reg(_), Loc::Mem(from)) => {
                        let at = self.addr(from);
                        let mut out = [0; 8];
                        for i in (0..lanes).filter(|&i| enabled >> i & 1 == 1) {
                            let x = self.memory.zmm(at + (i * elt) as u64, elt)?;
                            set_lane(&mut out, elt, i, lane(&x, elt, 0));
                        }
                        out
                    }
                    _ => return Err("vmaskmov between registers".into()),
                }
            }
            Kind::Broadcast => {
                let x = match v.src2 {
                    Loc::Mem(m) => self.memory.zmm(self.addr(m), elt)?,
                    _ => self.cpu.zmm[reg(v.src2)],
                };
                let mut out = [0; 8];
                for i in 0..lanes {
                    set_lane(&mut out, elt, i, lane(&x, elt, 0));
                }
                out
            }
            Kind::BroadcastBlock(n) => {
                let Loc::Mem(m) = v.src2 else {
                    unreachable!("checked at translation")
                };
                let block = self.memory.zmm(self.addr(m), n as usize)?;
                let q = n as usize / 8;
                let mut out = [0; 8];
                for (i, x) in out.iter_mut().enumerate().take(bytes / 8) {
                    *x = block[i % q];
                }
                out
            }
            Kind::Insert(n) => {
                let q = n as usize / 8;
                let block = match v.src2 {
                    Loc::Mem(m) => self.memory.zmm(self.addr(m), n as usize)?,
                    _ => self.cpu.zmm[reg(v.src2)],
                };
                let at = (v.imm as usize % (bytes / n as usize)) * q;
                let mut out = self.cpu.zmm[v.src1 as usize];
                out[at..at + q].copy_from_slice(&block[..q]);
                out
            }
            Kind::Extract(n) => {
                let x = self.cpu.zmm[reg(v.src2)];
                let q = n as usize / 8;
                let at = q * (v.imm as usize % (bytes / n as usize));
                let mut low = [0; 8];
                low[..q].copy_from_slice(&x[at..at + q]);
                match v.dst {
                    Loc::Mem(m) => return self.store(self.addr(m), &low, n as usize),
                    Loc::Reg(r) => {
                        self.write(v, r, low, n, false);
                        return Ok(());
                    }
                    Loc::Gpr32(_) => unreachable!("checked at translation"),
                }
            }
            Kind::ExtractPs => {
                let x = get32(&self.cpu.zmm[reg(v.src2)], v.imm as usize & 3);
                match v.dst {
                    Loc::Mem(m) => {
                        let at = self.addr(m);
                        return self.memory.write(at, &x.to_le_bytes());
                    }
                    Loc::Gpr32(r) => {
                        self.cpu.gpr[r as usize] = x as u64;
                        return Ok(());
                    }
                    Loc::Reg(_) => unreachable!("checked at translation"),
                }
            }
            Kind::Fma { negate } => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let mut out = self.cpu.zmm[dst_reg.unwrap() as usize];
                // vfmadd231: dst = src1 * src2 + dst, rounded once; vfnmadd231 negates the
                // product (exactly, before the rounding).
                let neg = |x: f64| if negate { -x } else { x };
                if elt == 8 {
                    for i in 0..lanes {
                        let (x, y) = (neg(f64::from_bits(a[i])), f64::from_bits(b[i]));
                        out[i] = x.mul_add(y, f64::from_bits(out[i])).to_bits();
                    }
                } else {
                    for i in 0..lanes {
                        let x = f32::from_bits(get32(&a, i));
                        let x = if negate { -x } else { x };
                        let (y, z) = (f32::from_bits(get32(&b, i)), f32::from_bits(get32(&out, i)));
                        set32(&mut out, i, x.mul_add(y, z).to_bits());
                    }
                }
                out
            }
            Kind::Add | Kind::Sub | Kind::Mul => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let mut out = [0; 8];
                if elt == 8 {
                    let op = match v.kind {
                        Kind::Add => |x: f64, y: f64| x + y,
                        Kind::Sub => |x: f64, y: f64| x - y,
                        _ => |x: f64, y: f64| x * y,
                    };
                    for i in 0..lanes {
                        out[i] = op(f64::from_bits(a[i]), f64::from_bits(b[i])).to_bits();
                    }
                } else {
                    let op = match v.kind {
                        Kind::Add => |x: f32, y: f32| x + y,
                        Kind::Sub => |x: f32, y: f32| x - y,
                        _ => |x: f32, y: f32| x * y,
                    };
                    for i in 0..lanes {
                        let (x, y) = (f32::from_bits(get32(&a, i)), f32::from_bits(get32(&b, i)));
                        set32(&mut out, i, op(x, y).to_bits());
                    }
                }
                out
            }
            Kind::Xor => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                std::array::from_fn(|i| a[i] ^ b[i])
            }
            Kind::ScalarMove => match (v.dst, v.src2) {
                (Loc::Mem(m), Loc::Reg(r)) => {
                    let x = self.cpu.zmm[r as usize];
                    let at = self.addr(m);
                    return match v.mask {
                        0 => self.store(at, &x, elt),
                        k => self.store_lanes(at, &x, elt, 1, self.cpu.k[k as usize]),
                    };
                }
                (Loc::Reg(r), Loc::Mem(m)) => {
                    let mut x = [0; 8];
                    if v.mask == 0 || self.cpu.k[v.mask as usize] & 1 == 1 {
                        x = self.memory.zmm(self.addr(m), elt)?;
                    }
                    self.write(v, r, x, 16, true);
                    return Ok(());
                }
                (Loc::Reg(r), Loc::Reg(s)) => {
                    // Lane 0 from src2, the rest of the low 128 bits from src1.
                    let mut x = self.cpu.zmm[v.src1 as usize];
                    x[2..].fill(0);
                    set_lane(&mut x, elt, 0, lane(&self.cpu.zmm[s as usize], elt, 0));
                    self.write(v, r, x, 16, true);
                    return Ok(());
                }
                _ => unreachable!("checked at translation"),
            },
            Kind::PermInLane => {
                let x = self.operand(v)?;
                let mut out = [0; 8];
                for i in 0..lanes {
                    let sel = (v.imm >> (2 * (i % 4))) as usize & 3;
                    set32(&mut out, i, get32(&x, i / 4 * 4 + sel));
                }
                out
            }
            Kind::PermPdImm => {
                let x = self.operand(v)?;
                std::array::from_fn(|i| {
                    let sel = (v.imm >> (2 * (i % 4))) as usize & 3;
                    if i < lanes {
                        x[i / 4 * 4 + sel]
                    } else {
                        0
                    }
                })
            }
            Kind::PermVar => {
                let (index, table) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let mut out = [0; 8];
                for i in 0..lanes {
                    let from = lane(&index, elt, i) as usize & (lanes - 1);
                    set_lane(&mut out, elt, i, lane(&table, elt, from));
                }
                out
            }
            Kind::ZeroExtendBytes => {
                let src = match v.src2 {
                    Loc::Mem(m) => self.memory.read(self.addr(m), lanes)?.to_vec(),
                    _ => from_zmm(&self.cpu.zmm[reg(v.src2)], lanes),
                };
                let mut out = [0; 8];
                for (i, &b) in src.iter().enumerate() {
                    set_lane(&mut out, elt, i, b as u64);
                }
                out
            }
            Kind::ShufBlocks => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let blocks = bytes / 16;
                let mut out = [0; 8];
                for j in 0..blocks {
                    // The low half of the blocks from src1, the high half from src2.
                    let from = if j < blocks / 2 { &a } else { &b };
                    let bits = if blocks == 4 { 2 } else { 1 };
                    let sel = (v.imm as usize >> (bits * j)) & ((1 << bits) - 1);
                    out[2 * j] = from[2 * sel];
                    out[2 * j + 1] = from[2 * sel + 1];
                }
                out
            }
            Kind::Perm2f128 => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let halves = [&a[0..2], &a[2..4], &b[0..2], &b[2..4]];
                let mut out = [0; 8];
                for j in 0..2 {
                    let control = v.imm as usize >> (4 * j);
                    if control & 8 == 0 {
                        out[2 * j..2 * j + 2].copy_from_slice(halves[control & 3]);
                    }
                }
                out
            }
            Kind::Shufps => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                let mut out = [0; 8];
                for i in 0..lanes {
                    let from = if i % 4 < 2 { &a } else { &b };
                    let sel = (v.imm >> (2 * (i % 4))) as usize & 3;
                    set32(&mut out, i, get32(from, i / 4 * 4 + sel));
                }
                out
            }
            Kind::Shufpd => {
                let (a, b) = (self.cpu.zmm[v.src1 as usize], self.operand(v)?);
                std::array::from_fn(|i| {
                    let from = if i % 2 == 0 { &a } else { &b };
                    let sel = (v.imm >> i) as usize & 1;
                    if i < lanes {
                        from[i / 2 * 2 + sel]
                    } else {
                        0
                    }
                })
            }
        };
        let dst = dst_reg.ok_or("a register destination expected")?;
        self.write(v, dst, new, v.bytes, false);
        Ok(())
    }
}

fn reg(loc: Loc) -> usize {
    match loc {
        Loc::Reg(r) => r as usize,
        _ => unreachable!("a register operand, checked at translation"),
    }
}
