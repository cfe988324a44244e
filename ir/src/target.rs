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
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            other => Err(format!("unknown ISA {other:?} (expected avx2 or avx512)")),
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
}

/// A machine to generate code for. Detected at run time by the runtime, or built by hand for
/// offline emission. Everything the planner and the lowering need to know about the machine
/// is a method here, so no layer above the backend matches on the ISA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Target {
    pub isa: Isa,
}

impl Target {
    pub const AVX2: Target = Target { isa: Isa::Avx2 };
    pub const AVX512: Target = Target { isa: Isa::Avx512 };

    pub fn new(isa: Isa) -> Target {
        Target { isa }
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
        }
    }

    pub fn masks(self) -> MaskSupport {
        match self.isa {
            Isa::Avx2 => MaskSupport::VectorRegister,
            Isa::Avx512 => MaskSupport::MaskRegisters { count: 7 },
        }
    }

    /// FMA can take its broadcast multiplicand straight from memory (AVX-512 `{1toN}`), so
    /// broadcasting B needs no register.
    pub fn fma_broadcast_operand(self) -> bool {
        self.isa == Isa::Avx512
    }

    /// Vector FMAs per cycle, for the planner's cost model.
    pub fn fma_per_cycle(self) -> f64 {
        2.0
    }

    /// Vector loads per cycle, for the planner's cost model.
    pub fn loads_per_cycle(self) -> f64 {
        2.0
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.isa.name())
    }
}
