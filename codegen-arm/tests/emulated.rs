//! The NEON correctness matrix, executed in an AArch64 emulator (unicorn): every kernel
//! against the double-double reference with sentinels in and around C, NaN in C when
//! beta = 0, the calling convention, and bit-for-bit agreement with the `Program`
//! interpreter. The same shapes, transposes, scalar kinds, padding and batch gaps as the
//! x86 matrix (`jit-runtime/tests/correctness.rs`).

mod common;

use common::check_spec;
use smallgemm_ir::reference::{padded_spec, rectangular_cases, square_cases, MATRIX_TRANS};
use smallgemm_ir::{Dtype, GemmSpec, Layout, Scalar, Trans};

fn check(dtype: Dtype, spec: &GemmSpec, batch: usize, seed: u64) {
    match dtype {
        Dtype::F64 => check_spec::<f64>(spec, batch, seed),
        _ => check_spec::<f32>(spec, batch, seed),
    }
}

/// Every square size 1..=32 with every transpose and alpha/beta combination.
fn squares(dtype: Dtype) {
    for case in square_cases(dtype) {
        check(dtype, &case.spec, case.batch, case.seed);
    }
}

#[test]
fn squares_f64() {
    squares(Dtype::F64)
}

#[test]
fn squares_f32() {
    squares(Dtype::F32)
}

fn rectangular(dtype: Dtype) {
    for case in rectangular_cases(dtype) {
        check(dtype, &case.spec, case.batch, case.seed);
    }
}

#[test]
fn rectangular_f64() {
    rectangular(Dtype::F64)
}

#[test]
fn rectangular_f32() {
    rectangular(Dtype::F32)
}

/// Other alpha and beta values: -1 for beta, values baked into the code, alpha = 0.
#[test]
fn other_scalar_kinds() {
    let others = [
        (Scalar::One, Scalar::MinusOne),
        (Scalar::Runtime, Scalar::MinusOne),
        (Scalar::fixed(0.75).unwrap(), Scalar::fixed(-2.5).unwrap()),
        (Scalar::Zero, Scalar::Zero),
        (Scalar::Zero, Scalar::Runtime),
        (Scalar::MinusOne, Scalar::Runtime),
    ];
    let mut seed = 50_000;
    for (alpha, beta) in others {
        for shape in [(1, 1, 1), (9, 4, 3), (17, 17, 17), (33, 5, 8)] {
            for trans in MATRIX_TRANS {
                seed += 1;
                let spec = padded_spec(Dtype::F64, Layout::ColMajor, shape, trans, alpha, beta, 1);
                check_spec::<f64>(&spec, 3, seed);
                let spec = padded_spec(Dtype::F32, Layout::RowMajor, shape, trans, alpha, beta, 2);
                check_spec::<f32>(&spec, 3, seed);
            }
        }
    }
}

/// Shapes above 64, up to 256 in every dimension: blocks and k become loops, scratch
/// panels grow past the immediate offsets of loads and stores.
#[test]
fn large_shapes() {
    let mut seed = 90_000;
    for (shape, trans) in [
        ((256, 256, 256), (Trans::N, Trans::N)),
        ((256, 256, 256), (Trans::T, Trans::T)),
        ((129, 200, 97), (Trans::T, Trans::N)),
        ((100, 3, 256), (Trans::N, Trans::T)),
        ((3, 250, 130), (Trans::N, Trans::N)),
    ] {
        seed += 1;
        let spec = padded_spec(
            Dtype::F64,
            Layout::ColMajor,
            shape,
            trans,
            Scalar::Runtime,
            Scalar::Runtime,
            1,
        );
        check_spec::<f64>(&spec, 2, seed);
        let spec = padded_spec(
            Dtype::F32,
            Layout::RowMajor,
            shape,
            trans,
            Scalar::One,
            Scalar::Zero,
            2,
        );
        check_spec::<f32>(&spec, 2, seed);
    }
}

/// Batch strides of 0 reuse one A or B for every matrix; a batch of 0 runs nothing.
#[test]
fn zero_strides_and_empty_batches() {
    let spec = GemmSpec::builder(Dtype::F64, 7, 5, 3)
        .stride_a(0)
        .beta(Scalar::One)
        .build()
        .unwrap();
    check_spec::<f64>(&spec, 5, 7);
    let spec = GemmSpec::builder(Dtype::F32, 7, 5, 3)
        .stride_b(0)
        .build()
        .unwrap();
    check_spec::<f32>(&spec, 5, 8);
    check_spec::<f32>(&spec, 0, 9);
}

/// Pointer-array batches: the kernel loads each matrix's address from the arrays.
#[test]
fn pointer_arrays() {
    let mut seed = 70_000;
    for (shape, trans) in [
        ((5, 3, 4), (Trans::N, Trans::N)),
        ((9, 7, 5), (Trans::T, Trans::N)),
        ((16, 16, 16), (Trans::N, Trans::T)),
        ((100, 40, 90), (Trans::T, Trans::T)),
    ] {
        for (alpha, beta) in [
            (Scalar::Runtime, Scalar::Runtime),
            (Scalar::One, Scalar::Zero),
            (Scalar::Zero, Scalar::One),
        ] {
            seed += 1;
            let spec = |dtype, layout| {
                GemmSpec::builder(dtype, shape.0, shape.1, shape.2)
                    .layout(layout)
                    .trans_a(trans.0)
                    .trans_b(trans.1)
                    .alpha(alpha)
                    .beta(beta)
                    .pointer_arrays()
                    .build()
                    .unwrap()
            };
            check_spec::<f64>(&spec(Dtype::F64, Layout::ColMajor), 5, seed);
            check_spec::<f32>(&spec(Dtype::F32, Layout::RowMajor), 3, seed);
        }
    }
}
