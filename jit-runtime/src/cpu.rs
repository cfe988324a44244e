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

/// Whether the variants for batches that stream from memory prefetch the next matrices
/// (`prefetcht0`, one trip or 4 KiB ahead, whichever is further). On the Intel Xeon of the
/// earlier sessions they paid; on an AMD EPYC (Zen 4) the same tall blocks without them ran
/// up to 47% faster from DRAM, never more than 3% slower (f64 16 1.31x, 19 1.47x, 24
/// 1.45x, 32 1.35x; f32 24 1.18x, 32 1.23x, 4 0.97x; one thread, alternated in one process:
/// docs/perf-notes.md, eighth session). Likely, not measured: its hardware prefetchers
/// follow the blocks' ascending columns alone, and the extra loads only compete with them.
/// Ninth session, same VM: `prefetcht0` one, two or four trips ahead lost again (f64
/// 12..32, geomean over LIBXSMM 0.79-1.00x against 1.15-1.24x without), `prefetcht1` /
/// `prefetcht2` one trip ahead won nowhere reliably. On AMD CPUs without AVX-512 (Zen 1 to
/// 3; measured on Zen 3) they pay four trips ahead ([`prefetch_trips`]): there the
/// streaming bench gained 1.03-1.14x for f32 at every size and 1.04-1.05x for f64 from 16
/// against no prefetches (one and two threads, alternated twice; docs/perf-notes.md,
/// eighteenth session), where one trip ahead had lost. Sets [`Target::software_prefetch`].
fn software_prefetch_pays() -> bool {
    amd_family().is_none() || !has_avx512()
}

/// How many trips of the batch loop ahead the streaming variants prefetch: four on AMD
/// (where they prefetch at all: Zen 1 to 3), one elsewhere. Sets
/// [`Target::prefetch_trips`].
fn prefetch_trips() -> u8 {
    if amd_family().is_some() {
        4
    } else {
        1
    }
}

/// How many bytes of A, B and C ahead the streaming variants prefetch at least: on AMD,
/// [`prefetch_trips`] alone decides; elsewhere the default target's distance. Sets
/// [`Target::prefetch_min_bytes_ahead`].
fn prefetch_min_bytes_ahead(isa: Isa) -> u32 {
    if amd_family().is_some() {
        0
    } else {
        Target::new(isa).prefetch_min_bytes_ahead
    }
}

/// Whether this CPU runs our AVX-512 kernels.
fn has_avx512() -> bool {
    supported_isas().contains(&Isa::Avx512)
}

/// Bytes of one core's L2 cache (from Linux's sysfs; 1 MiB where it cannot be read): a
/// batch larger than this streams from L3 or memory.
pub fn l2_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        data_caches()
            .into_iter()
            .find(|&(level, _)| level == 2)
            .map_or(1 << 20, |(_, size)| size)
    })
}

/// Bytes of the last-level cache (the highest level Linux's sysfs lists for cpu0; 32 MiB
/// where it cannot be read).
pub(crate) fn last_level_cache_bytes() -> usize {
    static LLC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| {
        data_caches()
            .into_iter()
            .max()
            .map_or(32 << 20, |(_, size)| size)
    })
}

/// The level and bytes of each data or unified cache Linux's sysfs lists for cpu0.
fn data_caches() -> Vec<(u32, usize)> {
    (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
            if read("type")?.trim() == "Instruction" {
                return None;
            }
            Some((
                read("level")?.trim().parse().ok()?,
                parse_size(&read("size")?)?,
            ))
        })
        .collect()
}

/// A sysfs cache size: "2048K", "1M", or bytes.
fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1 << 10),
        None => match text.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1 << 20),
            None => (text, 1),
        },
    };
    digits.parse::<usize>().ok().map(|n| n * unit)
}

/// The CPU family (base plus extended, as AMD documents it) where CPUID's vendor is AMD;
/// None for any other vendor. From CPUID rather than the model name, which VMs shorten to
/// "AMD EPYC".
fn amd_family() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        static FAMILY: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
        *FAMILY.get_or_init(|| {
            let vendor = __cpuid(0);
            // "AuthenticAMD" in EBX, EDX, ECX.
            if [vendor.ebx, vendor.edx, vendor.ecx] != [0x6874_7541, 0x6974_6e65, 0x444d_4163] {
                return None;
            }
            let eax = __cpuid(1).eax;
            let base = (eax >> 8) & 0xf;
            Some(if base == 0xf {
                base + ((eax >> 20) & 0xff)
            } else {
                base
            })
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Whether this CPU runs 512-bit operations as two 256-bit halves: AMD's family 19h with
/// AVX-512, Zen 4 (Zen 3, the same family, has none; Zen 5, family 1Ah, has 512-bit pipes
/// in its server parts).
fn runs_512_bit_as_halves() -> bool {
    amd_family() == Some(0x19)
}

/// Whether AVX2's masked stores (`vmaskmovps` / `vmaskmovpd` to memory) are slow here:
/// microcoded on AMD's cores. Measured on an EPYC (Zen 3), back to back in one loop: 15 TSC
/// cycles per ymm masked store and 5 per xmm one, against 0.9 for a plain ymm store; the
/// masked loads cost what plain ones do. Any AMD CPU (CPUID's vendor). Sets
/// [`Target::masked_stores_slow`].
fn masked_stores_slow() -> bool {
    amd_family().is_some()
}

/// Whether `vpermpd ymm` and the other permutes across 128-bit lanes are slow here: two
/// micro-ops on AMD's cores (measured on Zen 3: 1.25 cycles a permute, against 0.5 for
/// `vpermilps`). Any AMD CPU, for AVX2 kernels. Sets [`Target::cross_lane_permutes_slow`].
fn cross_lane_permutes_slow() -> bool {
    amd_family().is_some()
}

/// `isa` as a target for this CPU (which must run it).
fn target(isa: Isa) -> Target {
    Target {
        halves_512: isa == Isa::Avx512 && runs_512_bit_as_halves(),
        software_prefetch: software_prefetch_pays(),
        prefetch_trips: prefetch_trips(),
        prefetch_min_bytes_ahead: prefetch_min_bytes_ahead(isa),
        prefetch_spread: amd_family().is_none(),
        masked_stores_slow: isa == Isa::Avx2 && masked_stores_slow(),
        cross_lane_permutes_slow: isa == Isa::Avx2 && cross_lane_permutes_slow(),
        ..Target::new(isa)
    }
}

/// The best target of this CPU: AVX-512 over AVX2; NEON on AArch64.
pub fn detect() -> Result<Target, Error> {
    supported_isas()
        .first()
        .map(|&isa| target(isa))
        .ok_or(Error::NoSupportedIsa)
}

/// `isa` as a target, if this CPU runs it.
pub fn require(isa: Isa) -> Result<Target, Error> {
    let isas = supported_isas();
    if isas.contains(&isa) {
        Ok(target(isa))
    } else {
        let available = if isas.is_empty() {
            "none of avx2, avx512, neon".to_string()
        } else {
            isas.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
        };
        Err(Error::IsaNotAvailable { isa, available })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_and_order() {
        assert_eq!(parse_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_size("105M"), Some(105 << 20));
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("many"), None);
        // The last-level cache is at least as large as L2, whatever sysfs says.
        assert!(l2_bytes() > 0 && last_level_cache_bytes() >= l2_bytes());
    }
}
