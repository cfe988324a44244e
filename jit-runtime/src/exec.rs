//! Executable memory, write-xor-execute: code is copied into a fresh read-write mapping,
//! which is then made read+execute; no page is ever writable and executable at once.

use memmap2::{Mmap, MmapMut};

use crate::Error;

/// Machine code mapped executable; unmapped on drop.
pub struct ExecutableCode {
    map: Mmap,
}

impl ExecutableCode {
    pub fn new(code: &[u8]) -> Result<Self, Error> {
        let mut map = MmapMut::map_anon(code.len().max(1))
            .map_err(|e| Error::ExecutableMemory(e.to_string()))?;
        map[..code.len()].copy_from_slice(code);
        let map = map
            .make_exec()
            .map_err(|e| Error::ExecutableMemory(e.to_string()))?;
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the range is the mapping just written, readable and mapped.
        unsafe {
            synchronize_icache(map.as_ptr(), code.len())
        };
        Ok(ExecutableCode { map })
    }

    /// Address of the first byte.
    pub fn entry(&self) -> *const u8 {
        self.map.as_ptr()
    }
}

/// Makes freshly written code visible to instruction fetch. AArch64 instruction caches are
/// not coherent with data writes: clean the data cache lines to the point of unification,
/// invalidate the instruction cache lines, and synchronise (what `__clear_cache` does).
///
/// Safety: `start..start + len` is mapped and readable.
#[cfg(target_arch = "aarch64")]
unsafe fn synchronize_icache(start: *const u8, len: usize) {
    use std::arch::asm;
    let ctr: u64;
    // CTR_EL0: log2 of the smallest data (bits 19:16) and instruction (bits 3:0) cache line,
    // in words.
    asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack));
    let data_line = 4usize << ((ctr >> 16) & 0xf);
    let code_line = 4usize << (ctr & 0xf);
    let (start, end) = (start as usize, start as usize + len);
    let mut line = start & !(data_line - 1);
    while line < end {
        asm!("dc cvau, {}", in(reg) line, options(nostack));
        line += data_line;
    }
    asm!("dsb ish", options(nostack));
    let mut line = start & !(code_line - 1);
    while line < end {
        asm!("ic ivau, {}", in(reg) line, options(nostack));
        line += code_line;
    }
    asm!("dsb ish", "isb", options(nostack));
}

impl std::fmt::Debug for ExecutableCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExecutableCode({:p}, {} bytes)",
            self.map.as_ptr(),
            self.map.len()
        )
    }
}
