//! `Element`: the floating-point types a kernel computes on.

use std::fmt::{Debug, Display};
use std::ops::{Add, Mul, Sub};

use crate::spec::Dtype;

/// f32 or f64: what A, B and C hold. Sealed: kernels exist for these two only.
pub trait Element:
    Copy
    + Default
    + PartialEq
    + PartialOrd
    + Debug
    + Display
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + sealed::Sealed
    + 'static
{
    const DTYPE: Dtype;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// self * a + b with one rounding.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The value as raw bits, widened to 64 (for bitwise comparisons).
    fn bits(self) -> u64;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn mul_add(self, a: Self, b: Self) -> Self {
        f32::mul_add(self, a, b)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn mul_add(self, a: Self, b: Self) -> Self {
        f64::mul_add(self, a, b)
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}
