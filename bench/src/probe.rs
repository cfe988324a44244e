//! The machine's limits, measured in the same run as the GEMMs: one core's FMA peak (a
//! register-only FMA loop), and the bandwidth of three access patterns over a buffer: the
//! GEMM pattern (stream x, y, z and write z in place, the traffic of z += x·y), copy
//! (y = x) and triad (a = b + s·c). Written in inline assembly so that what runs is exactly the instruction mix
//! we mean, at the vector width of the JIT's ISA, whatever the compiler's target.

use smallgemm::{Dtype, Isa};

/// A memory access pattern probed for bandwidth, with the bytes it moves per byte of one
/// array (STREAM's convention: a read or a write of an array counts once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Reads x, y, z and writes z in place: the traffic of z += x·y, what a GEMM with
    /// beta ≠ 0 does to A, B, C. The values written are z's own (z | (x & y & 0), bitwise),
    /// so the probe can stream over a GEMM's operands between its samples and leave every
    /// element as it was, whatever type the bits hold.
    Gemm,
    /// y = x.
    Copy,
    /// a = b + s·c.
    Triad,
}

impl Pattern {
    pub const ALL: [Pattern; 3] = [Pattern::Gemm, Pattern::Copy, Pattern::Triad];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::Gemm => "gemm (read x, y, z; write z)",
            Pattern::Copy => "copy",
            Pattern::Triad => "triad",
        }
    }

    /// Bytes counted per byte of one array.
    pub fn traffic(self) -> usize {
        match self {
            Pattern::Gemm => 4,
            Pattern::Copy => 2,
            Pattern::Triad => 3,
        }
    }
}

/// Bytes of one unrolled step of the bandwidth loops (4 zmm or 8 ymm registers).
pub const STEP_BYTES: usize = 256;

/// FMA-loop iterations per call of [`fma_loop`]: about 0.1 ms on a 2+ GHz core.
const FMA_ITERS: u64 = 20_000;

/// The floating-point operations of one call of [`fma_loop`]: twelve FMAs of `isa`'s
/// vectors per iteration.
pub fn fma_loop_flops(isa: Isa, dtype: Dtype) -> f64 {
    let lanes = smallgemm::Target::new(isa).vector_bytes() / dtype.size();
    FMA_ITERS as f64 * 12.0 * lanes as f64 * 2.0
}

/// Runs the register-only FMA loop once; returns the floating-point operations it did
/// ([`fma_loop_flops`]). Twelve independent accumulators cover the FMA latency on two ports.
pub fn fma_loop(isa: Isa, dtype: Dtype) -> Result<f64, String> {
    check_isa(isa)?;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the ISA is supported by this CPU (checked); the asm touches only the
        // registers it declares (zmm0-15 through their xmm names; upper halves are not used
        // by code compiled without AVX-512) and ends with vzeroupper.
        unsafe {
            match (isa, dtype) {
                (Isa::Avx512, Dtype::F64) => fma_zmm_pd(FMA_ITERS),
                (Isa::Avx512, _) => fma_zmm_ps(FMA_ITERS),
                (Isa::Avx2, Dtype::F64) => fma_ymm_pd(FMA_ITERS),
                (Isa::Avx2, _) => fma_ymm_ps(FMA_ITERS),
                // check_isa above: an x86-64 CPU never runs NEON.
                (Isa::Neon, _) => return Err("the FMA probe has no NEON version".into()),
                // Other ISAs (NEON) never pass check_isa on x86-64.
                #[allow(unreachable_patterns)]
                _ => return Err(format!("no FMA probe for {}", isa.name())),
            }
        }
        Ok(fma_loop_flops(isa, dtype))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        Err("the FMA probe needs x86-64".into())
    }
}

fn check_isa(isa: Isa) -> Result<(), String> {
    if smallgemm::supported_isas().contains(&isa) {
        Ok(())
    } else {
        Err(format!("this CPU does not run {}", isa.name()))
    }
}

/// Runs `pattern` once over arrays of `bytes` bytes each (rounded down to [`STEP_BYTES`]);
/// returns the bytes counted. `x`, `y`, `z` must not overlap.
pub fn stream(
    isa: Isa,
    pattern: Pattern,
    x: &[f64],
    y: &[f64],
    z: &mut [f64],
) -> Result<usize, String> {
    let bytes = x.len().min(y.len()).min(z.len()) * 8;
    // SAFETY: each array holds at least `bytes` bytes; z is exclusively borrowed and so
    // overlaps neither x nor y.
    unsafe {
        stream_raw(
            isa,
            pattern,
            x.as_ptr().cast(),
            y.as_ptr().cast(),
            z.as_mut_ptr().cast(),
            bytes,
        )
    }
}

/// [`stream`] over raw memory: `bytes` (rounded down to [`STEP_BYTES`]) from each of x, y
/// and z, any alignment.
///
/// # Safety
/// x and y must be readable and z readable and writable for `bytes` bytes, z must overlap
/// neither x nor y, and nothing else may access z during the call. The Gemm pattern writes
/// back the bits it read; copy and triad overwrite z with f64 values.
pub unsafe fn stream_raw(
    isa: Isa,
    pattern: Pattern,
    x: *const u8,
    y: *const u8,
    z: *mut u8,
    bytes: usize,
) -> Result<usize, String> {
    check_isa(isa)?;
    let bytes = bytes / STEP_BYTES * STEP_BYTES;
    if bytes == 0 {
        return Ok(0);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (x, y, z) = (x.cast::<f64>(), y.cast::<f64>(), z.cast::<f64>());
        // SAFETY: the caller's promises cover `bytes` bytes of each array; the loops use
        // unaligned moves; the ISA is supported (checked).
        unsafe {
            match (isa, pattern) {
                (Isa::Avx512, Pattern::Gemm) => gemm_zmm(x, y, z, bytes),
                (Isa::Avx512, Pattern::Copy) => copy_zmm(x, z, bytes),
                (Isa::Avx512, Pattern::Triad) => triad_zmm(x, y, z, bytes),
                (Isa::Avx2, Pattern::Gemm) => gemm_ymm(x, y, z, bytes),
                (Isa::Avx2, Pattern::Copy) => copy_ymm(x, z, bytes),
                (Isa::Avx2, Pattern::Triad) => triad_ymm(x, y, z, bytes),
                (Isa::Neon, _) => return Err("the bandwidth probes have no NEON version".into()),
                // Other ISAs (NEON) never pass check_isa on x86-64.
                #[allow(unreachable_patterns)]
                _ => return Err(format!("no bandwidth probe for {}", isa.name())),
            }
        }
        Ok(bytes * pattern.traffic())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, y, z);
        Err("the bandwidth probes need x86-64".into())
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! fma_body {
    ($op:literal, $r:literal) => {
        concat!(
            "vxorps ",
            $r,
            "0, ",
            $r,
            "0, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "1, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "2, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "3, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "4, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "5, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "6, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "7, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "8, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "9, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "10, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "11, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "12, ",
            $r,
            "0\n",
            "vmovaps ",
            $r,
            "13, ",
            $r,
            "0\n",
            "2:\n",
            $op,
            " ",
            $r,
            "0, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "1, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "2, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "3, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "4, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "5, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "6, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "7, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "8, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "9, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "10, ",
            $r,
            "12, ",
            $r,
            "13\n",
            $op,
            " ",
            $r,
            "11, ",
            $r,
            "12, ",
            $r,
            "13\n",
            "dec {n}\n",
            "jnz 2b\n",
            "vzeroupper\n",
        )
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! fma_fn {
    ($name:ident, $op:literal, $r:literal) => {
        unsafe fn $name(iters: u64) {
            std::arch::asm!(
                fma_body!($op, $r),
                n = inout(reg) iters => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _,
                options(nostack, nomem),
            );
        }
    };
}

#[cfg(target_arch = "x86_64")]
fma_fn!(fma_zmm_pd, "vfmadd231pd", "zmm");
#[cfg(target_arch = "x86_64")]
fma_fn!(fma_zmm_ps, "vfmadd231ps", "zmm");
#[cfg(target_arch = "x86_64")]
fma_fn!(fma_ymm_pd, "vfmadd231pd", "ymm");
#[cfg(target_arch = "x86_64")]
fma_fn!(fma_ymm_ps, "vfmadd231ps", "ymm");

// The bandwidth loops: 256 bytes a step, as 4 zmm or 8 ymm operations per array.

#[cfg(target_arch = "x86_64")]
macro_rules! stream_fn {
    ($name:ident, $($body:literal),*) => {
        unsafe fn $name(x: *const f64, y: *const f64, z: *mut f64, bytes: usize) {
            std::arch::asm!(
                "xor {i}, {i}",
                "2:",
                $($body,)*
                "add {i}, 256",
                "cmp {i}, {n}",
                "jb 2b",
                "vzeroupper",
                x = in(reg) x, y = in(reg) y, z = in(reg) z, n = in(reg) bytes,
                i = out(reg) _,
                // The triad's scalar s.
                in("xmm15") 0.5f64,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                options(nostack),
            );
        }
    };
}

#[cfg(target_arch = "x86_64")]
stream_fn!(
    gemm_zmm,
    "vmovupd zmm0, [{z} + {i}]",
    "vmovupd zmm1, [{z} + {i} + 64]",
    "vmovupd zmm2, [{z} + {i} + 128]",
    "vmovupd zmm3, [{z} + {i} + 192]",
    "vmovupd zmm4, [{x} + {i}]",
    "vmovupd zmm5, [{x} + {i} + 64]",
    "vmovupd zmm6, [{x} + {i} + 128]",
    "vmovupd zmm7, [{x} + {i} + 192]",
    // 0xF0: the result is the first operand (z); y is still read from memory.
    "vpternlogq zmm0, zmm4, [{y} + {i}], 0xF0",
    "vpternlogq zmm1, zmm5, [{y} + {i} + 64], 0xF0",
    "vpternlogq zmm2, zmm6, [{y} + {i} + 128], 0xF0",
    "vpternlogq zmm3, zmm7, [{y} + {i} + 192], 0xF0",
    "vmovupd [{z} + {i}], zmm0",
    "vmovupd [{z} + {i} + 64], zmm1",
    "vmovupd [{z} + {i} + 128], zmm2",
    "vmovupd [{z} + {i} + 192], zmm3"
);

#[cfg(target_arch = "x86_64")]
stream_fn!(
    copy_zmm_inner,
    "/* {y} unused */",
    "vmovupd zmm0, [{x} + {i}]",
    "vmovupd zmm1, [{x} + {i} + 64]",
    "vmovupd zmm2, [{x} + {i} + 128]",
    "vmovupd zmm3, [{x} + {i} + 192]",
    "vmovupd [{z} + {i}], zmm0",
    "vmovupd [{z} + {i} + 64], zmm1",
    "vmovupd [{z} + {i} + 128], zmm2",
    "vmovupd [{z} + {i} + 192], zmm3"
);

#[cfg(target_arch = "x86_64")]
stream_fn!(
    triad_zmm,
    "vbroadcastsd zmm7, xmm15",
    "vmovupd zmm0, [{y} + {i}]",
    "vmovupd zmm1, [{y} + {i} + 64]",
    "vmovupd zmm2, [{y} + {i} + 128]",
    "vmovupd zmm3, [{y} + {i} + 192]",
    "vfmadd213pd zmm0, zmm7, [{x} + {i}]",
    "vfmadd213pd zmm1, zmm7, [{x} + {i} + 64]",
    "vfmadd213pd zmm2, zmm7, [{x} + {i} + 128]",
    "vfmadd213pd zmm3, zmm7, [{x} + {i} + 192]",
    "vmovupd [{z} + {i}], zmm0",
    "vmovupd [{z} + {i} + 64], zmm1",
    "vmovupd [{z} + {i} + 128], zmm2",
    "vmovupd [{z} + {i} + 192], zmm3"
);

#[cfg(target_arch = "x86_64")]
stream_fn!(
    gemm_ymm,
    "vmovupd ymm0, [{z} + {i}]",
    "vmovupd ymm1, [{z} + {i} + 32]",
    "vmovupd ymm2, [{z} + {i} + 64]",
    "vmovupd ymm3, [{z} + {i} + 96]",
    "vmovupd ymm4, [{x} + {i}]",
    "vmovupd ymm5, [{x} + {i} + 32]",
    "vmovupd ymm6, [{x} + {i} + 64]",
    "vmovupd ymm7, [{x} + {i} + 96]",
    // z | ((x & y) & !(x & y)) = z, bitwise; y is still read from memory.
    "vandpd ymm4, ymm4, [{y} + {i}]",
    "vandnpd ymm4, ymm4, ymm4",
    "vorpd ymm0, ymm0, ymm4",
    "vandpd ymm5, ymm5, [{y} + {i} + 32]",
    "vandnpd ymm5, ymm5, ymm5",
    "vorpd ymm1, ymm1, ymm5",
    "vandpd ymm6, ymm6, [{y} + {i} + 64]",
    "vandnpd ymm6, ymm6, ymm6",
    "vorpd ymm2, ymm2, ymm6",
    "vandpd ymm7, ymm7, [{y} + {i} + 96]",
    "vandnpd ymm7, ymm7, ymm7",
    "vorpd ymm3, ymm3, ymm7",
    "vmovupd [{z} + {i}], ymm0",
    "vmovupd [{z} + {i} + 32], ymm1",
    "vmovupd [{z} + {i} + 64], ymm2",
    "vmovupd [{z} + {i} + 96], ymm3",
    "vmovupd ymm0, [{z} + {i} + 128]",
    "vmovupd ymm1, [{z} + {i} + 160]",
    "vmovupd ymm2, [{z} + {i} + 192]",
    "vmovupd ymm3, [{z} + {i} + 224]",
    "vmovupd ymm4, [{x} + {i} + 128]",
    "vmovupd ymm5, [{x} + {i} + 160]",
    "vmovupd ymm6, [{x} + {i} + 192]",
    "vmovupd ymm7, [{x} + {i} + 224]",
    "vandpd ymm4, ymm4, [{y} + {i} + 128]",
    "vandnpd ymm4, ymm4, ymm4",
    "vorpd ymm0, ymm0, ymm4",
    "vandpd ymm5, ymm5, [{y} + {i} + 160]",
    "vandnpd ymm5, ymm5, ymm5",
    "vorpd ymm1, ymm1, ymm5",
    "vandpd ymm6, ymm6, [{y} + {i} + 192]",
    "vandnpd ymm6, ymm6, ymm6",
    "vorpd ymm2, ymm2, ymm6",
    "vandpd ymm7, ymm7, [{y} + {i} + 224]",
    "vandnpd ymm7, ymm7, ymm7",
    "vorpd ymm3, ymm3, ymm7",
    "vmovupd [{z} + {i} + 128], ymm0",
    "vmovupd [{z} + {i} + 160], ymm1",
    "vmovupd [{z} + {i} + 192], ymm2",
    "vmovupd [{z} + {i} + 224], ymm3"
);

#[cfg(target_arch = "x86_64")]
stream_fn!(
    copy_ymm_inner,
    "/* {y} unused */",
    "vmovupd ymm0, [{x} + {i}]",
    "vmovupd ymm1, [{x} + {i} + 32]",
    "vmovupd ymm2, [{x} + {i} + 64]",
    "vmovupd ymm3, [{x} + {i} + 96]",
    "vmovupd ymm4, [{x} + {i} + 128]",
    "vmovupd ymm5, [{x} + {i} + 160]",
    "vmovupd ymm6, [{x} + {i} + 192]",
    "vmovupd ymm7, [{x} + {i} + 224]",
    "vmovupd [{z} + {i}], ymm0",
    "vmovupd [{z} + {i} + 32], ymm1",
    "vmovupd [{z} + {i} + 64], ymm2",
    "vmovupd [{z} + {i} + 96], ymm3",
    "vmovupd [{z} + {i} + 128], ymm4",
    "vmovupd [{z} + {i} + 160], ymm5",
    "vmovupd [{z} + {i} + 192], ymm6",
    "vmovupd [{z} + {i} + 224], ymm7"
);

#[cfg(target_arch = "x86_64")]
stream_fn!(
    triad_ymm,
    "vbroadcastsd ymm7, xmm15",
    "vmovupd ymm0, [{y} + {i}]",
    "vmovupd ymm1, [{y} + {i} + 32]",
    "vmovupd ymm2, [{y} + {i} + 64]",
    "vmovupd ymm3, [{y} + {i} + 96]",
    "vfmadd213pd ymm0, ymm7, [{x} + {i}]",
    "vfmadd213pd ymm1, ymm7, [{x} + {i} + 32]",
    "vfmadd213pd ymm2, ymm7, [{x} + {i} + 64]",
    "vfmadd213pd ymm3, ymm7, [{x} + {i} + 96]",
    "vmovupd [{z} + {i}], ymm0",
    "vmovupd [{z} + {i} + 32], ymm1",
    "vmovupd [{z} + {i} + 64], ymm2",
    "vmovupd [{z} + {i} + 96], ymm3",
    "vmovupd ymm0, [{y} + {i} + 128]",
    "vmovupd ymm1, [{y} + {i} + 160]",
    "vmovupd ymm2, [{y} + {i} + 192]",
    "vmovupd ymm3, [{y} + {i} + 224]",
    "vfmadd213pd ymm0, ymm7, [{x} + {i} + 128]",
    "vfmadd213pd ymm1, ymm7, [{x} + {i} + 160]",
    "vfmadd213pd ymm2, ymm7, [{x} + {i} + 192]",
    "vfmadd213pd ymm3, ymm7, [{x} + {i} + 224]",
    "vmovupd [{z} + {i} + 128], ymm0",
    "vmovupd [{z} + {i} + 160], ymm1",
    "vmovupd [{z} + {i} + 192], ymm2",
    "vmovupd [{z} + {i} + 224], ymm3"
);

#[cfg(target_arch = "x86_64")]
unsafe fn copy_zmm(x: *const f64, z: *mut f64, bytes: usize) {
    copy_zmm_inner(x, x, z, bytes)
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_ymm(x: *const f64, z: *mut f64, bytes: usize) {
    copy_ymm_inner(x, x, z, bytes)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn patterns_compute_what_they_say() {
        for isa in smallgemm::supported_isas() {
            let n = 96; // 768 bytes: three steps
            let x: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let y = vec![2.0; n];
            // The GEMM pattern writes back z's own bits, NaNs and denormals included.
            let bits: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 52))
                .collect();
            let mut z: Vec<f64> = bits.iter().map(|&b| f64::from_bits(b)).collect();
            assert_eq!(stream(isa, Pattern::Gemm, &x, &y, &mut z), Ok(n * 8 * 4));
            assert!(z.iter().zip(&bits).all(|(v, &b)| v.to_bits() == b));
            // Raw and misaligned (the operands of an f32 batch): the bytes in the whole
            // steps unchanged, the bytes after them untouched.
            let mut raw: Vec<u8> = (0..n * 8 + 4).map(|i| (i * 7 + 3) as u8).collect();
            let before = raw.clone();
            let counted = unsafe {
                stream_raw(
                    isa,
                    Pattern::Gemm,
                    x.as_ptr().cast(),
                    y.as_ptr().cast(),
                    raw.as_mut_ptr().add(4),
                    n * 8 - 4,
                )
            };
            assert_eq!(counted, Ok((n * 8 - STEP_BYTES) * 4));
            assert_eq!(raw, before);
            let mut z = vec![1.0; n];
            stream(isa, Pattern::Copy, &x, &y, &mut z).unwrap();
            assert_eq!(z, x);
            stream(isa, Pattern::Triad, &x, &y, &mut z).unwrap();
            // a = b + s·c with b = x, c = y, s = 0.5.
            assert!(z.iter().enumerate().all(|(i, v)| *v == i as f64 + 1.0));
            for dtype in [Dtype::F64, Dtype::F32] {
                let flops = fma_loop(isa, dtype).unwrap();
                assert_eq!(
                    flops,
                    FMA_ITERS as f64
                        * 24.0
                        * (smallgemm::Target::new(isa).vector_bytes() / dtype.size()) as f64
                );
            }
        }
    }
}
