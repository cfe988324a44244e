//! Program → AArch64 instructions, one match arm per operation.
//!
//! dynasm panics on an immediate that does not fit its field, so every offset and constant
//! is checked here first and falls back to a longer sequence through x16/x17.

// dynasm's expansion converts every dynamic register number with `.into()`.
#![allow(clippy::useless_conversion)]

use dynasmrt::aarch64::Aarch64Relocation;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use smallgemm_ir::{Addr, Dtype, Gpr, MachineCode, Mask, Op, Program, Trips, VReg};

use crate::abi::{self, ADDRESS_TEMP, FRAME, SP, VALUE_TEMP};
use crate::regs;
use crate::EmitError;

type Assembler = VecAssembler<Aarch64Relocation>;

/// Bytes of one vector register.
const VECTOR: i64 = 16;

/// How a memory operand is reached: a base register (31 = sp) and a byte offset that the
/// chosen form encodes.
#[derive(Clone, Copy)]
enum Mem {
    /// `[base, #offset]`, offset a multiple of the access size, at most 4095 of them.
    Scaled(u8, u32),
    /// `[base, #offset]` unscaled (`ldur`/`stur`), -256..=255.
    Unscaled(u8, i32),
}

pub(crate) struct Emitter<'a> {
    ops: Assembler,
    program: &'a Program,
    /// Bytes per element: 8 (f64) or 4 (f32).
    elt: u32,
    /// Whether a vector register has been written (the scalar arguments live in v0, v1
    /// until the program stores them).
    vectors_written: bool,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(program: &'a Program) -> Result<Self, EmitError> {
        let elt = match program.dtype {
            Dtype::F64 => 8,
            Dtype::F32 => 4,
            Dtype::F16 => return Err(EmitError::Unsupported("f16")),
        };
        if program.lanes as u32 * elt != VECTOR as u32 {
            return Err(EmitError::Lanes(program.lanes));
        }
        Ok(Emitter {
            ops: Assembler::new(0),
            program,
            elt,
            vectors_written: false,
        })
    }

    /// Prologue, the program's operations, epilogue.
    pub(crate) fn body(&mut self) -> Result<(), EmitError> {
        let program = self.program;
        if program.gprs > abi::GENERAL.len() {
            return Err(EmitError::TooManyGeneralRegisters {
                needed: program.gprs,
                available: abi::GENERAL.len(),
            });
        }
        let saved_x: Vec<u8> = abi::GENERAL[..program.gprs]
            .iter()
            .copied()
            .filter(|&x| abi::is_callee_saved_general(x))
            .collect();
        let mut saved_d: Vec<u8> = regs::VECTOR[..program.vregs.min(32)]
            .iter()
            .copied()
            .filter(|&v| abi::is_callee_saved_vector(v))
            .collect();
        saved_d.sort_unstable();
        let scratch = program.scratch_bytes as u64;
        let frame = scratch > 0 || !saved_x.is_empty() || !saved_d.is_empty();
        if frame {
            // A frame record keeps the stack walkable; x29 marks where the saves start.
            dynasm!(self.ops
                ; .arch aarch64
                ; stp x29, x30, [sp, #-16]!
                ; mov x29, sp
            );
        }
        for pair in saved_x.chunks(2) {
            match *pair {
                [a, b] => dynasm!(self.ops ; .arch aarch64 ; stp X(a), X(b), [sp, #-16]!),
                [a] => dynasm!(self.ops ; .arch aarch64 ; str X(a), [sp, #-16]!),
                _ => {}
            }
        }
        for pair in saved_d.chunks(2) {
            match *pair {
                [a, b] => dynasm!(self.ops ; .arch aarch64 ; stp D(a), D(b), [sp, #-16]!),
                [a] => dynasm!(self.ops ; .arch aarch64 ; str D(a), [sp, #-16]!),
                _ => {}
            }
        }
        let saved_bytes = 16 * (saved_x.len().div_ceil(2) + saved_d.len().div_ceil(2)) as u64;
        if scratch > 0 {
            // sp = a 64-byte aligned area below the saves.
            let size = scratch.div_ceil(64) * 64;
            self.add_imm(ADDRESS_TEMP, SP, -(size as i64))?;
            dynasm!(self.ops ; .arch aarch64 ; and sp, x16, 0xffff_ffff_ffff_ffc0u64);
        }
        self.ops(&program.ops)?;
        if scratch > 0 {
            self.add_imm(SP, FRAME, -(saved_bytes as i64))?;
        }
        for pair in saved_d.chunks(2).rev() {
            match *pair {
                [a, b] => dynasm!(self.ops ; .arch aarch64 ; ldp D(a), D(b), [sp], #16),
                [a] => dynasm!(self.ops ; .arch aarch64 ; ldr D(a), [sp], #16),
                _ => {}
            }
        }
        for pair in saved_x.chunks(2).rev() {
            match *pair {
                [a, b] => dynasm!(self.ops ; .arch aarch64 ; ldp X(a), X(b), [sp], #16),
                [a] => dynasm!(self.ops ; .arch aarch64 ; ldr X(a), [sp], #16),
                _ => {}
            }
        }
        if frame {
            dynasm!(self.ops ; .arch aarch64 ; ldp x29, x30, [sp], #16);
        }
        dynasm!(self.ops ; .arch aarch64 ; ret);
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<MachineCode, EmitError> {
        let len = self.ops.offset().0;
        let bytes = self.ops.finalize().map_err(|e| match e {
            // A loop's conditional branches reach +-1 MiB: only a schedule that unrolls
            // far more than the planner does gets there.
            dynasmrt::DynasmError::ImpossibleRelocation(_) => EmitError::CodeTooLarge(len),
            e => EmitError::Assembler(e.to_string()),
        })?;
        Ok(MachineCode {
            code_len: bytes.len(),
            bytes,
        })
    }

    /// The operations, with two full-vector loads (or stores) of neighbouring addresses
    /// from one base fused into an `ldp q` (`stp q`).
    fn ops(&mut self, ops: &[Op]) -> Result<(), EmitError> {
        let mut i = 0;
        while i < ops.len() {
            if let Some(next) = ops.get(i + 1) {
                if self.pair(&ops[i], next)? {
                    i += 2;
                    continue;
                }
            }
            self.op(&ops[i])?;
            i += 1;
        }
        Ok(())
    }

    /// Emits `first` and `second` as one `ldp q`/`stp q` if they form a pair.
    fn pair(&mut self, first: &Op, second: &Op) -> Result<bool, EmitError> {
        let pairable = |x: Addr, y: Addr| {
            x.base == y.base
                && y.offset as i64 == x.offset as i64 + VECTOR
                && x.offset as i64 % VECTOR == 0
                && (-1024..=1008).contains(&(x.offset as i64))
        };
        match (first, second) {
            (
                Op::Load {
                    dst: d1,
                    addr: a1,
                    mask: None,
                },
                Op::Load {
                    dst: d2,
                    addr: a2,
                    mask: None,
                },
            ) if d1 != d2 && pairable(*a1, *a2) && a1.base != Gpr::SCRATCH => {
                let (t1, t2, base) = (self.v(*d1)?, self.v(*d2)?, self.x(a1.base)?);
                let off = a1.offset;
                self.vectors_written = true;
                dynasm!(self.ops ; .arch aarch64 ; ldp Q(t1), Q(t2), [XSP(base), off]);
                Ok(true)
            }
            (
                Op::Store {
                    src: s1,
                    addr: a1,
                    mask: None,
                },
                Op::Store {
                    src: s2,
                    addr: a2,
                    mask: None,
                },
            ) if pairable(*a1, *a2) && a1.base != Gpr::SCRATCH => {
                let (t1, t2, base) = (self.v(*s1)?, self.v(*s2)?, self.x(a1.base)?);
                let off = a1.offset;
                dynasm!(self.ops ; .arch aarch64 ; stp Q(t1), Q(t2), [XSP(base), off]);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn x(&self, g: Gpr) -> Result<u8, EmitError> {
        if g == Gpr::SCRATCH {
            return Ok(SP);
        }
        // A register past the program's count is one the prologue did not save.
        if g.0 as usize >= self.program.gprs {
            return Err(EmitError::UndeclaredGeneralRegister(g.0));
        }
        abi::GENERAL
            .get(g.0 as usize)
            .copied()
            .ok_or(EmitError::TooManyGeneralRegisters {
                needed: g.0 as usize + 1,
                available: abi::GENERAL.len(),
            })
    }

    fn v(&self, r: VReg) -> Result<u8, EmitError> {
        if r.0 as usize >= self.program.vregs || r.0 >= 32 {
            return Err(EmitError::TooManyVectorRegisters(r.0 as usize + 1));
        }
        Ok(regs::VECTOR[r.0 as usize])
    }

    fn lanes_of(&self, mask: Mask) -> Result<u32, EmitError> {
        self.program
            .masks
            .iter()
            .find(|d| d.mask == mask)
            .map(|d| d.lanes)
            .ok_or(EmitError::UndeclaredMask(mask.0))
    }

    /// The form that reaches `addr` with an access of `size` bytes; offsets that fit
    /// neither immediate form are added into x16 first.
    fn mem(&mut self, addr: Addr, size: u32) -> Result<Mem, EmitError> {
        let base = self.x(addr.base)?;
        let off = addr.offset as i64;
        if off >= 0 && off % size as i64 == 0 && off / (size as i64) < 4096 {
            return Ok(Mem::Scaled(base, off as u32));
        }
        if (-256..=255).contains(&off) {
            return Ok(Mem::Unscaled(base, off as i32));
        }
        self.add_imm(ADDRESS_TEMP, base, off)?;
        Ok(Mem::Scaled(ADDRESS_TEMP, 0))
    }

    /// `dst = base + imm` (`dst` may be `base`; 31 means sp for either). Large immediates
    /// go through x17, so `base` must not be x17.
    fn add_imm(&mut self, dst: u8, base: u8, imm: i64) -> Result<(), EmitError> {
        let magnitude = imm.unsigned_abs();
        let (lo, hi) = (
            (magnitude & 0xfff) as u32,
            ((magnitude >> 12) & 0xfff) as u32,
        );
        if magnitude >> 24 == 0 {
            let mut from = base;
            if hi != 0 {
                if imm < 0 {
                    dynasm!(self.ops ; .arch aarch64 ; sub XSP(dst), XSP(from), hi, lsl 12);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; add XSP(dst), XSP(from), hi, lsl 12);
                }
                from = dst;
            }
            if lo != 0 || from != dst {
                if imm < 0 {
                    dynasm!(self.ops ; .arch aarch64 ; sub XSP(dst), XSP(from), lo);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; add XSP(dst), XSP(from), lo);
                }
            }
            return Ok(());
        }
        self.mov_imm(VALUE_TEMP, magnitude)?;
        // The shifted-register forms read register 31 as zero, so copy sp first.
        let mut from = base;
        if from == SP {
            dynasm!(self.ops ; .arch aarch64 ; mov x16, sp);
            from = ADDRESS_TEMP;
        }
        if dst == SP {
            dynasm!(self.ops ; .arch aarch64 ; add x17, X(from), x17);
            if imm < 0 {
                return Err(EmitError::Unsupported("large negative stack adjustments"));
            }
            dynasm!(self.ops ; .arch aarch64 ; mov sp, x17);
        } else if imm < 0 {
            dynasm!(self.ops ; .arch aarch64 ; sub X(dst), X(from), x17);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; add X(dst), X(from), x17);
        }
        Ok(())
    }

    /// `x[dst] = value`: a movz of the lowest nonzero 16-bit piece, a movk for each other
    /// nonzero piece.
    fn mov_imm(&mut self, dst: u8, value: u64) -> Result<(), EmitError> {
        let piece = |i: u32| ((value >> (16 * i)) & 0xffff) as u32;
        let first = (0..4).find(|&i| piece(i) != 0).unwrap_or(0);
        for i in first..4 {
            let p = piece(i);
            match (i == first, i) {
                (true, 0) => dynasm!(self.ops ; .arch aarch64 ; movz X(dst), p),
                (true, 1) => dynasm!(self.ops ; .arch aarch64 ; movz X(dst), p, lsl 16),
                (true, 2) => dynasm!(self.ops ; .arch aarch64 ; movz X(dst), p, lsl 32),
                (true, _) => dynasm!(self.ops ; .arch aarch64 ; movz X(dst), p, lsl 48),
                (false, _) if p == 0 => {}
                (false, 1) => dynasm!(self.ops ; .arch aarch64 ; movk X(dst), p, lsl 16),
                (false, 2) => dynasm!(self.ops ; .arch aarch64 ; movk X(dst), p, lsl 32),
                (false, _) => dynasm!(self.ops ; .arch aarch64 ; movk X(dst), p, lsl 48),
            }
        }
        Ok(())
    }

    /// x16 = the address of `addr` (for forms without an offset: `ld1r`, lane accesses).
    fn address(&mut self, addr: Addr) -> Result<u8, EmitError> {
        let base = self.x(addr.base)?;
        if addr.offset == 0 {
            return Ok(base);
        }
        self.add_imm(ADDRESS_TEMP, base, addr.offset as i64)?;
        Ok(ADDRESS_TEMP)
    }

    /// A scalar, 64-bit or 128-bit load into the low bytes of v[t] (the rest zeroed).
    fn load_bytes(&mut self, t: u8, addr: Addr, size: u32) -> Result<(), EmitError> {
        match (self.mem(addr, size)?, size) {
            (Mem::Scaled(b, o), 16) => dynasm!(self.ops ; .arch aarch64 ; ldr Q(t), [XSP(b), o]),
            (Mem::Scaled(b, o), 8) => dynasm!(self.ops ; .arch aarch64 ; ldr D(t), [XSP(b), o]),
            (Mem::Scaled(b, o), _) => dynasm!(self.ops ; .arch aarch64 ; ldr S(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), 16) => dynasm!(self.ops ; .arch aarch64 ; ldur Q(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), 8) => dynasm!(self.ops ; .arch aarch64 ; ldur D(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), _) => dynasm!(self.ops ; .arch aarch64 ; ldur S(t), [XSP(b), o]),
        }
        self.vectors_written = true;
        Ok(())
    }

    /// Stores the low `size` bytes of v[t].
    fn store_bytes(&mut self, t: u8, addr: Addr, size: u32) -> Result<(), EmitError> {
        match (self.mem(addr, size)?, size) {
            (Mem::Scaled(b, o), 16) => dynasm!(self.ops ; .arch aarch64 ; str Q(t), [XSP(b), o]),
            (Mem::Scaled(b, o), 8) => dynasm!(self.ops ; .arch aarch64 ; str D(t), [XSP(b), o]),
            (Mem::Scaled(b, o), _) => dynasm!(self.ops ; .arch aarch64 ; str S(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), 16) => dynasm!(self.ops ; .arch aarch64 ; stur Q(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), 8) => dynasm!(self.ops ; .arch aarch64 ; stur D(t), [XSP(b), o]),
            (Mem::Unscaled(b, o), _) => dynasm!(self.ops ; .arch aarch64 ; stur S(t), [XSP(b), o]),
        }
        Ok(())
    }

    /// A load of the first `lanes` lanes, the others zeroed and their memory untouched:
    /// one `ldr` of 4, 8 or 16 bytes, and for three f32 lanes an `ld1` of lane 2 after.
    fn partial_load(&mut self, t: u8, addr: Addr, lanes: u32) -> Result<(), EmitError> {
        let bytes = lanes * self.elt;
        let first = if bytes == 12 { 8 } else { bytes };
        self.load_bytes(t, addr, first)?;
        if bytes == 12 {
            let at = self.address(Addr::new(addr.base, addr.offset + 8))?;
            dynasm!(self.ops ; .arch aarch64 ; ld1 {V(t).s * 1}[2], [XSP(at)]);
        }
        Ok(())
    }

    /// A store of the first `lanes` lanes only.
    fn partial_store(&mut self, t: u8, addr: Addr, lanes: u32) -> Result<(), EmitError> {
        let bytes = lanes * self.elt;
        let first = if bytes == 12 { 8 } else { bytes };
        self.store_bytes(t, addr, first)?;
        if bytes == 12 {
            let at = self.address(Addr::new(addr.base, addr.offset + 8))?;
            dynasm!(self.ops ; .arch aarch64 ; st1 {V(t).s * 1}[2], [XSP(at)]);
        }
        Ok(())
    }

    fn label(&mut self) -> DynamicLabel {
        self.ops.new_dynamic_label()
    }

    fn op(&mut self, op: &Op) -> Result<(), EmitError> {
        let f64 = self.elt == 8;
        let lanes = self.program.lanes as u32;
        match *op {
            Op::Zero { dst } => {
                let t = self.v(dst)?;
                dynasm!(self.ops ; .arch aarch64 ; movi V(t).d2, 0);
                self.vectors_written = true;
            }
            Op::Load { dst, addr, mask } => {
                let t = self.v(dst)?;
                match mask {
                    None => self.load_bytes(t, addr, VECTOR as u32)?,
                    Some(m) => {
                        let n = self.lanes_of(m)?.min(lanes);
                        self.partial_load(t, addr, n)?
                    }
                }
            }
            Op::Store { addr, src, mask } => {
                let t = self.v(src)?;
                match mask {
                    None => self.store_bytes(t, addr, VECTOR as u32)?,
                    Some(m) => {
                        let n = self.lanes_of(m)?.min(lanes);
                        self.partial_store(t, addr, n)?
                    }
                }
            }
            // NEON stores every tail in pieces (the lowering asks for it on AVX2 only).
            Op::StorePieces {
                addr,
                src,
                lanes: n,
            } => {
                let t = self.v(src)?;
                self.partial_store(t, addr, (n as u32).min(lanes))?
            }
            // The runtime makes them for x86 only (AArch64's `stnp` is not used).
            Op::StoreStream { .. } => {
                return Err(EmitError::Unsupported("streaming stores"));
            }
            // Full-width arithmetic is a valid narrowing: the upper lanes are left undefined
            // (the lowering narrows only x86 tails).
            Op::Narrow { .. } => {}
            // Lane-packed kernels are x86-only (`lane_pack::geometry` refuses NEON).
            Op::BroadcastGroup { .. }
            | Op::Permute { .. }
            | Op::InsertGroup { .. }
            | Op::Indices { .. }
            | Op::PermuteVar { .. } => {
                return Err(EmitError::Unsupported("lane-packed kernels"));
            }
            // Dot-product tails are AVX-512 only (`Schedule::validate` refuses NEON).
            Op::TransposeAdd { .. } => {
                return Err(EmitError::Unsupported("dot-product tails"));
            }
            Op::Broadcast { dst, addr } => {
                let t = self.v(dst)?;
                let at = self.address(addr)?;
                if f64 {
                    dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).d2 * 1}, [XSP(at)]);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; ld1r {V(t).s4 * 1}, [XSP(at)]);
                }
                self.vectors_written = true;
            }
            Op::LoadScalar { dst, addr } => {
                let t = self.v(dst)?;
                self.load_bytes(t, addr, self.elt)?;
            }
            Op::StoreScalar { addr, src } => {
                let t = self.v(src)?;
                self.store_bytes(t, addr, self.elt)?;
            }
            Op::Fma { acc, a, b, negate } => {
                let (d, n, m) = (self.v(acc)?, self.v(a)?, self.v(b)?);
                match (f64, negate) {
                    (true, false) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).d2, V(n).d2, V(m).d2)
                    }
                    (true, true) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmls V(d).d2, V(n).d2, V(m).d2)
                    }
                    (false, false) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).s4, V(n).s4, V(m).s4)
                    }
                    (false, true) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmls V(d).s4, V(n).s4, V(m).s4)
                    }
                }
                self.vectors_written = true;
            }
            Op::FmaLane {
                acc,
                a,
                b,
                lane,
                negate,
            } => {
                let (d, n, m) = (self.v(acc)?, self.v(a)?, self.v(b)?);
                if lane as u32 >= lanes {
                    return Err(EmitError::Lane(lane));
                }
                let l = lane as u32;
                match (f64, negate) {
                    (true, false) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).d2, V(n).d2, V(m).d[l])
                    }
                    (true, true) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmls V(d).d2, V(n).d2, V(m).d[l])
                    }
                    (false, false) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmla V(d).s4, V(n).s4, V(m).s[l])
                    }
                    (false, true) => {
                        dynasm!(self.ops ; .arch aarch64 ; fmls V(d).s4, V(n).s4, V(m).s[l])
                    }
                }
                self.vectors_written = true;
            }
            Op::FmaBroadcast { .. } => {
                return Err(EmitError::Unsupported(
                    "FMA with a broadcast memory operand",
                ));
            }
            Op::Add { dst, a, b } => {
                let (d, n, m) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                if f64 {
                    dynasm!(self.ops ; .arch aarch64 ; fadd V(d).d2, V(n).d2, V(m).d2);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; fadd V(d).s4, V(n).s4, V(m).s4);
                }
                self.vectors_written = true;
            }
            Op::Sub { dst, a, b } => {
                let (d, n, m) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                if f64 {
                    dynasm!(self.ops ; .arch aarch64 ; fsub V(d).d2, V(n).d2, V(m).d2);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; fsub V(d).s4, V(n).s4, V(m).s4);
                }
                self.vectors_written = true;
            }
            Op::Mul { dst, a, b } => {
                let (d, n, m) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                if f64 {
                    dynasm!(self.ops ; .arch aarch64 ; fmul V(d).d2, V(n).d2, V(m).d2);
                } else {
                    dynasm!(self.ops ; .arch aarch64 ; fmul V(d).s4, V(n).s4, V(m).s4);
                }
                self.vectors_written = true;
            }
            // No mask state: partial loads and stores read their lane count from the
            // program's mask declarations.
            Op::SetMask { mask, .. } => {
                self.lanes_of(mask)?;
            }
            Op::StoreParam { param, addr } => {
                let index = self
                    .program
                    .params
                    .iter()
                    .position(|p| *p == param)
                    .ok_or(EmitError::UnknownParam)?;
                if self.vectors_written {
                    return Err(EmitError::ParamClobbered);
                }
                let x = abi::float_argument(index);
                self.store_bytes(x, addr, self.elt)?;
            }
            Op::StoreConst { value, addr } => {
                let mem = self.mem(addr, self.elt)?;
                if f64 {
                    self.mov_imm(VALUE_TEMP, value.to_bits())?;
                    match mem {
                        Mem::Scaled(b, o) => {
                            dynasm!(self.ops ; .arch aarch64 ; str x17, [XSP(b), o])
                        }
                        Mem::Unscaled(b, o) => {
                            dynasm!(self.ops ; .arch aarch64 ; stur x17, [XSP(b), o])
                        }
                    }
                } else {
                    self.mov_imm(VALUE_TEMP, (value as f32).to_bits() as u64)?;
                    match mem {
                        Mem::Scaled(b, o) => {
                            dynasm!(self.ops ; .arch aarch64 ; str w17, [XSP(b), o])
                        }
                        Mem::Unscaled(b, o) => {
                            dynasm!(self.ops ; .arch aarch64 ; stur w17, [XSP(b), o])
                        }
                    }
                }
            }
            Op::LoadAddress { dst, addr } => {
                let d = self.x(dst)?;
                match self.mem(addr, 8)? {
                    Mem::Scaled(b, o) => dynasm!(self.ops ; .arch aarch64 ; ldr X(d), [XSP(b), o]),
                    Mem::Unscaled(b, o) => {
                        dynasm!(self.ops ; .arch aarch64 ; ldur X(d), [XSP(b), o])
                    }
                }
            }
            // The planner asks for prefetches on x86 only (the next matrix is usually
            // further away than `prfm`'s offset reaches); a hint may be dropped.
            Op::Prefetch { .. } => {}
            Op::Copy { dst, src } => {
                let (d, s) = (self.x(dst)?, self.x(src)?);
                // The add form reads register 31 as sp (a plain mov would read xzr).
                dynasm!(self.ops ; .arch aarch64 ; add XSP(d), XSP(s), 0);
            }
            Op::AddImm { dst, imm } => {
                let d = self.x(dst)?;
                if d == SP {
                    return Err(EmitError::Unsupported("moving the scratch base"));
                }
                self.add_imm(d, d, imm as i64)?;
            }
            Op::Loop {
                counter,
                trips,
                ref body,
            } => {
                let c = self.x(counter)?;
                if c == SP {
                    return Err(EmitError::Unsupported("sp as a loop counter"));
                }
                let top = self.label();
                let done = self.label();
                if let Trips::RegisterBy(step) = trips {
                    // counter -= step before each trip; a borrow (lo) means fewer than step
                    // were left, and adding it back leaves the remainder.
                    if step >= 4096 {
                        return Err(EmitError::Unsupported("a batch step above 4095"));
                    }
                    dynasm!(self.ops
                        ; .arch aarch64
                        ; subs X(c), XSP(c), step
                        ; b.lo =>done
                        ; =>top
                    );
                    self.ops(body)?;
                    dynasm!(self.ops
                        ; .arch aarch64
                        ; subs X(c), XSP(c), step
                        ; b.hs =>top
                        ; =>done
                        ; add XSP(c), XSP(c), step
                    );
                    return Ok(());
                }
                match trips {
                    Trips::Const(n) => self.mov_imm(c, n as u64)?,
                    Trips::Register | Trips::RegisterBy(_) => {
                        dynasm!(self.ops ; .arch aarch64 ; cbz X(c), =>done)
                    }
                }
                dynasm!(self.ops ; .arch aarch64 ; =>top);
                self.ops(body)?;
                dynasm!(self.ops
                    ; .arch aarch64
                    ; sub XSP(c), XSP(c), 1
                    ; cbnz X(c), =>top
                    ; =>done
                );
            }
        }
        Ok(())
    }
}
