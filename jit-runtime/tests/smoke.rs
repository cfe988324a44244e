mod common;
use smallgemm::{Dtype, GemmSpec, Isa, Jit, Scalar, Trans};

#[test]
fn smoke() {
    for isa in smallgemm::supported_isas() {
        let jit = Jit::with_isa(isa).unwrap();
        for n in [1usize, 2, 3, 5, 8, 9, 16, 17, 32] {
            for (ta, tb) in [
                (Trans::N, Trans::N),
                (Trans::T, Trans::T),
                (Trans::N, Trans::T),
                (Trans::T, Trans::N),
            ] {
                for (al, be) in [
                    (Scalar::One, Scalar::Zero),
                    (Scalar::Runtime, Scalar::Runtime),
                    (Scalar::MinusOne, Scalar::One),
                ] {
                    let s = GemmSpec::builder(Dtype::F64, n, n + 1, n + 2)
                        .trans_a(ta)
                        .trans_b(tb)
                        .alpha(al)
                        .beta(be)
                        .build()
                        .unwrap();
                    common::check_spec::<f64>(&jit, &s, 3, n as u64);
                    let s = GemmSpec::builder(Dtype::F32, n, n + 1, n + 2)
                        .trans_a(ta)
                        .trans_b(tb)
                        .alpha(al)
                        .beta(be)
                        .build()
                        .unwrap();
                    common::check_spec::<f32>(&jit, &s, 3, n as u64);
                }
            }
        }
        let _ = Isa::Avx2;
    }
}
