//! Every batch form: pointer arrays (machine code vs reference vs interpreter), strided and
//! pointer batches across threads (bit-identical for any thread count), MKL's grouped and
//! MAGMA's variable-size batches, and their argument checks.

use smallgemm::{
    Dtype, Element, Error, GemmGroup, GemmSpec, Jit, Layout, MatrixShape, Operand, Scalar, Trans,
};
use smallgemm_ir::reference::{expected, tolerance, SplitMix64, TestData};

/// Splits `buf` into disjoint mutable slices of `len` elements at `offsets` (any order, not
/// overlapping), returned in the order of `offsets`.
fn slices_at<'a, T>(buf: &'a mut [T], offsets: &[usize], len: usize) -> Vec<&'a mut [T]> {
    let mut order: Vec<usize> = (0..offsets.len()).collect();
    order.sort_by_key(|&i| offsets[i]);
    let mut out: Vec<Option<&'a mut [T]>> = (0..offsets.len()).map(|_| None).collect();
    let (mut rest, mut consumed) = (buf, 0);
    for i in order {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(offsets[i] - consumed);
        let (mine, tail) = tail.split_at_mut(len);
        out[i] = Some(mine);
        rest = tail;
        consumed = offsets[i] + len;
    }
    out.into_iter().map(|s| s.expect("every offset")).collect()
}

fn pointer_case<T: Element>(jit: &Jit, spec: &GemmSpec, batch: usize, seed: u64) {
    let kernel = jit.kernel(spec).unwrap();
    let (alpha, beta) = (
        spec.alpha().value().unwrap_or(0.625),
        spec.beta().value().unwrap_or(-1.25),
    );
    let (alpha_t, beta_t) = (T::from_f64(alpha), T::from_f64(beta));
    let mut data = TestData::<T>::new(spec, batch, seed);
    let (a, b, offsets) = (data.a.clone(), data.b.clone(), data.offsets.clone());
    let fa = spec.footprint(Operand::A);
    let fb = spec.footprint(Operand::B);
    let fc = spec.footprint(Operand::C);
    let a_s: Vec<&[T]> = offsets[0].iter().map(|&o| &a[o..o + fa]).collect();
    let b_s: Vec<&[T]> = offsets[1].iter().map(|&o| &b[o..o + fb]).collect();
    {
        let mut c_s = slices_at(data.c_mut(), &offsets[2], fc);
        kernel
            .run_pointers(&a_s, &b_s, &mut c_s, alpha_t, beta_t)
            .unwrap();
    }
    let report = data.check(alpha_t.to_f64(), beta_t.to_f64());
    assert!(
        report.passed(),
        "{}: {}",
        spec.name(),
        report.failure.unwrap()
    );
    // The interpreter, given the same matrices, agrees bit for bit.
    let machine = data.c().to_vec();
    data.reset_c();
    let generated = smallgemm::generate(spec, jit.target(), None).unwrap();
    let params: Vec<T> = generated
        .program
        .params
        .iter()
        .map(|p| match p {
            smallgemm_ir::Param::Alpha => alpha_t,
            smallgemm_ir::Param::Beta => beta_t,
        })
        .collect();
    let swap = spec.col_major().swap_operands;
    let (ka, kb) = if swap { (&b, &a) } else { (&a, &b) };
    let (oa, ob) = if swap {
        (&offsets[1], &offsets[0])
    } else {
        (&offsets[0], &offsets[1])
    };
    smallgemm_ir::interpret_pointer_arrays(
        &generated.program,
        ka,
        kb,
        data.c_mut(),
        [oa, ob, &offsets[2]],
        batch,
        &params,
    )
    .unwrap();
    assert!(
        machine
            .iter()
            .zip(data.c())
            .all(|(x, y)| x.bits() == y.bits()),
        "{}: machine code and interpreter differ",
        spec.name()
    );
}

#[test]
fn pointer_array_kernels_compute_the_reference() {
    for isa in smallgemm::supported_isas() {
        let jit = Jit::with_isa(isa).unwrap();
        let mut seed = 1;
        for (m, n, k) in [
            (1, 1, 1),
            (4, 4, 4),
            (13, 7, 5),
            (16, 16, 16),
            (33, 9, 17),
            (70, 40, 90),
        ] {
            for (ta, tb) in [
                (Trans::N, Trans::N),
                (Trans::T, Trans::N),
                (Trans::N, Trans::T),
                (Trans::T, Trans::T),
            ] {
                for (alpha, beta) in [
                    (Scalar::One, Scalar::Zero),
                    (Scalar::Runtime, Scalar::Runtime),
                    (Scalar::MinusOne, Scalar::One),
                    (Scalar::Zero, Scalar::Runtime),
                ] {
                    seed += 1;
                    let layout = if seed % 3 == 0 {
                        Layout::RowMajor
                    } else {
                        Layout::ColMajor
                    };
                    let spec = GemmSpec::builder(Dtype::F64, m, n, k)
                        .layout(layout)
                        .trans_a(ta)
                        .trans_b(tb)
                        .alpha(alpha)
                        .beta(beta)
                        .pointer_arrays()
                        .build()
                        .unwrap();
                    pointer_case::<f64>(&jit, &spec, 1 + (seed as usize % 7), seed);
                    let spec = GemmSpec::builder(Dtype::F32, m, n, k)
                        .layout(layout)
                        .trans_a(ta)
                        .trans_b(tb)
                        .alpha(alpha)
                        .beta(beta)
                        .pointer_arrays()
                        .build()
                        .unwrap();
                    pointer_case::<f32>(&jit, &spec, 1 + (seed as usize % 5), seed);
                }
            }
        }
    }
}

fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.nonzero()).collect()
}

#[test]
fn threads_split_strided_batches_bit_identically() {
    let Ok(one) = Jit::new() else { return };
    let one = one.with_threads(1);
    let all = Jit::new().unwrap();
    for (n, batch) in [(2, 100_000), (8, 5_003), (17, 301), (32, 97)] {
        let spec = GemmSpec::builder(Dtype::F64, n, n, n)
            .alpha(Scalar::Runtime)
            .beta(Scalar::One)
            .build()
            .unwrap();
        let a = random(spec.required_len(Operand::A, batch), 1);
        let b = random(spec.required_len(Operand::B, batch), 2);
        let c0 = random(spec.required_len(Operand::C, batch), 3);
        let (mut c1, mut c2) = (c0.clone(), c0.clone());
        one.gemm_batch_strided(&spec, &a, &b, &mut c1, batch, 0.5, 1.0)
            .unwrap();
        all.gemm_batch_strided(&spec, &a, &b, &mut c2, batch, 0.5, 1.0)
            .unwrap();
        assert!(
            c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
            "n = {n}"
        );
        // Spot-check against the reference: the last matrix, which a thread split reaches last.
        let last = batch - 1;
        for (row, col) in [(0, 0), (n - 1, n - 1), (n / 2, 0)] {
            let e = expected(
                &spec,
                &a,
                &b,
                &c0,
                [Operand::A, Operand::B, Operand::C].map(|o| last * spec.stride(o)),
                row,
                col,
                0.5,
                1.0,
            );
            let got = c2[last * spec.stride(Operand::C) + spec.index(Operand::C, row, col)];
            assert!(
                (got - e.value).abs() <= tolerance(&spec) * e.scale,
                "n = {n}"
            );
        }
    }
    // Errors are values and write nothing.
    let spec = GemmSpec::builder(Dtype::F64, 3, 3, 3).build().unwrap();
    let mut c = vec![7.0; 9];
    let err = all
        .gemm_batch_strided(&spec, &[1.0; 9], &[1.0; 8], &mut c, 1, 1.0, 0.0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::SliceTooShort {
                operand: Operand::B,
                ..
            }
        ),
        "{err}"
    );
    assert!(c.iter().all(|&x| x == 7.0));
}

/// Checks `c` (after) against the reference for one product given by its own spec.
fn check_product(
    spec: &GemmSpec,
    a: &[f64],
    b: &[f64],
    c0: &[f64],
    c: &[f64],
    alpha: f64,
    beta: f64,
) {
    for col in 0..spec.n() {
        for row in 0..spec.m() {
            let e = expected(spec, a, b, c0, [0, 0, 0], row, col, alpha, beta);
            let got = c[spec.index(Operand::C, row, col)];
            assert!(
                (got - e.value).abs() <= tolerance(spec) * e.scale.max(1e-300),
                "{}: C[{row},{col}] = {got}, want {}",
                spec.name(),
                e.value
            );
        }
    }
}

#[test]
fn grouped_batches_run_each_group_with_its_kernel() {
    let Ok(jit) = Jit::new() else { return };
    for layout in [Layout::ColMajor, Layout::RowMajor] {
        let groups = [
            GemmGroup {
                trans_a: Trans::N,
                trans_b: Trans::N,
                m: 4,
                n: 4,
                k: 4,
                alpha: 1.0,
                lda: 4,
                ldb: 4,
                beta: 0.0,
                ldc: 4,
                size: 3,
            },
            GemmGroup {
                trans_a: Trans::T,
                trans_b: Trans::N,
                m: 7,
                n: 3,
                k: 5,
                alpha: -0.5,
                lda: 9,
                ldb: 9,
                beta: 2.0,
                ldc: 9,
                size: 0,
            },
            GemmGroup {
                trans_a: Trans::N,
                trans_b: Trans::T,
                m: 9,
                n: 6,
                k: 2,
                alpha: 1.5,
                lda: 10,
                ldb: 8,
                beta: 1.0,
                ldc: 10,
                size: 4,
            },
            // k = 0: C = beta C, A and B never read.
            GemmGroup {
                trans_a: Trans::N,
                trans_b: Trans::N,
                m: 3,
                n: 2,
                k: 0,
                alpha: 3.0,
                lda: 3,
                ldb: 2,
                beta: -1.0,
                ldc: 3,
                size: 2,
            },
        ];
        let mut specs = Vec::new();
        for g in &groups {
            let spec = smallgemm::blas_spec(
                Dtype::F64,
                layout,
                (g.trans_a, g.trans_b),
                (g.m, g.n, g.k.max(1)),
                (g.lda, g.ldb.max(g.k.max(1)), g.ldc),
                g.alpha,
                g.beta,
                Some([0, 0, 10_000]),
            )
            .unwrap()
            .unwrap();
            for _ in 0..g.size {
                specs.push((spec, *g));
            }
        }
        let mut seed = 10;
        let mut a_store = Vec::new();
        let mut b_store = Vec::new();
        let mut c_store = Vec::new();
        for (spec, _) in &specs {
            seed += 3;
            a_store.push(random(spec.footprint(Operand::A), seed));
            b_store.push(random(spec.footprint(Operand::B), seed + 1));
            c_store.push(random(spec.footprint(Operand::C), seed + 2));
        }
        let c_before = c_store.clone();
        {
            let a: Vec<&[f64]> = a_store.iter().map(|x| x.as_slice()).collect();
            let b: Vec<&[f64]> = b_store.iter().map(|x| x.as_slice()).collect();
            let mut c: Vec<&mut [f64]> = c_store.iter_mut().map(|x| x.as_mut_slice()).collect();
            jit.gemm_batch_grouped(layout, &groups, &a, &b, &mut c)
                .unwrap();
        }
        for (i, (spec, g)) in specs.iter().enumerate() {
            let alpha = if g.k == 0 { 0.0 } else { g.alpha };
            check_product(
                spec,
                &a_store[i],
                &b_store[i],
                &c_before[i],
                &c_store[i],
                alpha,
                g.beta,
            );
        }
        // Group sizes must account for every matrix.
        let a: Vec<&[f64]> = a_store.iter().map(|x| x.as_slice()).collect();
        let b: Vec<&[f64]> = b_store.iter().map(|x| x.as_slice()).collect();
        let mut c: Vec<&mut [f64]> = c_store.iter_mut().map(|x| x.as_mut_slice()).collect();
        let err = jit
            .gemm_batch_grouped(layout, &groups[..2], &a, &b, &mut c)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::GroupSizes {
                    groups: 3,
                    matrices: 9
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn variable_size_batches_group_by_shape() {
    let Ok(jit) = Jit::new() else { return };
    let mut rng = SplitMix64::new(99);
    let count = 200;
    let shapes: Vec<MatrixShape> = (0..count)
        .map(|_| {
            let mut d = || 1 + (rng.next_u64() % 32) as usize;
            let (m, n, k) = (d(), d(), d());
            MatrixShape {
                m,
                n,
                k,
                lda: m,
                ldb: k + 1,
                ldc: m + 2,
            }
        })
        .collect();
    let specs: Vec<GemmSpec> = shapes
        .iter()
        .map(|s| {
            GemmSpec::builder(Dtype::F64, s.m, s.n, s.k)
                .lda(s.lda)
                .ldb(s.ldb)
                .ldc(s.ldc)
                .build()
                .unwrap()
        })
        .collect();
    let a_store: Vec<Vec<f64>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| random(s.footprint(Operand::A), 3 * i as u64))
        .collect();
    let b_store: Vec<Vec<f64>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| random(s.footprint(Operand::B), 3 * i as u64 + 1))
        .collect();
    let mut c_store: Vec<Vec<f64>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| random(s.footprint(Operand::C), 3 * i as u64 + 2))
        .collect();
    let c_before = c_store.clone();
    {
        let a: Vec<&[f64]> = a_store.iter().map(|x| x.as_slice()).collect();
        let b: Vec<&[f64]> = b_store.iter().map(|x| x.as_slice()).collect();
        let mut c: Vec<&mut [f64]> = c_store.iter_mut().map(|x| x.as_mut_slice()).collect();
        jit.gemm_batch_variable(
            Layout::ColMajor,
            (Trans::N, Trans::N),
            &shapes,
            1.25,
            &a,
            &b,
            0.5,
            &mut c,
        )
        .unwrap();
    }
    for i in 0..count {
        let spec = GemmSpec::builder(Dtype::F64, shapes[i].m, shapes[i].n, shapes[i].k)
            .lda(shapes[i].lda)
            .ldb(shapes[i].ldb)
            .ldc(shapes[i].ldc)
            .alpha(Scalar::Runtime)
            .beta(Scalar::Runtime)
            .build()
            .unwrap();
        check_product(
            &spec,
            &a_store[i],
            &b_store[i],
            &c_before[i],
            &c_store[i],
            1.25,
            0.5,
        );
    }
    // A matrix too short for its shape is an error, and nothing runs.
    let a: Vec<&[f64]> = a_store.iter().map(|x| x.as_slice()).collect();
    let mut b: Vec<&[f64]> = b_store.iter().map(|x| x.as_slice()).collect();
    b[150] = &b_store[150][1..];
    let snapshot = c_store.clone();
    let mut c: Vec<&mut [f64]> = c_store.iter_mut().map(|x| x.as_mut_slice()).collect();
    let err = jit
        .gemm_batch_variable(
            Layout::ColMajor,
            (Trans::N, Trans::N),
            &shapes,
            1.25,
            &a,
            &b,
            0.5,
            &mut c,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::MatrixTooShort {
                operand: Operand::B,
                index: 150,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(c_store, snapshot);
}

#[test]
fn batch_forms_are_checked() {
    let Ok(jit) = Jit::new() else { return };
    let strided = GemmSpec::builder(Dtype::F64, 2, 2, 2).build().unwrap();
    let kernel = jit.kernel(&strided).unwrap();
    let (a, b) = ([1.0; 4], [1.0; 4]);
    let mut c = [0.0; 4];
    let err = kernel
        .run_pointers(&[&a[..]], &[&b[..]], &mut [&mut c[..]], 1.0, 0.0)
        .unwrap_err();
    assert!(matches!(err, Error::BatchForm { .. }), "{err}");
    let pointers = GemmSpec::builder(Dtype::F64, 2, 2, 2)
        .pointer_arrays()
        .build()
        .unwrap();
    let kernel = jit.kernel(&pointers).unwrap();
    let err = kernel.run(&a, &b, &mut c, 1, 1.0, 0.0).unwrap_err();
    assert!(matches!(err, Error::BatchForm { .. }), "{err}");
    let err = kernel
        .run_pointers(&[&a[..], &a[..]], &[&b[..]], &mut [&mut c[..]], 1.0, 0.0)
        .unwrap_err();
    assert!(
        matches!(err, Error::BatchLengths { a: 2, b: 1, c: 1 }),
        "{err}"
    );
    kernel
        .run_pointers(&[&a[..]], &[&b[..]], &mut [&mut c[..]], 1.0, 0.0)
        .unwrap();
    assert_eq!(c, [2.0; 4]);
}
