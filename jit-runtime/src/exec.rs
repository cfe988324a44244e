//! Executable memory, write-xor-execute: code is copied into readable and writable pages,
//! which are then made readable and executable; no page is ever writable and executable at
//! once.
//!
//! On Unix, kernels take whole pages of chunks mapped ahead and shared: one `mprotect` a
//! kernel instead of an `mmap`, a page fault, an `mprotect` and, on drop, a `munmap` (on
//! Zen 3 about 4 µs against 12, and 5-7 µs less on drop; docs/perf-notes.md). A chunk is
//! unmapped when the last code placed in it is dropped; the pages of code dropped before
//! then are not reused.

use std::sync::Arc;

use crate::Error;

/// Machine code mapped executable; its pages are given back with the last code of its chunk.
pub struct ExecutableCode {
    /// Held, not read: the pages live as long as any code placed in them.
    _chunk: Arc<pages::Chunk>,
    entry: *const u8,
    len: usize,
}

// SAFETY: the pages behind `entry` are read-only (readable and executable) for as long as
// `_chunk` lives, which this value keeps alive; nothing ever writes them again.
unsafe impl Send for ExecutableCode {}
unsafe impl Sync for ExecutableCode {}

impl ExecutableCode {
    pub fn new(code: &[u8]) -> Result<Self, Error> {
        let (chunk, entry) = pages::place(code)?;
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the range is the code just written, readable and mapped.
        unsafe {
            synchronize_icache(entry, code.len())
        };
        Ok(ExecutableCode {
            _chunk: chunk,
            entry,
            len: code.len(),
        })
    }

    /// Address of the first byte.
    pub fn entry(&self) -> *const u8 {
        self.entry
    }
}

#[cfg(unix)]
mod pages {
    use std::sync::{Arc, Mutex, OnceLock, PoisonError};

    use crate::Error;

    /// Pages a chunk maps at once. Code larger than a quarter of it gets a mapping of its
    /// own, so that a chunk holds at least four kernels.
    pub(super) const CHUNK_PAGES: usize = 16;

    /// One anonymous mapping; its pages are writable until code is placed in them, then
    /// readable and executable.
    pub(super) struct Chunk {
        base: *mut u8,
        len: usize,
    }

    // SAFETY: a chunk is only an address range; `place` hands each page to one writer, once.
    unsafe impl Send for Chunk {}
    unsafe impl Sync for Chunk {}

    impl Drop for Chunk {
        fn drop(&mut self) {
            // SAFETY: `base..base + len` is this chunk's own mapping, and no code in it is
            // referenced any more (every `ExecutableCode` holds its chunk).
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }

    /// The chunk new code goes into, and the bytes of it already taken.
    struct Cursor {
        chunk: Arc<Chunk>,
        used: usize,
    }

    static CURSOR: Mutex<Option<Cursor>> = Mutex::new(None);

    fn page_bytes() -> usize {
        static PAGE: OnceLock<usize> = OnceLock::new();
        // SAFETY: sysconf has no preconditions.
        *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            n if n > 0 => n as usize,
            _ => 4096,
        })
    }

    fn last_os_error(what: &str) -> Error {
        Error::ExecutableMemory(format!("{what}: {}", std::io::Error::last_os_error()))
    }

    /// A fresh readable and writable mapping of `len` bytes, its pages faulted in now
    /// (where the OS can) rather than one by one as code is copied.
    fn map(len: usize) -> Result<Chunk, Error> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let populate = libc::MAP_POPULATE;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let populate = 0;
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_os_error("mmap"));
        }
        Ok(Chunk {
            base: base.cast(),
            len,
        })
    }

    /// Pages for `bytes` bytes that no one else has: whole pages of the current chunk, or
    /// of a new one when it is full, or a mapping of their own for large code.
    fn take(bytes: usize) -> Result<(Arc<Chunk>, usize), Error> {
        let chunk_bytes = CHUNK_PAGES * page_bytes();
        if bytes > chunk_bytes / 4 {
            return Ok((Arc::new(map(bytes)?), 0));
        }
        // The cursor is consistent whenever the lock is free, even after a panic elsewhere.
        let mut cursor = CURSOR.lock().unwrap_or_else(PoisonError::into_inner);
        match cursor.as_mut() {
            Some(c) if c.used + bytes <= chunk_bytes => {
                let offset = c.used;
                c.used += bytes;
                Ok((Arc::clone(&c.chunk), offset))
            }
            _ => {
                let chunk = Arc::new(map(chunk_bytes)?);
                *cursor = Some(Cursor {
                    chunk: Arc::clone(&chunk),
                    used: bytes,
                });
                Ok((chunk, 0))
            }
        }
    }

    /// Copies `code` into pages of its own and makes them readable and executable; returns
    /// their chunk and the address of the first byte.
    pub(super) fn place(code: &[u8]) -> Result<(Arc<Chunk>, *const u8), Error> {
        let page = page_bytes();
        let bytes = code.len().max(1).div_ceil(page) * page;
        let (chunk, offset) = take(bytes)?;
        // SAFETY: `offset..offset + bytes` lies inside the chunk, page-aligned, and `take`
        // gave it to no one else; the pages are still readable and writable.
        unsafe {
            let start = chunk.base.add(offset);
            std::ptr::copy_nonoverlapping(code.as_ptr(), start, code.len());
            if libc::mprotect(start.cast(), bytes, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                return Err(last_os_error("mprotect"));
            }
            Ok((chunk, start))
        }
    }
}

/// Elsewhere a mapping per code, through memmap2.
#[cfg(not(unix))]
mod pages {
    use std::sync::Arc;

    use memmap2::{Mmap, MmapMut};

    use crate::Error;

    pub(super) struct Chunk {
        _map: Mmap,
    }

    pub(super) fn place(code: &[u8]) -> Result<(Arc<Chunk>, *const u8), Error> {
        let mut map = MmapMut::map_anon(code.len().max(1))
            .map_err(|e| Error::ExecutableMemory(e.to_string()))?;
        map[..code.len()].copy_from_slice(code);
        let map = map
            .make_exec()
            .map_err(|e| Error::ExecutableMemory(e.to_string()))?;
        let entry = map.as_ptr();
        Ok((Arc::new(Chunk { _map: map }), entry))
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
        write!(f, "ExecutableCode({:p}, {} bytes)", self.entry, self.len)
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// `mov eax, value; ret`, after `padding` one-byte NOPs.
    fn returning(value: u32, padding: usize) -> Vec<u8> {
        let mut code = vec![0x90; padding];
        code.push(0xB8);
        code.extend_from_slice(&value.to_le_bytes());
        code.push(0xC3);
        code
    }

    fn call(code: &ExecutableCode) -> u32 {
        // SAFETY: every code these tests map is a `returning` function.
        let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(code.entry()) };
        f()
    }

    /// The permissions /proc/self/maps gives the page at `address` (e.g. "r-xp").
    fn permissions(address: *const u8) -> String {
        let a = address as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (range, perms) = (fields.next().unwrap(), fields.next().unwrap());
            let (lo, hi) = range.split_once('-').unwrap();
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).unwrap(),
                usize::from_str_radix(hi, 16).unwrap(),
            );
            if (lo..hi).contains(&a) {
                return perms.to_string();
            }
        }
        panic!("{address:p} is not mapped");
    }

    #[test]
    fn code_runs_from_pages_that_are_executable_and_not_writable() {
        for (value, padding) in [(7, 0), (0xDEAD_BEEF, 4090), (41, 5000), (3, 100_000)] {
            let code = ExecutableCode::new(&returning(value, padding)).unwrap();
            assert_eq!(call(&code), value);
            let end = code.entry().wrapping_add(padding + 5);
            for address in [code.entry(), end] {
                assert_eq!(permissions(address), "r-xp", "padding {padding}");
            }
        }
    }

    #[test]
    fn dropping_code_keeps_the_rest_of_its_chunk() {
        // More pages than one chunk holds, so that the code spans several.
        let mut codes: Vec<(u32, ExecutableCode)> = (0..3 * pages::CHUNK_PAGES as u32)
            .map(|i| {
                (
                    i,
                    ExecutableCode::new(&returning(i, (i as usize * 37) % 3000)).unwrap(),
                )
            })
            .collect();
        // Drop every other code, then all but the last of each run of ten.
        codes.retain(|(i, _)| i % 2 == 1);
        for (i, code) in &codes {
            assert_eq!(call(code), *i);
        }
        codes.retain(|(i, _)| i % 10 == 9);
        for (i, code) in &codes {
            assert_eq!(call(code), *i);
        }
        // A chunk whose code is all dropped is unmapped; new code still maps.
        drop(codes);
        let code = ExecutableCode::new(&returning(5, 0)).unwrap();
        assert_eq!(call(&code), 5);
    }
}
