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
        Ok(ExecutableCode { map })
    }

    /// Address of the first byte.
    pub fn entry(&self) -> *const u8 {
        self.map.as_ptr()
    }
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
