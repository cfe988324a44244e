//! The kernel cache of one `Jit`: one compiled kernel per (spec, schedule) for the JIT's
//! one target, shared by all threads. Concurrent first requests for one key compile it
//! once; the others wait for it.
//!
//! A hit is the common case and must cost tens of nanoseconds, so compiled kernels also sit
//! in a read-mostly map (a shared read lock, a fast non-cryptographic hash: the keys are
//! our own specs, not attacker-chosen) in front of the map that coordinates compilations.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rustc_hash::FxHashMap;
use smallgemm_ir::{GemmSpec, Schedule};

use crate::kernel::Kernel;
use crate::Error;

// The target is the JIT's, the same for every key: kept out, a hit compares less.
type Key = (GemmSpec, Option<Schedule>);
type Slot = Arc<OnceLock<Result<Arc<Kernel>, Error>>>;

thread_local! {
    /// The kernel this thread got last, with its cache's id and key: a caller that asks for
    /// the same kernel again (a loop of calls) finds it without touching a lock. It keeps
    /// that kernel alive until the thread's next lookup elsewhere, or its end.
    static LAST_HIT: RefCell<Option<(u64, Key, Arc<Kernel>)>> = const { RefCell::new(None) };
}

/// Ids of caches, never reused: a thread's last hit names the cache it came from.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) struct KernelCache {
    id: u64,
    /// Kernels compiled successfully: the hit path reads only this.
    ready: RwLock<FxHashMap<Key, Arc<Kernel>>>,
    /// One slot per key ever asked for, holding its kernel or its error once compiled.
    slots: Mutex<HashMap<Key, Slot>>,
    compilations: AtomicUsize,
}

impl Default for KernelCache {
    fn default() -> Self {
        KernelCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ready: RwLock::default(),
            slots: Mutex::default(),
            compilations: AtomicUsize::new(0),
        }
    }
}

impl KernelCache {
    /// The cached kernel for `key`, compiled by `compile` on first use. Errors are cached
    /// too: a spec that failed to compile fails again at the cost of a lookup.
    pub(crate) fn get_or_compile(
        &self,
        key: Key,
        compile: impl FnOnce() -> Result<Kernel, Error>,
    ) -> Result<Arc<Kernel>, Error> {
        // A panic elsewhere while holding a lock leaves the maps consistent (insertions are
        // single calls), so a poisoned lock is still usable.
        let last = LAST_HIT.with(|last| match &*last.borrow() {
            Some((id, k, kernel)) if *id == self.id && *k == key => Some(kernel.clone()),
            _ => None,
        });
        if let Some(kernel) = last {
            return Ok(kernel);
        }
        let ready = self
            .ready
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(kernel) = ready {
            LAST_HIT.with(|last| *last.borrow_mut() = Some((self.id, key, kernel.clone())));
            return Ok(kernel);
        }
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(key).or_default().clone()
        };
        // The map lock is released: other keys compile in parallel, and threads asking for
        // this key block in `get_or_init` until the first one has compiled it.
        slot.get_or_init(|| {
            self.compilations.fetch_add(1, Ordering::Relaxed);
            let kernel = compile().map(Arc::new);
            if let Ok(kernel) = &kernel {
                self.ready
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, kernel.clone());
            }
            kernel
        })
        .clone()
    }

    pub(crate) fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
