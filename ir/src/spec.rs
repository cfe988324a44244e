//! `GemmSpec`: the problem, validated on construction, and its column-major view.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Element type of A, B and C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE half precision: GPU kernels only (tensor cores); CPU targets reject it.
    F16,
    F32,
    F64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }

    /// Unit roundoff (half the machine epsilon).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Dtype::F16 => 1.0 / 2048.0,
            Dtype::F32 => f32::EPSILON as f64 / 2.0,
            Dtype::F64 => f64::EPSILON / 2.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }
}

/// op(X): the stored matrix or its transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Trans {
    N,
    T,
}

/// Storage order of all three matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    ColMajor,
    RowMajor,
}

/// How alpha or beta enters the kernel. 0, 1 and -1 change the code (no multiply, a
/// subtraction, C not read); `Fixed` bakes any other value into the code (offline emission);
/// `Runtime` takes the value as a kernel argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scalar {
    Zero,
    One,
    MinusOne,
    Runtime,
    /// A value other than 0, 1, -1, stored as the bits of an f64 so that specs hash.
    Fixed(u64),
}

impl Scalar {
    /// The kind that bakes `value` into the code: 0, 1 and -1 get their own kinds.
    pub fn fixed(value: f64) -> Result<Scalar, SpecError> {
        if !value.is_finite() {
            return Err(SpecError::NonFiniteScalar { value });
        }
        Ok(Self::classify(value).unwrap_or(Scalar::Fixed(value.to_bits())))
    }

    /// The kind for a value known only when the kernel runs: 0, 1 and -1 still get their own
    /// kinds (BLAS semantics: beta = 0 means C is not read), anything else is `Runtime`.
    pub fn from_value(value: f64) -> Scalar {
        Self::classify(value).unwrap_or(Scalar::Runtime)
    }

    fn classify(value: f64) -> Option<Scalar> {
        if value == 0.0 {
            Some(Scalar::Zero)
        } else if value == 1.0 {
            Some(Scalar::One)
        } else if value == -1.0 {
            Some(Scalar::MinusOne)
        } else {
            None
        }
    }

    /// The value this kind stands for, or `None` for `Runtime`.
    pub fn value(self) -> Option<f64> {
        match self {
            Scalar::Zero => Some(0.0),
            Scalar::One => Some(1.0),
            Scalar::MinusOne => Some(-1.0),
            Scalar::Fixed(bits) => Some(f64::from_bits(bits)),
            Scalar::Runtime => None,
        }
    }

    /// True when the kernel multiplies by a value (as opposed to a sign or nothing).
    pub fn is_general(self) -> bool {
        matches!(self, Scalar::Runtime | Scalar::Fixed(_))
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Runtime => write!(f, "runtime"),
            other => write!(f, "{}", other.value().unwrap_or(f64::NAN)),
        }
    }
}

/// How the kernel finds the matrices of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchForm {
    /// Matrix i of X starts `i * stride_x` elements after the first: the kernel takes the
    /// first matrix's address and the strides are constants in its code.
    Strided,
    /// The kernel takes arrays of `batch` pointers, one per matrix (MKL's and MAGMA's
    /// pointer-array batches); the strides are unused.
    PointerArrays,
}

/// Which matrix an error or a dimension is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    A,
    B,
    C,
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operand::A => "A",
            Operand::B => "B",
            Operand::C => "C",
        })
    }
}

/// Why a spec is not a GEMM we can compile.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SpecError {
    #[error("{dim} must be at least 1 (got 0)")]
    ZeroDimension { dim: &'static str },
    #[error("ld{} = {ld} is too small: the stored {operand} needs at least {min}", operand.to_string().to_lowercase())]
    LeadingDimension {
        operand: Operand,
        ld: usize,
        min: usize,
    },
    #[error("stride_c = {stride} lets consecutive C matrices of the batch overlap (each C spans {min} elements)")]
    OverlappingC { stride: usize, min: usize },
    #[error("{what} spans {bytes} bytes; kernels address within 2 GiB (a 32-bit displacement)")]
    TooLarge { what: String, bytes: u128 },
    #[error("alpha and beta must be finite (got {value})")]
    NonFiniteScalar { value: f64 },
}

/// A batched GEMM problem: C_i = alpha * op(A_i) * op(B_i) + beta * C_i for every i of a
/// strided batch. Sizes, leading dimensions, transposes, strides and the kinds of alpha and
/// beta are all compile-time facts of the generated kernel; only the pointers, the batch
/// length and run-time alpha/beta values are arguments. A `GemmSpec` that exists is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct GemmSpec {
    dtype: Dtype,
    layout: Layout,
    trans_a: Trans,
    trans_b: Trans,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    alpha: Scalar,
    beta: Scalar,
    stride_a: usize,
    stride_b: usize,
    stride_c: usize,
    batch_form: BatchForm,
}

/// Builder for [`GemmSpec`]: start from [`GemmSpec::builder`], which defaults to column-major,
/// no transposes, tight leading dimensions, packed batches, alpha = 1 and beta = 0.
#[derive(Clone, Copy, Debug)]
pub struct GemmSpecBuilder {
    dtype: Dtype,
    layout: Layout,
    trans_a: Trans,
    trans_b: Trans,
    m: usize,
    n: usize,
    k: usize,
    lda: Option<usize>,
    ldb: Option<usize>,
    ldc: Option<usize>,
    alpha: Scalar,
    beta: Scalar,
    stride_a: Option<usize>,
    stride_b: Option<usize>,
    stride_c: Option<usize>,
    batch_form: BatchForm,
}

impl GemmSpecBuilder {
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    pub fn trans_a(mut self, t: Trans) -> Self {
        self.trans_a = t;
        self
    }
    pub fn trans_b(mut self, t: Trans) -> Self {
        self.trans_b = t;
        self
    }
    pub fn lda(mut self, ld: usize) -> Self {
        self.lda = Some(ld);
        self
    }
    pub fn ldb(mut self, ld: usize) -> Self {
        self.ldb = Some(ld);
        self
    }
    pub fn ldc(mut self, ld: usize) -> Self {
        self.ldc = Some(ld);
        self
    }
    pub fn alpha(mut self, s: Scalar) -> Self {
        self.alpha = s;
        self
    }
    pub fn beta(mut self, s: Scalar) -> Self {
        self.beta = s;
        self
    }
    /// Element distance between consecutive A matrices of the batch (0 reuses one A).
    pub fn stride_a(mut self, s: usize) -> Self {
        self.stride_a = Some(s);
        self
    }
    /// Element distance between consecutive B matrices of the batch (0 reuses one B).
    pub fn stride_b(mut self, s: usize) -> Self {
        self.stride_b = Some(s);
        self
    }
    /// Element distance between consecutive C matrices; C matrices must not overlap.
    pub fn stride_c(mut self, s: usize) -> Self {
        self.stride_c = Some(s);
        self
    }

    /// The kernel takes arrays of pointers to the matrices instead of strided batches.
    pub fn pointer_arrays(mut self) -> Self {
        self.batch_form = BatchForm::PointerArrays;
        self
    }

    pub fn build(self) -> Result<GemmSpec, SpecError> {
        for (dim, v) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            if v == 0 {
                return Err(SpecError::ZeroDimension { dim });
            }
        }
        let mut spec = GemmSpec {
            dtype: self.dtype,
            layout: self.layout,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            m: self.m,
            n: self.n,
            k: self.k,
            lda: 0,
            ldb: 0,
            ldc: 0,
            alpha: self.alpha,
            beta: self.beta,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            batch_form: self.batch_form,
        };
        for (operand, ld) in [
            (Operand::A, self.lda),
            (Operand::B, self.ldb),
            (Operand::C, self.ldc),
        ] {
            let min = spec.stored_dims(operand).0;
            let ld = ld.unwrap_or(min);
            if ld < min {
                return Err(SpecError::LeadingDimension { operand, ld, min });
            }
            *spec.ld_mut(operand) = ld;
        }
        spec.stride_a = self.stride_a.unwrap_or(spec.footprint(Operand::A));
        spec.stride_b = self.stride_b.unwrap_or(spec.footprint(Operand::B));
        spec.stride_c = self.stride_c.unwrap_or(spec.footprint(Operand::C));
        if spec.batch_form == BatchForm::Strided && spec.stride_c < spec.footprint(Operand::C) {
            return Err(SpecError::OverlappingC {
                stride: spec.stride_c,
                min: spec.footprint(Operand::C),
            });
        }
        for scalar in [spec.alpha, spec.beta] {
            if let Some(value) = scalar.value() {
                if !value.is_finite() {
                    return Err(SpecError::NonFiniteScalar { value });
                }
            }
        }
        let limit = i32::MAX as u128;
        let elt = spec.dtype.size() as u128;
        for operand in [Operand::A, Operand::B, Operand::C] {
            let bytes = spec.footprint(operand) as u128 * elt;
            let stride = spec.stride(operand) as u128 * elt;
            if bytes > limit {
                return Err(SpecError::TooLarge {
                    what: format!("one {operand} matrix"),
                    bytes,
                });
            }
            if stride > limit {
                return Err(SpecError::TooLarge {
                    what: format!("the batch stride of {operand}"),
                    bytes: stride,
                });
            }
        }
        Ok(spec)
    }
}

impl GemmSpec {
    /// Start a spec for C (m x n) = op(A) (m x k) * op(B) (k x n).
    pub fn builder(dtype: Dtype, m: usize, n: usize, k: usize) -> GemmSpecBuilder {
        GemmSpecBuilder {
            dtype,
            layout: Layout::ColMajor,
            trans_a: Trans::N,
            trans_b: Trans::N,
            m,
            n,
            k,
            lda: None,
            ldb: None,
            ldc: None,
            alpha: Scalar::One,
            beta: Scalar::Zero,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            batch_form: BatchForm::Strided,
        }
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn trans_a(&self) -> Trans {
        self.trans_a
    }
    pub fn trans_b(&self) -> Trans {
        self.trans_b
    }
    pub fn m(&self) -> usize {
        self.m
    }
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn alpha(&self) -> Scalar {
        self.alpha
    }
    pub fn beta(&self) -> Scalar {
        self.beta
    }
    pub fn batch_form(&self) -> BatchForm {
        self.batch_form
    }

    /// Leading dimension of an operand, in elements.
    pub fn ld(&self, operand: Operand) -> usize {
        match operand {
            Operand::A => self.lda,
            Operand::B => self.ldb,
            Operand::C => self.ldc,
        }
    }

    fn ld_mut(&mut self, operand: Operand) -> &mut usize {
        match operand {
            Operand::A => &mut self.lda,
            Operand::B => &mut self.ldb,
            Operand::C => &mut self.ldc,
        }
    }

    /// Batch stride of an operand, in elements.
    pub fn stride(&self, operand: Operand) -> usize {
        match operand {
            Operand::A => self.stride_a,
            Operand::B => self.stride_b,
            Operand::C => self.stride_c,
        }
    }

    /// (rows, cols) of op(X) as the user sees it: A is m x k, B is k x n, C is m x n.
    pub fn op_dims(&self, operand: Operand) -> (usize, usize) {
        match operand {
            Operand::A => (self.m, self.k),
            Operand::B => (self.k, self.n),
            Operand::C => (self.m, self.n),
        }
    }

    fn trans(&self, operand: Operand) -> Trans {
        match operand {
            Operand::A => self.trans_a,
            Operand::B => self.trans_b,
            Operand::C => Trans::N,
        }
    }

    /// (leading, other) extent of the matrix as stored: the leading extent is what `ld` must
    /// cover (rows for column-major, columns for row-major).
    pub fn stored_dims(&self, operand: Operand) -> (usize, usize) {
        let (r, c) = self.op_dims(operand);
        let (r, c) = match self.trans(operand) {
            Trans::N => (r, c),
            Trans::T => (c, r),
        };
        match self.layout {
            Layout::ColMajor => (r, c),
            Layout::RowMajor => (c, r),
        }
    }

    /// Elements one matrix of this operand spans in memory: ld * (other - 1) + leading.
    pub fn footprint(&self, operand: Operand) -> usize {
        let (lead, other) = self.stored_dims(operand);
        self.ld(operand) * (other - 1) + lead
    }

    /// Bytes one matrix each of A, B and C span in memory together.
    pub fn footprint_bytes(&self) -> usize {
        [Operand::A, Operand::B, Operand::C]
            .iter()
            .map(|&o| self.footprint(o))
            .sum::<usize>()
            * self.dtype.size()
    }

    /// Elements a slice must hold for `batch` strided matrices of this operand (saturating at
    /// `usize::MAX`, which no slice holds). For pointer arrays: what each pointer must hold.
    pub fn required_len(&self, operand: Operand, batch: usize) -> usize {
        match (batch, self.batch_form) {
            (0, _) => 0,
            (_, BatchForm::PointerArrays) => self.footprint(operand),
            _ => self
                .stride(operand)
                .saturating_mul(batch - 1)
                .saturating_add(self.footprint(operand)),
        }
    }

    /// Offset, in elements, of op(X)[row, col] of matrix 0 (C has no op).
    pub fn index(&self, operand: Operand, row: usize, col: usize) -> usize {
        let (r, c) = match self.trans(operand) {
            Trans::N => (row, col),
            Trans::T => (col, row),
        };
        let ld = self.ld(operand);
        match self.layout {
            Layout::ColMajor => r + c * ld,
            Layout::RowMajor => r * ld + c,
        }
    }

    /// Floating-point operations of one GEMM of the batch (2mnk).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// The same computation as a column-major problem. Row-major storage is column-major
    /// storage of the transpose, and C^T = op(B)^T op(A)^T, so a row-major spec becomes a
    /// column-major one with A and B (and m and n) swapped: the caller then passes B's pointer
    /// where the kernel expects A's and vice versa (`swap_operands`).
    pub fn col_major(&self) -> ColMajorProblem {
        let base = ColMajorProblem {
            dtype: self.dtype,
            m: self.m,
            n: self.n,
            k: self.k,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            lda: self.lda,
            ldb: self.ldb,
            ldc: self.ldc,
            alpha: self.alpha,
            beta: self.beta,
            stride_a: self.stride_a,
            stride_b: self.stride_b,
            stride_c: self.stride_c,
            batch_form: self.batch_form,
            swap_operands: false,
        };
        match self.layout {
            Layout::ColMajor => base,
            Layout::RowMajor => ColMajorProblem {
                m: self.n,
                n: self.m,
                trans_a: self.trans_b,
                trans_b: self.trans_a,
                lda: self.ldb,
                ldb: self.lda,
                stride_a: self.stride_b,
                stride_b: self.stride_a,
                swap_operands: true,
                ..base
            },
        }
    }

    /// A short name that encodes the spec, usable as a symbol or file name.
    pub fn name(&self) -> String {
        let t = |t: Trans| match t {
            Trans::N => 'n',
            Trans::T => 't',
        };
        let s = |s: Scalar| match s {
            Scalar::Zero => "0".to_string(),
            Scalar::One => "1".to_string(),
            Scalar::MinusOne => "m1".to_string(),
            Scalar::Runtime => "r".to_string(),
            Scalar::Fixed(bits) => format!("x{bits:016x}"),
        };
        let batch = match self.batch_form {
            BatchForm::Strided => {
                format!("s{}x{}x{}", self.stride_a, self.stride_b, self.stride_c)
            }
            BatchForm::PointerArrays => "p".to_string(),
        };
        format!(
            "{}gemm_{}{}{}_m{}n{}k{}_ld{}x{}x{}_a{}_b{}_{batch}",
            match self.dtype {
                Dtype::F16 => 'h',
                Dtype::F32 => 's',
                Dtype::F64 => 'd',
            },
            match self.layout {
                Layout::ColMajor => 'c',
                Layout::RowMajor => 'r',
            },
            t(self.trans_a),
            t(self.trans_b),
            self.m,
            self.n,
            self.k,
            self.lda,
            self.ldb,
            self.ldc,
            s(self.alpha),
            s(self.beta),
        )
    }
}

/// The column-major form of a spec that lowering works on (see [`GemmSpec::col_major`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ColMajorProblem {
    pub dtype: Dtype,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: Trans,
    pub trans_b: Trans,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub alpha: Scalar,
    pub beta: Scalar,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch_form: BatchForm,
    /// The kernel's A is the caller's B and vice versa (row-major specs).
    pub swap_operands: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_tight() {
        let s = GemmSpec::builder(Dtype::F64, 3, 4, 5).build().unwrap();
        assert_eq!(
            (s.ld(Operand::A), s.ld(Operand::B), s.ld(Operand::C)),
            (3, 5, 3)
        );
        assert_eq!(s.footprint(Operand::A), 15);
        // (15 + 20 + 12) f64 elements.
        assert_eq!(s.footprint_bytes(), 376);
        assert_eq!(s.stride(Operand::B), 20);
        assert_eq!(s.required_len(Operand::C, 3), 36);
        assert_eq!(s.required_len(Operand::C, 0), 0);
    }

    #[test]
    fn leading_dimensions_follow_transpose_and_layout() {
        let s = GemmSpec::builder(Dtype::F32, 3, 4, 5)
            .trans_a(Trans::T)
            .build()
            .unwrap();
        assert_eq!(s.ld(Operand::A), 5);
        let r = GemmSpec::builder(Dtype::F32, 3, 4, 5)
            .layout(Layout::RowMajor)
            .build()
            .unwrap();
        assert_eq!(
            (r.ld(Operand::A), r.ld(Operand::B), r.ld(Operand::C)),
            (5, 4, 4)
        );
        assert_eq!(r.index(Operand::A, 1, 2), 7);
    }

    #[test]
    fn invalid_specs_are_typed_errors() {
        assert_eq!(
            GemmSpec::builder(Dtype::F64, 0, 1, 1).build(),
            Err(SpecError::ZeroDimension { dim: "m" })
        );
        assert_eq!(
            GemmSpec::builder(Dtype::F64, 4, 4, 4).lda(3).build(),
            Err(SpecError::LeadingDimension {
                operand: Operand::A,
                ld: 3,
                min: 4
            })
        );
        assert_eq!(
            GemmSpec::builder(Dtype::F64, 4, 4, 4)
                .trans_b(Trans::T)
                .ldb(3)
                .build()
                .unwrap_err()
                .to_string(),
            "ldb = 3 is too small: the stored B needs at least 4"
        );
        assert!(matches!(
            GemmSpec::builder(Dtype::F64, 4, 4, 4).stride_c(15).build(),
            Err(SpecError::OverlappingC {
                stride: 15,
                min: 16
            })
        ));
        assert!(matches!(
            GemmSpec::builder(Dtype::F64, 100_000, 4, 4)
                .ldc(100_000)
                .stride_c(1 << 30)
                .build(),
            Err(SpecError::TooLarge { .. })
        ));
        assert!(Scalar::fixed(f64::NAN).is_err());
    }

    #[test]
    fn row_major_swaps_operands() {
        let s = GemmSpec::builder(Dtype::F64, 3, 4, 5)
            .layout(Layout::RowMajor)
            .trans_a(Trans::T)
            .build()
            .unwrap();
        let p = s.col_major();
        assert!(p.swap_operands);
        assert_eq!((p.m, p.n, p.k), (4, 3, 5));
        assert_eq!((p.trans_a, p.trans_b), (Trans::N, Trans::T));
        assert_eq!((p.lda, p.ldb, p.ldc), (4, 3, 4));
    }

    #[test]
    fn scalars_classify() {
        assert_eq!(Scalar::from_value(0.0), Scalar::Zero);
        assert_eq!(Scalar::from_value(-1.0), Scalar::MinusOne);
        assert_eq!(Scalar::from_value(2.5), Scalar::Runtime);
        assert_eq!(Scalar::fixed(2.5).unwrap().value(), Some(2.5));
        assert_eq!(Scalar::fixed(1.0).unwrap(), Scalar::One);
    }
}
