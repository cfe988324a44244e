//! insta snapshots of the PTX of fixed specs: any change to the generated code shows up in
//! review. (Each is also assembled by ptxas in tests/ptxas.rs.)

use smallgemm_codegen_ptx::{generate, BatchKind};
use smallgemm_ir::{Dtype, GemmSpec, GpuTarget, Layout, Scalar, Sm, Trans};

fn ptx(spec: GemmSpec, sm: Sm, kind: BatchKind) -> String {
    generate(&spec, &GpuTarget::new(sm), None, kind)
        .expect("kernel")
        .ptx
}

#[test]
fn dgemm_4x4x4_tiny_many_per_block() {
    let spec = GemmSpec::builder(Dtype::F64, 4, 4, 4).build().unwrap();
    insta::assert_snapshot!(ptx(spec, Sm::Sm80, BatchKind::Strided));
}

#[test]
fn sgemm_6x5x3_transposed_runtime_scalars() {
    let spec = GemmSpec::builder(Dtype::F32, 6, 5, 3)
        .trans_a(Trans::T)
        .layout(Layout::RowMajor)
        .alpha(Scalar::Runtime)
        .beta(Scalar::Runtime)
        .build()
        .unwrap();
    insta::assert_snapshot!(ptx(spec, Sm::Sm90, BatchKind::Strided));
}

#[test]
fn hgemm_16x16x16_tensor_cores() {
    let spec = GemmSpec::builder(Dtype::F16, 16, 16, 16)
        .beta(Scalar::One)
        .build()
        .unwrap();
    insta::assert_snapshot!(ptx(spec, Sm::Sm90, BatchKind::Strided));
}

#[test]
fn dgemm_3x3x3_variable_size_pointer_arrays() {
    let spec = GemmSpec::builder(Dtype::F64, 3, 3, 3)
        .beta(Scalar::MinusOne)
        .build()
        .unwrap();
    insta::assert_snapshot!(ptx(spec, Sm::Sm80, BatchKind::VariableSize));
}
