//! smallgemm-bench: smallgemm against LIBXSMM, OpenBLAS, MKL's JIT, nano-gemm,
//! matrixmultiply and a naive loop, in one run on the same buffers, each figure beside the
//! bound that this machine's measured limits set.
//!
//! - [`suite`]: the run ([`run`], [`Config`]): limits, then every case and competitor.
//! - [`probe`]: FMA peak and bandwidth probes (inline assembly).
//! - [`competitor`]: the implementations, behind [`BatchGemm`]; the C libraries sit in
//!   `ffi` behind the cargo features `libxsmm`, `openblas` and `mkl`.
//! - [`measure`]: the timing harness (warm-up, sample sizing, threads between barriers).
//! - [`stats`]: medians with 95% bootstrap confidence intervals.
//! - [`latency`]: JIT latency (cache miss, first compile, cache hit).
//! - [`report`]: terminal table, CSV, SVG.

pub mod buffer;
pub mod competitor;
mod ffi;
pub mod latency;
pub mod measure;
pub mod probe;
pub mod report;
pub mod stats;
pub mod suite;

pub use competitor::{BatchGemm, Competitor};
pub use measure::Timing;
pub use suite::{run, Config, Figure, Limits, Regime, Report, Shape};
