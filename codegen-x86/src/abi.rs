//! The System V AMD64 calling convention, as the kernels use it:
//! `kernel(a, b, c, batch, [alpha], [beta])` with the pointers and batch in rdi, rsi, rdx,
//! rcx and the run-time scalars in xmm0, xmm1 in `Program::params` order.

use iced_x86::Register;

/// General registers in the order Program numbers them: the four arguments first, then the
/// registers the lowering allocates (caller-saved before callee-saved, so small kernels push
/// nothing). r11 is kept back as the backend's own temporary; rbp is the frame pointer when
/// the kernel has scratch memory.
pub(crate) const GENERAL: [Register; 13] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::RAX,
    Register::RBX,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// The backend's temporary general register (never allocated to the Program).
pub(crate) const TEMP: Register = Register::R11;

/// Registers the callee must preserve.
pub(crate) fn is_callee_saved(r: Register) -> bool {
    matches!(
        r,
        Register::RBX
            | Register::RBP
            | Register::R12
            | Register::R13
            | Register::R14
            | Register::R15
    )
}

/// The xmm register that carries the `i`-th floating-point argument.
pub(crate) fn float_argument(i: usize) -> Register {
    Register::try_from(Register::XMM0 as usize + i).expect("at most two scalar arguments")
}
