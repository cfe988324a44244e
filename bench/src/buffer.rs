//! Cache-line-aligned, heap-allocated arrays of f32/f64: every competitor gets the same
//! alignment, and a 1 GiB streaming arena is allocated once and reused.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use smallgemm::Element;
use smallgemm_ir::reference::SplitMix64;

const ALIGN: usize = 64;

/// `len` elements of T, 64-byte aligned, zero-initialised.
pub struct AlignedBuf<T: Element> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<T>; T is Send + Sync.
unsafe impl<T: Element> Send for AlignedBuf<T> {}
// SAFETY: shared access only hands out &[T].
unsafe impl<T: Element> Sync for AlignedBuf<T> {}

impl<T: Element> AlignedBuf<T> {
    /// Zeroed memory (untouched pages stay unmapped until written); an error when the size
    /// overflows or the allocation fails, never an abort.
    pub fn zeroed(len: usize) -> Result<Self, String> {
        let bytes = len
            .max(1)
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| format!("buffer of {len} elements overflows"))?;
        let layout = Layout::from_size_align(bytes, ALIGN).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) } as *mut T;
        let ptr =
            NonNull::new(raw).ok_or_else(|| format!("cannot allocate {} MiB", bytes >> 20))?;
        Ok(AlignedBuf { ptr, len })
    }

    /// A line-aligned copy of `x`.
    pub fn from_slice(x: &[T]) -> Result<Self, String> {
        let mut buf = Self::zeroed(x.len())?;
        buf.copy_from_slice(x);
        Ok(buf)
    }

    /// Random values in ±[1/4, 1] (never zero or tiny: no denormals, no shortcuts).
    pub fn random(len: usize, seed: u64) -> Result<Self, String> {
        let mut buf = Self::zeroed(len)?;
        buf.fill_random(seed);
        Ok(buf)
    }

    pub fn fill_random(&mut self, seed: u64) {
        let mut rng = SplitMix64::new(seed);
        for x in self.iter_mut() {
            *x = T::from_f64(rng.nonzero());
        }
    }

    fn layout(&self) -> Layout {
        Layout::from_size_align(self.len.max(1) * std::mem::size_of::<T>(), ALIGN)
            .expect("checked when allocated")
    }
}

impl<T: Element> Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr holds len initialised (zeroed is a valid f32/f64) elements.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as Deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> Drop for AlignedBuf<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr() as *mut u8, self.layout()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_random() {
        let b = AlignedBuf::<f64>::random(1000, 3).unwrap();
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|x| x.abs() >= 0.25 && x.abs() <= 1.0));
        assert!(AlignedBuf::<f64>::zeroed(usize::MAX).is_err());
    }
}
