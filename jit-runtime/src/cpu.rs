//! Which of our instruction sets this CPU runs.

use smallgemm_ir::{Isa, Target};

use crate::Error;

/// Every ISA of ours that this CPU supports, best first.
// On AArch64 the x86 probes are compiled out and NEON is pushed right after `new`.
#[cfg_attr(target_arch = "aarch64", allow(clippy::vec_init_then_push))]
pub fn supported_isas() -> Vec<Isa> {
    let mut isas = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            isas.push(Isa::Avx512);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            isas.push(Isa::Avx2);
        }
    }
    // Advanced SIMD is part of every AArch64 CPU that runs a general-purpose OS.
    #[cfg(target_arch = "aarch64")]
    isas.push(Isa::Neon);
    isas
}

/// The best target of this CPU: AVX-512 over AVX2; NEON on AArch64.
pub fn detect() -> Result<Target, Error> {
    supported_isas()
        .first()
        .map(|&isa| Target::new(isa))
        .ok_or(Error::NoSupportedIsa)
}

/// `isa` as a target, if this CPU runs it.
pub fn require(isa: Isa) -> Result<Target, Error> {
    let isas = supported_isas();
    if isas.contains(&isa) {
        Ok(Target::new(isa))
    } else {
        let available = if isas.is_empty() {
            "none of avx2, avx512, neon".to_string()
        } else {
            isas.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
        };
        Err(Error::IsaNotAvailable { isa, available })
    }
}
