//! The AAPCS64 calling convention, as the kernels use it:
//! `kernel(a, b, c, batch, [alpha], [beta])` with the pointers and batch in x0..x3 and the
//! run-time scalars in v0, v1 (d0/s0, d1/s1) in `Program::params` order.

/// General registers in the order Program numbers them: the four arguments first, then the
/// registers the lowering allocates, caller-saved x4..x15 before callee-saved x19..x28, so
/// that small kernels save nothing. x16/x17 (the intra-procedure-call scratch registers)
/// are the backend's own temporaries; x18 is the platform register (reserved on Apple and
/// Windows); x29 is the frame pointer when the kernel has a frame; x30 holds the return
/// address.
pub(crate) const GENERAL: [u8; 26] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
];

/// The backend's temporary for addresses whose offset does not fit an instruction.
pub(crate) const ADDRESS_TEMP: u8 = 16;
/// The backend's temporary for constants (so an address can still be formed in x16).
pub(crate) const VALUE_TEMP: u8 = 17;
/// The frame pointer.
pub(crate) const FRAME: u8 = 29;
/// Register number 31 addresses the stack pointer as a base register.
pub(crate) const SP: u8 = 31;

/// General registers the callee must preserve (x19..x28; x29/x30 are saved as a pair).
pub(crate) fn is_callee_saved_general(x: u8) -> bool {
    (19..=28).contains(&x)
}

/// Vector registers whose low 64 bits (d8..d15) the callee must preserve.
pub(crate) fn is_callee_saved_vector(v: u8) -> bool {
    (8..=15).contains(&v)
}

/// The vector register that carries the `i`-th floating-point argument.
pub(crate) fn float_argument(i: usize) -> u8 {
    i as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes after the lowering may use as many general registers as every backend has.
    #[test]
    fn the_registers_every_backend_promises() {
        assert!(GENERAL.len() >= smallgemm_ir::Gpr::EVERY_BACKEND);
        assert!(!GENERAL.contains(&ADDRESS_TEMP));
    }
}
