//! Calling conventions, as the kernels use them:
//! `kernel(a, b, c, batch, [alpha], [beta])` with the scalars present as
//! `Program::params` lists them.
//!
//! - System V AMD64 (Linux, macOS): a, b, c, batch in rdi, rsi, rdx, rcx; the scalars in
//!   xmm0, xmm1; rbx, rbp, r12–r15 callee-saved.
//! - Microsoft x64 (Windows): a, b, c, batch in rcx, rdx, r8, r9; the scalars are the fifth
//!   and sixth arguments, on the stack above the 32-byte shadow space; rbx, rbp, rdi, rsi,
//!   r12–r15 and xmm6–xmm15 callee-saved.

use iced_x86::Register;

/// Which calling convention the kernel follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CallConv {
    #[default]
    SysV,
    Win64,
}

/// Where a floating-point argument arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArgumentLocation {
    Register(Register),
    /// Bytes above the stack pointer at entry (which points at the return address).
    Stack(i32),
}

impl CallConv {
    /// General registers in the order Program numbers them: the four arguments first, then
    /// the registers the lowering allocates (caller-saved before callee-saved, so small
    /// kernels push nothing). r11 is kept back as the backend's own temporary; rbp is the
    /// frame pointer when the kernel has a frame.
    pub(crate) fn general(self) -> &'static [Register] {
        use Register::*;
        match self {
            CallConv::SysV => &[
                RDI, RSI, RDX, RCX, R8, R9, R10, RAX, RBX, R12, R13, R14, R15,
            ],
            CallConv::Win64 => &[
                RCX, RDX, R8, R9, R10, RAX, RBX, RSI, RDI, R12, R13, R14, R15,
            ],
        }
    }

    /// Whether the callee must preserve general register `r`.
    pub(crate) fn is_callee_saved(self, r: Register) -> bool {
        use Register::*;
        match self {
            CallConv::SysV => matches!(r, RBX | RBP | R12 | R13 | R14 | R15),
            CallConv::Win64 => matches!(r, RBX | RBP | RDI | RSI | R12 | R13 | R14 | R15),
        }
    }

    /// Vector registers whose low 128 bits the callee must preserve.
    pub(crate) fn callee_saved_vectors(self) -> std::ops::Range<usize> {
        match self {
            CallConv::SysV => 0..0,
            CallConv::Win64 => 6..16,
        }
    }

    /// Where the `i`-th floating-point argument (after the four integer ones) arrives.
    pub(crate) fn float_argument(self, i: usize) -> ArgumentLocation {
        match self {
            CallConv::SysV => ArgumentLocation::Register(
                Register::try_from(Register::XMM0 as usize + i).expect("at most two scalars"),
            ),
            // Return address (8) + shadow space (32), then one 8-byte slot per argument.
            CallConv::Win64 => ArgumentLocation::Stack(40 + 8 * i as i32),
        }
    }
}

/// The backend's temporary general register (never allocated to the Program).
pub(crate) const TEMP: Register = Register::R11;

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes after the lowering may use as many general registers as every backend has.
    #[test]
    fn both_conventions_have_the_registers_every_backend_promises() {
        for conv in [CallConv::SysV, CallConv::Win64] {
            let general = conv.general();
            assert!(
                general.len() >= smallgemm_ir::Gpr::EVERY_BACKEND,
                "{conv:?}"
            );
            assert!(!general.contains(&TEMP) && !general.contains(&Register::RSP));
        }
    }
}
