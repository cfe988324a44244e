//! A direct x86-64 byte encoder for exactly the instruction forms `emit.rs` produces.
//!
//! iced-x86's CodeAssembler and BlockEncoder cost about 0.5 µs per instruction, which
//! dominated spec-to-kernel time; writing the bytes directly is ~20x faster. The encodings
//! are chosen to match iced's byte for byte (2-byte VEX whenever allowed, W and L of
//! WIG/LIG forms 0, the shortest displacement with EVEX disp8*N compression, short
//! branches whenever they reach), so iced stays the test oracle (`encode_tests.rs`).
//!
//! Registers are plain numbers: general registers in encoding order (rax = 0 … r15 = 15),
//! vector registers 0–31, opmask registers 0–7.

/// rsp: the stack pointer, and a base that needs a SIB byte (as does r12).
pub(crate) const RSP: u8 = 4;
/// rbp: the frame pointer, and a base that needs a displacement (as does r13).
pub(crate) const RBP: u8 = 5;

/// `[base + disp]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mem {
    pub base: u8,
    pub disp: i32,
    /// Encode a displacement byte even when `disp` is 0 (iced does so for operands made
    /// with `MemoryOperand::with_base_displ`; kept for byte-identical output).
    pub keep_disp: bool,
}

impl Mem {
    /// The shortest displacement that fits (none for 0, except for rbp/r13 bases).
    pub(crate) fn new(base: u8, disp: i32) -> Mem {
        Mem {
            base,
            disp,
            keep_disp: false,
        }
    }

    /// At least a disp8, even for 0.
    pub(crate) fn with_disp(base: u8, disp: i32) -> Mem {
        Mem {
            base,
            disp,
            keep_disp: true,
        }
    }
}

/// The r/m operand: a register or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rm {
    Reg(u8),
    Mem(Mem),
}

/// One VEX or EVEX instruction form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VForm {
    evex: bool,
    /// 1 = 0F, 2 = 0F38.
    map: u8,
    /// 0 = none, 1 = 66, 2 = F3, 3 = F2.
    pp: u8,
    w: bool,
    /// Vector length: 0 = 128, 1 = 256, 2 = 512 (EVEX only).
    l: u8,
    opcode: u8,
    /// EVEX disp8*N scale of a full (not broadcast) memory operand.
    n: u8,
}

const fn vex(map: u8, pp: u8, w: bool, l: u8, opcode: u8) -> VForm {
    VForm {
        evex: false,
        map,
        pp,
        w,
        l,
        opcode,
        n: 1,
    }
}

const fn evex(map: u8, pp: u8, w: bool, l: u8, opcode: u8, n: u8) -> VForm {
    VForm {
        evex: true,
        map,
        pp,
        w,
        l,
        opcode,
        n,
    }
}

impl VForm {
    /// The same instruction on `bytes`-byte vectors (16, 32 or 64; 64 only for EVEX): VEX.L
    /// or EVEX.L'L, and for EVEX the disp8*N scale of a full-vector memory operand. Forms
    /// whose memory operand is one element keep their N.
    pub(crate) const fn with_width(self, bytes: usize) -> VForm {
        let l = match bytes {
            16 => 0,
            32 => 1,
            _ => 2,
        };
        let full = self.n as usize == 16 << self.l;
        VForm {
            l,
            n: if self.evex && full {
                bytes as u8
            } else {
                self.n
            },
            ..self
        }
    }
}

// The forms, named as iced's `Code` names them.
pub(crate) const VEX_VMOVUPD_YMM_M256: VForm = vex(1, 1, false, 1, 0x10);
pub(crate) const VEX_VMOVUPD_M256_YMM: VForm = vex(1, 1, false, 1, 0x11);
pub(crate) const VEX_VMOVUPS_YMM_M256: VForm = vex(1, 0, false, 1, 0x10);
pub(crate) const VEX_VMOVUPS_M256_YMM: VForm = vex(1, 0, false, 1, 0x11);
pub(crate) const VEX_VMOVNTPD_M256_YMM: VForm = vex(1, 1, false, 1, 0x2B);
pub(crate) const VEX_VMOVNTPS_M256_YMM: VForm = vex(1, 0, false, 1, 0x2B);
pub(crate) const VEX_VMASKMOVPD_YMM_YMM_M256: VForm = vex(2, 1, false, 1, 0x2D);
pub(crate) const VEX_VMASKMOVPD_M256_YMM_YMM: VForm = vex(2, 1, false, 1, 0x2F);
pub(crate) const VEX_VMASKMOVPS_YMM_YMM_M256: VForm = vex(2, 1, false, 1, 0x2C);
pub(crate) const VEX_VMASKMOVPS_M256_YMM_YMM: VForm = vex(2, 1, false, 1, 0x2E);
pub(crate) const VEX_VBROADCASTSD_YMM_M64: VForm = vex(2, 1, false, 1, 0x19);
pub(crate) const VEX_VBROADCASTSS_YMM_M32: VForm = vex(2, 1, false, 1, 0x18);
pub(crate) const VEX_VMOVSD_XMM_M64: VForm = vex(1, 3, false, 0, 0x10);
pub(crate) const VEX_VMOVSD_M64_XMM: VForm = vex(1, 3, false, 0, 0x11);
pub(crate) const VEX_VMOVSS_XMM_M32: VForm = vex(1, 2, false, 0, 0x10);
pub(crate) const VEX_VMOVSS_M32_XMM: VForm = vex(1, 2, false, 0, 0x11);
pub(crate) const VEX_VFMADD231PD_YMM: VForm = vex(2, 1, true, 1, 0xB8);
pub(crate) const VEX_VFMADD231PS_YMM: VForm = vex(2, 1, false, 1, 0xB8);
pub(crate) const VEX_VFNMADD231PD_YMM: VForm = vex(2, 1, true, 1, 0xBC);
pub(crate) const VEX_VFNMADD231PS_YMM: VForm = vex(2, 1, false, 1, 0xBC);
pub(crate) const VEX_VADDPD_YMM: VForm = vex(1, 1, false, 1, 0x58);
pub(crate) const VEX_VADDPS_YMM: VForm = vex(1, 0, false, 1, 0x58);
pub(crate) const VEX_VSUBPD_YMM: VForm = vex(1, 1, false, 1, 0x5C);
pub(crate) const VEX_VSUBPS_YMM: VForm = vex(1, 0, false, 1, 0x5C);
pub(crate) const VEX_VMULPD_YMM: VForm = vex(1, 1, false, 1, 0x59);
pub(crate) const VEX_VMULPS_YMM: VForm = vex(1, 0, false, 1, 0x59);
pub(crate) const VEX_VXORPS_XMM: VForm = vex(1, 0, false, 0, 0x57);
pub(crate) const VEX_VMOVDQU_YMM_M256: VForm = vex(1, 2, false, 1, 0x6F);
pub(crate) const VEX_VMOVDQU_XMM_M128: VForm = vex(1, 2, false, 0, 0x6F);
pub(crate) const VEX_VMOVDQU_M128_XMM: VForm = vex(1, 2, false, 0, 0x7F);
/// Broadcast of one f64 into an xmm (vbroadcastsd has no xmm form).
pub(crate) const VEX_VMOVDDUP_XMM_M64: VForm = vex(1, 3, false, 0, 0x12);
pub(crate) const VEX_VBROADCASTSS_XMM_M32: VForm = vex(2, 1, false, 0, 0x18);
pub(crate) const VEX_KMOVW_K_R32: VForm = vex(1, 0, false, 0, 0x92);
/// In-lane permutes with an immediate (lane-packed kernels): map 0F3A.
pub(crate) const VEX_VPERMILPS_YMM_IMM8: VForm = vex(3, 1, false, 1, 0x04);
pub(crate) const VEX_VPERMPD_YMM_IMM8: VForm = vex(3, 1, true, 1, 0x01);
/// A 128-bit group repeated across the vector (0F38).
pub(crate) const VEX_VBROADCASTF128_YMM_M128: VForm = vex(2, 1, false, 1, 0x1A);
pub(crate) const VEX_VINSERTF128_YMM_M128: VForm = vex(3, 1, false, 1, 0x18);
/// Stores of a tail in pieces (`Op::StorePieces`, map 0F3A): the upper 128 bits of a ymm
/// into an xmm (`op xmm, ymm, imm8`: the ymm in ModRM.reg), and one f32 lane of an xmm to
/// memory (`op [mem], xmm, imm8`).
pub(crate) const VEX_VEXTRACTF128_XMM_YMM_IMM8: VForm = vex(3, 1, false, 1, 0x19);
pub(crate) const VEX_VEXTRACTPS_M32_XMM_IMM8: VForm = vex(3, 1, false, 0, 0x17);
/// Their EVEX forms (AVX-512 kernels' registers above 15), and the upper 256 bits of a zmm
/// into a ymm.
pub(crate) const EVEX_VEXTRACTF64X4_YMM_ZMM_IMM8: VForm = evex(3, 1, true, 2, 0x1B, 32);
pub(crate) const EVEX_VEXTRACTF32X4_XMM_YMM_IMM8: VForm = evex(3, 1, false, 1, 0x19, 16);
pub(crate) const EVEX_VEXTRACTPS_M32_XMM_IMM8: VForm = evex(3, 1, false, 0, 0x17, 4);

pub(crate) const EVEX_VMOVUPD_ZMM_M512: VForm = evex(1, 1, true, 2, 0x10, 64);
pub(crate) const EVEX_VMOVUPD_M512_ZMM: VForm = evex(1, 1, true, 2, 0x11, 64);
pub(crate) const EVEX_VMOVUPS_ZMM_M512: VForm = evex(1, 0, false, 2, 0x10, 64);
pub(crate) const EVEX_VMOVUPS_M512_ZMM: VForm = evex(1, 0, false, 2, 0x11, 64);
pub(crate) const EVEX_VMOVNTPD_M512_ZMM: VForm = evex(1, 1, true, 2, 0x2B, 64);
pub(crate) const EVEX_VMOVNTPS_M512_ZMM: VForm = evex(1, 0, false, 2, 0x2B, 64);
pub(crate) const EVEX_VBROADCASTSD_ZMM_M64: VForm = evex(2, 1, true, 2, 0x19, 8);
pub(crate) const EVEX_VBROADCASTSS_ZMM_M32: VForm = evex(2, 1, false, 2, 0x18, 4);
pub(crate) const EVEX_VMOVSD_XMM_M64: VForm = evex(1, 3, true, 0, 0x10, 8);
pub(crate) const EVEX_VMOVSD_M64_XMM: VForm = evex(1, 3, true, 0, 0x11, 8);
pub(crate) const EVEX_VMOVSS_XMM_M32: VForm = evex(1, 2, false, 0, 0x10, 4);
pub(crate) const EVEX_VMOVSS_M32_XMM: VForm = evex(1, 2, false, 0, 0x11, 4);
pub(crate) const EVEX_VFMADD231PD_ZMM: VForm = evex(2, 1, true, 2, 0xB8, 64);
pub(crate) const EVEX_VFMADD231PS_ZMM: VForm = evex(2, 1, false, 2, 0xB8, 64);
pub(crate) const EVEX_VFNMADD231PD_ZMM: VForm = evex(2, 1, true, 2, 0xBC, 64);
pub(crate) const EVEX_VFNMADD231PS_ZMM: VForm = evex(2, 1, false, 2, 0xBC, 64);
pub(crate) const EVEX_VADDPD_ZMM: VForm = evex(1, 1, true, 2, 0x58, 64);
pub(crate) const EVEX_VADDPS_ZMM: VForm = evex(1, 0, false, 2, 0x58, 64);
pub(crate) const EVEX_VSUBPD_ZMM: VForm = evex(1, 1, true, 2, 0x5C, 64);
pub(crate) const EVEX_VSUBPS_ZMM: VForm = evex(1, 0, false, 2, 0x5C, 64);
pub(crate) const EVEX_VMULPD_ZMM: VForm = evex(1, 1, true, 2, 0x59, 64);
pub(crate) const EVEX_VMULPS_ZMM: VForm = evex(1, 0, false, 2, 0x59, 64);
pub(crate) const EVEX_VMOVDDUP_XMM_M64: VForm = evex(1, 3, true, 0, 0x12, 8);
pub(crate) const EVEX_VBROADCASTSD_YMM_M64: VForm = evex(2, 1, true, 1, 0x19, 8);
pub(crate) const EVEX_VBROADCASTSS_XMM_M32: VForm = evex(2, 1, false, 0, 0x18, 4);
pub(crate) const EVEX_VBROADCASTSS_YMM_M32: VForm = evex(2, 1, false, 1, 0x18, 4);
pub(crate) const EVEX_VPXORD_XMM: VForm = evex(1, 1, false, 0, 0xEF, 16);
pub(crate) const EVEX_VPERMILPS_ZMM_IMM8: VForm = evex(3, 1, false, 2, 0x04, 64);
pub(crate) const EVEX_VPERMPD_ZMM_IMM8: VForm = evex(3, 1, true, 2, 0x01, 64);
pub(crate) const EVEX_VBROADCASTF32X4_ZMM_M128: VForm = evex(2, 1, false, 2, 0x1A, 16);
pub(crate) const EVEX_VBROADCASTF64X4_ZMM_M256: VForm = evex(2, 1, true, 2, 0x1B, 32);
/// Their AVX512DQ siblings (packed tails).
pub(crate) const EVEX_VBROADCASTF64X2_ZMM_M128: VForm = evex(2, 1, true, 2, 0x1A, 16);
pub(crate) const EVEX_VBROADCASTF32X8_ZMM_M256: VForm = evex(2, 1, false, 2, 0x1B, 32);
/// A group of four elements from memory into one 128- or 256-bit lane: `op reg, reg, [mem],
/// imm8` (lane-packed kernels, map 0F3A).
pub(crate) const EVEX_VINSERTF32X4_ZMM_M128: VForm = evex(3, 1, false, 2, 0x18, 16);
pub(crate) const EVEX_VINSERTF64X4_ZMM_M256: VForm = evex(3, 1, true, 2, 0x1A, 32);
/// Eight f32 and two f64 (AVX512DQ, packed tails).
pub(crate) const EVEX_VINSERTF32X8_ZMM_M256: VForm = evex(3, 1, false, 2, 0x1A, 32);
pub(crate) const EVEX_VINSERTF64X2_ZMM_M128: VForm = evex(3, 1, true, 2, 0x18, 16);
/// Full permutes by an index vector (`op dst, index, src`), and the index vector from 16
/// bytes zero-extended to dwords (lane-packed 3x3x3, map 0F38).
pub(crate) const EVEX_VPERMPS_ZMM: VForm = evex(2, 1, false, 2, 0x16, 64);
pub(crate) const EVEX_VPMOVZXBD_ZMM_M128: VForm = evex(2, 1, false, 2, 0x31, 16);
pub(crate) const EVEX_VPERMPD_ZMM: VForm = evex(2, 1, true, 2, 0x16, 64);
pub(crate) const EVEX_VPMOVZXBQ_ZMM_M64: VForm = evex(2, 1, false, 2, 0x32, 8);
/// The shuffles of dot-product tails' transpose-adds (`op dst, a, b, imm8`): 128-bit blocks
/// (map 0F3A) and elements within them (map 0F).
pub(crate) const EVEX_VSHUFF32X4_ZMM_IMM8: VForm = evex(3, 1, false, 2, 0x23, 64);
pub(crate) const EVEX_VSHUFF64X2_ZMM_IMM8: VForm = evex(3, 1, true, 2, 0x23, 64);
pub(crate) const EVEX_VSHUFPS_ZMM_IMM8: VForm = evex(1, 0, false, 2, 0xC6, 64);
pub(crate) const EVEX_VSHUFPD_ZMM_IMM8: VForm = evex(1, 1, true, 2, 0xC6, 64);
/// Their AVX2 forms in 32-byte vectors: 128-bit halves (map 0F3A) and elements (map 0F).
pub(crate) const VEX_VPERM2F128_YMM_IMM8: VForm = vex(3, 1, false, 1, 0x06);
pub(crate) const VEX_VSHUFPS_YMM_IMM8: VForm = vex(1, 0, false, 1, 0xC6);
pub(crate) const VEX_VSHUFPD_YMM_IMM8: VForm = vex(1, 1, false, 1, 0xC6);

/// The EVEX operand extras: opmask, zeroing, embedded broadcast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Evex {
    /// Opmask register k1–k7; 0 for none.
    pub mask: u8,
    pub zeroing: bool,
    /// `{1toN}`: the memory operand is one element (4 or 8 bytes, per EVEX.W).
    pub broadcast: bool,
}

/// A branch target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Label(u32);

/// Branch conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cond {
    /// Below (carry set): an unsigned subtraction borrowed.
    B = 0x2,
    /// Above or equal (carry clear).
    Ae = 0x3,
    Z = 0x4,
    Nz = 0x5,
}

/// A branch whose displacement is written once all labels are final.
struct Branch {
    /// Offset of the branch's first byte.
    at: usize,
    label: Label,
    short: bool,
}

/// A RIP-relative disp32 to patch: at `at`, relative to the instruction end `end`.
struct RipFixup {
    at: usize,
    end: usize,
    label: Label,
}

/// The displacement a memory operand gets (disp8 already scaled by N).
enum Disp {
    None,
    D8(i8),
    D32,
}

/// One instruction being written straight into the buffer's next 16 bytes (no capacity
/// check per byte, and no copy through the stack, whose narrow stores followed by a wide
/// load stalled store forwarding).
struct Inst<'a> {
    b: &'a mut [u8; 16],
    n: usize,
}

impl Inst<'_> {
    #[inline(always)]
    fn push(&mut self, x: u8) {
        self.b[self.n] = x;
        self.n += 1;
    }

    #[inline(always)]
    fn extend(&mut self, xs: &[u8]) {
        self.b[self.n..self.n + xs.len()].copy_from_slice(xs);
        self.n += xs.len();
    }

    /// ModRM (+ SIB + displacement) for `reg` and `rm`; the disp8 scale is `1 << shift`.
    #[inline(always)]
    fn modrm(&mut self, reg: u8, rm: Rm, shift: u32) {
        let reg = (reg & 7) << 3;
        match rm {
            Rm::Reg(r) => self.push(0xC0 | reg | (r & 7)),
            Rm::Mem(m) => {
                let base = m.base & 7;
                // rbp/r13 with mod 00 would mean RIP-relative / no base.
                let disp = if m.disp == 0 && !m.keep_disp && base != RBP {
                    Disp::None
                } else if m.disp & ((1 << shift) - 1) == 0 && i8::try_from(m.disp >> shift).is_ok()
                {
                    // N is a power of two: a shift, not a (slow) division.
                    Disp::D8((m.disp >> shift) as i8)
                } else {
                    Disp::D32
                };
                let md = match disp {
                    Disp::None => 0x00,
                    Disp::D8(_) => 0x40,
                    Disp::D32 => 0x80,
                };
                self.push(md | reg | base);
                if base == RSP {
                    // SIB: no index, the base again.
                    self.push(0x24);
                }
                match disp {
                    Disp::None => {}
                    Disp::D8(d) => self.push(d as u8),
                    Disp::D32 => self.extend(&m.disp.to_le_bytes()),
                }
            }
        }
    }
}

/// Machine code being written, with its labels and the references still to resolve.
pub(crate) struct Assembler {
    /// The code is `buf[..len]`; the rest is room, so that an instruction can be written
    /// without growing the Vec byte by byte.
    buf: Vec<u8>,
    len: usize,
    labels: Vec<Option<usize>>,
    branches: Vec<Branch>,
    rip: Vec<RipFixup>,
}

/// Why a buffer could not be finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EncodeError {
    UnboundLabel,
    DisplacementOutOfRange,
}

impl Assembler {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Assembler {
            buf: vec![0; bytes.max(64)],
            len: 0,
            labels: Vec::new(),
            branches: Vec::new(),
            rip: Vec::new(),
        }
    }

    /// Current offset.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Room for `n` more bytes.
    #[inline(always)]
    fn reserve(&mut self, n: usize) {
        if self.buf.len() < self.len + n {
            let size = (2 * self.buf.len()).max(self.len + n);
            self.buf.resize(size, 0);
        }
    }

    /// The next 16 bytes, for one instruction.
    #[inline(always)]
    fn inst(&mut self) -> Inst<'_> {
        self.reserve(16);
        let window = &mut self.buf[self.len..self.len + 16];
        Inst {
            b: window.try_into().expect("16 bytes"),
            n: 0,
        }
    }

    /// Appends `bytes`.
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    pub(crate) fn new_label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() as u32 - 1)
    }

    /// Binds `label` here. Forward branches to it that now reach with a rel8 are
    /// shrunk (their rel32 bytes removed), which is what iced's BlockEncoder converges to
    /// for the properly nested loops the emitter produces: everything between such a
    /// branch and its label is final, and only forward branches are still rel32.
    pub(crate) fn bind(&mut self, label: Label) {
        let mut here = self.len;
        // Latest first: shrinking an inner branch can only let an outer one reach.
        let mut i = self.branches.len();
        while i > 0 {
            i -= 1;
            let b = &self.branches[i];
            if b.label != label || b.short {
                continue;
            }
            let at = b.at;
            let rel = here as i64 - (at as i64 + 2);
            if i8::try_from(rel).is_err() {
                continue;
            }
            // rel32 jcc is 0F 8x + 4 bytes; rel8 is 7x + 1 byte.
            let cc = self.buf[at + 1] & 0x0F;
            self.buf[at] = 0x70 | cc;
            self.buf.copy_within(at + 5..self.len, at + 1);
            self.len -= 4;
            self.branches[i].short = true;
            for b in &mut self.branches {
                if b.at > at {
                    b.at -= 4;
                }
            }
            for f in &mut self.rip {
                if f.at > at {
                    f.at -= 4;
                    f.end -= 4;
                }
            }
            for l in self.labels.iter_mut().flatten() {
                if *l > at {
                    *l -= 4;
                }
            }
            here -= 4;
        }
        self.labels[label.0 as usize] = Some(here);
    }

    /// `jcc label`: rel8 when the (bound) target reaches, else rel32 (shrunk at `bind`
    /// when a forward target turns out near).
    pub(crate) fn jcc(&mut self, cond: Cond, label: Label) {
        let at = self.len;
        let short = match self.labels[label.0 as usize] {
            Some(target) => i8::try_from(target as i64 - (at as i64 + 2)).is_ok(),
            None => false,
        };
        if short {
            self.put(&[0x70 | cond as u8, 0]);
        } else {
            self.put(&[0x0F, 0x80 | cond as u8, 0, 0, 0, 0]);
        }
        self.branches.push(Branch { at, label, short });
    }

    /// Appends raw bytes (data after the code).
    pub(crate) fn bytes(&mut self, data: &[u8]) {
        self.put(data);
    }

    /// Resolves the branches and RIP-relative references.
    pub(crate) fn finish(mut self) -> Result<Vec<u8>, EncodeError> {
        self.buf.truncate(self.len);
        for b in &self.branches {
            let target = self.labels[b.label.0 as usize].ok_or(EncodeError::UnboundLabel)?;
            if b.short {
                let rel = i8::try_from(target as i64 - (b.at as i64 + 2))
                    .map_err(|_| EncodeError::DisplacementOutOfRange)?;
                self.buf[b.at + 1] = rel as u8;
            } else {
                let rel = i32::try_from(target as i64 - (b.at as i64 + 6))
                    .map_err(|_| EncodeError::DisplacementOutOfRange)?;
                self.buf[b.at + 2..b.at + 6].copy_from_slice(&rel.to_le_bytes());
            }
        }
        for f in &self.rip {
            let target = self.labels[f.label.0 as usize].ok_or(EncodeError::UnboundLabel)?;
            let rel = i32::try_from(target as i64 - f.end as i64)
                .map_err(|_| EncodeError::DisplacementOutOfRange)?;
            self.buf[f.at..f.at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        Ok(self.buf)
    }

    /// A VEX or EVEX instruction: `reg` in ModRM.reg, `vvvv` the extra source (0 when the
    /// form has none, which encodes as 1111), `rm` in ModRM.rm. Inlined into each call
    /// site, where the operand kinds are constants and most branches fold away.
    #[inline(always)]
    pub(crate) fn vec(&mut self, f: VForm, reg: u8, vvvv: u8, rm: Rm, e: Evex) {
        let (rm_b, rm_x) = match rm {
            Rm::Reg(r) => ((r >> 3) & 1, (r >> 4) & 1),
            Rm::Mem(m) => ((m.base >> 3) & 1, 0),
        };
        let r = (reg >> 3) & 1;
        let mut i = self.inst();
        if f.evex {
            let r2 = (reg >> 4) & 1;
            let v2 = (vvvv >> 4) & 1;
            let p0 =
                ((r ^ 1) << 7) | ((rm_x ^ 1) << 6) | ((rm_b ^ 1) << 5) | ((r2 ^ 1) << 4) | f.map;
            let p1 = ((f.w as u8) << 7) | ((!vvvv & 15) << 3) | 0x04 | f.pp;
            let p2 = ((e.zeroing as u8) << 7)
                | (f.l << 5)
                | ((e.broadcast as u8) << 4)
                | ((v2 ^ 1) << 3)
                | (e.mask & 7);
            i.extend(&[0x62, p0, p1, p2, f.opcode]);
            // disp8*N: N is the element size under broadcast, else the form's.
            let shift = if e.broadcast {
                if f.w {
                    3
                } else {
                    2
                }
            } else {
                f.n.trailing_zeros()
            };
            i.modrm(reg, rm, shift);
        } else {
            let tail = ((!vvvv & 15) << 3) | (f.l << 2) | f.pp;
            if f.map == 1 && !f.w && rm_b == 0 {
                i.extend(&[0xC5, ((r ^ 1) << 7) | tail, f.opcode]);
            } else {
                // X is always clear: no index registers.
                let b1 = ((r ^ 1) << 7) | 0x40 | ((rm_b ^ 1) << 5) | f.map;
                let b2 = ((f.w as u8) << 7) | tail;
                i.extend(&[0xC4, b1, b2, f.opcode]);
            }
            i.modrm(reg, rm, 0);
        }
        let n = i.n;
        self.len += n;
    }

    /// A vector instruction followed by an 8-bit immediate.
    pub(crate) fn vec_imm8(&mut self, f: VForm, reg: u8, vvvv: u8, rm: Rm, e: Evex, imm: u8) {
        self.vec(f, reg, vvvv, rm, e);
        self.put(&[imm]);
    }

    /// A VEX or EVEX instruction with a RIP-relative memory operand at `label` (EVEX: no
    /// mask, no broadcast).
    pub(crate) fn vec_rip(&mut self, f: VForm, reg: u8, label: Label) {
        debug_assert!(f.evex || reg < 16);
        let r = (reg >> 3) & 1;
        // vvvv unused: 1111.
        let tail = 0x78 | (f.l << 2) | f.pp;
        if f.evex {
            // No index or base register: X and B set (inverted); V' set; no mask.
            let r2 = (reg >> 4) & 1;
            let p0 = ((r ^ 1) << 7) | 0x60 | ((r2 ^ 1) << 4) | f.map;
            let p1 = ((f.w as u8) << 7) | 0x78 | 0x04 | f.pp;
            self.put(&[0x62, p0, p1, (f.l << 5) | 0x08, f.opcode]);
        } else if f.map == 1 && !f.w {
            self.put(&[0xC5, ((r ^ 1) << 7) | tail, f.opcode]);
        } else {
            let b1 = ((r ^ 1) << 7) | 0x60 | f.map;
            self.put(&[0xC4, b1, ((f.w as u8) << 7) | tail, f.opcode]);
        }
        self.put(&[((reg & 7) << 3) | 0x05]);
        let at = self.len;
        self.put(&[0; 4]);
        self.rip.push(RipFixup {
            at,
            end: at + 4,
            label,
        });
    }

    /// A legacy instruction: optional REX (W, and the high bits of reg and rm), opcode
    /// bytes, ModRM, immediate.
    #[inline(always)]
    fn legacy(&mut self, w: bool, opcode: &[u8], reg: u8, rm: Rm, imm: &[u8]) {
        let b = match rm {
            Rm::Reg(r) => (r >> 3) & 1,
            Rm::Mem(m) => (m.base >> 3) & 1,
        };
        let rex = ((w as u8) << 3) | (((reg >> 3) & 1) << 2) | b;
        let mut i = self.inst();
        if rex != 0 {
            i.push(0x40 | rex);
        }
        i.extend(opcode);
        i.modrm(reg, rm, 0);
        i.extend(imm);
        let n = i.n;
        self.len += n;
    }

    /// `prefetcht0 m8` (0F 18 /1): into every cache level.
    pub(crate) fn prefetcht0(&mut self, m: Rm) {
        self.legacy(false, &[0x0F, 0x18], 1, m, &[]);
    }

    /// `sfence`: orders the weakly ordered (non-temporal) stores before it.
    pub(crate) fn sfence(&mut self) {
        self.bytes(&[0x0F, 0xAE, 0xF8]);
    }

    /// `push r64`.
    pub(crate) fn push(&mut self, r: u8) {
        if r >= 8 {
            self.put(&[0x41]);
        }
        self.put(&[0x50 | (r & 7)]);
    }

    /// `pop r64`.
    pub(crate) fn pop(&mut self, r: u8) {
        if r >= 8 {
            self.put(&[0x41]);
        }
        self.put(&[0x58 | (r & 7)]);
    }

    /// `mov r64, r/m64` (8B, also for register to register, as iced's Mov_r64_rm64).
    pub(crate) fn mov_r64_rm64(&mut self, dst: u8, src: Rm) {
        self.legacy(true, &[0x8B], dst, src, &[]);
    }

    /// `mov r/m64, r64`.
    pub(crate) fn mov_rm64_r64(&mut self, dst: Rm, src: u8) {
        self.legacy(true, &[0x89], src, dst, &[]);
    }

    /// `mov r32, r/m32`.
    pub(crate) fn mov_r32_rm32(&mut self, dst: u8, src: Rm) {
        self.legacy(false, &[0x8B], dst, src, &[]);
    }

    /// `mov r/m32, r32`.
    pub(crate) fn mov_rm32_r32(&mut self, dst: Rm, src: u8) {
        self.legacy(false, &[0x89], src, dst, &[]);
    }

    /// `mov r32, imm32` (B8+r; writing r32 zero-extends).
    pub(crate) fn mov_r32_imm32(&mut self, dst: u8, imm: u32) {
        if dst >= 8 {
            self.put(&[0x41]);
        }
        self.put(&[0xB8 | (dst & 7)]);
        self.put(&imm.to_le_bytes());
    }

    /// `mov dword [mem], imm32`.
    pub(crate) fn mov_m32_imm32(&mut self, dst: Mem, imm: u32) {
        self.legacy(false, &[0xC7], 0, Rm::Mem(dst), &imm.to_le_bytes());
    }

    /// `add/or/adc/sbb/and/sub/xor/cmp r/m64, imm8` (83 /ext ib).
    fn alu64_imm8(&mut self, ext: u8, dst: u8, imm: i8) {
        self.legacy(true, &[0x83], ext, Rm::Reg(dst), &[imm as u8]);
    }

    /// The same with imm32 (81 /ext id), used even when the value fits in imm8.
    fn alu64_imm32(&mut self, ext: u8, dst: u8, imm: i32) {
        self.legacy(true, &[0x81], ext, Rm::Reg(dst), &imm.to_le_bytes());
    }

    pub(crate) fn add64_imm8(&mut self, dst: u8, imm: i8) {
        self.alu64_imm8(0, dst, imm);
    }

    pub(crate) fn add64_imm32(&mut self, dst: u8, imm: i32) {
        self.alu64_imm32(0, dst, imm);
    }

    pub(crate) fn sub64_imm8(&mut self, dst: u8, imm: i8) {
        self.alu64_imm8(5, dst, imm);
    }

    pub(crate) fn and64_imm8(&mut self, dst: u8, imm: i8) {
        self.alu64_imm8(4, dst, imm);
    }

    pub(crate) fn sub64_imm32(&mut self, dst: u8, imm: i32) {
        self.alu64_imm32(5, dst, imm);
    }

    /// `test r/m64, r64`.
    pub(crate) fn test64(&mut self, a: u8, b: u8) {
        self.legacy(true, &[0x85], b, Rm::Reg(a), &[]);
    }

    /// `dec r/m64`.
    pub(crate) fn dec64(&mut self, r: u8) {
        self.legacy(true, &[0xFF], 1, Rm::Reg(r), &[]);
    }

    pub(crate) fn vzeroupper(&mut self) {
        self.put(&[0xC5, 0xF8, 0x77]);
    }

    pub(crate) fn ret(&mut self) {
        self.put(&[0xC3]);
    }
}
