//! Profiler integration: with `SMALLGEMM_PERF_MAP=1`, every compiled kernel is appended to
//! `/tmp/perf-<pid>.map` (the format `perf report` reads for JIT code: start address and
//! size in hex, then a name), named after its spec and ISA.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// Appends one kernel to the map when profiling is on; `name` is only called then.
/// Failures are ignored: a missing map must never break a computation.
pub(crate) fn register(start: *const u8, len: usize, name: impl FnOnce() -> String) {
    static MAP: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    let map = MAP.get_or_init(|| {
        let on = std::env::var("SMALLGEMM_PERF_MAP").is_ok_and(|v| v == "1");
        on.then(|| {
            let path = format!("/tmp/perf-{}.map", std::process::id());
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok()
                .map(Mutex::new)
        })
        .flatten()
    });
    if let Some(file) = map {
        if let Ok(mut file) = file.lock() {
            let _ = writeln!(file, "{:x} {:x} smallgemm_{}", start as usize, len, name());
        }
    }
}
