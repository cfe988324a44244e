//! The iced-x86 code path this crate used before `encode.rs`: Program → iced `Instruction`s →
//! CodeAssembler. Test-only, as the oracle the direct encoder must match byte for byte.

use iced_x86::code_asm::registers::{xmm as xmm_regs, ymm, zmm};
use iced_x86::code_asm::{qword_ptr, xmmword_ptr, ymmword_ptr, CodeAssembler, CodeLabel};
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use smallgemm_ir::{narrowed_ops, Addr, Dtype, Isa, Op, Program, Shuffle, Trips, VReg};

use smallgemm_ir::MachineCode;

use crate::abi::{self, CallConv};
use crate::{regs, EmitError};

/// The instruction forms of one (ISA, dtype): vector ops are the same code with other opcodes.
struct Forms {
    load: Code,
    store: Code,
    masked_load: Code,
    masked_store: Code,
    broadcast: Code,
    load_scalar: Code,
    store_scalar: Code,
    fma: Code,
    fnma: Code,
    add: Code,
    sub: Code,
    mul: Code,
}

/// The forms for `bytes`-byte vectors.
fn forms(isa: Isa, dtype: Dtype, bytes: usize) -> Result<Forms, EmitError> {
    use Code::*;
    let narrow = |load, store, masked_load, masked_store, broadcast, fma, fnma, add, sub, mul| {
        let full = full_forms(isa, dtype)?;
        Ok(Forms {
            load,
            store,
            masked_load,
            masked_store,
            broadcast,
            load_scalar: full.load_scalar,
            store_scalar: full.store_scalar,
            fma,
            fnma,
            add,
            sub,
            mul,
        })
    };
    match (isa, dtype, bytes) {
        (Isa::Avx2, Dtype::F64, 16) => narrow(
            VEX_Vmovupd_xmm_xmmm128,
            VEX_Vmovupd_xmmm128_xmm,
            VEX_Vmaskmovpd_xmm_xmm_m128,
            VEX_Vmaskmovpd_m128_xmm_xmm,
            VEX_Vmovddup_xmm_xmmm64,
            VEX_Vfmadd231pd_xmm_xmm_xmmm128,
            VEX_Vfnmadd231pd_xmm_xmm_xmmm128,
            VEX_Vaddpd_xmm_xmm_xmmm128,
            VEX_Vsubpd_xmm_xmm_xmmm128,
            VEX_Vmulpd_xmm_xmm_xmmm128,
        ),
        (Isa::Avx2, Dtype::F32, 16) => narrow(
            VEX_Vmovups_xmm_xmmm128,
            VEX_Vmovups_xmmm128_xmm,
            VEX_Vmaskmovps_xmm_xmm_m128,
            VEX_Vmaskmovps_m128_xmm_xmm,
            VEX_Vbroadcastss_xmm_m32,
            VEX_Vfmadd231ps_xmm_xmm_xmmm128,
            VEX_Vfnmadd231ps_xmm_xmm_xmmm128,
            VEX_Vaddps_xmm_xmm_xmmm128,
            VEX_Vsubps_xmm_xmm_xmmm128,
            VEX_Vmulps_xmm_xmm_xmmm128,
        ),
        (Isa::Avx512, Dtype::F64, 16) => narrow(
            EVEX_Vmovupd_xmm_k1z_xmmm128,
            EVEX_Vmovupd_xmmm128_k1z_xmm,
            EVEX_Vmovupd_xmm_k1z_xmmm128,
            EVEX_Vmovupd_xmmm128_k1z_xmm,
            EVEX_Vmovddup_xmm_k1z_xmmm64,
            EVEX_Vfmadd231pd_xmm_k1z_xmm_xmmm128b64,
            EVEX_Vfnmadd231pd_xmm_k1z_xmm_xmmm128b64,
            EVEX_Vaddpd_xmm_k1z_xmm_xmmm128b64,
            EVEX_Vsubpd_xmm_k1z_xmm_xmmm128b64,
            EVEX_Vmulpd_xmm_k1z_xmm_xmmm128b64,
        ),
        (Isa::Avx512, Dtype::F64, 32) => narrow(
            EVEX_Vmovupd_ymm_k1z_ymmm256,
            EVEX_Vmovupd_ymmm256_k1z_ymm,
            EVEX_Vmovupd_ymm_k1z_ymmm256,
            EVEX_Vmovupd_ymmm256_k1z_ymm,
            EVEX_Vbroadcastsd_ymm_k1z_xmmm64,
            EVEX_Vfmadd231pd_ymm_k1z_ymm_ymmm256b64,
            EVEX_Vfnmadd231pd_ymm_k1z_ymm_ymmm256b64,
            EVEX_Vaddpd_ymm_k1z_ymm_ymmm256b64,
            EVEX_Vsubpd_ymm_k1z_ymm_ymmm256b64,
            EVEX_Vmulpd_ymm_k1z_ymm_ymmm256b64,
        ),
        (Isa::Avx512, Dtype::F32, 16) => narrow(
            EVEX_Vmovups_xmm_k1z_xmmm128,
            EVEX_Vmovups_xmmm128_k1z_xmm,
            EVEX_Vmovups_xmm_k1z_xmmm128,
            EVEX_Vmovups_xmmm128_k1z_xmm,
            EVEX_Vbroadcastss_xmm_k1z_xmmm32,
            EVEX_Vfmadd231ps_xmm_k1z_xmm_xmmm128b32,
            EVEX_Vfnmadd231ps_xmm_k1z_xmm_xmmm128b32,
            EVEX_Vaddps_xmm_k1z_xmm_xmmm128b32,
            EVEX_Vsubps_xmm_k1z_xmm_xmmm128b32,
            EVEX_Vmulps_xmm_k1z_xmm_xmmm128b32,
        ),
        (Isa::Avx512, Dtype::F32, 32) => narrow(
            EVEX_Vmovups_ymm_k1z_ymmm256,
            EVEX_Vmovups_ymmm256_k1z_ymm,
            EVEX_Vmovups_ymm_k1z_ymmm256,
            EVEX_Vmovups_ymmm256_k1z_ymm,
            EVEX_Vbroadcastss_ymm_k1z_xmmm32,
            EVEX_Vfmadd231ps_ymm_k1z_ymm_ymmm256b32,
            EVEX_Vfnmadd231ps_ymm_k1z_ymm_ymmm256b32,
            EVEX_Vaddps_ymm_k1z_ymm_ymmm256b32,
            EVEX_Vsubps_ymm_k1z_ymm_ymmm256b32,
            EVEX_Vmulps_ymm_k1z_ymm_ymmm256b32,
        ),
        _ => full_forms(isa, dtype),
    }
}

/// The forms for the ISA's widest vectors.
fn full_forms(isa: Isa, dtype: Dtype) -> Result<Forms, EmitError> {
    use Code::*;
    Ok(match (isa, dtype) {
        (Isa::Avx2, Dtype::F64) => Forms {
            load: VEX_Vmovupd_ymm_ymmm256,
            store: VEX_Vmovupd_ymmm256_ymm,
            masked_load: VEX_Vmaskmovpd_ymm_ymm_m256,
            masked_store: VEX_Vmaskmovpd_m256_ymm_ymm,
            broadcast: VEX_Vbroadcastsd_ymm_m64,
            load_scalar: VEX_Vmovsd_xmm_m64,
            store_scalar: VEX_Vmovsd_m64_xmm,
            fma: VEX_Vfmadd231pd_ymm_ymm_ymmm256,
            fnma: VEX_Vfnmadd231pd_ymm_ymm_ymmm256,
            add: VEX_Vaddpd_ymm_ymm_ymmm256,
            sub: VEX_Vsubpd_ymm_ymm_ymmm256,
            mul: VEX_Vmulpd_ymm_ymm_ymmm256,
        },
        (Isa::Avx2, Dtype::F32) => Forms {
            load: VEX_Vmovups_ymm_ymmm256,
            store: VEX_Vmovups_ymmm256_ymm,
            masked_load: VEX_Vmaskmovps_ymm_ymm_m256,
            masked_store: VEX_Vmaskmovps_m256_ymm_ymm,
            broadcast: VEX_Vbroadcastss_ymm_m32,
            load_scalar: VEX_Vmovss_xmm_m32,
            store_scalar: VEX_Vmovss_m32_xmm,
            fma: VEX_Vfmadd231ps_ymm_ymm_ymmm256,
            fnma: VEX_Vfnmadd231ps_ymm_ymm_ymmm256,
            add: VEX_Vaddps_ymm_ymm_ymmm256,
            sub: VEX_Vsubps_ymm_ymm_ymmm256,
            mul: VEX_Vmulps_ymm_ymm_ymmm256,
        },
        (Isa::Avx512, Dtype::F64) => Forms {
            load: EVEX_Vmovupd_zmm_k1z_zmmm512,
            store: EVEX_Vmovupd_zmmm512_k1z_zmm,
            masked_load: EVEX_Vmovupd_zmm_k1z_zmmm512,
            masked_store: EVEX_Vmovupd_zmmm512_k1z_zmm,
            broadcast: EVEX_Vbroadcastsd_zmm_k1z_xmmm64,
            load_scalar: EVEX_Vmovsd_xmm_k1z_m64,
            store_scalar: EVEX_Vmovsd_m64_k1_xmm,
            fma: EVEX_Vfmadd231pd_zmm_k1z_zmm_zmmm512b64_er,
            fnma: EVEX_Vfnmadd231pd_zmm_k1z_zmm_zmmm512b64_er,
            add: EVEX_Vaddpd_zmm_k1z_zmm_zmmm512b64_er,
            sub: EVEX_Vsubpd_zmm_k1z_zmm_zmmm512b64_er,
            mul: EVEX_Vmulpd_zmm_k1z_zmm_zmmm512b64_er,
        },
        (Isa::Avx512, Dtype::F32) => Forms {
            load: EVEX_Vmovups_zmm_k1z_zmmm512,
            store: EVEX_Vmovups_zmmm512_k1z_zmm,
            masked_load: EVEX_Vmovups_zmm_k1z_zmmm512,
            masked_store: EVEX_Vmovups_zmmm512_k1z_zmm,
            broadcast: EVEX_Vbroadcastss_zmm_k1z_xmmm32,
            load_scalar: EVEX_Vmovss_xmm_k1z_m32,
            store_scalar: EVEX_Vmovss_m32_k1_xmm,
            fma: EVEX_Vfmadd231ps_zmm_k1z_zmm_zmmm512b32_er,
            fnma: EVEX_Vfnmadd231ps_zmm_k1z_zmm_zmmm512b32_er,
            add: EVEX_Vaddps_zmm_k1z_zmm_zmmm512b32_er,
            sub: EVEX_Vsubps_zmm_k1z_zmm_zmmm512b32_er,
            mul: EVEX_Vmulps_zmm_k1z_zmm_zmmm512b32_er,
        },
        (_, Dtype::F16) => return Err(EmitError::Unsupported("f16", isa)),
        (Isa::Neon, _) => return Err(EmitError::Unsupported("the x86-64 backend", isa)),
    })
}

/// Scalar moves have shorter VEX forms while the register is below 16.
fn vex_scalar(dtype: Dtype, load: bool) -> Code {
    match (dtype, load) {
        (Dtype::F64, true) => Code::VEX_Vmovsd_xmm_m64,
        (Dtype::F64, false) => Code::VEX_Vmovsd_m64_xmm,
        // f16 programs are rejected by `forms` before any operation is emitted.
        (_, true) => Code::VEX_Vmovss_xmm_m32,
        (_, false) => Code::VEX_Vmovss_m32_xmm,
    }
}

pub(crate) struct Emitter<'a> {
    asm: CodeAssembler,
    program: &'a Program,
    isa: Isa,
    conv: CallConv,
    /// Bytes from rbp up to the stack pointer at entry (when the kernel has a frame).
    entry_offset: i32,
    forms: Forms,
    /// Bytes of the vectors being emitted (narrower after an `Op::Narrow` prefix).
    width: usize,
    /// AVX2 tail masks: (label of the constant, vector register, enabled lanes).
    mask_constants: Vec<(CodeLabel, u32)>,
    /// Index vectors of full permutes, as bytes (zero-extended by the load).
    index_constants: Vec<(CodeLabel, [u8; 16])>,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(program: &'a Program, isa: Isa, conv: CallConv) -> Result<Self, EmitError> {
        let mut asm = CodeAssembler::new(64)?;
        asm.set_prefer_vex(true);
        Ok(Emitter {
            asm,
            program,
            isa,
            conv,
            entry_offset: 0,
            forms: forms(isa, program.dtype, program.vector_bytes())?,
            width: program.vector_bytes(),
            mask_constants: Vec::new(),
            index_constants: Vec::new(),
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
        let pushed: Vec<Register> = general[..program.gprs]
            .iter()
            .copied()
            .filter(|&r| self.conv.is_callee_saved(r))
            .collect();
        let saved_vectors: Vec<usize> = self
            .conv
            .callee_saved_vectors()
            .filter(|&v| v < program.vregs)
            .collect();
        let scratch = (program.scratch_bytes as i32 + 63) / 64 * 64;
        let frame = scratch > 0 || !saved_vectors.is_empty();
        for &r in &pushed {
            self.add(Instruction::with1(Code::Push_r64, r)?)?;
        }
        if frame {
            // rbp = the stack pointer after the pushes; rsp = a 64-byte aligned area below it:
            // scratch memory first, then the saved vector registers.
            self.add(Instruction::with1(Code::Push_r64, Register::RBP)?)?;
            self.add(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RBP,
                Register::RSP,
            )?)?;
            self.add(Instruction::with2(
                Code::And_rm64_imm8,
                Register::RSP,
                -64i32,
            )?)?;
            let size = scratch + 16 * saved_vectors.len() as i32;
            self.add(Instruction::with2(
                Code::Sub_rm64_imm32,
                Register::RSP,
                size,
            )?)?;
            // Stack arguments sit above the return address, the pushes and rbp's slot.
            self.entry_offset = 8 * (pushed.len() as i32 + 1);
        }
        for (i, &v) in saved_vectors.iter().enumerate() {
            let slot =
                MemoryOperand::with_base_displ(Register::RSP, (scratch + 16 * i as i32) as i64);
            let x = xmm(VReg(v as u8));
            self.add(Instruction::with2(Code::VEX_Vmovdqu_xmmm128_xmm, slot, x)?)?;
        }
        self.ops(&program.ops)?;
        if program.stores_streaming() {
            self.add(Instruction::with(Code::Sfence))?;
        }
        for (i, &v) in saved_vectors.iter().enumerate() {
            let slot =
                MemoryOperand::with_base_displ(Register::RSP, (scratch + 16 * i as i32) as i64);
            let x = xmm(VReg(v as u8));
            self.add(Instruction::with2(Code::VEX_Vmovdqu_xmm_xmmm128, x, slot)?)?;
        }
        if frame {
            self.add(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RSP,
                Register::RBP,
            )?)?;
            self.add(Instruction::with1(Code::Pop_r64, Register::RBP)?)?;
        }
        for &r in pushed.iter().rev() {
            self.add(Instruction::with1(Code::Pop_r64, r)?)?;
        }
        self.asm.vzeroupper()?;
        self.asm.ret()?;
        Ok(())
    }

    /// Appends the constants and assembles.
    pub(crate) fn finish(mut self) -> Result<MachineCode, EmitError> {
        let program = self.program;
        let mut end = self.asm.create_label();
        self.asm.set_label(&mut end)?;
        self.asm.zero_bytes()?;
        let constants = std::mem::take(&mut self.mask_constants);
        let lanes = program.lanes as u32;
        for (mut label, enabled) in constants {
            self.asm.set_label(&mut label)?;
            match program.dtype {
                Dtype::F64 => self.asm.dq(&(0..lanes)
                    .map(|i| if i < enabled { u64::MAX } else { 0 })
                    .collect::<Vec<_>>())?,
                Dtype::F32 | Dtype::F16 => self.asm.dd(&(0..lanes)
                    .map(|i| if i < enabled { u32::MAX } else { 0 })
                    .collect::<Vec<_>>())?,
            }
        }
        let index_bytes = program.lanes.min(16);
        for (mut label, indices) in std::mem::take(&mut self.index_constants) {
            self.asm.set_label(&mut label)?;
            self.asm.db(&indices[..index_bytes])?;
        }
        let result = self.asm.assemble_options(
            0,
            iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )?;
        let code_len = result.label_ip(&end)? as usize;
        Ok(MachineCode {
            bytes: result.inner.code_buffer,
            code_len,
        })
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
            let narrow = forms(self.isa, self.program.dtype, bytes as usize)?;
            let full = std::mem::replace(&mut self.forms, narrow);
            let width = std::mem::replace(&mut self.width, bytes as usize);
            let result = self.op(op);
            self.forms = full;
            self.width = width;
            result?;
        }
        Ok(())
    }

    fn gpr(&self, g: smallgemm_ir::Gpr) -> Result<Register, EmitError> {
        regs::general(self.conv.general(), self.program.gprs, g)
    }

    fn mem(&self, addr: Addr, broadcast: bool) -> Result<MemoryOperand, EmitError> {
        let displ = addr.offset as i64;
        Ok(MemoryOperand::new(
            self.gpr(addr.base)?,
            Register::None,
            1,
            displ,
            // 1 = the shortest displacement that fits (none for 0).
            if displ == 0 { 0 } else { 1 },
            broadcast,
            Register::None,
        ))
    }

    fn v(&self, r: smallgemm_ir::VReg) -> Result<Register, EmitError> {
        if r.0 as usize >= self.program.vregs {
            return Err(EmitError::TooManyVectorRegisters(r.0 as usize + 1));
        }
        Ok(vector(self.width, r))
    }

    fn add(&mut self, i: Instruction) -> Result<(), EmitError> {
        self.asm.add_instruction(i)?;
        Ok(())
    }

    /// Applies a tail mask to a load or store: an opmask on AVX-512, or the vmaskmov form
    /// with the mask's vector register on AVX2.
    fn masked(
        &mut self,
        store: bool,
        reg: Register,
        mem: MemoryOperand,
        mask: smallgemm_ir::Mask,
    ) -> Result<(), EmitError> {
        // Tails of exactly 4, 8, 16 or 32 bytes: a plain move of that size.
        let lanes = self
            .program
            .masks
            .iter()
            .find(|d| d.mask == mask)
            .map_or(0, |d| d.lanes as usize);
        let elt = self.program.dtype.size();
        let bytes = lanes * elt;
        // The whole vector's width, not a Narrow prefix's: a tail that fills its narrowed
        // vector exactly is still a plain move.
        if bytes < self.program.vector_bytes() {
            let evex = self.isa == Isa::Avx512;
            let n = vector_number(reg);
            let small = n < 16;
            let x = nth_register(Register::XMM0, n);
            let y = nth_register(Register::YMM0, n);
            let exact = match (bytes, store) {
                (4, false) if small => Some((Code::VEX_Vmovss_xmm_m32, x)),
                (4, true) if small => Some((Code::VEX_Vmovss_m32_xmm, x)),
                (4, false) => Some((Code::EVEX_Vmovss_xmm_k1z_m32, x)),
                (4, true) => Some((Code::EVEX_Vmovss_m32_k1_xmm, x)),
                (8, false) if small => Some((Code::VEX_Vmovsd_xmm_m64, x)),
                (8, true) if small => Some((Code::VEX_Vmovsd_m64_xmm, x)),
                (8, false) => Some((Code::EVEX_Vmovsd_xmm_k1z_m64, x)),
                (8, true) => Some((Code::EVEX_Vmovsd_m64_k1_xmm, x)),
                (16, false) if evex => Some((Code::EVEX_Vmovupd_xmm_k1z_xmmm128, x)),
                (16, true) if evex => Some((Code::EVEX_Vmovupd_xmmm128_k1z_xmm, x)),
                (32, false) if evex => Some((Code::EVEX_Vmovupd_ymm_k1z_ymmm256, y)),
                (32, true) if evex => Some((Code::EVEX_Vmovupd_ymmm256_k1z_ymm, y)),
                (16, false) => Some((Code::VEX_Vmovupd_xmm_xmmm128, x)),
                (16, true) => Some((Code::VEX_Vmovupd_xmmm128_xmm, x)),
                _ => None,
            };
            if let Some((code, r)) = exact {
                let code = match (self.program.dtype, code) {
                    (Dtype::F32, Code::EVEX_Vmovupd_xmm_k1z_xmmm128) => {
                        Code::EVEX_Vmovups_xmm_k1z_xmmm128
                    }
                    (Dtype::F32, Code::EVEX_Vmovupd_xmmm128_k1z_xmm) => {
                        Code::EVEX_Vmovups_xmmm128_k1z_xmm
                    }
                    (Dtype::F32, Code::EVEX_Vmovupd_ymm_k1z_ymmm256) => {
                        Code::EVEX_Vmovups_ymm_k1z_ymmm256
                    }
                    (Dtype::F32, Code::EVEX_Vmovupd_ymmm256_k1z_ymm) => {
                        Code::EVEX_Vmovups_ymmm256_k1z_ymm
                    }
                    (Dtype::F32, Code::VEX_Vmovupd_xmm_xmmm128) => Code::VEX_Vmovups_xmm_xmmm128,
                    (Dtype::F32, Code::VEX_Vmovupd_xmmm128_xmm) => Code::VEX_Vmovups_xmmm128_xmm,
                    (_, c) => c,
                };
                let i = if store {
                    Instruction::with2(code, mem, r)?
                } else {
                    Instruction::with2(code, r, mem)?
                };
                return self.add(i);
            }
        }
        match self.isa {
            Isa::Avx512 => {
                let code = if store {
                    self.forms.masked_store
                } else {
                    self.forms.masked_load
                };
                let mut i = if store {
                    Instruction::with2(code, mem, reg)?
                } else {
                    Instruction::with2(code, reg, mem)?
                };
                i.set_op_mask(regs::opmask(mask.0)?);
                i.set_zeroing_masking(!store);
                self.add(i)
            }
            Isa::Neon => Err(EmitError::Unsupported("the x86-64 backend", self.isa)),
            Isa::Avx2 => {
                let m = self
                    .program
                    .mask_vreg(mask)
                    .ok_or(EmitError::MaskWithoutRegister(mask.0))?;
                let m = self.v(m)?;
                let i = if store {
                    Instruction::with3(self.forms.masked_store, mem, m, reg)?
                } else {
                    Instruction::with3(self.forms.masked_load, reg, m, mem)?
                };
                self.add(i)
            }
        }
    }

    fn op(&mut self, op: &Op) -> Result<(), EmitError> {
        let f = &self.forms;
        let (fma, fnma, add, sub, mul) = (f.fma, f.fnma, f.add, f.sub, f.mul);
        let (load, store, broadcast) = (f.load, f.store, f.broadcast);
        let dtype = self.program.dtype;
        match *op {
            Op::Zero { dst } => {
                // The xmm forms zero the whole register and are recognised as zero idioms.
                let x = xmm(dst);
                let i = if dst.0 < 16 {
                    Instruction::with3(Code::VEX_Vxorps_xmm_xmm_xmmm128, x, x, x)?
                } else {
                    Instruction::with3(Code::EVEX_Vpxord_xmm_k1z_xmm_xmmm128b32, x, x, x)?
                };
                self.add(i)?;
            }
            Op::Load { dst, addr, mask } => {
                let (r, m) = (self.v(dst)?, self.mem(addr, false)?);
                match mask {
                    None => self.add(Instruction::with2(load, r, m)?)?,
                    Some(mask) => self.masked(false, r, m, mask)?,
                }
            }
            Op::Store { addr, src, mask } => {
                let (r, m) = (self.v(src)?, self.mem(addr, false)?);
                match mask {
                    None => self.add(Instruction::with2(store, m, r)?)?,
                    Some(mask) => self.masked(true, r, m, mask)?,
                }
            }
            Op::StoreStream { addr, src } => {
                use Code::*;
                let code = match (self.isa, dtype, self.width) {
                    (Isa::Avx2, Dtype::F64, 16) => VEX_Vmovntpd_m128_xmm,
                    (Isa::Avx2, Dtype::F64, _) => VEX_Vmovntpd_m256_ymm,
                    (Isa::Avx2, _, 16) => VEX_Vmovntps_m128_xmm,
                    (Isa::Avx2, _, _) => VEX_Vmovntps_m256_ymm,
                    (_, Dtype::F64, 16) => EVEX_Vmovntpd_m128_xmm,
                    (_, Dtype::F64, 32) => EVEX_Vmovntpd_m256_ymm,
                    (_, Dtype::F64, _) => EVEX_Vmovntpd_m512_zmm,
                    (_, _, 16) => EVEX_Vmovntps_m128_xmm,
                    (_, _, 32) => EVEX_Vmovntps_m256_ymm,
                    _ => EVEX_Vmovntps_m512_zmm,
                };
                let (r, m) = (self.v(src)?, self.mem(addr, false)?);
                self.add(Instruction::with2(code, m, r)?)?;
            }
            Op::StorePieces { addr, src, lanes } => {
                use crate::emit::{piece_addr, store_pieces, Piece};
                let n = vector_number(self.v(src)?);
                let (x, y) = (
                    nth_register(Register::XMM0, n),
                    nth_register(Register::YMM0, n),
                );
                let pieces = store_pieces(self.isa, lanes as usize * dtype.size())
                    .ok_or(EmitError::Unsupported("this store in pieces", self.isa))?;
                let z = nth_register(Register::ZMM0, n);
                let f64 = dtype == Dtype::F64;
                // AVX-512 kernels use registers above 15, which only EVEX reaches.
                let evex = self.isa == Isa::Avx512;
                let pick = |vex: Code, evex_code: Code| if evex { evex_code } else { vex };
                for (offset, piece) in pieces {
                    let m = self.mem(piece_addr(addr, offset)?, false)?;
                    let i = match piece {
                        Piece::Low32 => {
                            let code = if f64 {
                                Code::EVEX_Vmovupd_ymmm256_k1z_ymm
                            } else {
                                Code::EVEX_Vmovups_ymmm256_k1z_ymm
                            };
                            Instruction::with2(code, m, y)?
                        }
                        Piece::MoveHigh256Down => Instruction::with3(
                            Code::EVEX_Vextractf64x4_ymmm256_k1z_zmm_imm8,
                            y,
                            z,
                            1u32,
                        )?,
                        Piece::Low16 => {
                            let code = match (f64, evex) {
                                (true, false) => Code::VEX_Vmovupd_xmmm128_xmm,
                                (false, false) => Code::VEX_Vmovups_xmmm128_xmm,
                                (true, true) => Code::EVEX_Vmovupd_xmmm128_k1z_xmm,
                                (false, true) => Code::EVEX_Vmovups_xmmm128_k1z_xmm,
                            };
                            Instruction::with2(code, m, x)?
                        }
                        Piece::MoveHighDown => {
                            let code = pick(
                                Code::VEX_Vextractf128_xmmm128_ymm_imm8,
                                Code::EVEX_Vextractf32x4_xmmm128_k1z_ymm_imm8,
                            );
                            Instruction::with3(code, x, y, 1u32)?
                        }
                        Piece::Low8 => {
                            let code = pick(Code::VEX_Vmovsd_m64_xmm, Code::EVEX_Vmovsd_m64_k1_xmm);
                            Instruction::with2(code, m, x)?
                        }
                        Piece::Lane4(0) => {
                            let code = pick(Code::VEX_Vmovss_m32_xmm, Code::EVEX_Vmovss_m32_k1_xmm);
                            Instruction::with2(code, m, x)?
                        }
                        Piece::Lane4(lane) => {
                            let code = pick(
                                Code::VEX_Vextractps_rm32_xmm_imm8,
                                Code::EVEX_Vextractps_rm32_xmm_imm8,
                            );
                            Instruction::with3(code, m, x, lane as u32)?
                        }
                    };
                    self.add(i)?;
                }
            }
            Op::Broadcast { dst, addr } => {
                let i = Instruction::with2(broadcast, self.v(dst)?, self.mem(addr, false)?)?;
                self.add(i)?;
            }
            Op::BroadcastGroup { dst, addr, lanes } => {
                let bytes = self.width;
                let code = group_broadcast_code(self.isa, dtype, bytes, lanes).ok_or(
                    EmitError::Unsupported("this width of group broadcast", self.isa),
                )?;
                let i = Instruction::with2(code, self.v(dst)?, self.mem(addr, false)?)?;
                self.add(i)?;
            }
            Op::Permute { dst, src, select } => {
                let bytes = self.width;
                let code = permute_code(self.isa, dtype, bytes)
                    .ok_or(EmitError::Unsupported("this width of permute", self.isa))?;
                let imm = select
                    .iter()
                    .enumerate()
                    .fold(0u32, |imm, (i, &t)| imm | (t as u32) << (2 * i));
                let i = Instruction::with3(code, self.v(dst)?, self.v(src)?, imm)?;
                self.add(i)?;
            }
            Op::Indices { dst, indices } => {
                crate::emit::full_permutes(self.isa, self.program)?;
                let r = zmm::get_zmm(self.v(dst)?).ok_or(EmitError::Unsupported(
                    "this width of full permute",
                    self.isa,
                ))?;
                let label = self.asm.create_label();
                self.index_constants.push((label, indices));
                match dtype {
                    Dtype::F64 => self.asm.vpmovzxbq(r, qword_ptr(label))?,
                    _ => self.asm.vpmovzxbd(r, xmmword_ptr(label))?,
                }
            }
            Op::PermuteVar { dst, index, src } => {
                crate::emit::full_permutes(self.isa, self.program)?;
                let (dst, index, src) = (self.v(dst)?, self.v(index)?, self.v(src)?);
                let code = match dtype {
                    Dtype::F64 => Code::EVEX_Vpermpd_zmm_k1z_zmm_zmmm512b64,
                    _ => Code::EVEX_Vpermps_zmm_k1z_zmm_zmmm512b32,
                };
                self.add(Instruction::with3(code, dst, index, src)?)?;
            }
            Op::InsertGroup {
                dst,
                addr,
                group,
                lanes,
            } => {
                let bytes = self.width;
                let code = insert_code(self.isa, dtype, bytes, lanes).ok_or(
                    EmitError::Unsupported("this width of group insert", self.isa),
                )?;
                let r = self.v(dst)?;
                let i = Instruction::with4(code, r, r, self.mem(addr, false)?, group as u32)?;
                self.add(i)?;
            }
            Op::LoadScalar { dst, addr } => {
                self.v(dst)?;
                let code = if dst.0 < 16 {
                    vex_scalar(dtype, true)
                } else {
                    self.forms.load_scalar
                };
                self.add(Instruction::with2(code, xmm(dst), self.mem(addr, false)?)?)?;
            }
            Op::StoreScalar { addr, src } => {
                self.v(src)?;
                let code = if src.0 < 16 {
                    vex_scalar(dtype, false)
                } else {
                    self.forms.store_scalar
                };
                self.add(Instruction::with2(code, self.mem(addr, false)?, xmm(src))?)?;
            }
            Op::Fma { acc, a, b, negate } => {
                let code = if negate { fnma } else { fma };
                let i = Instruction::with3(code, self.v(acc)?, self.v(a)?, self.v(b)?)?;
                self.add(i)?;
            }
            Op::FmaBroadcast { acc, a, b, negate } => {
                if self.isa != Isa::Avx512 {
                    return Err(EmitError::Unsupported(
                        "FMA with a broadcast operand",
                        self.isa,
                    ));
                }
                let code = if negate { fnma } else { fma };
                let i = Instruction::with3(code, self.v(acc)?, self.v(a)?, self.mem(b, true)?)?;
                self.add(i)?;
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
                let [lo, hi] =
                    crate::emit::transpose_add(self.isa, self.program, dst, a, b, tmp, width)?;
                let (dst, a, b, tmp) = (self.v(dst)?, self.v(a)?, self.v(b)?, self.v(tmp)?);
                let avx2 = self.isa == Isa::Avx2;
                for (shuffle, to) in [(hi, tmp), (lo, dst)] {
                    let (code, imm) = match (shuffle, dtype) {
                        (Shuffle::Blocks(imm), Dtype::F64) => {
                            (Code::EVEX_Vshuff64x2_zmm_k1z_zmm_zmmm512b64_imm8, imm)
                        }
                        (Shuffle::Blocks(imm), _) => {
                            (Code::EVEX_Vshuff32x4_zmm_k1z_zmm_zmmm512b32_imm8, imm)
                        }
                        (Shuffle::Halves(imm), _) => {
                            (Code::VEX_Vperm2f128_ymm_ymm_ymmm256_imm8, imm)
                        }
                        (Shuffle::Elements(imm), Dtype::F64) if avx2 => {
                            (Code::VEX_Vshufpd_ymm_ymm_ymmm256_imm8, imm)
                        }
                        (Shuffle::Elements(imm), _) if avx2 => {
                            (Code::VEX_Vshufps_ymm_ymm_ymmm256_imm8, imm)
                        }
                        (Shuffle::Elements(imm), Dtype::F64) => {
                            (Code::EVEX_Vshufpd_zmm_k1z_zmm_zmmm512b64_imm8, imm)
                        }
                        (Shuffle::Elements(imm), _) => {
                            (Code::EVEX_Vshufps_zmm_k1z_zmm_zmmm512b32_imm8, imm)
                        }
                    };
                    self.add(Instruction::with4(code, to, a, b, imm as u32)?)?;
                }
                self.add(Instruction::with3(add, dst, dst, tmp)?)?;
            }
            Op::Add { dst, a, b } => self.add(Instruction::with3(
                add,
                self.v(dst)?,
                self.v(a)?,
                self.v(b)?,
            )?)?,
            Op::Sub { dst, a, b } => self.add(Instruction::with3(
                sub,
                self.v(dst)?,
                self.v(a)?,
                self.v(b)?,
            )?)?,
            Op::Mul { dst, a, b } => self.add(Instruction::with3(
                mul,
                self.v(dst)?,
                self.v(a)?,
                self.v(b)?,
            )?)?,
            Op::SetMask { lanes, .. } if crate::emit::exact_tail(self.program, lanes) => {}
            Op::SetMask { mask, lanes } => match self.isa {
                Isa::Avx512 => {
                    let bits = ((1u32 << lanes) - 1) as i32;
                    let temp = low32(abi::TEMP);
                    self.add(Instruction::with2(Code::Mov_r32_imm32, temp, bits)?)?;
                    let k = regs::opmask(mask.0)?;
                    self.add(Instruction::with2(Code::VEX_Kmovw_kr_r32, k, temp)?)?;
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
                    // The constant goes after the code; the assembler resolves the label.
                    let label = self.asm.create_label();
                    self.mask_constants.push((label, lanes));
                    if r.is_xmm() {
                        let r = xmm_regs::get_xmm(r)
                            .ok_or(EmitError::Unsupported("a mask above xmm15", self.isa))?;
                        self.asm.vmovdqu(r, xmmword_ptr(label))?;
                    } else {
                        let r = ymm::get_ymm(r)
                            .ok_or(EmitError::Unsupported("a mask above ymm15", self.isa))?;
                        self.asm.vmovdqu(r, ymmword_ptr(label))?;
                    }
                }
            },
            Op::StoreParam { param, addr } => {
                let index = self
                    .program
                    .params
                    .iter()
                    .position(|p| *p == param)
                    .ok_or(EmitError::UnknownParam)?;
                let to = self.mem(addr, false)?;
                match self.conv.float_argument(index) {
                    abi::ArgumentLocation::Register(x) => {
                        self.add(Instruction::with2(vex_scalar(dtype, false), to, x)?)?;
                    }
                    abi::ArgumentLocation::Stack(offset) => {
                        // Copy the argument's slot through the temporary register; rbp is
                        // `entry_offset` bytes below the stack pointer at entry.
                        let from = MemoryOperand::with_base_displ(
                            Register::RBP,
                            (self.entry_offset + offset) as i64,
                        );
                        let (load, store, temp) = match dtype {
                            Dtype::F64 => (Code::Mov_r64_rm64, Code::Mov_rm64_r64, abi::TEMP),
                            _ => (Code::Mov_r32_rm32, Code::Mov_rm32_r32, low32(abi::TEMP)),
                        };
                        self.add(Instruction::with2(load, temp, from)?)?;
                        self.add(Instruction::with2(store, to, temp)?)?;
                    }
                }
            }
            Op::StoreConst { value, addr } => {
                let words: Vec<u32> = match dtype {
                    Dtype::F64 => {
                        let bits = value.to_bits();
                        vec![bits as u32, (bits >> 32) as u32]
                    }
                    Dtype::F32 | Dtype::F16 => vec![(value as f32).to_bits()],
                };
                for (w, word) in words.into_iter().enumerate() {
                    let at = Addr::new(addr.base, addr.offset + 4 * w as i32);
                    let i = Instruction::with2(Code::Mov_rm32_imm32, self.mem(at, false)?, word)?;
                    self.add(i)?;
                }
            }
            Op::LoadAddress { dst, addr } => {
                let i =
                    Instruction::with2(Code::Mov_r64_rm64, self.gpr(dst)?, self.mem(addr, false)?)?;
                self.add(i)?;
            }
            Op::Prefetch { addr } => {
                let i = Instruction::with1(Code::Prefetcht0_m8, self.mem(addr, false)?)?;
                self.add(i)?;
            }
            Op::Copy { dst, src } => {
                let i = Instruction::with2(Code::Mov_r64_rm64, self.gpr(dst)?, self.gpr(src)?)?;
                self.add(i)?;
            }
            Op::AddImm { dst, imm } => {
                let code = if i8::try_from(imm).is_ok() {
                    Code::Add_rm64_imm8
                } else {
                    Code::Add_rm64_imm32
                };
                self.add(Instruction::with2(code, self.gpr(dst)?, imm)?)?;
            }
            // `ops` applies a prefix to the operation after it.
            Op::Narrow { .. } => return Err(EmitError::StrayNarrow),
            Op::Loop {
                counter,
                trips,
                ref body,
            } => {
                let counter = self.gpr(counter)?;
                let mut top = self.asm.create_label();
                let mut done = self.asm.create_label();
                if let Trips::RegisterBy(step) = trips {
                    let step = step as i32;
                    self.add(Instruction::with2(Code::Sub_rm64_imm8, counter, step)?)?;
                    self.asm.jb(done)?;
                    self.asm.set_label(&mut top)?;
                    self.ops(body)?;
                    self.add(Instruction::with2(Code::Sub_rm64_imm8, counter, step)?)?;
                    self.asm.jae(top)?;
                    self.asm.set_label(&mut done)?;
                    self.add(Instruction::with2(Code::Add_rm64_imm8, counter, step)?)?;
                    return Ok(());
                }
                match trips {
                    Trips::Const(n) => {
                        self.add(Instruction::with2(Code::Mov_r32_imm32, low32(counter), n)?)?;
                    }
                    Trips::Register | Trips::RegisterBy(_) => {
                        self.add(Instruction::with2(Code::Test_rm64_r64, counter, counter)?)?;
                        self.asm.jz(done)?;
                    }
                }
                self.asm.set_label(&mut top)?;
                self.ops(body)?;
                self.add(Instruction::with1(Code::Dec_rm64, counter)?)?;
                self.asm.jnz(top)?;
                if trips == Trips::Register {
                    self.asm.set_label(&mut done)?;
                    self.asm.zero_bytes()?;
                }
            }
        }
        Ok(())
    }
}

/// The lane-packed kernels' permute within groups of four lanes of `bytes`-byte vectors.
fn permute_code(isa: Isa, dtype: Dtype, bytes: usize) -> Option<Code> {
    use Code::*;
    let evex = isa == Isa::Avx512;
    match (dtype, bytes, evex) {
        (Dtype::F32, 16, false) => Some(VEX_Vpermilps_xmm_xmmm128_imm8),
        (Dtype::F32, 32, false) => Some(VEX_Vpermilps_ymm_ymmm256_imm8),
        (Dtype::F32, 16, true) => Some(EVEX_Vpermilps_xmm_k1z_xmmm128b32_imm8),
        (Dtype::F32, 32, true) => Some(EVEX_Vpermilps_ymm_k1z_ymmm256b32_imm8),
        (Dtype::F32, 64, true) => Some(EVEX_Vpermilps_zmm_k1z_zmmm512b32_imm8),
        (Dtype::F64, 32, false) => Some(VEX_Vpermpd_ymm_ymmm256_imm8),
        (Dtype::F64, 32, true) => Some(EVEX_Vpermpd_ymm_k1z_ymmm256b64_imm8),
        (Dtype::F64, 64, true) => Some(EVEX_Vpermpd_zmm_k1z_zmmm512b64_imm8),
        _ => None,
    }
}

/// The broadcast of a group of `group` elements into every group of a `bytes`-byte vector
/// (`Op::BroadcastGroup`); the same choices as the other encoder's.
fn group_broadcast_code(isa: Isa, dtype: Dtype, bytes: usize, group: u8) -> Option<Code> {
    use Code::*;
    let evex = isa == Isa::Avx512;
    let group_bytes = group as usize * dtype.size();
    match (dtype, group_bytes, bytes, evex) {
        (Dtype::F32, 16, 32, false) => Some(VEX_Vbroadcastf128_ymm_m128),
        (Dtype::F32, 16, 32, true) => Some(EVEX_Vbroadcastf32x4_ymm_k1z_m128),
        (Dtype::F32, 16, 64, true) => Some(EVEX_Vbroadcastf32x4_zmm_k1z_m128),
        (Dtype::F32, 32, 64, true) => Some(EVEX_Vbroadcastf32x8_zmm_k1z_m256),
        (Dtype::F32, 8, 32, false) => Some(VEX_Vbroadcastsd_ymm_m64),
        (Dtype::F32, 8, 32, true) => Some(EVEX_Vbroadcastsd_ymm_k1z_xmmm64),
        (Dtype::F32, 8, 64, true) => Some(EVEX_Vbroadcastsd_zmm_k1z_xmmm64),
        (Dtype::F64, 16, 64, true) => Some(EVEX_Vbroadcastf64x2_zmm_k1z_m128),
        (Dtype::F64, 32, 64, true) => Some(EVEX_Vbroadcastf64x4_zmm_k1z_m256),
        _ => None,
    }
}

/// The insert of a group of `group` elements from memory into one group of a vector
/// (`Op::InsertGroup`); the same choices as the other encoder's.
fn insert_code(isa: Isa, dtype: Dtype, bytes: usize, group: u8) -> Option<Code> {
    use Code::*;
    let group_bytes = group as usize * dtype.size();
    match (dtype, group_bytes, bytes, isa == Isa::Avx512) {
        (Dtype::F32, 16, 32, false) => Some(VEX_Vinsertf128_ymm_ymm_xmmm128_imm8),
        (Dtype::F32, 16, 32, true) => Some(EVEX_Vinsertf32x4_ymm_k1z_ymm_xmmm128_imm8),
        (Dtype::F32, 16, 64, true) => Some(EVEX_Vinsertf32x4_zmm_k1z_zmm_xmmm128_imm8),
        (Dtype::F32, 32, 64, true) => Some(EVEX_Vinsertf32x8_zmm_k1z_zmm_ymmm256_imm8),
        (Dtype::F64, 16, 64, true) => Some(EVEX_Vinsertf64x2_zmm_k1z_zmm_xmmm128_imm8),
        (Dtype::F64, 32, 64, true) => Some(EVEX_Vinsertf64x4_zmm_k1z_zmm_ymmm256_imm8),
        _ => None,
    }
}

/// The 32-bit view of a 64-bit general register (writing it zero-extends).
fn low32(r: Register) -> Register {
    Register::try_from(Register::EAX as usize + (r as usize - Register::RAX as usize))
        .expect("every 64-bit general register has a 32-bit view")
}

/// The vector register for `v` with `bytes`-byte vectors: xmm, ymm or zmm.
fn vector(bytes: usize, v: VReg) -> Register {
    let first = match bytes {
        16 => Register::XMM0,
        32 => Register::YMM0,
        _ => Register::ZMM0,
    };
    nth_register(first, v.0 as usize)
}

/// The number of an xmm, ymm or zmm register.
fn vector_number(r: Register) -> usize {
    let first = if r.is_xmm() {
        Register::XMM0
    } else if r.is_ymm() {
        Register::YMM0
    } else {
        Register::ZMM0
    };
    r as usize - first as usize
}

/// The xmm register that aliases the low lanes of `v`.
fn xmm(v: VReg) -> Register {
    nth_register(Register::XMM0, v.0 as usize)
}

fn nth_register(first: Register, i: usize) -> Register {
    Register::try_from(first as usize + i).expect("register numbers are checked against the target")
}
