//! `Target`: what a CPU offers the planner and the lowering.

use serde::{Deserialize, Serialize};

use crate::spec::Dtype;

/// Instruction sets with a code generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isa {
    /// x86-64 with AVX2 and FMA3: 16 ymm registers, masked moves through a vector register.
    Avx2,
    /// x86-64 with AVX-512 F/VL/DQ/BW: 32 zmm registers, opmask registers, embedded broadcast.
    Avx512,
    /// AArch64 Advanced SIMD (NEON): 32 128-bit registers, FMA by element, no masks.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            "neon" => Ok(Isa::Neon),
            other => Err(format!(
                "unknown ISA {other:?} (expected avx2, avx512 or neon)"
            )),
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a partial vector (a tail along m) is loaded and stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskSupport {
    /// Dedicated mask registers (AVX-512 k1..k7): no vector register is spent.
    MaskRegisters { count: u32 },
    /// The mask lives in a vector register (AVX2 `vmaskmov`): one register less for blocking.
    VectorRegister,
    /// No masks at all: the backend loads and stores the enabled lanes alone (AArch64
    /// `ldr d`/`ldr s`, lane inserts), so neither a register nor a setup is spent.
    PartialAccess,
}

/// A machine to generate code for. Detected at run time by the runtime, or built by hand for
/// offline emission. Everything the planner and the lowering need to know about the machine
/// is a method here, so no layer above the backend matches on the ISA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Target {
    pub isa: Isa,
    /// 512-bit arithmetic issues as two 256-bit halves (AMD Zen 4): a zmm FMA takes both FMA
    /// pipes for a cycle, an xmm or ymm FMA one of them. It changes how tails are lowered
    /// ([`Target::narrow_tail_bytes`]), not the planner's cost model: counting a zmm FMA as
    /// two narrow ones there made it pick blocks that lost on Zen 4 (docs/perf-notes.md,
    /// ninth session).
    #[serde(default)]
    pub halves_512: bool,
    /// Prefetching the next matrices (`prefetcht0`, [`Target::prefetch_trips`] ahead)
    /// speeds up batches that stream from memory ([`crate::prefetch_pays`]). True on the
    /// Intel Xeons measured and on AMD Zen 3 (four trips ahead); false on AMD Zen 4, where
    /// the streaming variants ran up to 47% faster without the prefetches and never more
    /// than 3% slower (docs/perf-notes.md, eighth and ninth sessions).
    #[serde(default = "prefetching_pays_by_default")]
    pub software_prefetch: bool,
    /// How many trips of the batch loop ahead those prefetches reach (0 counts as 1). One
    /// on the Intel Xeons; four on AMD Zen 3 (AVX2), where one trip ahead lost and four
    /// gained 3-14% streaming from DRAM (docs/perf-notes.md, eighteenth and nineteenth
    /// sessions): one matrix's compute there is shorter than a miss, so a line asked for one
    /// matrix ahead arrives late.
    #[serde(default = "one_trip_ahead")]
    pub prefetch_trips: u8,
    /// Those prefetches reach at least this many bytes of A, B and C ahead: more trips than
    /// [`Target::prefetch_trips`] where the matrices are small, whose next one is asked for
    /// too late. 4 KiB on the Intel Xeons, where every size then gains from prefetching
    /// ([`crate::prefetch_pays`]): streaming from DRAM at one thread went from 72-87% of the
    /// bound to 87-99% at f64 2..8 and f32 2 and 4..8 (2 and 8 KiB did about as well;
    /// docs/perf-notes.md, twenty-first session); 0 on AMD, whose distance
    /// [`Target::prefetch_trips`] alone sets (measured on Zen 3 only).
    #[serde(default = "intel_min_bytes_ahead")]
    pub prefetch_min_bytes_ahead: u32,
    /// Where the batch loop's body has inner loops (the k loops of matrices from about
    /// 12), the prefetches of the next matrices walk each operand line by line at an even
    /// rate through those loops ([`crate::prefetch`]) instead of coming before each line's
    /// first use, which asks for all of the next A within the first block of columns (a
    /// burst of misses, likely more than the core keeps in flight, during which the compute
    /// they should overlap waits).
    /// True on the Intel Xeons: streaming from DRAM at one thread, f64 from 20 up went from
    /// 78-89% of the bound to 85-93%, f32 from 82-89% to 90-92% (docs/perf-notes.md,
    /// twenty-fifth session); false on AMD, where it was not measured.
    #[serde(default = "spreading_pays_by_default")]
    pub prefetch_spread: bool,
    /// AVX2's masked stores (`vmaskmovps` / `vmaskmovpd` to memory) are slow: microcoded on
    /// AMD's cores (measured on Zen 3, back to back: 15 TSC cycles a ymm store, 5 an xmm
    /// one, against under 1 for a plain store). Tails of C are then stored in whole pieces
    /// ([`Target::tail_stores_in_pieces`]). AVX-512's opmask stores are not affected.
    #[serde(default)]
    pub masked_stores_slow: bool,
    /// Permutes across 128-bit lanes (`vpermpd ymm`) are slow: two micro-ops on AMD's Zen
    /// 1 to 3 (measured on Zen 3: 1.25 cycles a permute, 6.4 cycles of latency, against 0.5
    /// for the in-lane `vpermilps`; Intel's cores take one, 3 cycles). Lane-packed f64
    /// kernels in 256-bit vectors, whose groups of four lanes span both halves, are then not
    /// planned: the register blocks ran 1.1-1.3x (2x2x2) and 1.3x (4x4x4) to 2.0x (4x4x32)
    /// faster there (hot, one thread, alternated in one process).
    #[serde(default)]
    pub cross_lane_permutes_slow: bool,
}

fn prefetching_pays_by_default() -> bool {
    true
}

fn one_trip_ahead() -> u8 {
    1
}

fn spreading_pays_by_default() -> bool {
    true
}

fn intel_min_bytes_ahead() -> u32 {
    INTEL_MIN_BYTES_AHEAD
}

/// [`Target::prefetch_min_bytes_ahead`] on Intel.
const INTEL_MIN_BYTES_AHEAD: u32 = 4096;

impl Target {
    pub const AVX2: Target = Target::new(Isa::Avx2);
    pub const AVX512: Target = Target::new(Isa::Avx512);
    pub const NEON: Target = Target::new(Isa::Neon);
    /// AVX-512 on AMD Zen 4: 512-bit operations run as two 256-bit halves, and prefetching
    /// the next matrices does not pay.
    pub const AVX512_HALVES: Target = Target {
        isa: Isa::Avx512,
        halves_512: true,
        software_prefetch: false,
        prefetch_trips: 1,
        prefetch_min_bytes_ahead: 0,
        prefetch_spread: false,
        masked_stores_slow: false,
        cross_lane_permutes_slow: false,
    };
    /// AVX2 on AMD (Zen 1 to 3): slow masked stores and cross-lane permutes, and the
    /// streaming variants prefetch four trips ahead.
    pub const AVX2_AMD: Target = Target {
        isa: Isa::Avx2,
        halves_512: false,
        software_prefetch: true,
        prefetch_trips: 4,
        prefetch_min_bytes_ahead: 0,
        prefetch_spread: false,
        masked_stores_slow: true,
        cross_lane_permutes_slow: true,
    };

    pub const fn new(isa: Isa) -> Target {
        Target {
            isa,
            halves_512: false,
            software_prefetch: true,
            prefetch_trips: 1,
            prefetch_min_bytes_ahead: INTEL_MIN_BYTES_AHEAD,
            prefetch_spread: true,
            masked_stores_slow: false,
            cross_lane_permutes_slow: false,
        }
    }

    /// Whether kernels of this element type can be generated for this target.
    pub fn supports(self, dtype: Dtype) -> bool {
        dtype != Dtype::F16
    }

    /// Bytes in one vector register.
    pub fn vector_bytes(self) -> usize {
        match self.isa {
            Isa::Avx2 => 32,
            Isa::Avx512 => 64,
            Isa::Neon => 16,
        }
    }

    /// Whether a tail of `bytes` bytes (less than a vector) is loaded and stored through a
    /// mask. x86 moves 4, 8, 16 and 32 bytes exactly (vmovss, vmovsd, xmm, ymm) and any
    /// other tail takes a masked move, whose store does not forward to a later load of any
    /// byte of its whole vector: the next column's or the next matrix's C waits for it to
    /// retire. NEON stores tails exactly, piece by piece.
    pub fn masked_tail(self, bytes: usize) -> bool {
        match self.isa {
            Isa::Avx2 | Isa::Avx512 => {
                bytes % self.vector_bytes() != 0 && !matches!(bytes, 4 | 8 | 16 | 32)
            }
            Isa::Neon => false,
        }
    }

    /// Whether a tail of C of `bytes` bytes, which would take a masked store
    /// ([`Target::masked_tail`]), is stored in whole pieces instead (`Op::StorePieces`):
    /// AVX2 where masked stores are slow.
    pub fn tail_stores_in_pieces(self, bytes: usize) -> bool {
        self.isa == Isa::Avx2 && self.masked_stores_slow && self.masked_tail(bytes)
    }

    /// Whether a masked store of a tail of C of `bytes` bytes holds up later loads that
    /// overlap its whole vector, not only the lanes it writes: Intel's cores check the
    /// full width and cannot forward from a masked store, so such a load waits until the
    /// store commits. Measured on Emerald Rapids with AVX-512: the masked store of one
    /// matrix's last column reaches into the next matrix's C, and f64 5x5x5 with C read
    /// took 36 cycles a matrix instead of 23 (docs/perf-notes.md, twenty-third session).
    /// Not on AMD's targets ([`Target::masked_stores_hold_up_loads`]).
    pub fn tail_store_holds_up_loads(self, bytes: usize) -> bool {
        self.masked_stores_hold_up_loads() && self.masked_tail(bytes)
    }

    /// Whether this is one of Intel's x86 targets, whose masked stores hold up later loads
    /// of their whole vector ([`Target::tail_store_holds_up_loads`]); not AMD's (Zen 3's
    /// slow masked stores, Zen 4's halves), where that was not measured.
    pub fn masked_stores_hold_up_loads(self) -> bool {
        matches!(self.isa, Isa::Avx2 | Isa::Avx512) && !self.halves_512 && !self.masked_stores_slow
    }

    /// Vector widths in bytes that kernels may use, narrowest first (AVX-512VL and AVX give
    /// the narrower x86 registers every instruction the wide ones have; the NEON backend
    /// has 16-byte vectors only).
    pub fn vector_widths(self) -> &'static [usize] {
        match self.isa {
            Isa::Avx2 => &[16, 32],
            Isa::Avx512 => &[16, 32, 64],
            Isa::Neon => &[16],
        }
    }

    /// Elements of `dtype` in one vector register.
    pub fn lanes(self, dtype: Dtype) -> usize {
        self.vector_bytes() / dtype.size()
    }

    /// Architectural vector registers.
    pub fn vector_registers(self) -> usize {
        match self.isa {
            Isa::Avx2 => 16,
            Isa::Avx512 => 32,
            Isa::Neon => 32,
        }
    }

    pub fn masks(self) -> MaskSupport {
        match self.isa {
            Isa::Avx2 => MaskSupport::VectorRegister,
            Isa::Avx512 => MaskSupport::MaskRegisters { count: 7 },
            Isa::Neon => MaskSupport::PartialAccess,
        }
    }

    /// FMA can take its broadcast multiplicand straight from memory (AVX-512 `{1toN}`), so
    /// broadcasting B needs no register.
    pub fn fma_broadcast_operand(self) -> bool {
        self.isa == Isa::Avx512
    }

    /// FMA can multiply by one lane of a vector register (AArch64 `fmla v.2d, v.2d, v.d[i]`),
    /// so B is loaded a whole vector at a time and each loaded element is used in place:
    /// one load per `lanes` elements of B instead of one broadcast per element.
    pub fn fma_by_element(self) -> bool {
        self.isa == Isa::Neon
    }

    /// The width (16 or 32 bytes) the arithmetic of a row block's tail vector runs at, when
    /// narrower than its `vector_bytes`-byte vectors: the smallest x86 vector that holds its
    /// `tail_bytes`, as MKL's kernels do. On Intel's 512-bit pipes only beside
    /// `full_vectors` full ones: blocks of tails alone lost (narrow FMAs do not issue on the
    /// 512-bit-only port); where 512-bit operations run as halves a narrow FMA takes half the
    /// pipes of a full one anywhere. None: full width (also where a tail is loaded and
    /// stored piece by piece, NEON).
    pub fn narrow_tail_bytes(
        self,
        full_vectors: usize,
        tail_bytes: usize,
        vector_bytes: usize,
    ) -> Option<usize> {
        if (full_vectors == 0 && !self.halves_512) || self.masks() == MaskSupport::PartialAccess {
            return None;
        }
        let bytes = tail_bytes.next_power_of_two().max(16);
        (bytes < vector_bytes).then_some(bytes)
    }

    /// How a step of a register block that keeps both the FMA pipes and the load ports busy
    /// is costed: None, by the busier of the two; Some(s), by their p-norm with p = 2^s,
    /// which adds up to 2^(1/p) - 1 where both are saturated at once.
    ///
    /// AVX2: Some(3), the 8-norm. Register-only loops of one block step from L1 on the Zen 3 EPYC here (cycles
    /// a step against the norm): 2x4 4.26 (4.36), 2x5 5.16 (5.30), 2x6 6.21 (6.25), 5x2
    /// 5.24 (5.30), 1x8 5.73 (6.03); the hard max said 4, 5, 6, 5, 6. It breaks the ties of
    /// the hard max toward blocks with fewer loads a FMA: planned against the hard max's
    /// plans, hot, one thread, alternated in one process, where they differ: f64 12 1.06x,
    /// 13 1.06x, 24 1.05x, 30 1.10x, 32 1.11x, f32 24..27 and 29..32 1.01-1.06x; f32 12,
    /// 16 and 28 0.94-0.96x; the rest within 2%.
    ///
    /// AVX-512 on Intel: Some(3) too (with [`Target::fma_latency_norm`]). On an Emerald
    /// Rapids Xeon one-vector blocks that broadcast B from memory ran at the FMA bound in
    /// register-only loops from L1 (1x12 to 1x30: 98-99%), but in whole kernels with the
    /// batch in L2 the tuner's taller blocks ran 1.06-1.21x faster than those the hard max
    /// picked there (1x8 to 1x12, a load per FMA). Planned with both norms against the hard max,
    /// hot, one thread, alternated, shapes without tuning entries: 30 rectangular and
    /// larger shapes (7x40x40 to 100x40x90) geomean f64 1.06-1.07x, f32 1.05-1.06x (four
    /// runs; 50x8x50 1.21-1.32x, 100x40x90 1.10-1.15x; the one loss 16x40x16, 0.92-0.94x);
    /// squares 2..32 and the small-k shapes with no database at all f64 1.04x, f32 1.02x
    /// (mid squares 1.06-1.22x; shapes with k = 8 0.91-1.14x). AMD's Zen 4 (halves) keeps
    /// the hard max: the norms were not measured there.
    pub fn saturation_norm(self) -> Option<u32> {
        match self.isa {
            Isa::Avx2 => Some(3),
            Isa::Avx512 if !self.halves_512 => Some(3),
            Isa::Avx512 | Isa::Neon => None,
        }
    }

    /// How a step of a register block with few accumulators is costed against the FMA
    /// latency (each accumulator's FMAs form a chain): None, by the longer of the two;
    /// Some(s), by their p-norm with p = 2^s. On Intel's AVX-512 cores the chains' limit
    /// is not sharp: register-only loops of one block, 128 steps from L1 on an Emerald
    /// Rapids Xeon, ran 1x8 and 2x4 blocks (8 accumulators, the latency's 4 cycles times 2
    /// FMAs a cycle) at 94% and 86% of the FMA bound, 12 accumulators (1x12, 2x6, 3x4) at
    /// 98-100%; the 8-norm says 92% and 99.5%. See [`Target::saturation_norm`] for what
    /// the two norms did to the plans.
    pub fn fma_latency_norm(self) -> Option<u32> {
        match self.isa {
            Isa::Avx512 if !self.halves_512 => Some(3),
            _ => None,
        }
    }

    /// Vector FMAs per cycle, for the planner's cost model. Two pipes on both x86 ISAs and on
    /// current AArch64 cores (Cortex-A76/Neoverse N1 and later: two 128-bit FMA pipes).
    pub fn fma_per_cycle(self) -> f64 {
        2.0
    }

    /// Vector loads per cycle, for the planner's cost model: two load pipes on both x86
    /// ISAs. NEON counts one: the paper's Cortex-A57 has a single load pipe, and where newer
    /// cores have two, a 16-byte load moves a quarter of an AVX-512 one, so with C and the
    /// next matrices streaming in, the blocks that reuse loaded registers most must win.
    pub fn loads_per_cycle(self) -> f64 {
        match self.isa {
            Isa::Avx2 | Isa::Avx512 => 2.0,
            Isa::Neon => 1.0,
        }
    }

    /// Loads per cycle when some are broadcasts of one element: x86 cores since Golden
    /// Cove (and Zen 4) have a third load port, which takes narrow loads such as a
    /// broadcast's but not a full vector. Counting it, the planner picks one-vector blocks
    /// with FMAs that broadcast B from memory where it used to pick two-vector ones
    /// (measured on Sapphire Rapids, hot, one thread, geomean over MKL JIT: squares 9..32
    /// 0.93x against 0.89x, rectangular shapes 0.96-1.00x against 0.89-0.91x).
    ///
    /// AVX2 counts 1.5: the AVX2-only cores (Haswell to Comet Lake, Zen 1 to 3) have two
    /// load ports, and `vbroadcastsd ymm, m64` is a load into a register of its own
    /// (AVX2's FMA cannot broadcast from memory). Register-only loops of one step of a
    /// block on the Zen 3 EPYC here, from L1: blocks of one vector by 8, 12 and 13 columns
    /// took 5.7, 8.2 and 9.0 cycles a step, 1.55-1.58 loads a cycle, where 2 predicted 4.5,
    /// 6.5 and 7 (FMA-bound blocks of two vectors by 4 to 6 columns ran within 6% of the
    /// FMA bound). Counting 3, the planner chose one-vector blocks that ran 0.65-0.85x
    /// of what it chooses with 2 (hot, one thread, alternated in one process, every square
    /// 8..32 where the plans differ); counting 1.5 rather than 2 moved f64 7, 13, 19, 25,
    /// 26 and f32 13 from one-vector blocks to 2x4..4x2 ones: 1.18-1.28x, and no plan that
    /// changed lost.
    pub fn mixed_loads_per_cycle(self) -> f64 {
        match self.isa {
            Isa::Avx2 => 1.5,
            Isa::Avx512 => 3.0,
            Isa::Neon => 1.0,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.isa.name())?;
        let notes: Vec<&str> = [
            (self.halves_512, "512-bit halves"),
            (!self.software_prefetch, "no software prefetch"),
            (
                self.software_prefetch && self.prefetch_trips > 1,
                "prefetch far ahead",
            ),
            (self.masked_stores_slow, "slow masked stores"),
            (self.cross_lane_permutes_slow, "slow cross-lane permutes"),
        ]
        .into_iter()
        .filter_map(|(on, note)| on.then_some(note))
        .collect();
        if !notes.is_empty() {
            write!(f, " ({})", notes.join(", "))?;
        }
        Ok(())
    }
}
