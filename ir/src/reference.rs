//! The reference GEMM in higher precision, and a harness that checks a kernel's output
//! against it: random operands (never zeros), sentinels around and inside C (its ld padding
//! and the gaps between batch entries), and NaN in C when beta = 0.

use crate::element::Element;
use crate::schedule::Schedule;
use crate::spec::{BatchForm, Dtype, GemmSpec, Layout, Operand, Scalar, Trans};

/// Sentinel written everywhere in C's buffer that the GEMM must not touch.
pub const SENTINEL: f64 = -7.0e5 - 0.3125;

/// Elements of sentinel before and after C's slice.
pub const GUARD: usize = 64;

/// a + b as an unevaluated sum (hi, lo) with hi = fl(a + b): Knuth's TwoSum.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// a * b as (hi, lo) with hi = fl(a * b), exact through one FMA.
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    (p, a.mul_add(b, -p))
}

/// A double-double accumulator: about 106 bits of significand.
#[derive(Clone, Copy, Default)]
struct DoubleDouble {
    hi: f64,
    lo: f64,
}

impl DoubleDouble {
    fn add(&mut self, (hi, lo): (f64, f64)) {
        let (s, e) = two_sum(self.hi, hi);
        let e = e + self.lo + lo;
        let (s, e) = two_sum(s, e);
        self.hi = s;
        self.lo = e;
    }
    fn scaled(self, x: f64) -> DoubleDouble {
        let (p, e) = two_prod(self.hi, x);
        let mut r = DoubleDouble { hi: p, lo: 0.0 };
        r.add((e + self.lo * x, 0.0));
        r
    }
    fn value(self) -> f64 {
        self.hi + self.lo
    }
}

/// The result of the reference for one element of C, and the magnitude its error is
/// measured against: |alpha| Σ|a||b| + |beta| |c| (the standard GEMM error bound's scale).
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub value: f64,
    pub scale: f64,
}

/// C[row, col] after the GEMM of the matrices that start at element offsets `[oa, ob, oc]`
/// of `a`, `b`, `c`, in double-double arithmetic. `c` is C before the GEMM; with beta = 0 it
/// is not read (BLAS semantics).
#[allow(clippy::too_many_arguments)]
pub fn expected<T: Element>(
    spec: &GemmSpec,
    a: &[T],
    b: &[T],
    c: &[T],
    [oa, ob, oc]: [usize; 3],
    row: usize,
    col: usize,
    alpha: f64,
    beta: f64,
) -> Expected {
    let mut sum = DoubleDouble::default();
    let mut magnitude = 0.0;
    if alpha != 0.0 {
        for p in 0..spec.k() {
            let x = a[oa + spec.index(Operand::A, row, p)].to_f64();
            let y = b[ob + spec.index(Operand::B, p, col)].to_f64();
            sum.add(two_prod(x, y));
            magnitude += (x * y).abs();
        }
    }
    let mut result = sum.scaled(alpha);
    let mut scale = alpha.abs() * magnitude;
    if beta != 0.0 {
        let old = c[oc + spec.index(Operand::C, row, col)].to_f64();
        result.add(two_prod(beta, old));
        scale += (beta * old).abs();
    }
    Expected {
        value: result.value(),
        scale,
    }
}

/// Error tolerance, relative to `Expected::scale`: a dot product of length k accumulated
/// with FMAs, then alpha and beta applied, with a safety factor of 2.
pub fn tolerance(spec: &GemmSpec) -> f64 {
    2.0 * (spec.k() as f64 + 3.0) * spec.dtype().unit_roundoff()
}

/// A small, fast, seedable generator (SplitMix64): test data must be reproducible from the
/// seed printed with a failure.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, -1/4] ∪ [1/4, 1]: never zero, never tiny, both signs.
    pub fn nonzero(&mut self) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let magnitude = 0.25 + 0.75 * u;
        if self.next_u64() & 1 == 0 {
            magnitude
        } else {
            -magnitude
        }
    }
}

/// Operands for one checked run of a spec: A and B random, C random (or NaN when beta = 0)
/// inside the m x n blocks and `SENTINEL` everywhere else, including `GUARD` elements on
/// either side of the slice the kernel gets. Strided batches use the spec's strides;
/// pointer-array batches place the matrices in a shuffled order with gaps between them.
#[derive(Clone, Debug)]
pub struct TestData<T: Element> {
    pub spec: GemmSpec,
    pub batch: usize,
    pub a: Vec<T>,
    pub b: Vec<T>,
    /// Element offset of each matrix of A, B and C in `a`, `b` and `c()`.
    pub offsets: [Vec<usize>; 3],
    /// C with the guards: the kernel's C is `c[GUARD..GUARD + len]`, see [`Self::c_mut`].
    c_guarded: Vec<T>,
    /// `c_guarded` as it was before the kernel ran.
    c_before: Vec<T>,
}

/// What a check found.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// Largest error over all of C, relative to each element's `Expected::scale`.
    pub max_error: f64,
    pub tolerance: f64,
    /// The first problem found, if any.
    pub failure: Option<String>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

impl<T: Element> TestData<T> {
    pub fn new(spec: &GemmSpec, batch: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let operands = [Operand::A, Operand::B, Operand::C];
        let offsets: [Vec<usize>; 3] = operands.map(|operand| match spec.batch_form() {
            BatchForm::Strided => (0..batch).map(|i| i * spec.stride(operand)).collect(),
            BatchForm::PointerArrays => scattered(&mut rng, spec.footprint(operand), batch),
        });
        // Each buffer ends where its last matrix does.
        let [a_len, b_len, c_len] = [0, 1, 2].map(|o| {
            let footprint = spec.footprint(operands[o]);
            offsets[o].iter().map(|&x| x + footprint).max().unwrap_or(0)
        });
        let mut random =
            |n: usize| -> Vec<T> { (0..n).map(|_| T::from_f64(rng.nonzero())).collect() };
        let a = random(a_len);
        let b = random(b_len);
        let mut c_guarded = vec![T::from_f64(SENTINEL); c_len + 2 * GUARD];
        let nan_c = spec.beta() == Scalar::Zero;
        let fill = random(spec.m() * spec.n() * batch);
        let mut values = fill.into_iter();
        for &offset in &offsets[2] {
            for col in 0..spec.n() {
                for row in 0..spec.m() {
                    let at = GUARD + offset + spec.index(Operand::C, row, col);
                    let v = values.next().expect("one value per element");
                    c_guarded[at] = if nan_c { T::from_f64(f64::NAN) } else { v };
                }
            }
        }
        TestData {
            spec: *spec,
            batch,
            a,
            b,
            offsets,
            c_before: c_guarded.clone(),
            c_guarded,
        }
    }

    /// The C slice to hand to the kernel (element 0 is the first C of the batch).
    pub fn c_mut(&mut self) -> &mut [T] {
        let len = self.c_guarded.len() - 2 * GUARD;
        &mut self.c_guarded[GUARD..GUARD + len]
    }

    /// The C slice as the kernel left it.
    pub fn c(&self) -> &[T] {
        &self.c_guarded[GUARD..self.c_guarded.len() - GUARD]
    }

    /// Restores C to its state before any run.
    pub fn reset_c(&mut self) {
        self.c_guarded.copy_from_slice(&self.c_before);
    }

    /// Compares C with the reference (alpha and beta are the values the kernel used) and
    /// every element outside the m x n blocks with its sentinel, bit for bit.
    pub fn check(&self, alpha: f64, beta: f64) -> CheckReport {
        let spec = &self.spec;
        let tolerance = tolerance(spec);
        let before = &self.c_before[GUARD..self.c_before.len() - GUARD];
        let mut inside = vec![false; self.c_guarded.len()];
        let mut max_error: f64 = 0.0;
        let mut failure = None;
        for index in 0..self.batch {
            for col in 0..spec.n() {
                for row in 0..spec.m() {
                    let at = self.offsets[2][index] + spec.index(Operand::C, row, col);
                    inside[GUARD + at] = true;
                    let o = [0, 1, 2].map(|x| self.offsets[x][index]);
                    let e = expected(spec, &self.a, &self.b, before, o, row, col, alpha, beta);
                    // Round the exact value to T before comparing: that much error is free.
                    let exact = T::from_f64(e.value).to_f64();
                    let got = self.c()[at].to_f64();
                    let diff = (got - exact).abs();
                    let error = if e.scale > 0.0 {
                        diff / e.scale
                    } else if diff == 0.0 {
                        0.0
                    } else {
                        f64::INFINITY
                    };
                    // NaN (a NaN that leaked from C, say) counts as the worst error.
                    let error = if error.is_nan() { f64::INFINITY } else { error };
                    max_error = max_error.max(error);
                    if error > tolerance && failure.is_none() {
                        failure = Some(format!(
                            "C[{row},{col}] of matrix {index}: got {got}, expected {} (error {error:.3e} > tolerance {tolerance:.3e})",
                            e.value
                        ));
                    }
                }
            }
        }
        if failure.is_none() {
            for (i, (now, was)) in self.c_guarded.iter().zip(&self.c_before).enumerate() {
                if !inside[i] && now.bits() != was.bits() {
                    failure = Some(format!(
                        "element {} of C's buffer (outside every m x n block) changed from {was} to {now}",
                        i as i64 - GUARD as i64
                    ));
                    break;
                }
            }
        }
        CheckReport {
            max_error,
            tolerance,
            failure,
        }
    }
}

/// Offsets of `batch` matrices of `footprint` elements, in a shuffled order with gaps of 0..3
/// elements between them: pointer arrays need not be ordered or evenly spaced.
fn scattered(rng: &mut SplitMix64, footprint: usize, batch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..batch).collect();
    for i in (1..batch).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut offsets = vec![0; batch];
    let mut next = 0;
    for slot in order {
        offsets[slot] = next;
        next += footprint + (rng.next_u64() % 4) as usize;
    }
    offsets
}

/// Test specs: a spec with padded leading dimensions (by `pad`, `pad + 1`, `pad + 2` mod 3)
/// and gaps between the matrices of the batch, so that kernels that touch padding or gaps
/// hit sentinels.
#[allow(clippy::too_many_arguments)]
pub fn padded_spec(
    dtype: Dtype,
    layout: Layout,
    (m, n, k): (usize, usize, usize),
    (ta, tb): (Trans, Trans),
    alpha: Scalar,
    beta: Scalar,
    pad: usize,
) -> GemmSpec {
    let builder = GemmSpec::builder(dtype, m, n, k)
        .layout(layout)
        .trans_a(ta)
        .trans_b(tb)
        .alpha(alpha)
        .beta(beta);
    let tight = builder.build().expect("a valid shape");
    let ld = |o: Operand, extra: usize| tight.stored_dims(o).0 + extra;
    let padded = builder
        .lda(ld(Operand::A, pad))
        .ldb(ld(Operand::B, (pad + 1) % 3))
        .ldc(ld(Operand::C, (pad + 2) % 3))
        .build()
        .expect("padding keeps a spec valid");
    let gap = (pad * 7) % 5;
    builder
        .lda(ld(Operand::A, pad))
        .ldb(ld(Operand::B, (pad + 1) % 3))
        .ldc(ld(Operand::C, (pad + 2) % 3))
        .stride_a(padded.footprint(Operand::A) + gap)
        .stride_b(padded.footprint(Operand::B) + (gap + 1) % 3)
        .stride_c(padded.footprint(Operand::C) + gap)
        .build()
        .expect("gaps keep a spec valid")
}

/// Test shapes: a fixed sample of 320 rectangular shapes up to 64, rich in 1, primes and sizes next
/// to multiples of the vector widths,
/// and the five extremes of 1 and 64 (325 in all).
pub fn rectangular_shapes() -> Vec<(usize, usize, usize)> {
    const FAVOURITES: [usize; 24] = [
        1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 4, 8, 15, 16, 33,
    ];
    let mut rng = SplitMix64::new(2024);
    let pick = |rng: &mut SplitMix64| {
        if rng.next_u64() % 3 == 0 {
            1 + (rng.next_u64() % 64) as usize
        } else {
            FAVOURITES[(rng.next_u64() % FAVOURITES.len() as u64) as usize]
        }
    };
    let mut shapes: Vec<_> = (0..320)
        .map(|_| (pick(&mut rng), pick(&mut rng), pick(&mut rng)))
        .collect();
    shapes.extend([(1, 1, 1), (64, 1, 1), (1, 64, 1), (1, 1, 64), (64, 64, 64)]);
    shapes
}

/// The alpha kinds the CPU correctness matrices cycle through (the runtime's and the
/// emulated NEON and AVX-512 ones share [`square_cases`] and [`rectangular_cases`]).
pub const MATRIX_ALPHAS: [Scalar; 3] = [Scalar::One, Scalar::MinusOne, Scalar::Runtime];
/// The beta kinds of the correctness matrices.
pub const MATRIX_BETAS: [Scalar; 3] = [Scalar::Zero, Scalar::One, Scalar::Runtime];
/// The transposes of the correctness matrices.
pub const MATRIX_TRANS: [(Trans, Trans); 4] = [
    (Trans::N, Trans::N),
    (Trans::N, Trans::T),
    (Trans::T, Trans::N),
    (Trans::T, Trans::T),
];
/// Batch lengths that are not multiples of any chunk size.
pub const MATRIX_BATCHES: [usize; 4] = [1, 3, 7, 13];

/// `values` as the little-endian bytes of their element type (an emulator's memory).
pub fn to_le_bytes<T: Element>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::DTYPE.size());
    for v in values {
        match T::DTYPE {
            Dtype::F64 => out.extend_from_slice(&v.bits().to_le_bytes()),
            _ => out.extend_from_slice(&(v.bits() as u32).to_le_bytes()),
        }
    }
    out
}

/// The elements whose little-endian bytes `bytes` holds (the reverse of [`to_le_bytes`]).
pub fn from_le_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    let size = T::DTYPE.size();
    bytes
        .chunks_exact(size)
        .map(|c| match T::DTYPE {
            Dtype::F64 => T::from_f64(f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            _ => T::from_f64(f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64),
        })
        .collect()
}

/// One case of a correctness matrix: the spec, the batch length to run it on and the seed
/// of its data.
#[derive(Clone, Copy, Debug)]
pub struct MatrixCase {
    pub spec: GemmSpec,
    pub batch: usize,
    pub seed: u64,
}

/// Every square size 1..=32 with every transpose and alpha/beta combination: padded
/// leading dimensions and gaps between the matrices in turn, every fifth row-major, the
/// batch lengths in turn.
pub fn square_cases(dtype: Dtype) -> Vec<MatrixCase> {
    let mut cases = Vec::new();
    let mut seed = 0;
    for n in 1..=32 {
        for trans in MATRIX_TRANS {
            for alpha in MATRIX_ALPHAS {
                for beta in MATRIX_BETAS {
                    seed += 1;
                    let layout = if seed % 5 == 0 {
                        Layout::RowMajor
                    } else {
                        Layout::ColMajor
                    };
                    cases.push(MatrixCase {
                        spec: padded_spec(dtype, layout, (n, n, n), trans, alpha, beta, seed % 3),
                        batch: MATRIX_BATCHES[seed % MATRIX_BATCHES.len()],
                        seed: seed as u64,
                    });
                }
            }
        }
    }
    cases
}

/// The [`rectangular_shapes`], each with every transpose, cycling through the nine
/// alpha/beta combinations, both layouts, the paddings and the batch lengths.
pub fn rectangular_cases(dtype: Dtype) -> Vec<MatrixCase> {
    let mut cases = Vec::new();
    let mut seed = 10_000;
    for (i, shape) in rectangular_shapes().into_iter().enumerate() {
        for (t, trans) in MATRIX_TRANS.into_iter().enumerate() {
            seed += 1;
            let combo = (i + t) % 9;
            let (alpha, beta) = (MATRIX_ALPHAS[combo / 3], MATRIX_BETAS[combo % 3]);
            let layout = if (i + t) % 4 == 1 {
                Layout::RowMajor
            } else {
                Layout::ColMajor
            };
            cases.push(MatrixCase {
                spec: padded_spec(dtype, layout, shape, trans, alpha, beta, i % 3),
                batch: MATRIX_BATCHES[(i + t) % MATRIX_BATCHES.len()],
                seed,
            });
        }
    }
    cases
}

/// The cases the variants of a schedule are checked on (prefetching and streaming ones):
/// every square size and a fifth of the [`rectangular_shapes`], f64 then f32 for each,
/// column-major, cycling through the transposes, scalar kinds, paddings and batch lengths.
pub fn variant_cases() -> Vec<MatrixCase> {
    let shapes = (1..=32)
        .map(|n| (n, n, n))
        .chain(rectangular_shapes().into_iter().step_by(5));
    let mut cases = Vec::new();
    let mut seed = 120_000;
    for (i, shape) in shapes.enumerate() {
        let (trans, alpha, beta) = (
            MATRIX_TRANS[i % 4],
            MATRIX_ALPHAS[i % 3],
            MATRIX_BETAS[(i / 3) % 3],
        );
        for dtype in [Dtype::F64, Dtype::F32] {
            seed += 1;
            cases.push(MatrixCase {
                spec: padded_spec(dtype, Layout::ColMajor, shape, trans, alpha, beta, i % 3),
                batch: MATRIX_BATCHES[i % MATRIX_BATCHES.len()],
                seed,
            });
        }
    }
    cases
}

/// The cases dot-product tails (`Schedule::dot_tail`) are checked on: m one or two more than
/// a multiple of the lanes (m = 1 and 2 too), k below, at and past a vector, n past the
/// lanes; packed tails with four rows past a multiple (m = 4 too) or eight (f32), k a
/// multiple of the group or not, n past one block of sums; each alpha/beta kind and one
/// fixed pair, A transposed or not in turn, the paddings and batch lengths in turn;
/// column-major.
pub fn dot_tail_cases() -> Vec<MatrixCase> {
    let shapes = [
        (Dtype::F64, 9, 9, 9),
        (Dtype::F64, 17, 17, 17),
        (Dtype::F64, 25, 30, 12),
        (Dtype::F64, 1, 9, 20),
        (Dtype::F32, 17, 17, 17),
        (Dtype::F32, 17, 33, 21),
        (Dtype::F32, 33, 5, 16),
        (Dtype::F32, 1, 17, 15),
        // Two rows as dot products.
        (Dtype::F64, 10, 11, 9),
        (Dtype::F64, 2, 9, 12),
        (Dtype::F32, 18, 18, 18),
        (Dtype::F32, 34, 9, 21),
        (Dtype::F32, 2, 17, 33),
        // Packed tails.
        (Dtype::F64, 12, 12, 12),
        (Dtype::F64, 28, 27, 7),
        (Dtype::F64, 4, 9, 5),
        (Dtype::F32, 20, 20, 20),
        (Dtype::F32, 24, 26, 9),
        (Dtype::F32, 4, 33, 6),
        // Groups in a loop (past the unrolling budget, with the blocks' k loop).
        (Dtype::F64, 20, 40, 45),
        (Dtype::F32, 24, 30, 41),
    ];
    let scalars = MATRIX_ALPHAS
        .into_iter()
        .flat_map(|alpha| MATRIX_BETAS.map(|beta| (alpha, beta)))
        .chain([(
            Scalar::fixed(2.5).expect("a finite value"),
            Scalar::MinusOne,
        )]);
    let mut cases = Vec::new();
    let mut seed = 150_000;
    for (i, (alpha, beta)) in scalars.enumerate() {
        for (dtype, m, n, k) in shapes {
            seed += 1;
            let trans = [(Trans::N, Trans::N), (Trans::T, Trans::N)][i % 2];
            cases.push(MatrixCase {
                spec: padded_spec(
                    dtype,
                    Layout::ColMajor,
                    (m, n, k),
                    trans,
                    alpha,
                    beta,
                    i % 3,
                ),
                batch: MATRIX_BATCHES[i % MATRIX_BATCHES.len()],
                seed,
            });
        }
    }
    cases
}

/// `planned` (the target's plan for a case) with a dot-product tail and plain vectors.
pub fn with_dot_tail(planned: Schedule) -> Schedule {
    Schedule {
        dot_tail: true,
        lane_pack: false,
        vector_bytes: 0,
        m_vectors: planned.m_vectors.max(1),
        n_cols: planned.n_cols.max(1),
        ..planned
    }
}

/// The two schedules a dot-tail case runs under: `planned` [`with_dot_tail`], and a
/// looped, batch-unrolled, prefetching form.
pub fn dot_tail_schedules(planned: Schedule) -> [Schedule; 2] {
    let with_tail = with_dot_tail(planned);
    let looped = Schedule {
        m_vectors: 1,
        n_cols: 3,
        k_unroll: 4,
        unroll_m_blocks: false,
        unroll_n_blocks: false,
        vector_bytes: 0,
        batch_unroll: 2,
        prefetch: true,
        split_tail: false,
        interleave: false,
        lane_pack: false,
        dot_tail: true,
        b_resident: false,
    };
    [with_tail, looped]
}

/// The specs lane-packed kernels are checked on (2x2x2, 3x3x3 and 4x4xk): each dtype and
/// size with four scalar kinds, one of them row-major, transposes where 2x2 takes them,
/// packed batches and batches with gaps between the matrices (whose sentinels catch stray
/// writes).
pub fn lane_packed_specs() -> Vec<GemmSpec> {
    let scalars = [
        (Scalar::One, Scalar::Zero),
        (Scalar::MinusOne, Scalar::One),
        (Scalar::Runtime, Scalar::Runtime),
        (
            Scalar::fixed(0.5).expect("a finite value"),
            Scalar::MinusOne,
        ),
    ];
    let mut specs = Vec::new();
    for dtype in [Dtype::F64, Dtype::F32] {
        for (side, depth) in [(2, 2), (3, 3), (4, 4), (4, 8), (4, 12), (4, 32)] {
            for (i, &(alpha, beta)) in scalars.iter().enumerate() {
                for gap in [0, 3] {
                    let layout = if i == 1 {
                        Layout::RowMajor
                    } else {
                        Layout::ColMajor
                    };
                    let (ta, tb) = MATRIX_TRANS[(i + gap) % MATRIX_TRANS.len()];
                    let mut builder = GemmSpec::builder(dtype, side, side, depth)
                        .layout(layout)
                        .trans_a(ta)
                        .trans_b(tb)
                        .alpha(alpha)
                        .beta(beta);
                    if gap > 0 {
                        let (size, operand) = (side * side, side * depth);
                        builder = builder
                            .stride_a(operand + gap)
                            .stride_b(operand + gap + 1)
                            .stride_c(size + gap);
                    }
                    specs.push(builder.build().expect("a valid lane-packed spec"));
                }
            }
        }
    }
    specs
}
