//! Differential tests: the direct encoder against iced-x86, form by form over every
//! register, many bases and displacements, and whole kernels against the old iced path.

use iced_x86::code_asm::{qword_ptr, xmmword_ptr, ymmword_ptr, CodeAssembler};
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};
use smallgemm_ir::{
    lower, plan, Dtype, GemmSpec, GemmSpecBuilder, Isa, Layout, Scalar, Schedule, Target, Trans,
};

use crate::encode::{self as enc, Assembler, Cond, Evex, Mem, Rm, VForm};
use crate::CallConv;

/// iced's encoding of one instruction.
fn iced(i: &Instruction) -> Vec<u8> {
    let mut e = Encoder::new(64);
    e.encode(i, 0)
        .unwrap_or_else(|err| panic!("iced cannot encode {i:?}: {err}"));
    e.take_buffer()
}

/// The encoder's bytes for what `f` writes.
fn ours(f: impl FnOnce(&mut Assembler)) -> Vec<u8> {
    let mut a = Assembler::with_capacity(16);
    f(&mut a);
    a.finish().unwrap()
}

fn check(what: &dyn Fn() -> String, expected: Vec<u8>, got: Vec<u8>) {
    assert_eq!(
        got,
        expected,
        "{}: ours {:02x?}, iced {:02x?}",
        what(),
        got,
        expected
    );
}

fn gpr(n: u8) -> Register {
    Register::try_from(Register::RAX as usize + n as usize).unwrap()
}
fn gpr32(n: u8) -> Register {
    Register::try_from(Register::EAX as usize + n as usize).unwrap()
}
fn xmm(n: u8) -> Register {
    Register::try_from(Register::XMM0 as usize + n as usize).unwrap()
}
fn ymm(n: u8) -> Register {
    Register::try_from(Register::YMM0 as usize + n as usize).unwrap()
}
fn zmm(n: u8) -> Register {
    Register::try_from(Register::ZMM0 as usize + n as usize).unwrap()
}
fn k(n: u8) -> Register {
    Register::try_from(Register::K0 as usize + n as usize).unwrap()
}

/// Every base register: the argument registers, r8–r15, rax, rbx, and the special cases
/// rsp/r12 (SIB) and rbp/r13 (no mod-00 form).
const BASES: [u8; 16] = [7, 6, 2, 1, 8, 9, 10, 11, 12, 13, 14, 15, 0, 3, 4, 5];

/// Displacements around every disp8 and disp8*N limit, and far ones.
fn displacements() -> Vec<i32> {
    let mut d = vec![
        0,
        1,
        -1,
        2,
        -3,
        64,
        -64,
        127,
        -127,
        128,
        -128,
        -129,
        255,
        256,
        1 << 20,
        -(1 << 20),
        (1 << 20) + 8,
        i32::MAX,
        i32::MIN,
    ];
    for n in [4, 8, 16, 32, 64] {
        for q in [1, 2, 126, 127, 128, 129, 1000] {
            for s in [-1, 1] {
                d.push(s * n * q);
                d.push(s * n * q + n / 2);
                d.push(s * n * q - 1);
            }
        }
    }
    d
}

fn mems() -> Vec<Mem> {
    let mut v = Vec::new();
    for &b in &BASES {
        for &d in &displacements() {
            v.push(Mem::new(b, d));
            if d == 0 || d == 64 || d == 16 || d == 1 << 20 {
                v.push(Mem::with_disp(b, d));
            }
        }
    }
    v
}

/// The iced operand for `m`, as the old emitter built it.
fn iced_mem(m: Mem, broadcast: bool) -> MemoryOperand {
    let size = if m.disp == 0 && !m.keep_disp { 0 } else { 1 };
    MemoryOperand::new(
        gpr(m.base),
        Register::None,
        1,
        m.disp as i64,
        size,
        broadcast,
        Register::None,
    )
}

/// How a form's operands are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `op reg, [mem]`.
    Load,
    /// `op [mem], reg`.
    Store,
    /// `op reg, reg, [mem]` (AVX2 vmaskmov load).
    LoadVvvv,
    /// `op [mem], reg(vvvv), reg` (AVX2 vmaskmov store).
    StoreVvvv,
    /// `op reg, reg, reg`.
    Rrr,
    /// `op reg, reg, imm8` (in-lane permutes).
    RrImm,
    /// `op reg, reg, [mem], imm8` (group inserts).
    RrmImm,
    /// `op [mem], reg, imm8` (vextractps).
    StoreImm,
    /// `op xmm, ymm, imm8` with the ymm in ModRM.reg (vextractf128, vextractf32x4).
    ExtractImm,
    /// `op ymm, zmm, imm8` with the zmm in ModRM.reg (vextractf64x4).
    ExtractImm256,
}

/// The encoder's form, iced's code, operand shape, register class.
type Row = (VForm, Code, Shape, fn(u8) -> Register);

fn table() -> Vec<Row> {
    use Shape::*;
    vec![
        (
            enc::VEX_VMOVUPD_YMM_M256,
            Code::VEX_Vmovupd_ymm_ymmm256,
            Load,
            ymm,
        ),
        (
            enc::VEX_VMOVUPD_M256_YMM,
            Code::VEX_Vmovupd_ymmm256_ymm,
            Store,
            ymm,
        ),
        (
            enc::VEX_VMOVUPS_YMM_M256,
            Code::VEX_Vmovups_ymm_ymmm256,
            Load,
            ymm,
        ),
        (
            enc::VEX_VMOVUPS_M256_YMM,
            Code::VEX_Vmovups_ymmm256_ymm,
            Store,
            ymm,
        ),
        (
            enc::VEX_VMASKMOVPD_YMM_YMM_M256,
            Code::VEX_Vmaskmovpd_ymm_ymm_m256,
            LoadVvvv,
            ymm,
        ),
        (
            enc::VEX_VMASKMOVPD_M256_YMM_YMM,
            Code::VEX_Vmaskmovpd_m256_ymm_ymm,
            StoreVvvv,
            ymm,
        ),
        (
            enc::VEX_VMASKMOVPS_YMM_YMM_M256,
            Code::VEX_Vmaskmovps_ymm_ymm_m256,
            LoadVvvv,
            ymm,
        ),
        (
            enc::VEX_VMASKMOVPS_M256_YMM_YMM,
            Code::VEX_Vmaskmovps_m256_ymm_ymm,
            StoreVvvv,
            ymm,
        ),
        (
            enc::VEX_VBROADCASTSD_YMM_M64,
            Code::VEX_Vbroadcastsd_ymm_m64,
            Load,
            ymm,
        ),
        (
            enc::VEX_VBROADCASTSS_YMM_M32,
            Code::VEX_Vbroadcastss_ymm_m32,
            Load,
            ymm,
        ),
        (enc::VEX_VMOVSD_XMM_M64, Code::VEX_Vmovsd_xmm_m64, Load, xmm),
        (
            enc::VEX_VMOVSD_M64_XMM,
            Code::VEX_Vmovsd_m64_xmm,
            Store,
            xmm,
        ),
        (enc::VEX_VMOVSS_XMM_M32, Code::VEX_Vmovss_xmm_m32, Load, xmm),
        (
            enc::VEX_VMOVSS_M32_XMM,
            Code::VEX_Vmovss_m32_xmm,
            Store,
            xmm,
        ),
        (
            enc::VEX_VFMADD231PD_YMM,
            Code::VEX_Vfmadd231pd_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VFMADD231PS_YMM,
            Code::VEX_Vfmadd231ps_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VFNMADD231PD_YMM,
            Code::VEX_Vfnmadd231pd_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VFNMADD231PS_YMM,
            Code::VEX_Vfnmadd231ps_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VADDPD_YMM,
            Code::VEX_Vaddpd_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VADDPS_YMM,
            Code::VEX_Vaddps_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VSUBPD_YMM,
            Code::VEX_Vsubpd_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VSUBPS_YMM,
            Code::VEX_Vsubps_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VMULPD_YMM,
            Code::VEX_Vmulpd_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VMULPS_YMM,
            Code::VEX_Vmulps_ymm_ymm_ymmm256,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VXORPS_XMM,
            Code::VEX_Vxorps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VMOVDQU_YMM_M256,
            Code::VEX_Vmovdqu_ymm_ymmm256,
            Load,
            ymm,
        ),
        (
            enc::VEX_VMOVDQU_XMM_M128,
            Code::VEX_Vmovdqu_xmm_xmmm128,
            Load,
            xmm,
        ),
        (
            enc::VEX_VMOVDQU_M128_XMM,
            Code::VEX_Vmovdqu_xmmm128_xmm,
            Store,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPD_ZMM_M512,
            Code::EVEX_Vmovupd_zmm_k1z_zmmm512,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VMOVUPD_M512_ZMM,
            Code::EVEX_Vmovupd_zmmm512_k1z_zmm,
            Store,
            zmm,
        ),
        (
            enc::EVEX_VMOVUPS_ZMM_M512,
            Code::EVEX_Vmovups_zmm_k1z_zmmm512,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VMOVUPS_M512_ZMM,
            Code::EVEX_Vmovups_zmmm512_k1z_zmm,
            Store,
            zmm,
        ),
        (
            enc::EVEX_VBROADCASTSD_ZMM_M64,
            Code::EVEX_Vbroadcastsd_zmm_k1z_xmmm64,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VBROADCASTSS_ZMM_M32,
            Code::EVEX_Vbroadcastss_zmm_k1z_xmmm32,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VMOVSD_XMM_M64,
            Code::EVEX_Vmovsd_xmm_k1z_m64,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VMOVSD_M64_XMM,
            Code::EVEX_Vmovsd_m64_k1_xmm,
            Store,
            xmm,
        ),
        (
            enc::EVEX_VMOVSS_XMM_M32,
            Code::EVEX_Vmovss_xmm_k1z_m32,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VMOVSS_M32_XMM,
            Code::EVEX_Vmovss_m32_k1_xmm,
            Store,
            xmm,
        ),
        (
            enc::EVEX_VFMADD231PD_ZMM,
            Code::EVEX_Vfmadd231pd_zmm_k1z_zmm_zmmm512b64_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VFMADD231PS_ZMM,
            Code::EVEX_Vfmadd231ps_zmm_k1z_zmm_zmmm512b32_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VFNMADD231PD_ZMM,
            Code::EVEX_Vfnmadd231pd_zmm_k1z_zmm_zmmm512b64_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VFNMADD231PS_ZMM,
            Code::EVEX_Vfnmadd231ps_zmm_k1z_zmm_zmmm512b32_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VADDPD_ZMM,
            Code::EVEX_Vaddpd_zmm_k1z_zmm_zmmm512b64_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VADDPS_ZMM,
            Code::EVEX_Vaddps_zmm_k1z_zmm_zmmm512b32_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VSUBPD_ZMM,
            Code::EVEX_Vsubpd_zmm_k1z_zmm_zmmm512b64_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VSUBPS_ZMM,
            Code::EVEX_Vsubps_zmm_k1z_zmm_zmmm512b32_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VMULPD_ZMM,
            Code::EVEX_Vmulpd_zmm_k1z_zmm_zmmm512b64_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VMULPS_ZMM,
            Code::EVEX_Vmulps_zmm_k1z_zmm_zmmm512b32_er,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VPXORD_XMM,
            Code::EVEX_Vpxord_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        // Narrower vectors: the full-width forms at 16 and 32 bytes, and the broadcasts.
        (
            enc::VEX_VMOVUPD_YMM_M256.with_width(16),
            Code::VEX_Vmovupd_xmm_xmmm128,
            Load,
            xmm,
        ),
        (
            enc::VEX_VMOVUPD_M256_YMM.with_width(16),
            Code::VEX_Vmovupd_xmmm128_xmm,
            Store,
            xmm,
        ),
        (
            enc::VEX_VMASKMOVPD_YMM_YMM_M256.with_width(16),
            Code::VEX_Vmaskmovpd_xmm_xmm_m128,
            LoadVvvv,
            xmm,
        ),
        (
            enc::VEX_VMASKMOVPD_M256_YMM_YMM.with_width(16),
            Code::VEX_Vmaskmovpd_m128_xmm_xmm,
            StoreVvvv,
            xmm,
        ),
        (
            enc::VEX_VFMADD231PD_YMM.with_width(16),
            Code::VEX_Vfmadd231pd_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VFNMADD231PD_YMM.with_width(16),
            Code::VEX_Vfnmadd231pd_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VADDPD_YMM.with_width(16),
            Code::VEX_Vaddpd_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VSUBPD_YMM.with_width(16),
            Code::VEX_Vsubpd_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VMULPD_YMM.with_width(16),
            Code::VEX_Vmulpd_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VMOVUPS_YMM_M256.with_width(16),
            Code::VEX_Vmovups_xmm_xmmm128,
            Load,
            xmm,
        ),
        (
            enc::VEX_VMOVUPS_M256_YMM.with_width(16),
            Code::VEX_Vmovups_xmmm128_xmm,
            Store,
            xmm,
        ),
        (
            enc::VEX_VMASKMOVPS_YMM_YMM_M256.with_width(16),
            Code::VEX_Vmaskmovps_xmm_xmm_m128,
            LoadVvvv,
            xmm,
        ),
        (
            enc::VEX_VMASKMOVPS_M256_YMM_YMM.with_width(16),
            Code::VEX_Vmaskmovps_m128_xmm_xmm,
            StoreVvvv,
            xmm,
        ),
        (
            enc::VEX_VFMADD231PS_YMM.with_width(16),
            Code::VEX_Vfmadd231ps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VFNMADD231PS_YMM.with_width(16),
            Code::VEX_Vfnmadd231ps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VADDPS_YMM.with_width(16),
            Code::VEX_Vaddps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VSUBPS_YMM.with_width(16),
            Code::VEX_Vsubps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::VEX_VMULPS_YMM.with_width(16),
            Code::VEX_Vmulps_xmm_xmm_xmmm128,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPD_ZMM_M512.with_width(16),
            Code::EVEX_Vmovupd_xmm_k1z_xmmm128,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPD_M512_ZMM.with_width(16),
            Code::EVEX_Vmovupd_xmmm128_k1z_xmm,
            Store,
            xmm,
        ),
        (
            enc::EVEX_VFMADD231PD_ZMM.with_width(16),
            Code::EVEX_Vfmadd231pd_xmm_k1z_xmm_xmmm128b64,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VFNMADD231PD_ZMM.with_width(16),
            Code::EVEX_Vfnmadd231pd_xmm_k1z_xmm_xmmm128b64,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VADDPD_ZMM.with_width(16),
            Code::EVEX_Vaddpd_xmm_k1z_xmm_xmmm128b64,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VSUBPD_ZMM.with_width(16),
            Code::EVEX_Vsubpd_xmm_k1z_xmm_xmmm128b64,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VMULPD_ZMM.with_width(16),
            Code::EVEX_Vmulpd_xmm_k1z_xmm_xmmm128b64,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPS_ZMM_M512.with_width(16),
            Code::EVEX_Vmovups_xmm_k1z_xmmm128,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPS_M512_ZMM.with_width(16),
            Code::EVEX_Vmovups_xmmm128_k1z_xmm,
            Store,
            xmm,
        ),
        (
            enc::EVEX_VFMADD231PS_ZMM.with_width(16),
            Code::EVEX_Vfmadd231ps_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VFNMADD231PS_ZMM.with_width(16),
            Code::EVEX_Vfnmadd231ps_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VADDPS_ZMM.with_width(16),
            Code::EVEX_Vaddps_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VSUBPS_ZMM.with_width(16),
            Code::EVEX_Vsubps_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VMULPS_ZMM.with_width(16),
            Code::EVEX_Vmulps_xmm_k1z_xmm_xmmm128b32,
            Rrr,
            xmm,
        ),
        (
            enc::EVEX_VMOVUPD_ZMM_M512.with_width(32),
            Code::EVEX_Vmovupd_ymm_k1z_ymmm256,
            Load,
            ymm,
        ),
        (
            enc::EVEX_VMOVUPD_M512_ZMM.with_width(32),
            Code::EVEX_Vmovupd_ymmm256_k1z_ymm,
            Store,
            ymm,
        ),
        (
            enc::EVEX_VFMADD231PD_ZMM.with_width(32),
            Code::EVEX_Vfmadd231pd_ymm_k1z_ymm_ymmm256b64,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VFNMADD231PD_ZMM.with_width(32),
            Code::EVEX_Vfnmadd231pd_ymm_k1z_ymm_ymmm256b64,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VADDPD_ZMM.with_width(32),
            Code::EVEX_Vaddpd_ymm_k1z_ymm_ymmm256b64,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VSUBPD_ZMM.with_width(32),
            Code::EVEX_Vsubpd_ymm_k1z_ymm_ymmm256b64,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VMULPD_ZMM.with_width(32),
            Code::EVEX_Vmulpd_ymm_k1z_ymm_ymmm256b64,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VMOVUPS_ZMM_M512.with_width(32),
            Code::EVEX_Vmovups_ymm_k1z_ymmm256,
            Load,
            ymm,
        ),
        (
            enc::EVEX_VMOVUPS_M512_ZMM.with_width(32),
            Code::EVEX_Vmovups_ymmm256_k1z_ymm,
            Store,
            ymm,
        ),
        (
            enc::EVEX_VFMADD231PS_ZMM.with_width(32),
            Code::EVEX_Vfmadd231ps_ymm_k1z_ymm_ymmm256b32,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VFNMADD231PS_ZMM.with_width(32),
            Code::EVEX_Vfnmadd231ps_ymm_k1z_ymm_ymmm256b32,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VADDPS_ZMM.with_width(32),
            Code::EVEX_Vaddps_ymm_k1z_ymm_ymmm256b32,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VSUBPS_ZMM.with_width(32),
            Code::EVEX_Vsubps_ymm_k1z_ymm_ymmm256b32,
            Rrr,
            ymm,
        ),
        (
            enc::EVEX_VMULPS_ZMM.with_width(32),
            Code::EVEX_Vmulps_ymm_k1z_ymm_ymmm256b32,
            Rrr,
            ymm,
        ),
        (
            enc::VEX_VMOVDDUP_XMM_M64,
            Code::VEX_Vmovddup_xmm_xmmm64,
            Load,
            xmm,
        ),
        (
            enc::VEX_VBROADCASTSS_XMM_M32,
            Code::VEX_Vbroadcastss_xmm_m32,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VMOVDDUP_XMM_M64,
            Code::EVEX_Vmovddup_xmm_k1z_xmmm64,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VBROADCASTSD_YMM_M64,
            Code::EVEX_Vbroadcastsd_ymm_k1z_xmmm64,
            Load,
            ymm,
        ),
        (
            enc::EVEX_VBROADCASTSS_XMM_M32,
            Code::EVEX_Vbroadcastss_xmm_k1z_xmmm32,
            Load,
            xmm,
        ),
        (
            enc::EVEX_VBROADCASTSS_YMM_M32,
            Code::EVEX_Vbroadcastss_ymm_k1z_xmmm32,
            Load,
            ymm,
        ),
        // Lane-packed kernels: in-lane permutes and group broadcasts, at every width used.
        (
            enc::VEX_VPERMILPS_YMM_IMM8,
            Code::VEX_Vpermilps_ymm_ymmm256_imm8,
            RrImm,
            ymm,
        ),
        (
            enc::VEX_VPERMILPS_YMM_IMM8.with_width(16),
            Code::VEX_Vpermilps_xmm_xmmm128_imm8,
            RrImm,
            xmm,
        ),
        (
            enc::VEX_VPERMPD_YMM_IMM8,
            Code::VEX_Vpermpd_ymm_ymmm256_imm8,
            RrImm,
            ymm,
        ),
        (
            enc::EVEX_VPERMILPS_ZMM_IMM8,
            Code::EVEX_Vpermilps_zmm_k1z_zmmm512b32_imm8,
            RrImm,
            zmm,
        ),
        (
            enc::EVEX_VPERMILPS_ZMM_IMM8.with_width(32),
            Code::EVEX_Vpermilps_ymm_k1z_ymmm256b32_imm8,
            RrImm,
            ymm,
        ),
        (
            enc::EVEX_VPERMILPS_ZMM_IMM8.with_width(16),
            Code::EVEX_Vpermilps_xmm_k1z_xmmm128b32_imm8,
            RrImm,
            xmm,
        ),
        (
            enc::EVEX_VPERMPD_ZMM_IMM8,
            Code::EVEX_Vpermpd_zmm_k1z_zmmm512b64_imm8,
            RrImm,
            zmm,
        ),
        (
            enc::EVEX_VPERMPD_ZMM_IMM8.with_width(32),
            Code::EVEX_Vpermpd_ymm_k1z_ymmm256b64_imm8,
            RrImm,
            ymm,
        ),
        (
            enc::VEX_VBROADCASTF128_YMM_M128,
            Code::VEX_Vbroadcastf128_ymm_m128,
            Load,
            ymm,
        ),
        (
            enc::EVEX_VBROADCASTF32X4_ZMM_M128,
            Code::EVEX_Vbroadcastf32x4_zmm_k1z_m128,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VBROADCASTF32X4_ZMM_M128.with_width(32),
            Code::EVEX_Vbroadcastf32x4_ymm_k1z_m128,
            Load,
            ymm,
        ),
        (
            enc::EVEX_VBROADCASTF64X4_ZMM_M256,
            Code::EVEX_Vbroadcastf64x4_zmm_k1z_m256,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VPMOVZXBD_ZMM_M128,
            Code::EVEX_Vpmovzxbd_zmm_k1z_xmmm128,
            Load,
            zmm,
        ),
        (
            enc::EVEX_VPERMPS_ZMM,
            Code::EVEX_Vpermps_zmm_k1z_zmm_zmmm512b32,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VPERMPD_ZMM,
            Code::EVEX_Vpermpd_zmm_k1z_zmm_zmmm512b64,
            Rrr,
            zmm,
        ),
        (
            enc::EVEX_VPMOVZXBQ_ZMM_M64,
            Code::EVEX_Vpmovzxbq_zmm_k1z_xmmm64,
            Load,
            zmm,
        ),
        (
            enc::VEX_VINSERTF128_YMM_M128,
            Code::VEX_Vinsertf128_ymm_ymm_xmmm128_imm8,
            RrmImm,
            ymm,
        ),
        (
            enc::VEX_VEXTRACTPS_M32_XMM_IMM8,
            Code::VEX_Vextractps_rm32_xmm_imm8,
            StoreImm,
            xmm,
        ),
        (
            enc::VEX_VEXTRACTF128_XMM_YMM_IMM8,
            Code::VEX_Vextractf128_xmmm128_ymm_imm8,
            ExtractImm,
            ymm,
        ),
        (
            enc::EVEX_VEXTRACTPS_M32_XMM_IMM8,
            Code::EVEX_Vextractps_rm32_xmm_imm8,
            StoreImm,
            xmm,
        ),
        (
            enc::EVEX_VEXTRACTF32X4_XMM_YMM_IMM8,
            Code::EVEX_Vextractf32x4_xmmm128_k1z_ymm_imm8,
            ExtractImm,
            ymm,
        ),
        (
            enc::EVEX_VEXTRACTF64X4_YMM_ZMM_IMM8,
            Code::EVEX_Vextractf64x4_ymmm256_k1z_zmm_imm8,
            ExtractImm256,
            zmm,
        ),
        (
            enc::EVEX_VINSERTF32X4_ZMM_M128,
            Code::EVEX_Vinsertf32x4_zmm_k1z_zmm_xmmm128_imm8,
            RrmImm,
            zmm,
        ),
        (
            enc::EVEX_VINSERTF32X4_ZMM_M128.with_width(32),
            Code::EVEX_Vinsertf32x4_ymm_k1z_ymm_xmmm128_imm8,
            RrmImm,
            ymm,
        ),
        (
            enc::EVEX_VINSERTF64X4_ZMM_M256,
            Code::EVEX_Vinsertf64x4_zmm_k1z_zmm_ymmm256_imm8,
            RrmImm,
            zmm,
        ),
    ]
}

fn is_evex(code: Code) -> bool {
    format!("{code:?}").starts_with("EVEX")
}

/// Every vector form, every register, every base and displacement (and, for EVEX, every
/// opmask with zeroing on loads, and embedded broadcast on the arithmetic forms).
#[test]
fn vector_forms_match_iced() {
    let mems = mems();
    let mut count = 0usize;
    for (form, code, shape, class) in table() {
        let evex = is_evex(code);
        let regs: u8 = if evex { 32 } else { 16 };
        let masks: &[(u8, bool)] = if !evex {
            &[(0, false)]
        } else {
            match shape {
                Shape::Load => &[(0, false), (1, true), (2, false), (3, true), (7, true)],
                Shape::Store => &[(0, false), (1, false), (4, false), (7, false)],
                // vextractps takes no opmask.
                Shape::StoreImm => &[(0, false)],
                _ => &[(0, false), (1, false), (5, true), (7, true)],
            }
        };
        for r in 0..regs {
            for &(mask, zeroing) in masks {
                let extras = Evex {
                    mask,
                    zeroing,
                    broadcast: false,
                };
                let finish = |mut i: Instruction| {
                    if mask != 0 {
                        i.set_op_mask(k(mask));
                        i.set_zeroing_masking(zeroing);
                    }
                    iced(&i)
                };
                match shape {
                    Shape::Load
                    | Shape::Store
                    | Shape::LoadVvvv
                    | Shape::StoreVvvv
                    | Shape::RrmImm
                    | Shape::StoreImm => {
                        // All memory operands for a few registers, a few for the rest.
                        let step = if [0, 7, 8, 15, 16, 31].contains(&r) && mask <= 1 {
                            1
                        } else {
                            97
                        };
                        for m in mems.iter().step_by(step) {
                            let v = (r + 5) % regs;
                            let im = iced_mem(*m, false);
                            let (expected, got) = match shape {
                                Shape::Load => (
                                    finish(Instruction::with2(code, class(r), im).unwrap()),
                                    ours(|a| a.vec(form, r, 0, Rm::Mem(*m), extras)),
                                ),
                                Shape::Store => (
                                    finish(Instruction::with2(code, im, class(r)).unwrap()),
                                    ours(|a| a.vec(form, r, 0, Rm::Mem(*m), extras)),
                                ),
                                Shape::RrmImm => {
                                    let imm = r % 4;
                                    (
                                        finish(
                                            Instruction::with4(
                                                code,
                                                class(r),
                                                class(v),
                                                im,
                                                imm as u32,
                                            )
                                            .unwrap(),
                                        ),
                                        ours(|a| a.vec_imm8(form, r, v, Rm::Mem(*m), extras, imm)),
                                    )
                                }
                                Shape::StoreImm => {
                                    let imm = r % 4;
                                    (
                                        finish(
                                            Instruction::with3(code, im, class(r), imm as u32)
                                                .unwrap(),
                                        ),
                                        ours(|a| a.vec_imm8(form, r, 0, Rm::Mem(*m), extras, imm)),
                                    )
                                }
                                Shape::LoadVvvv => (
                                    finish(
                                        Instruction::with3(code, class(r), class(v), im).unwrap(),
                                    ),
                                    ours(|a| a.vec(form, r, v, Rm::Mem(*m), extras)),
                                ),
                                _ => (
                                    finish(
                                        Instruction::with3(code, im, class(v), class(r)).unwrap(),
                                    ),
                                    ours(|a| a.vec(form, r, v, Rm::Mem(*m), extras)),
                                ),
                            };
                            check(
                                &|| format!("{code:?} r{r} v{v} {m:?} k{mask}"),
                                expected,
                                got,
                            );
                            count += 1;
                        }
                    }
                    Shape::RrImm => {
                        for a in 0..regs {
                            for imm in [0x00u8, 0x44, 0xa0, 0xee, 0xf5, 0xff] {
                                let i = Instruction::with3(code, class(r), class(a), imm as u32)
                                    .unwrap();
                                let got =
                                    ours(|asm| asm.vec_imm8(form, r, 0, Rm::Reg(a), extras, imm));
                                check(
                                    &|| format!("{code:?} {r} {a} {imm:#x} k{mask}"),
                                    finish(i),
                                    got,
                                );
                                count += 1;
                            }
                        }
                    }
                    Shape::ExtractImm | Shape::ExtractImm256 => {
                        let dst = if shape == Shape::ExtractImm { xmm } else { ymm };
                        for a in 0..regs {
                            for imm in [0u8, 1] {
                                let i =
                                    Instruction::with3(code, dst(a), class(r), imm as u32).unwrap();
                                let got =
                                    ours(|asm| asm.vec_imm8(form, r, 0, Rm::Reg(a), extras, imm));
                                check(
                                    &|| format!("{code:?} {a} {r} {imm:#x} k{mask}"),
                                    finish(i),
                                    got,
                                );
                                count += 1;
                            }
                        }
                    }
                    Shape::Rrr => {
                        for a in 0..regs {
                            for b in [0, 3, 7, 8, 12, 15, 16, 23, 31] {
                                if b >= regs {
                                    continue;
                                }
                                let i =
                                    Instruction::with3(code, class(r), class(a), class(b)).unwrap();
                                let got = ours(|asm| asm.vec(form, r, a, Rm::Reg(b), extras));
                                check(&|| format!("{code:?} {r} {a} {b} k{mask}"), finish(i), got);
                                count += 1;
                            }
                        }
                        // The memory form, with and without {1toN} (FMA and arithmetic).
                        if evex && code != Code::EVEX_Vpxord_xmm_k1z_xmm_xmmm128b32 {
                            for m in mems.iter().step_by(if mask == 0 { 1 } else { 13 }) {
                                for broadcast in [false, true] {
                                    let a = (r + 9) % regs;
                                    let im = iced_mem(*m, broadcast);
                                    let i =
                                        Instruction::with3(code, class(r), class(a), im).unwrap();
                                    let extras = Evex {
                                        broadcast,
                                        ..extras
                                    };
                                    let got = ours(|asm| asm.vec(form, r, a, Rm::Mem(*m), extras));
                                    check(
                                        &|| format!("{code:?} {r} {a} {m:?} b{broadcast} k{mask}"),
                                        finish(i),
                                        got,
                                    );
                                    count += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(count > 100_000, "{count}");
}

#[test]
fn general_forms_match_iced() {
    let mems = mems();
    for r in 0..16u8 {
        let what = || format!("r{r}");
        check(
            &what,
            iced(&Instruction::with1(Code::Push_r64, gpr(r)).unwrap()),
            ours(|a| a.push(r)),
        );
        check(
            &what,
            iced(&Instruction::with1(Code::Pop_r64, gpr(r)).unwrap()),
            ours(|a| a.pop(r)),
        );
        check(
            &what,
            iced(&Instruction::with1(Code::Dec_rm64, gpr(r)).unwrap()),
            ours(|a| a.dec64(r)),
        );
        for imm in [0u32, 1, 0xFF, 0xFFFF, 0x8000_0000, u32::MAX] {
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_r32_imm32, gpr32(r), imm).unwrap()),
                ours(|a| a.mov_r32_imm32(r, imm)),
            );
        }
        for imm in [0i32, 1, -1, 127, -128, -64] {
            let imm8 = imm as i8;
            check(
                &what,
                iced(&Instruction::with2(Code::Add_rm64_imm8, gpr(r), imm).unwrap()),
                ours(|a| a.add64_imm8(r, imm8)),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::And_rm64_imm8, gpr(r), imm).unwrap()),
                ours(|a| a.and64_imm8(r, imm8)),
            );
        }
        for imm in [0i32, 1, 128, -129, 1 << 20, i32::MAX, i32::MIN] {
            check(
                &what,
                iced(&Instruction::with2(Code::Add_rm64_imm32, gpr(r), imm).unwrap()),
                ours(|a| a.add64_imm32(r, imm)),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::Sub_rm64_imm32, gpr(r), imm).unwrap()),
                ours(|a| a.sub64_imm32(r, imm)),
            );
        }
        for s in 0..16u8 {
            let what = || format!("r{r} r{s}");
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_r64_rm64, gpr(r), gpr(s)).unwrap()),
                ours(|a| a.mov_r64_rm64(r, Rm::Reg(s))),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::Test_rm64_r64, gpr(r), gpr(s)).unwrap()),
                ours(|a| a.test64(r, s)),
            );
        }
        for kk in 1..8u8 {
            let i = Instruction::with2(Code::VEX_Kmovw_kr_r32, k(kk), gpr32(r)).unwrap();
            let got = ours(|a| a.vec(enc::VEX_KMOVW_K_R32, kk, 0, Rm::Reg(r), Evex::default()));
            check(&|| format!("kmovw k{kk}, r{r}"), iced(&i), got);
        }
        for m in &mems {
            let what = || format!("r{r} {m:?}");
            let im = iced_mem(*m, false);
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_r64_rm64, gpr(r), im).unwrap()),
                ours(|a| a.mov_r64_rm64(r, Rm::Mem(*m))),
            );
            check(
                &what,
                iced(&Instruction::with1(Code::Prefetcht0_m8, im).unwrap()),
                ours(|a| a.prefetcht0(Rm::Mem(*m))),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_rm64_r64, im, gpr(r)).unwrap()),
                ours(|a| a.mov_rm64_r64(Rm::Mem(*m), r)),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_r32_rm32, gpr32(r), im).unwrap()),
                ours(|a| a.mov_r32_rm32(r, Rm::Mem(*m))),
            );
            check(
                &what,
                iced(&Instruction::with2(Code::Mov_rm32_r32, im, gpr32(r)).unwrap()),
                ours(|a| a.mov_rm32_r32(Rm::Mem(*m), r)),
            );
        }
    }
    for m in &mems {
        for imm in [0u32, 0x3FF0_0000, u32::MAX] {
            check(
                &|| format!("mov dword {m:?}, {imm:#x}"),
                iced(&Instruction::with2(Code::Mov_rm32_imm32, iced_mem(*m, false), imm).unwrap()),
                ours(|a| a.mov_m32_imm32(*m, imm)),
            );
        }
    }
    let mut a = CodeAssembler::new(64).unwrap();
    a.vzeroupper().unwrap();
    a.ret().unwrap();
    check(
        &|| "vzeroupper; ret".into(),
        a.assemble(0).unwrap(),
        ours(|a| {
            a.vzeroupper();
            a.ret()
        }),
    );
}

/// Forward and backward jz/jnz across the rel8 limit, nested, and RIP-relative constant
/// loads, against iced's CodeAssembler (BlockEncoder picks rel8 whenever it reaches).
#[test]
fn branches_and_rip_match_iced() {
    for inner in [
        0usize, 1, 60, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 200,
    ] {
        for outer in [0usize, 3, 100, 130] {
            for rip in [false, true] {
                let mut ia = CodeAssembler::new(64).unwrap();
                ia.set_prefer_vex(true);
                let mut ca = Assembler::with_capacity(64);
                // test; jz done1; top1: [outer filler] test; jz done2; top2: [inner filler]
                // jnz top2; done2: jnz top1; done1: ret; constant
                let mut idone1 = ia.create_label();
                let mut itop1 = ia.create_label();
                let mut idone2 = ia.create_label();
                let mut itop2 = ia.create_label();
                let mut iconst = ia.create_label();
                let (cdone1, ctop1, cdone2, ctop2, cconst) = (
                    ca.new_label(),
                    ca.new_label(),
                    ca.new_label(),
                    ca.new_label(),
                    ca.new_label(),
                );
                ia.add_instruction(
                    Instruction::with2(Code::Test_rm64_r64, Register::RCX, Register::RCX).unwrap(),
                )
                .unwrap();
                ca.test64(1, 1);
                ia.jz(idone1).unwrap();
                ca.jcc(Cond::Z, cdone1);
                ia.set_label(&mut itop1).unwrap();
                ca.bind(ctop1);
                ia.db(&vec![0x90; outer]).unwrap();
                ca.bytes(&vec![0x90; outer]);
                ia.add_instruction(
                    Instruction::with2(Code::Test_rm64_r64, Register::RDX, Register::RDX).unwrap(),
                )
                .unwrap();
                ca.test64(2, 2);
                ia.jz(idone2).unwrap();
                ca.jcc(Cond::Z, cdone2);
                ia.set_label(&mut itop2).unwrap();
                ca.bind(ctop2);
                if rip {
                    ia.vmovdqu(iced_x86::code_asm::ymm3, ymmword_ptr(iconst))
                        .unwrap();
                    ca.vec_rip(enc::VEX_VMOVDQU_YMM_M256, 3, cconst);
                    // EVEX, registers above 15 (index vectors of full permutes).
                    for r in [0u8, 9, 17, 31] {
                        let z = zmm(r);
                        let z = iced_x86::code_asm::registers::zmm::get_zmm(z).unwrap();
                        ia.vpmovzxbd(z, xmmword_ptr(iconst)).unwrap();
                        ca.vec_rip(enc::EVEX_VPMOVZXBD_ZMM_M128, r, cconst);
                        ia.vpmovzxbq(z, qword_ptr(iconst)).unwrap();
                        ca.vec_rip(enc::EVEX_VPMOVZXBQ_ZMM_M64, r, cconst);
                    }
                }
                ia.db(&vec![0x90; inner]).unwrap();
                ca.bytes(&vec![0x90; inner]);
                ia.jnz(itop2).unwrap();
                ca.jcc(Cond::Nz, ctop2);
                ia.set_label(&mut idone2).unwrap();
                ia.zero_bytes().unwrap();
                ca.bind(cdone2);
                ia.jnz(itop1).unwrap();
                ca.jcc(Cond::Nz, ctop1);
                ia.set_label(&mut idone1).unwrap();
                ca.bind(cdone1);
                ia.ret().unwrap();
                ca.ret();
                ia.set_label(&mut iconst).unwrap();
                ca.bind(cconst);
                ia.dq(&[u64::MAX, 0, 0, 0]).unwrap();
                ca.bytes(&[0xFF; 8]);
                ca.bytes(&[0; 24]);
                check(
                    &|| format!("inner {inner} outer {outer} rip {rip}"),
                    ia.assemble(0).unwrap(),
                    ca.finish().unwrap(),
                );
            }
        }
    }
}

/// A label that is never bound is an error, not a panic.
#[test]
fn unbound_label_is_an_error() {
    let mut a = Assembler::with_capacity(8);
    let l = a.new_label();
    a.jcc(Cond::Nz, l);
    assert!(a.finish().is_err());
}

fn specs() -> Vec<GemmSpecBuilder> {
    let b = GemmSpec::builder;
    let mut v = Vec::new();
    for n in 1..=32 {
        v.push(b(Dtype::F64, n, n, n));
        v.push(b(Dtype::F32, n, n, n));
    }
    for dtype in [Dtype::F64, Dtype::F32] {
        v.extend([
            b(dtype, 13, 3, 5)
                .alpha(Scalar::Runtime)
                .beta(Scalar::Runtime),
            b(dtype, 9, 17, 4).alpha(Scalar::Runtime),
            b(dtype, 7, 5, 11).beta(Scalar::Runtime),
            b(dtype, 24, 5, 17)
                .alpha(Scalar::MinusOne)
                .beta(Scalar::MinusOne),
            b(dtype, 7, 6, 4).trans_a(Trans::T).lda(5).ldc(9),
            b(dtype, 9, 4, 3)
                .trans_b(Trans::T)
                .alpha(Scalar::fixed(0.5).unwrap())
                .beta(Scalar::fixed(2.0).unwrap()),
            b(dtype, 5, 6, 7)
                .layout(Layout::RowMajor)
                .trans_a(Trans::T)
                .trans_b(Trans::T)
                .beta(Scalar::One),
            b(dtype, 100, 40, 90),
            // Lane-packed with B gathered by inserts.
            b(dtype, 4, 4, 8).beta(Scalar::Runtime),
            b(dtype, 4, 4, 32).alpha(Scalar::MinusOne),
            b(dtype, 64, 3, 200).alpha(Scalar::Runtime),
            b(dtype, 1, 33, 2),
            b(dtype, 31, 1, 1),
            // Lane-packed kernels with every kind of scalar.
            b(dtype, 2, 2, 2)
                .alpha(Scalar::Runtime)
                .beta(Scalar::Runtime),
            b(dtype, 4, 4, 4)
                .alpha(Scalar::MinusOne)
                .beta(Scalar::fixed(0.5).unwrap()),
            b(dtype, 12, 12, 12).pointer_arrays(),
            b(dtype, 5, 7, 3)
                .pointer_arrays()
                .alpha(Scalar::Runtime)
                .beta(Scalar::Runtime),
            b(dtype, 17, 9, 8).pointer_arrays().trans_b(Trans::T),
        ]);
    }
    v
}

/// Whole kernels: the new encoder and the old iced path give the same bytes.
#[test]
fn kernels_match_the_iced_path() {
    let mut kernels = 0;
    for builder in specs() {
        let spec = builder.build().unwrap();
        let problem = spec.col_major();
        for target in [Target::AVX2, Target::AVX2_AMD, Target::AVX512] {
            // The planner's schedule, the same blocking at every vector width, and with a
            // dot-product tail where the shape takes one.
            let planned = plan(&problem, target);
            let widths = target.vector_widths().iter().map(|&vector_bytes| Schedule {
                vector_bytes,
                ..planned
            });
            let dot_tail = smallgemm_ir::reference::with_dot_tail(planned);
            for schedule in std::iter::once(planned).chain(widths).chain([dot_tail]) {
                if schedule.validate(&problem, target).is_err() {
                    continue;
                }
                let program = lower(&problem, target, &schedule).unwrap();
                for conv in [CallConv::SysV, CallConv::Win64] {
                    let old = crate::emit_iced(&program, target.isa, conv).unwrap();
                    let new = crate::emit_with(&program, target.isa, conv).unwrap();
                    if new != old {
                        let (o, n) = (crate::listing(&old), crate::listing(&new));
                        let line = o
                            .lines()
                            .zip(n.lines())
                            .find(|(a, b)| a != b)
                            .map(|(a, b)| format!("iced: {a}\nours: {b}"));
                        panic!(
                            "{} {:?} {conv:?}: first difference\n{line:?}",
                            spec.name(),
                            target.isa
                        );
                    }
                    kernels += 1;
                }
            }
        }
    }
    assert!(kernels >= 4 * 90, "{kernels}");
}

/// Kernels with streaming stores of C (`smallgemm_ir::stream_store`): the same bytes on
/// both paths, `vmovntps` / `vmovntpd` at every vector width, and a fence before returning.
#[test]
fn streaming_store_kernels_match_the_iced_path() {
    let mut kernels = 0;
    for (dtype, sizes) in [
        (Dtype::F64, [4, 8, 16, 24, 32]),
        (Dtype::F32, [8, 16, 32, 24, 12]),
    ] {
        for n in sizes {
            let spec = GemmSpec::builder(dtype, n, n, 5)
                .alpha(Scalar::Runtime)
                .beta(Scalar::Zero)
                .build()
                .unwrap();
            let problem = spec.col_major();
            for target in [Target::AVX2, Target::AVX512] {
                let planned = plan(&problem, target);
                for &vector_bytes in target.vector_widths() {
                    for prefetch in [false, true] {
                        let schedule = Schedule {
                            vector_bytes,
                            prefetch,
                            ..planned
                        };
                        if schedule.validate(&problem, target).is_err() {
                            continue;
                        }
                        let mut program = lower(&problem, target, &schedule).unwrap();
                        if !smallgemm_ir::stream_store::apply(&mut program) {
                            continue;
                        }
                        for conv in [CallConv::SysV, CallConv::Win64] {
                            let old = crate::emit_iced(&program, target.isa, conv).unwrap();
                            let new = crate::emit_with(&program, target.isa, conv).unwrap();
                            assert!(new == old, "{} {schedule:?} {conv:?}", spec.name());
                            let text = crate::listing(&new);
                            let nt = if dtype == Dtype::F64 {
                                "vmovntpd"
                            } else {
                                "vmovntps"
                            };
                            assert!(text.contains(nt) && text.contains("sfence"), "{text}");
                            assert!(!text.contains("vmovupd [") && !text.contains("vmovups ["));
                            kernels += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(kernels >= 40, "{kernels}");
}

/// Errors, never panics, for programs the backend cannot encode.
#[test]
fn bad_programs_are_errors() {
    let spec = GemmSpec::builder(Dtype::F64, 4, 4, 4).build().unwrap();
    let problem = spec.col_major();
    let target = Target::AVX2;
    let mut program = lower(&problem, target, &plan(&problem, target)).unwrap();
    program.vregs = 40;
    assert!(crate::emit(&program, Isa::Avx2).is_err());
    program.vregs = 1;
    assert!(crate::emit(&program, Isa::Avx2).is_err());
}

/// A `Narrow` prefix applies to the operation after it in its body: one with none after it,
/// or before another prefix, is an error in the interpreter and in both encoders, not a
/// silently full-width operation.
#[test]
fn stray_narrow_prefixes_are_errors() {
    use smallgemm_ir::reference::TestData;
    use smallgemm_ir::{interpret, Op};
    /// The innermost body with a prefix.
    fn narrowing_body(ops: &mut Vec<Op>) -> Option<&mut Vec<Op>> {
        if ops.iter().any(|op| matches!(op, Op::Narrow { .. })) {
            return Some(ops);
        }
        ops.iter_mut().find_map(|op| match op {
            Op::Loop { body, .. } => narrowing_body(body),
            _ => None,
        })
    }
    // Rows 8..12 are a tail beside a full vector: narrowed.
    let spec = GemmSpec::builder(Dtype::F64, 12, 4, 5).build().unwrap();
    let schedule = Schedule {
        m_vectors: 2,
        n_cols: 4,
        k_unroll: 0,
        unroll_m_blocks: true,
        unroll_n_blocks: true,
        vector_bytes: 0,
        batch_unroll: 0,
        prefetch: false,
        split_tail: false,
        interleave: false,
        lane_pack: false,
        dot_tail: false,
        b_resident: false,
    };
    let target = Target::AVX512;
    let program = lower(&spec.col_major(), target, &schedule).unwrap();
    for doubled in [false, true] {
        let mut bad = program.clone();
        let body = narrowing_body(&mut bad.ops).expect("a narrowed tail");
        let at = match doubled {
            true => body
                .iter()
                .position(|op| matches!(op, Op::Narrow { .. }))
                .unwrap(),
            false => body.len(),
        };
        body.insert(at, Op::Narrow { bytes: 32 });
        let mut data = TestData::<f64>::new(&spec, 1, 7);
        let (a, b) = (data.a.clone(), data.b.clone());
        assert!(
            interpret(&bad, &a, &b, data.c_mut(), 1, &[]).is_err(),
            "{bad}"
        );
        for conv in [CallConv::SysV, CallConv::Win64] {
            assert!(matches!(
                crate::emit_with(&bad, target.isa, conv),
                Err(crate::EmitError::StrayNarrow)
            ));
            assert!(matches!(
                crate::emit_iced(&bad, target.isa, conv),
                Err(crate::EmitError::StrayNarrow)
            ));
        }
    }
    let mut data = TestData::<f64>::new(&spec, 1, 7);
    let (a, b) = (data.a.clone(), data.b.clone());
    interpret(&program, &a, &b, data.c_mut(), 1, &[]).unwrap();
    let (alpha, beta) = (spec.alpha().value(), spec.beta().value());
    assert!(data.check(alpha.unwrap(), beta.unwrap()).passed());
    assert!(crate::emit(&program, target.isa).is_ok());
}

/// A general register past the program's count is one the prologue does not save: emitting
/// a program that uses it is an error, not code that clobbers the caller's register.
#[test]
fn undeclared_general_registers_are_errors() {
    use smallgemm_ir::{Gpr, Op};
    let problem = GemmSpec::builder(Dtype::F64, 8, 4, 4)
        .build()
        .unwrap()
        .col_major();
    let target = Target::AVX512;
    let program = lower(&problem, target, &plan(&problem, target)).unwrap();
    let undeclared = program.gprs as u8;
    let mut bad = program.clone();
    bad.ops.insert(
        0,
        Op::Copy {
            dst: Gpr(undeclared),
            src: Gpr::A,
        },
    );
    for conv in [CallConv::SysV, CallConv::Win64] {
        assert!(crate::emit_with(&program, target.isa, conv).is_ok());
        assert!(crate::emit_iced(&program, target.isa, conv).is_ok());
        assert!(matches!(
            crate::emit_with(&bad, target.isa, conv),
            Err(crate::EmitError::UndeclaredGeneralRegister(g)) if g == undeclared
        ));
        assert!(matches!(
            crate::emit_iced(&bad, target.isa, conv),
            Err(crate::EmitError::UndeclaredGeneralRegister(g)) if g == undeclared
        ));
    }
}
