//! Register mapping: the Program's numbered vector registers onto v0..v31.

/// Physical register of each Program vector register: v0..v7, then the caller-saved
/// v16..v31, and v8..v15 (whose low halves a callee must preserve) last, so kernels with
/// up to 24 vector registers save nothing. v0 and v1 stay first: they carry the scalar
/// arguments, which the program stores before it writes any vector register.
pub(crate) const VECTOR: [u8; 32] = [
    0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 8, 9,
    10, 11, 12, 13, 14, 15,
];
