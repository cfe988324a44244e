//! The runtime's contract: one compilation per spec under concurrency, and bad input
//! rejected with an error value before anything runs, leaving C untouched.

use std::sync::Arc;

use smallgemm::{Dtype, Error, GemmSpec, Isa, Jit, Operand, Scalar, SpecError, Trans};

fn specs() -> Vec<GemmSpec> {
    let mut out = Vec::new();
    for n in 1..=12 {
        for dtype in [Dtype::F32, Dtype::F64] {
            out.push(
                GemmSpec::builder(dtype, n, n + 1, 2 * n)
                    .trans_b(if n % 2 == 0 { Trans::T } else { Trans::N })
                    .beta(Scalar::Runtime)
                    .build()
                    .unwrap(),
            );
        }
    }
    out
}

#[test]
fn eight_threads_compile_each_spec_once() {
    let Ok(jit) = Jit::new() else { return };
    let jit = Arc::new(jit);
    let specs = specs();
    let kernels: Vec<Vec<Arc<smallgemm::Kernel>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (jit, specs) = (&jit, &specs);
                s.spawn(move || {
                    // Each thread walks the specs from a different starting point.
                    (0..specs.len())
                        .map(|i| jit.kernel(&specs[(i + t * 3) % specs.len()]).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(jit.compilations(), specs.len());
    assert_eq!(jit.cached_kernels(), specs.len());
    for (t, list) in kernels.iter().enumerate() {
        for (i, k) in list.iter().enumerate() {
            let spec = &specs[(i + t * 3) % specs.len()];
            assert_eq!(k.spec(), spec);
            assert!(Arc::ptr_eq(k, &jit.kernel(spec).unwrap()));
        }
    }
    assert_eq!(
        jit.compilations(),
        specs.len(),
        "cache hits compile nothing"
    );
}

fn setup() -> Option<(Jit, GemmSpec)> {
    let jit = Jit::new().ok()?;
    let spec = GemmSpec::builder(Dtype::F64, 4, 3, 2)
        .beta(Scalar::One)
        .build()
        .unwrap();
    Some((jit, spec))
}

#[test]
fn short_slices_are_errors_and_write_nothing() {
    let Some((jit, spec)) = setup() else { return };
    let kernel = jit.kernel(&spec).unwrap();
    let batch = 5;
    let a = vec![1.0; spec.required_len(Operand::A, batch)];
    let b = vec![1.0; spec.required_len(Operand::B, batch)];
    let c_len = spec.required_len(Operand::C, batch);
    for (operand, short_a, short_b, short_c) in [
        (Operand::A, 1, 0, 0),
        (Operand::B, 0, 1, 0),
        (Operand::C, 0, 0, 1),
    ] {
        let mut c = vec![7.0; c_len - short_c];
        let err = kernel
            .run(&a[short_a..], &b[short_b..], &mut c, batch, 1.0, 1.0)
            .unwrap_err();
        assert!(
            matches!(err, Error::SliceTooShort { operand: o, batch: 5, .. } if o == operand),
            "{err}"
        );
        assert!(
            c.iter().all(|&x| x == 7.0),
            "C was written despite the error"
        );
    }
    // A batch of 0 needs nothing and does nothing.
    kernel.run::<f64>(&[], &[], &mut [], 0, 1.0, 1.0).unwrap();
}

#[test]
fn wrong_dtype_and_scalars_are_errors() {
    let Some((jit, spec)) = setup() else { return };
    let kernel = jit.kernel(&spec).unwrap();
    let (a, b, mut c) = (vec![1f32; 8], vec![1f32; 6], vec![7f32; 12]);
    assert_eq!(
        kernel.run(&a, &b, &mut c, 1, 1.0, 1.0).unwrap_err(),
        Error::DtypeMismatch {
            kernel: Dtype::F64,
            given: Dtype::F32
        }
    );
    let (a, b, mut c) = (vec![1.0; 8], vec![1.0; 6], vec![7.0; 12]);
    let err = kernel.run(&a, &b, &mut c, 1, 2.0, 1.0).unwrap_err();
    assert!(
        matches!(err, Error::ScalarMismatch { which: "alpha", .. }),
        "{err}"
    );
    let err = kernel.run(&a, &b, &mut c, 1, 1.0, 0.5).unwrap_err();
    assert!(
        matches!(err, Error::ScalarMismatch { which: "beta", .. }),
        "{err}"
    );
    assert!(c.iter().all(|&x| x == 7.0));
}

#[test]
fn raw_pointers_are_checked() {
    let Some((jit, spec)) = setup() else { return };
    let kernel = jit.kernel(&spec).unwrap();
    let (a, b, mut c) = (vec![1.0f64; 8], vec![1.0f64; 6], vec![7.0f64; 12]);
    // SAFETY: null and misaligned pointers are rejected before any access; the valid call
    // passes slices that hold one matrix each.
    unsafe {
        let err = kernel
            .run_raw(std::ptr::null(), b.as_ptr(), c.as_mut_ptr(), 1, 1.0, 1.0)
            .unwrap_err();
        assert_eq!(
            err,
            Error::NullPointer {
                operand: Operand::A
            }
        );
        let misaligned = (b.as_ptr() as *const u8).add(1) as *const f64;
        let err = kernel
            .run_raw(a.as_ptr(), misaligned, c.as_mut_ptr(), 1, 1.0, 1.0)
            .unwrap_err();
        assert_eq!(
            err,
            Error::Misaligned {
                operand: Operand::B
            }
        );
        // Null pointers with no work are fine.
        kernel
            .run_raw::<f64>(
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                1.0,
                1.0,
            )
            .unwrap();
        kernel
            .run_raw(a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 1, 1.0, 1.0)
            .unwrap();
    }
    assert_eq!(c[0], 7.0 + 2.0);
}

#[test]
fn invalid_specs_are_errors() {
    assert_eq!(
        GemmSpec::builder(Dtype::F64, 4, 0, 4).build().unwrap_err(),
        SpecError::ZeroDimension { dim: "n" }
    );
    assert!(matches!(
        GemmSpec::builder(Dtype::F64, 4, 4, 4).ldc(2).build(),
        Err(SpecError::LeadingDimension {
            operand: Operand::C,
            ld: 2,
            min: 4
        })
    ));
    assert!(matches!(
        GemmSpec::builder(Dtype::F64, 4, 4, 4).stride_c(8).build(),
        Err(SpecError::OverlappingC { .. })
    ));
    // Errors convert into the runtime's error type.
    let e: Error = GemmSpec::builder(Dtype::F32, 1, 1, 0)
        .build()
        .unwrap_err()
        .into();
    assert!(e.to_string().contains("k must be at least 1"), "{e}");
}

#[test]
fn unavailable_isa_is_a_clear_error() {
    let isas = smallgemm::supported_isas();
    for isa in [Isa::Avx2, Isa::Avx512] {
        match Jit::with_isa(isa) {
            Ok(jit) => assert!(isas.contains(&isa) && jit.target().isa == isa),
            Err(e) => {
                assert!(!isas.contains(&isa));
                assert!(e.to_string().contains(isa.name()), "{e}");
            }
        }
    }
}

#[test]
fn global_gemm_runs_a_strided_batch() {
    if smallgemm::supported_isas().is_empty() {
        assert_eq!(smallgemm::global().err(), Some(Error::NoSupportedIsa));
        return;
    }
    let spec = GemmSpec::builder(Dtype::F32, 2, 2, 2)
        .alpha(Scalar::from_value(3.0))
        .build()
        .unwrap();
    let a = [1.0f32, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 1.0];
    let b = [1.0f32, 0.0, 0.0, 1.0, 5.0, 6.0, 7.0, 8.0];
    let mut c = [f32::NAN; 8];
    smallgemm::gemm_batch_strided(&spec, &a, &b, &mut c, 2, 3.0, 0.0).unwrap();
    assert_eq!(c, [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0]);
}
