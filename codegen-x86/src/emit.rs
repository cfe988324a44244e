//! Program → x86-64 instructions, one match arm per operation.

use iced_x86::Register;
use smallgemm_ir::{
    narrowed_ops, transpose_add_operands, Addr, Dtype, Isa, Op, Program, Shuffle, Target, Trips,
    VReg,
};

use smallgemm_ir::MachineCode;

use crate::abi::{self, CallConv};
use crate::encode::{self as enc, Assembler, Cond, Evex, Label, Mem, Rm, VForm};
use crate::{regs, EmitError};

/// The instruction forms of one (ISA, dtype): vector ops are the same code with other opcodes.
#[derive(Clone, Copy)]
struct Forms {
    load: VForm,
    store: VForm,
    /// The non-temporal store (whole aligned vectors only).
    store_stream: VForm,
    masked_load: VForm,
    masked_store: VForm,
    broadcast: VForm,
    load_scalar: VForm,
    store_scalar: VForm,
    fma: VForm,
    fnma: VForm,
    add: VForm,
    sub: VForm,
    mul: VForm,
}

/// The forms for `bytes`-byte vectors: the full-width forms narrowed (xmm/ymm, VEX on AVX2,
/// EVEX under AVX-512VL), with the broadcasts that exist at each width.
fn forms(isa: Isa, dtype: Dtype, bytes: usize) -> Result<Forms, EmitError> {
    let full = full_forms(isa, dtype)?;
    if bytes == Target::new(isa).vector_bytes() {
        return Ok(full);
    }
    if !Target::new(isa).vector_widths().contains(&bytes) {
        return Err(EmitError::Unsupported("this vector width", isa));
    }
    let w = |f: VForm| f.with_width(bytes);
    let broadcast = match (isa, dtype, bytes) {
        (Isa::Avx2, Dtype::F64, _) => enc::VEX_VMOVDDUP_XMM_M64,
        (Isa::Avx2, _, _) => enc::VEX_VBROADCASTSS_XMM_M32,
        (_, Dtype::F64, 16) => enc::EVEX_VMOVDDUP_XMM_M64,
        (_, Dtype::F64, _) => enc::EVEX_VBROADCASTSD_YMM_M64,
        (_, _, 16) => enc::EVEX_VBROADCASTSS_XMM_M32,
        _ => enc::EVEX_VBROADCASTSS_YMM_M32,
    };
    Ok(Forms {
        load: w(full.load),
        store: w(full.store),
        store_stream: w(full.store_stream),
        masked_load: w(full.masked_load),
        masked_store: w(full.masked_store),
        broadcast,
        load_scalar: full.load_scalar,
        store_scalar: full.store_scalar,
        fma: w(full.fma),
        fnma: w(full.fnma),
        add: w(full.add),
        sub: w(full.sub),
        mul: w(full.mul),
    })
}

/// The forms for the ISA's widest vectors.
fn full_forms(isa: Isa, dtype: Dtype) -> Result<Forms, EmitError> {
    use enc::*;
    Ok(match (isa, dtype) {
        (Isa::Avx2, Dtype::F64) => Forms {
            load: VEX_VMOVUPD_YMM_M256,
            store: VEX_VMOVUPD_M256_YMM,
            store_stream: VEX_VMOVNTPD_M256_YMM,
            masked_load: VEX_VMASKMOVPD_YMM_YMM_M256,
            masked_store: VEX_VMASKMOVPD_M256_YMM_YMM,
            broadcast: VEX_VBROADCASTSD_YMM_M64,
            load_scalar: VEX_VMOVSD_XMM_M64,
            store_scalar: VEX_VMOVSD_M64_XMM,
            fma: VEX_VFMADD231PD_YMM,
            fnma: VEX_VFNMADD231PD_YMM,
            add: VEX_VADDPD_YMM,
            sub: VEX_VSUBPD_YMM,
            mul: VEX_VMULPD_YMM,
        },
        (Isa::Avx2, Dtype::F32) => Forms {
            load: VEX_VMOVUPS_YMM_M256,
            store: VEX_VMOVUPS_M256_YMM,
            store_stream: VEX_VMOVNTPS_M256_YMM,
            masked_load: VEX_VMASKMOVPS_YMM_YMM_M256,
            masked_store: VEX_VMASKMOVPS_M256_YMM_YMM,
            broadcast: VEX_VBROADCASTSS_YMM_M32,
            load_scalar: VEX_VMOVSS_XMM_M32,
            store_scalar: VEX_VMOVSS_M32_XMM,
            fma: VEX_VFMADD231PS_YMM,
            fnma: VEX_VFNMADD231PS_YMM,
            add: VEX_VADDPS_YMM,
            sub: VEX_VSUBPS_YMM,
            mul: VEX_VMULPS_YMM,
        },
        (Isa::Avx512, Dtype::F64) => Forms {
            load: EVEX_VMOVUPD_ZMM_M512,
            store: EVEX_VMOVUPD_M512_ZMM,
            store_stream: EVEX_VMOVNTPD_M512_ZMM,
            masked_load: EVEX_VMOVUPD_ZMM_M512,
            masked_store: EVEX_VMOVUPD_M512_ZMM,
            broadcast: EVEX_VBROADCASTSD_ZMM_M64,
            load_scalar: EVEX_VMOVSD_XMM_M64,
            store_scalar: EVEX_VMOVSD_M64_XMM,
            fma: EVEX_VFMADD231PD_ZMM,
            fnma: EVEX_VFNMADD231PD_ZMM,
            add: EVEX_VADDPD_ZMM,
            sub: EVEX_VSUBPD_ZMM,
            mul: EVEX_VMULPD_ZMM,
        },
        (Isa::Avx512, Dtype::F32) => Forms {
            load: EVEX_VMOVUPS_ZMM_M512,
            store: EVEX_VMOVUPS_M512_ZMM,
            store_stream: EVEX_VMOVNTPS_M512_ZMM,
            masked_load: EVEX_VMOVUPS_ZMM_M512,
            masked_store: EVEX_VMOVUPS_M512_ZMM,
            broadcast: EVEX_VBROADCASTSS_ZMM_M32,
            load_scalar: EVEX_VMOVSS_XMM_M32,
            store_scalar: EVEX_VMOVSS_M32_XMM,
            fma: EVEX_VFMADD231PS_ZMM,
            fnma: EVEX_VFNMADD231PS_ZMM,
            add: EVEX_VADDPS_ZMM,
            sub: EVEX_VSUBPS_ZMM,
            mul: EVEX_VMULPS_ZMM,
        },
        (_, Dtype::F16) => return Err(EmitError::Unsupported("f16", isa)),
        (Isa::Neon, _) => return Err(EmitError::Unsupported("the x86-64 backend", isa)),
    })
}

/// The lane-packed kernels' permute within groups of four lanes of `bytes`-byte vectors
/// (None where the width has none).
fn permute_form(isa: Isa, dtype: Dtype, bytes: usize) -> Option<VForm> {
    use enc::*;
    let evex = isa == Isa::Avx512;
    match (dtype, evex) {
        (Dtype::F32, true) => Some(EVEX_VPERMILPS_ZMM_IMM8.with_width(bytes)),
        (Dtype::F32, false) => Some(VEX_VPERMILPS_YMM_IMM8.with_width(bytes)),
        // vpermpd has no 128-bit form.
        (Dtype::F64, _) if bytes == 16 => None,
        (Dtype::F64, true) => Some(EVEX_VPERMPD_ZMM_IMM8.with_width(bytes)),
        (Dtype::F64, false) => Some(VEX_VPERMPD_YMM_IMM8.with_width(bytes)),
        (Dtype::F16, _) => None,
    }
}

/// The broadcast of a group of `group` elements from memory into every group of a
/// `bytes`-byte vector (`Op::BroadcastGroup`), where one instruction does it.
fn group_broadcast_form(isa: Isa, dtype: Dtype, bytes: usize, group: u8) -> Option<VForm> {
    use enc::*;
    let evex = isa == Isa::Avx512;
    let group_bytes = group as usize * dtype.size();
    match (dtype, group_bytes, bytes, evex) {
        (Dtype::F32, 16, 32, false) => Some(VEX_VBROADCASTF128_YMM_M128),
        (Dtype::F32, 16, 32 | 64, true) => Some(EVEX_VBROADCASTF32X4_ZMM_M128.with_width(bytes)),
        (Dtype::F32, 32, 64, true) => Some(EVEX_VBROADCASTF32X8_ZMM_M256),
        // Two f32 are one f64's bits.
        (Dtype::F32, 8, 32, false) => Some(VEX_VBROADCASTSD_YMM_M64),
        (Dtype::F32, 8, 32, true) => Some(EVEX_VBROADCASTSD_YMM_M64),
        (Dtype::F32, 8, 64, true) => Some(EVEX_VBROADCASTSD_ZMM_M64),
        (Dtype::F64, 16, 64, true) => Some(EVEX_VBROADCASTF64X2_ZMM_M128),
        (Dtype::F64, 32, 64, true) => Some(EVEX_VBROADCASTF64X4_ZMM_M256),
        _ => None,
    }
}

/// The insert of a group of `group` elements from memory into a `bytes`-byte vector that
/// has more than one such group (`Op::InsertGroup`).
fn insert_form(isa: Isa, dtype: Dtype, bytes: usize, group: u8) -> Option<VForm> {
    use enc::*;
    let group_bytes = group as usize * dtype.size();
    match (dtype, group_bytes, bytes, isa == Isa::Avx512) {
        (Dtype::F32, 16, 32, false) => Some(VEX_VINSERTF128_YMM_M128),
        (Dtype::F32, 16, 32 | 64, true) => Some(EVEX_VINSERTF32X4_ZMM_M128.with_width(bytes)),
        (Dtype::F32, 32, 64, true) => Some(EVEX_VINSERTF32X8_ZMM_M256),
        (Dtype::F64, 16, 64, true) => Some(EVEX_VINSERTF64X2_ZMM_M128),
        (Dtype::F64, 32, 64, true) => Some(EVEX_VINSERTF64X4_ZMM_M256),
        _ => None,
    }
}

/// The (lo, hi) shuffles of a transpose-add (`Op::TransposeAdd`), on AVX-512 only, where
/// its operands define it (`transpose_add_operands`). Both emitters ask here.
pub(crate) fn transpose_add(
    isa: Isa,
    program: &Program,
    dst: VReg,
    a: VReg,
    b: VReg,
    tmp: VReg,
    width: u8,
) -> Result<[Shuffle; 2], EmitError> {
    let operands = [dst, a, b, tmp];
    let (elt, bytes) = (program.dtype.size(), program.vector_bytes());
    let isa_has = |b| isa == Isa::Avx512 && b == 64 || isa == Isa::Avx2 && b == 32;
    match transpose_add_operands(elt, bytes, operands, width) {
        Some(s) if isa_has(bytes) => Ok(s),
        _ => Err(EmitError::Unsupported("this transpose-add", isa)),
    }
}

/// One move of an `Op::StorePieces`, at a byte offset from its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// The low 32 bytes of a zmm (vmovupd / vmovups ymm; AVX-512).
    Low32,
    /// The upper 256 bits of the zmm moved down into its low half, so the pieces after it
    /// take lanes from there (vextractf64x4 into the source register itself; AVX-512).
    MoveHigh256Down,
    /// The low 16 bytes (vmovupd / vmovups).
    Low16,
    /// The upper 128 bits of the ymm moved down into its low half, so the pieces after it
    /// take lanes from there (vextractf128, or vextractf32x4 on AVX-512, into the source
    /// register itself).
    MoveHighDown,
    /// The low 8 bytes (vmovsd, also for two f32 lanes).
    Low8,
    /// One f32 lane of the low 128 bits: lane 0 (vmovss) or 2 (vextractps).
    Lane4(u8),
}

/// The moves that store the first `bytes` bytes (a multiple of 4, under a vector: 32 on
/// AVX2, 64 on AVX-512) of a vector register, each with its byte offset: largest first, so
/// that each upper half is brought down at most once. Both emitters ask here. None for
/// other sizes.
pub(crate) fn store_pieces(isa: Isa, bytes: usize) -> Option<Vec<(i32, Piece)>> {
    let vector = match isa {
        Isa::Avx2 => 32,
        Isa::Avx512 => 64,
        Isa::Neon => return None,
    };
    if bytes == 0 || bytes >= vector || bytes % 4 != 0 {
        return None;
    }
    let mut pieces = Vec::with_capacity(6);
    let mut at = 0;
    for (size, low, move_down) in [
        (32, Piece::Low32, Piece::MoveHigh256Down),
        (16, Piece::Low16, Piece::MoveHighDown),
    ] {
        if bytes - at >= size {
            pieces.push((at as i32, low));
            at += size;
            if bytes > at {
                pieces.push((at as i32, move_down));
            }
        }
    }
    if bytes - at >= 8 {
        pieces.push((at as i32, Piece::Low8));
        at += 8;
    }
    if bytes > at {
        pieces.push((at as i32, Piece::Lane4((at % 16 / 4) as u8)));
    }
    Some(pieces)
}

/// Full permutes (`Indices`, `PermuteVar`) exist for 512-bit f32 and f64 vectors only: the
/// kernels that use them are lane-packed 3x3x3. Both emitters ask here.
pub(crate) fn full_permutes(isa: Isa, program: &Program) -> Result<(), EmitError> {
    let wide = matches!(
        (program.dtype, program.lanes),
        (Dtype::F32, 16) | (Dtype::F64, 8)
    );
    if isa == Isa::Avx512 && wide {
        Ok(())
    } else {
        Err(EmitError::Unsupported("this width of full permute", isa))
    }
}

/// The immediate of `vpermilps` / `vpermpd` for a selection within groups of four lanes.
fn permute_imm(select: [u8; 4]) -> Result<u8, EmitError> {
    if select.iter().any(|&t| t >= 4) {
        return Err(EmitError::Encoder(format!("lane selection {select:?}")));
    }
    Ok(select
        .iter()
        .enumerate()
        .fold(0, |imm, (i, &t)| imm | t << (2 * i)))
}

/// The address of a piece `offset` bytes into a store at `addr`.
pub(crate) fn piece_addr(addr: Addr, offset: i32) -> Result<Addr, EmitError> {
    let offset = addr
        .offset
        .checked_add(offset)
        .ok_or_else(|| EmitError::Encoder(format!("offset {} + {offset}", addr.offset)))?;
    Ok(Addr { offset, ..addr })
}

/// Scalar moves have shorter VEX forms while the register is below 16.
fn vex_scalar(dtype: Dtype, load: bool) -> VForm {
    match (dtype, load) {
        (Dtype::F64, true) => enc::VEX_VMOVSD_XMM_M64,
        (Dtype::F64, false) => enc::VEX_VMOVSD_M64_XMM,
        // f16 programs are rejected by `forms` before any operation is emitted.
        (_, true) => enc::VEX_VMOVSS_XMM_M32,
        (_, false) => enc::VEX_VMOVSS_M32_XMM,
    }
}

pub(crate) struct Emitter<'a> {
    asm: Assembler,
    program: &'a Program,
    isa: Isa,
    conv: CallConv,
    /// Bytes from rbp up to the stack pointer at entry (when the kernel has a frame).
    entry_offset: i32,
    forms: Forms,
    /// The 16- and 32-byte forms of narrow tails, made on first use: a kernel has many
    /// narrow operations, and making the forms each time showed in the compile time.
    narrow_forms: [Option<Forms>; 2],
    /// AVX2 tail masks: (label of the constant, enabled lanes).
    mask_constants: Vec<(Label, u32)>,
    /// Index vectors of full permutes, as bytes (zero-extended by the load; f64 uses the
    /// first eight).
    index_constants: Vec<(Label, [u8; 16])>,
    /// Whether a non-temporal store was emitted (the body then ends with a fence): noted as
    /// the stores go out, since walking the program again for them cost 7% of a compile.
    stored_streaming: bool,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(program: &'a Program, isa: Isa, conv: CallConv) -> Result<Self, EmitError> {
        Ok(Emitter {
            // Instructions are 4 to 11 bytes: room for all of them, so the buffer is not
            // regrown and copied midway.
            asm: Assembler::with_capacity(256 + 12 * count_ops(&program.ops)),
            program,
            isa,
            conv,
            entry_offset: 0,
            forms: forms(isa, program.dtype, program.vector_bytes())?,
            narrow_forms: [None; 2],
            mask_constants: Vec::new(),
            index_constants: Vec::new(),
            stored_streaming: false,
        })
    }

    /// Prologue, the program's operations, epilogue.
    pub(crate) fn body(&mut self) -> Result<(), EmitError> {
        let program = self.program;
        let general = self.conv.general();
        if program.gprs > general.len() {
            return Err(EmitError::TooManyGeneralRegisters {
                needed: program.gprs,
                available: general.len(),
            });
        }
        let pushed: Vec<u8> = general[..program.gprs]
            .iter()
            .copied()
            .filter(|&r| self.conv.is_callee_saved(r))
            .map(gp)
            .collect();
        let saved_vectors: Vec<usize> = self
            .conv
            .callee_saved_vectors()
            .filter(|&v| v < program.vregs)
            .collect();
        let scratch = (program.scratch_bytes as i32 + 63) / 64 * 64;
        let frame = scratch > 0 || !saved_vectors.is_empty();
        for &r in &pushed {
            self.asm.push(r);
        }
        if frame {
            // rbp = the stack pointer after the pushes; rsp = a 64-byte aligned area below it:
            // scratch memory first, then the saved vector registers.
            self.asm.push(enc::RBP);
            self.asm.mov_r64_rm64(enc::RBP, Rm::Reg(enc::RSP));
            self.asm.and64_imm8(enc::RSP, -64);
            self.asm
                .sub64_imm32(enc::RSP, scratch + 16 * saved_vectors.len() as i32);
            // Stack arguments sit above the return address, the pushes and rbp's slot.
            self.entry_offset = 8 * (pushed.len() as i32 + 1);
        }
        // The slots keep a disp8 even at offset 0, as the iced path encoded them.
        for (i, &v) in saved_vectors.iter().enumerate() {
            let slot = Mem::with_disp(enc::RSP, scratch + 16 * i as i32);
            let no = Evex::default();
            self.asm
                .vec(enc::VEX_VMOVDQU_M128_XMM, v as u8, 0, Rm::Mem(slot), no);
        }
        self.ops(&program.ops)?;
        if self.stored_streaming {
            // Non-temporal stores are weakly ordered: without the fence a lock or atomic the
            // caller releases after the call would not order them (threads of a split batch).
            self.asm.sfence();
        }
        for (i, &v) in saved_vectors.iter().enumerate() {
            let slot = Mem::with_disp(enc::RSP, scratch + 16 * i as i32);
            let no = Evex::default();
            self.asm
                .vec(enc::VEX_VMOVDQU_XMM_M128, v as u8, 0, Rm::Mem(slot), no);
        }
        if frame {
            self.asm.mov_r64_rm64(enc::RSP, Rm::Reg(enc::RBP));
            self.asm.pop(enc::RBP);
        }
        for &r in pushed.iter().rev() {
            self.asm.pop(r);
        }
        self.asm.vzeroupper();
        self.asm.ret();
        Ok(())
    }

    /// Appends the constants and resolves labels.
    pub(crate) fn finish(mut self) -> Result<MachineCode, EmitError> {
        let program = self.program;
        let code_len = self.asm.len();
        let lanes = program.lanes as u32;
        for &(label, enabled) in &self.mask_constants {
            self.asm.bind(label);
            for i in 0..lanes {
                let on = i < enabled;
                match program.dtype {
                    Dtype::F64 => self.asm.bytes(&[if on { 0xFF } else { 0 }; 8]),
                    Dtype::F32 | Dtype::F16 => self.asm.bytes(&[if on { 0xFF } else { 0 }; 4]),
                }
            }
        }
        let index_bytes = program.lanes.min(16);
        for &(label, indices) in &self.index_constants {
            self.asm.bind(label);
            self.asm.bytes(&indices[..index_bytes]);
        }
        let bytes = self
            .asm
            .finish()
            .map_err(|e| EmitError::Encoder(format!("{e:?}")))?;
        Ok(MachineCode { bytes, code_len })
    }

    fn ops(&mut self, ops: &[Op]) -> Result<(), EmitError> {
        for unit in narrowed_ops(ops) {
            let (bytes, op) = unit.map_err(|_| EmitError::StrayNarrow)?;
            let Some(bytes) = bytes else {
                self.op(op)?;
                continue;
            };
            if let Op::TransposeAdd { .. } = op {
                return Err(EmitError::Unsupported("a narrowed transpose-add", self.isa));
            }
            let narrow = self.narrow_forms(bytes as usize)?;
            let full = std::mem::replace(&mut self.forms, narrow);
            let result = self.op(op);
            self.forms = full;
            result?;
        }
        Ok(())
    }

    fn gpr(&self, g: smallgemm_ir::Gpr) -> Result<u8, EmitError> {
        Ok(gp(regs::general(
            self.conv.general(),
            self.program.gprs,
            g,
        )?))
    }

    fn mem(&self, addr: Addr) -> Result<Rm, EmitError> {
        Ok(Rm::Mem(Mem::new(self.gpr(addr.base)?, addr.offset)))
    }

    fn v(&self, r: VReg) -> Result<u8, EmitError> {
        if r.0 as usize >= self.program.vregs {
            return Err(EmitError::TooManyVectorRegisters(r.0 as usize + 1));
        }
        Ok(r.0)
    }

    /// A vector instruction without EVEX extras.
    #[inline(always)]
    fn vec(&mut self, f: VForm, reg: u8, vvvv: u8, rm: Rm) {
        self.asm.vec(f, reg, vvvv, rm, Evex::default());
    }

    /// Applies a tail mask to a load or store: an opmask on AVX-512, or the vmaskmov form
    /// with the mask's vector register on AVX2 — unless the enabled lanes are exactly 4, 8,
    /// 16 or 32 bytes, which a plain move of that size loads (zeroing the lanes above, as
    /// every VEX/EVEX load does) or stores: no mask, and a store that forwards to the loads
    /// after it.
    fn masked(
        &mut self,
        store: bool,
        reg: u8,
        mem: Rm,
        mask: smallgemm_ir::Mask,
    ) -> Result<(), EmitError> {
        if let Some(form) = self.exact_move(store, reg, mask) {
            self.vec(form, reg, 0, mem);
            return Ok(());
        }
        match self.isa {
            Isa::Avx512 => {
                let k = opmask(mask.0)?;
                let (code, zeroing) = if store {
                    (self.forms.masked_store, false)
                } else {
                    (self.forms.masked_load, true)
                };
                let extras = Evex {
                    mask: k,
                    zeroing,
                    broadcast: false,
                };
                self.asm.vec(code, reg, 0, mem, extras);
                Ok(())
            }
            Isa::Neon => Err(EmitError::Unsupported("the x86-64 backend", self.isa)),
            Isa::Avx2 => {
                let m = self
                    .program
                    .mask_vreg(mask)
                    .ok_or(EmitError::MaskWithoutRegister(mask.0))?;
                let m = self.v(m)?;
                let code = if store {
                    self.forms.masked_store
                } else {
                    self.forms.masked_load
                };
                self.vec(code, reg, m, mem);
                Ok(())
            }
        }
    }

    /// The plain move that loads or stores exactly the lanes `mask` enables, if one exists.
    fn exact_move(&self, store: bool, reg: u8, mask: smallgemm_ir::Mask) -> Option<VForm> {
        let lanes = self.program.masks.iter().find(|d| d.mask == mask)?.lanes;
        if !exact_tail(self.program, lanes) {
            return None;
        }
        let dtype = self.program.dtype;
        let bytes = lanes as usize * dtype.size();
        let evex = reg >= 16;
        Some(match (bytes, store, evex) {
            (4, false, false) => enc::VEX_VMOVSS_XMM_M32,
            (4, true, false) => enc::VEX_VMOVSS_M32_XMM,
            (4, false, true) => enc::EVEX_VMOVSS_XMM_M32,
            (4, true, true) => enc::EVEX_VMOVSS_M32_XMM,
            (8, false, false) => enc::VEX_VMOVSD_XMM_M64,
            (8, true, false) => enc::VEX_VMOVSD_M64_XMM,
            (8, false, true) => enc::EVEX_VMOVSD_XMM_M64,
            (8, true, true) => enc::EVEX_VMOVSD_M64_XMM,
            (16 | 32, _, _) => {
                let f = full_forms(self.isa, dtype).ok()?;
                let f = if store { f.store } else { f.load };
                f.with_width(bytes)
            }
            _ => return None,
        })
    }

    fn narrow_forms(&mut self, bytes: usize) -> Result<Forms, EmitError> {
        let slot = match bytes {
            16 => 0,
            32 => 1,
            _ => return forms(self.isa, self.program.dtype, bytes),
        };
        if let Some(forms) = self.narrow_forms[slot] {
            return Ok(forms);
        }
        let made = forms(self.isa, self.program.dtype, bytes)?;
        self.narrow_forms[slot] = Some(made);
        Ok(made)
    }

    fn op(&mut self, op: &Op) -> Result<(), EmitError> {
        let f = &self.forms;
        let (fma, fnma, add, sub, mul) = (f.fma, f.fnma, f.add, f.sub, f.mul);
        let (load, store, broadcast) = (f.load, f.store, f.broadcast);
        let dtype = self.program.dtype;
        match *op {
            Op::Zero { dst } => {
                // The xmm forms zero the whole register and are recognised as zero idioms.
                let x = self.v(dst)?;
                let form = if x < 16 {
                    enc::VEX_VXORPS_XMM
                } else {
                    enc::EVEX_VPXORD_XMM
                };
                self.vec(form, x, x, Rm::Reg(x));
            }
            Op::Load { dst, addr, mask } => {
                let (r, m) = (self.v(dst)?, self.mem(addr)?);
                match mask {
                    None => self.vec(load, r, 0, m),
                    Some(mask) => self.masked(false, r, m, mask)?,
                }
            }
            Op::Store { addr, src, mask } => {
                let (r, m) = (self.v(src)?, self.mem(addr)?);
                match mask {
                    None => self.vec(store, r, 0, m),
                    Some(mask) => self.masked(true, r, m, mask)?,
                }
            }
            Op::StoreStream { addr, src } => {
                let (r, m) = (self.v(src)?, self.mem(addr)?);
                self.vec(self.forms.store_stream, r, 0, m);
                self.stored_streaming = true;
            }
            Op::StorePieces { addr, src, lanes } => {
                let r = self.v(src)?;
                let bytes = lanes as usize * dtype.size();
                let pieces = store_pieces(self.isa, bytes)
                    .ok_or(EmitError::Unsupported("this store in pieces", self.isa))?;
                let store = full_forms(self.isa, dtype)?.store;
                // AVX-512 kernels use registers above 15, which only EVEX reaches.
                let [extract128, low8, lane0, lane] = if self.isa == Isa::Avx512 {
                    [
                        enc::EVEX_VEXTRACTF32X4_XMM_YMM_IMM8,
                        enc::EVEX_VMOVSD_M64_XMM,
                        enc::EVEX_VMOVSS_M32_XMM,
                        enc::EVEX_VEXTRACTPS_M32_XMM_IMM8,
                    ]
                } else {
                    [
                        enc::VEX_VEXTRACTF128_XMM_YMM_IMM8,
                        enc::VEX_VMOVSD_M64_XMM,
                        enc::VEX_VMOVSS_M32_XMM,
                        enc::VEX_VEXTRACTPS_M32_XMM_IMM8,
                    ]
                };
                for (offset, piece) in pieces {
                    let m = self.mem(piece_addr(addr, offset)?)?;
                    let no = Evex::default();
                    let to_self = |asm: &mut Assembler, form, imm| {
                        asm.vec_imm8(form, r, 0, Rm::Reg(r), no, imm)
                    };
                    match piece {
                        Piece::Low32 => self.vec(store.with_width(32), r, 0, m),
                        Piece::MoveHigh256Down => {
                            to_self(&mut self.asm, enc::EVEX_VEXTRACTF64X4_YMM_ZMM_IMM8, 1)
                        }
                        Piece::Low16 => self.vec(store.with_width(16), r, 0, m),
                        Piece::MoveHighDown => to_self(&mut self.asm, extract128, 1),
                        Piece::Low8 => self.vec(low8, r, 0, m),
                        Piece::Lane4(0) => self.vec(lane0, r, 0, m),
                        Piece::Lane4(l) => self.asm.vec_imm8(lane, r, 0, m, no, l),
                    }
                }
            }
            Op::Broadcast { dst, addr } => {
                let (r, m) = (self.v(dst)?, self.mem(addr)?);
                self.vec(broadcast, r, 0, m);
            }
            Op::BroadcastGroup { dst, addr, lanes } => {
                let bytes = self.program.vector_bytes();
                let form = group_broadcast_form(self.isa, dtype, bytes, lanes).ok_or(
                    EmitError::Unsupported("this width of group broadcast", self.isa),
                )?;
                let (r, m) = (self.v(dst)?, self.mem(addr)?);
                self.vec(form, r, 0, m);
            }
            Op::Permute { dst, src, select } => {
                let bytes = self.program.vector_bytes();
                let form = permute_form(self.isa, dtype, bytes)
                    .ok_or(EmitError::Unsupported("this width of permute", self.isa))?;
                let (dst, src) = (self.v(dst)?, self.v(src)?);
                let imm = permute_imm(select)?;
                self.asm
                    .vec_imm8(form, dst, 0, Rm::Reg(src), Evex::default(), imm);
            }
            Op::Indices { dst, indices } => {
                full_permutes(self.isa, self.program)?;
                let r = self.v(dst)?;
                // The constant goes after the code; `finish` binds its label.
                let label = self.asm.new_label();
                self.index_constants.push((label, indices));
                let form = match dtype {
                    Dtype::F64 => enc::EVEX_VPMOVZXBQ_ZMM_M64,
                    _ => enc::EVEX_VPMOVZXBD_ZMM_M128,
                };
                self.asm.vec_rip(form, r, label);
            }
            Op::PermuteVar { dst, index, src } => {
                full_permutes(self.isa, self.program)?;
                let (dst, index, src) = (self.v(dst)?, self.v(index)?, self.v(src)?);
                let form = match dtype {
                    Dtype::F64 => enc::EVEX_VPERMPD_ZMM,
                    _ => enc::EVEX_VPERMPS_ZMM,
                };
                self.vec(form, dst, index, Rm::Reg(src));
            }
            Op::InsertGroup {
                dst,
                addr,
                group,
                lanes,
            } => {
                let bytes = self.program.vector_bytes();
                let form = insert_form(self.isa, dtype, bytes, lanes).ok_or(
                    EmitError::Unsupported("this width of group insert", self.isa),
                )?;
                let (r, m) = (self.v(dst)?, self.mem(addr)?);
                self.asm.vec_imm8(form, r, r, m, Evex::default(), group);
            }
            Op::LoadScalar { dst, addr } => {
                let (r, m) = (self.v(dst)?, self.mem(addr)?);
                let form = if r < 16 {
                    vex_scalar(dtype, true)
                } else {
                    self.forms.load_scalar
                };
                self.vec(form, r, 0, m);
            }
            Op::StoreScalar { addr, src } => {
                let (r, m) = (self.v(src)?, self.mem(addr)?);
                let form = if r < 16 {
                    vex_scalar(dtype, false)
                } else {
                    self.forms.store_scalar
                };
                self.vec(form, r, 0, m);
            }
            Op::Fma { acc, a, b, negate } => {
                let form = if negate { fnma } else { fma };
                let (acc, a, b) = (self.v(acc)?, self.v(a)?, self.v(b)?);
                self.vec(form, acc, a, Rm::Reg(b));
            }
            Op::FmaBroadcast { acc, a, b, negate } => {
                if self.isa != Isa::Avx512 {
                    return Err(EmitError::Unsupported(
                        "FMA with a broadcast operand",
                        self.isa,
                    ));
                }
                let form = if negate { fnma } else { fma };
                let (acc, a, m) = (self.v(acc)?, self.v(a)?, self.mem(b)?);
                let extras = Evex {
                    broadcast: true,
                    ..Evex::default()
                };
                self.asm.vec(form, acc, a, m, extras);
            }
            Op::FmaLane { .. } => {
                return Err(EmitError::Unsupported("FMA by element", self.isa));
            }
            Op::TransposeAdd {
                dst,
                a,
                b,
                tmp,
                width,
            } => {
                let [lo, hi] = transpose_add(self.isa, self.program, dst, a, b, tmp, width)?;
                let (dst, a, b, tmp) = (self.v(dst)?, self.v(a)?, self.v(b)?, self.v(tmp)?);
                // `transpose_add` gave Blocks only to AVX-512, Halves only to AVX2.
                let avx2 = self.isa == Isa::Avx2;
                for (shuffle, to) in [(hi, tmp), (lo, dst)] {
                    let (form, imm) = match (shuffle, dtype) {
                        (Shuffle::Blocks(imm), Dtype::F64) => (enc::EVEX_VSHUFF64X2_ZMM_IMM8, imm),
                        (Shuffle::Blocks(imm), _) => (enc::EVEX_VSHUFF32X4_ZMM_IMM8, imm),
                        (Shuffle::Halves(imm), _) => (enc::VEX_VPERM2F128_YMM_IMM8, imm),
                        (Shuffle::Elements(imm), Dtype::F64) if avx2 => {
                            (enc::VEX_VSHUFPD_YMM_IMM8, imm)
                        }
                        (Shuffle::Elements(imm), _) if avx2 => (enc::VEX_VSHUFPS_YMM_IMM8, imm),
                        (Shuffle::Elements(imm), Dtype::F64) => (enc::EVEX_VSHUFPD_ZMM_IMM8, imm),
                        (Shuffle::Elements(imm), _) => (enc::EVEX_VSHUFPS_ZMM_IMM8, imm),
                    };
                    self.asm
                        .vec_imm8(form, to, a, Rm::Reg(b), Evex::default(), imm);
                }
                self.vec(add, dst, dst, Rm::Reg(tmp));
            }
            Op::Add { dst, a, b } => {
                let (dst, a, b) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                self.vec(add, dst, a, Rm::Reg(b));
            }
            Op::Sub { dst, a, b } => {
                let (dst, a, b) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                self.vec(sub, dst, a, Rm::Reg(b));
            }
            Op::Mul { dst, a, b } => {
                let (dst, a, b) = (self.v(dst)?, self.v(a)?, self.v(b)?);
                self.vec(mul, dst, a, Rm::Reg(b));
            }
            // Tails that plain moves load and store exactly need no mask (`exact_move`).
            Op::SetMask { lanes, .. } if exact_tail(self.program, lanes) => {}
            Op::SetMask { mask, lanes } => match self.isa {
                Isa::Avx512 => {
                    let k = opmask(mask.0)?;
                    let bits = 1u32.checked_shl(lanes).map_or(u32::MAX, |b| b - 1);
                    let temp = gp(abi::TEMP);
                    self.asm.mov_r32_imm32(temp, bits);
                    self.vec(enc::VEX_KMOVW_K_R32, k, 0, Rm::Reg(temp));
                }
                Isa::Neon => {
                    return Err(EmitError::Unsupported("the x86-64 backend", self.isa));
                }
                Isa::Avx2 => {
                    let vreg = self
                        .program
                        .mask_vreg(mask)
                        .ok_or(EmitError::MaskWithoutRegister(mask.0))?;
                    let r = self.v(vreg)?;
                    if r >= 16 {
                        return Err(EmitError::Unsupported("a mask above ymm15", self.isa));
                    }
                    // The constant goes after the code; `finish` binds its label.
                    let label = self.asm.new_label();
                    self.mask_constants.push((label, lanes));
                    let form = if self.program.vector_bytes() == 16 {
                        enc::VEX_VMOVDQU_XMM_M128
                    } else {
                        enc::VEX_VMOVDQU_YMM_M256
                    };
                    self.asm.vec_rip(form, r, label);
                }
            },
            Op::StoreParam { param, addr } => {
                let index = self
                    .program
                    .params
                    .iter()
                    .position(|p| *p == param)
                    .ok_or(EmitError::UnknownParam)?;
                let to = self.mem(addr)?;
                match self.conv.float_argument(index) {
                    abi::ArgumentLocation::Register(x) => {
                        let x = (x as u32 - Register::XMM0 as u32) as u8;
                        self.vec(vex_scalar(dtype, false), x, 0, to);
                    }
                    abi::ArgumentLocation::Stack(offset) => {
                        // Copy the argument's slot through the temporary register; rbp is
                        // `entry_offset` bytes below the stack pointer at entry.
                        let from = Rm::Mem(Mem::with_disp(enc::RBP, self.entry_offset + offset));
                        let temp = gp(abi::TEMP);
                        match dtype {
                            Dtype::F64 => {
                                self.asm.mov_r64_rm64(temp, from);
                                self.asm.mov_rm64_r64(to, temp);
                            }
                            _ => {
                                self.asm.mov_r32_rm32(temp, from);
                                self.asm.mov_rm32_r32(to, temp);
                            }
                        }
                    }
                }
            }
            Op::StoreConst { value, addr } => {
                let base = self.gpr(addr.base)?;
                let bits = value.to_bits();
                let words: &[u32] = match dtype {
                    Dtype::F64 => &[bits as u32, (bits >> 32) as u32],
                    Dtype::F32 | Dtype::F16 => &[(value as f32).to_bits()],
                };
                for (w, &word) in words.iter().enumerate() {
                    let at = Mem::new(base, addr.offset.wrapping_add(4 * w as i32));
                    self.asm.mov_m32_imm32(at, word);
                }
            }
            Op::LoadAddress { dst, addr } => {
                let (dst, m) = (self.gpr(dst)?, self.mem(addr)?);
                self.asm.mov_r64_rm64(dst, m);
            }
            Op::Prefetch { addr } => {
                let m = self.mem(addr)?;
                self.asm.prefetcht0(m);
            }
            Op::Copy { dst, src } => {
                let (dst, src) = (self.gpr(dst)?, self.gpr(src)?);
                self.asm.mov_r64_rm64(dst, Rm::Reg(src));
            }
            Op::AddImm { dst, imm } => {
                let dst = self.gpr(dst)?;
                match i8::try_from(imm) {
                    Ok(imm8) => self.asm.add64_imm8(dst, imm8),
                    Err(_) => self.asm.add64_imm32(dst, imm),
                }
            }
            // `ops` applies a prefix to the operation after it.
            Op::Narrow { .. } => return Err(EmitError::StrayNarrow),
            Op::Loop {
                counter,
                trips,
                ref body,
            } => {
                let counter = self.gpr(counter)?;
                let top = self.asm.new_label();
                let done = self.asm.new_label();
                if let Trips::RegisterBy(step) = trips {
                    // counter -= step before each trip; a borrow means fewer than step were
                    // left, and adding it back leaves the remainder.
                    let step = i8::try_from(step)
                        .map_err(|_| EmitError::Unsupported("a batch step above 127", self.isa))?;
                    self.asm.sub64_imm8(counter, step);
                    self.asm.jcc(Cond::B, done);
                    self.asm.bind(top);
                    self.ops(body)?;
                    self.asm.sub64_imm8(counter, step);
                    self.asm.jcc(Cond::Ae, top);
                    self.asm.bind(done);
                    self.asm.add64_imm8(counter, step);
                    return Ok(());
                }
                match trips {
                    // Writing the 32-bit register zero-extends into the counter.
                    Trips::Const(n) => self.asm.mov_r32_imm32(counter, n),
                    Trips::Register | Trips::RegisterBy(_) => {
                        self.asm.test64(counter, counter);
                        self.asm.jcc(Cond::Z, done);
                    }
                }
                self.asm.bind(top);
                self.ops(body)?;
                self.asm.dec64(counter);
                self.asm.jcc(Cond::Nz, top);
                if trips == Trips::Register {
                    self.asm.bind(done);
                }
            }
        }
        Ok(())
    }
}

/// Whether `lanes` lanes (fewer than a vector) are 4, 8, 16 or 32 bytes: a plain move
/// loads or stores them exactly, with no mask.
pub(crate) fn exact_tail(program: &Program, lanes: u32) -> bool {
    let elt = program.dtype.size();
    let bytes = lanes as usize * elt;
    bytes < program.vector_bytes() && matches!(bytes, 4 | 8 | 16 | 32)
}

/// Operations in `ops`, loop bodies included once.
fn count_ops(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Loop { body, .. } => 1 + count_ops(body),
            _ => 1,
        })
        .sum()
}

/// The encoding number of a 64-bit general register (rax = 0 … r15 = 15).
fn gp(r: Register) -> u8 {
    (r as u32 - Register::RAX as u32) as u8
}

/// The opmask register number for mask `i` (k0 means "no mask", so masks start at k1).
fn opmask(i: u8) -> Result<u8, EmitError> {
    let k = regs::opmask(i)?;
    Ok((k as u32 - Register::K0 as u32) as u8)
}
