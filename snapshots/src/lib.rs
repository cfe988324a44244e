//! The fixed specs whose generated code is kept as insta snapshots (see `tests/`).
//! Review a change with `INSTA_UPDATE=always cargo test -p smallgemm-snapshots` and
//! `git diff snapshots/`.

use smallgemm::{Dtype, GemmSpec, Layout, Scalar, Trans};

/// (snapshot name, spec): tiny, with tails, square 16, rectangular, transposed, row-major,
/// run-time and fixed scalars, one large enough to loop, and one whose last row AVX-512
/// computes as dot products.
pub fn fixed_specs() -> Vec<(&'static str, GemmSpec)> {
    let b = GemmSpec::builder;
    let specs = [
        ("d_2x2x2_nn", b(Dtype::F64, 2, 2, 2)),
        ("s_3x3x3_nn_beta1", b(Dtype::F32, 3, 3, 3).beta(Scalar::One)),
        (
            "d_13x3x5_tails_runtime",
            b(Dtype::F64, 13, 3, 5)
                .alpha(Scalar::Runtime)
                .beta(Scalar::Runtime),
        ),
        ("d_16x16x16_nn", b(Dtype::F64, 16, 16, 16).beta(Scalar::One)),
        ("s_16x16x16_nn", b(Dtype::F32, 16, 16, 16)),
        (
            "d_24x5x17_rect_minus",
            b(Dtype::F64, 24, 5, 17)
                .alpha(Scalar::MinusOne)
                .beta(Scalar::MinusOne),
        ),
        (
            "d_7x6x4_tn_padded",
            b(Dtype::F64, 7, 6, 4).trans_a(Trans::T).lda(5).ldc(9),
        ),
        (
            "s_9x4x3_nt_fixed",
            b(Dtype::F32, 9, 4, 3)
                .trans_b(Trans::T)
                .alpha(Scalar::fixed(0.5).unwrap())
                .beta(Scalar::fixed(2.0).unwrap()),
        ),
        (
            "d_5x6x7_rowmajor_tt",
            b(Dtype::F64, 5, 6, 7)
                .layout(Layout::RowMajor)
                .trans_a(Trans::T)
                .trans_b(Trans::T)
                .beta(Scalar::One),
        ),
        ("d_100x40x90_loops", b(Dtype::F64, 100, 40, 90)),
        (
            "d_9x12x9_dot_tail",
            b(Dtype::F64, 9, 12, 9).beta(Scalar::One),
        ),
    ];
    specs
        .into_iter()
        .map(|(name, builder)| (name, builder.build().expect("fixed specs are valid")))
        .collect()
}
