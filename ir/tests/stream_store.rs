//! The streaming-store pass (`smallgemm_ir::stream_store`), checked through the `Program`
//! interpreter, which refuses a streaming store anywhere but at a multiple of the vector
//! width in C: every program the pass changes still computes the reference, and the pass
//! changes only programs whose every store to C can stream.

use std::collections::{BTreeSet, HashMap};

use smallgemm_ir::reference::TestData;
use smallgemm_ir::{
    compile_program, interpret, plan, plan_streaming, stream_store, Dtype, Element, GemmSpec, Gpr,
    Isa, Op, Program, Scalar, Schedule, Target, Trans,
};

/// Interprets `program` for `spec` (beta = 0: C starts as NaN) on a batch of 3 and checks
/// it against the reference, sentinels included.
fn check<T: Element>(spec: &GemmSpec, program: &Program, what: &str) {
    let batch = 3;
    let mut data = TestData::<T>::new(spec, batch, 11);
    let alpha = spec.alpha().value().unwrap_or(1.25);
    let params: Vec<T> = program.params.iter().map(|_| T::from_f64(alpha)).collect();
    let (a, b) = (data.a.clone(), data.b.clone());
    interpret(program, &a, &b, data.c_mut(), batch, &params)
        .unwrap_or_else(|e| panic!("{} ({what}): {e}\n{program}", spec.name()));
    let report = data.check(alpha, 0.0);
    assert!(
        report.passed(),
        "{} ({what}): {}",
        spec.name(),
        report.failure.unwrap()
    );
}

fn count(ops: &[Op], f: &dyn Fn(&Op) -> bool) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Loop { body, .. } => count(body, f),
            op => usize::from(f(op)),
        })
        .sum()
}

fn streaming_stores(p: &Program) -> usize {
    count(&p.ops, &|op| matches!(op, Op::StoreStream { .. }))
}

/// Applies the pass to the hot and the streaming schedule of `spec`; returns for which it
/// changed the program, after checking each changed program against the reference.
fn try_spec<T: Element>(spec: &GemmSpec, target: Target) -> Vec<bool> {
    let problem = spec.col_major();
    let hot = plan(&problem, target);
    let streaming = plan_streaming(&problem, target, &hot);
    [hot, streaming]
        .iter()
        .map(|schedule| {
            let (_, mut program) = compile_program(spec, target, Some(schedule)).unwrap();
            let before = program.to_string();
            let changed = stream_store::apply(&mut program);
            if changed {
                assert!(program.stores_streaming());
                let what = format!("{target}, {schedule:?}, streaming stores");
                check::<T>(spec, &program, &what);
            } else {
                assert_eq!(before, program.to_string(), "{} changed", spec.name());
            }
            changed
        })
        .collect()
}

fn spec(dtype: Dtype, m: usize, n: usize, k: usize) -> GemmSpec {
    GemmSpec::builder(dtype, m, n, k)
        .alpha(Scalar::One)
        .beta(Scalar::Zero)
        .build()
        .unwrap()
}

#[test]
fn streaming_stores_compute_the_reference() {
    let mut changed = Vec::new();
    for isa in [Isa::Avx512, Isa::Avx2] {
        let target = Target::new(isa);
        for n in 1..=34 {
            for dtype in [Dtype::F64, Dtype::F32] {
                let s = spec(dtype, n, n, n);
                let results = match dtype {
                    Dtype::F64 => try_spec::<f64>(&s, target),
                    _ => try_spec::<f32>(&s, target),
                };
                if results.iter().any(|&c| c) {
                    changed.push((isa, dtype, n));
                }
            }
        }
    }
    // Columns a multiple of the vector width apart (and whole vectors) stream...
    for expected in [
        (Isa::Avx512, Dtype::F64, 8),
        (Isa::Avx512, Dtype::F64, 16),
        (Isa::Avx512, Dtype::F64, 32),
        (Isa::Avx512, Dtype::F32, 16),
        (Isa::Avx512, Dtype::F32, 32),
        (Isa::Avx2, Dtype::F64, 4),
        (Isa::Avx2, Dtype::F64, 12),
        (Isa::Avx2, Dtype::F32, 8),
        (Isa::Avx2, Dtype::F32, 24),
    ] {
        assert!(changed.contains(&expected), "{expected:?} did not stream");
    }
    // ...a row tail in any column, or columns off the width, do not.
    for unexpected in [
        (Isa::Avx512, Dtype::F64, 12),
        (Isa::Avx512, Dtype::F64, 20),
        (Isa::Avx512, Dtype::F32, 24),
        (Isa::Avx512, Dtype::F64, 31),
        (Isa::Avx2, Dtype::F64, 6),
    ] {
        assert!(!changed.contains(&unexpected), "{unexpected:?} streamed");
    }
}

#[test]
fn other_shapes_and_operands_stream_only_where_aligned() {
    let target = Target::new(Isa::Avx512);
    // Rectangular and transposed: the stores are C's whatever op(A) and op(B) are.
    for (m, n, k) in [(16, 5, 3), (8, 13, 31), (32, 2, 17), (24, 24, 1)] {
        for (ta, tb) in [
            (Trans::N, Trans::N),
            (Trans::T, Trans::N),
            (Trans::N, Trans::T),
        ] {
            for alpha in [Scalar::One, Scalar::MinusOne, Scalar::Runtime] {
                let s = GemmSpec::builder(Dtype::F64, m, n, k)
                    .trans_a(ta)
                    .trans_b(tb)
                    .alpha(alpha)
                    .beta(Scalar::Zero)
                    .build()
                    .unwrap();
                assert!(
                    try_spec::<f64>(&s, target).iter().any(|&c| c),
                    "{} did not stream",
                    s.name()
                );
            }
        }
    }
    // C's leading dimension padded to a whole number of vectors: streams.
    let padded = GemmSpec::builder(Dtype::F64, 8, 8, 8)
        .ldc(16)
        .beta(Scalar::Zero)
        .build()
        .unwrap();
    assert!(try_spec::<f64>(&padded, target).iter().any(|&c| c));
    // A batch stride of C off the vector width: C's second matrix is misaligned.
    let off_stride = GemmSpec::builder(Dtype::F64, 8, 8, 8)
        .stride_c(8 * 8 + 1)
        .beta(Scalar::Zero)
        .build()
        .unwrap();
    assert_eq!(try_spec::<f64>(&off_stride, target), [false, false]);
    // Columns off the width (ldc 9), the matrices on it (72 elements apart).
    let off_ld = GemmSpec::builder(Dtype::F64, 8, 8, 8)
        .ldc(9)
        .stride_c(72)
        .beta(Scalar::Zero)
        .build()
        .unwrap();
    assert_eq!(try_spec::<f64>(&off_ld, target), [false, false]);
}

#[test]
fn the_next_matrix_s_c_is_not_prefetched() {
    let target = Target::new(Isa::Avx512);
    let s = spec(Dtype::F64, 32, 32, 32);
    let problem = s.col_major();
    let streaming = Schedule {
        prefetch: true,
        ..plan_streaming(&problem, target, &plan(&problem, target))
    };
    let (_, mut program) = compile_program(&s, target, Some(&streaming)).unwrap();
    let prefetches = |p: &Program| count(&p.ops, &|op| matches!(op, Op::Prefetch { .. }));
    let before = prefetches(&program);
    assert_eq!(
        prefetched_operands(&program.ops),
        [Gpr::A, Gpr::B, Gpr::C].into()
    );
    let gprs = program.gprs;
    assert!(stream_store::apply(&mut program));
    // C's walking register, the last one, went with its prefetches.
    assert_eq!(program.gprs, gprs - 1);
    let walk_c = format!("Gpr({})", gprs - 1);
    assert!(!format!("{:?}", program.ops).contains(&walk_c));
    // 4x6 blocks in the loop over columns and a 4x2 block after it.
    assert_eq!(streaming_stores(&program), 4 * 6 + 4 * 2);
    // The prefetches of C's lines went (walking the next matrices: target.prefetch_spread),
    // and no more: those of A and B stay.
    assert!(target.prefetch_spread);
    assert_eq!(prefetched_operands(&program.ops), [Gpr::A, Gpr::B].into());
    assert_eq!(before - prefetches(&program), before / 3);
    check::<f64>(&s, &program, "streaming schedule, streaming stores");
    // Prefetching before each line's first use, the prefetch before each store went.
    let first_use = Target {
        prefetch_spread: false,
        ..target
    };
    let (_, mut program) = compile_program(&s, first_use, Some(&streaming)).unwrap();
    let before = prefetches(&program);
    assert!(stream_store::apply(&mut program));
    assert_eq!(before - prefetches(&program), 4 * 6 + 4 * 2);
    assert_eq!(prefetched_operands(&program.ops), [Gpr::A, Gpr::B].into());
    check::<f64>(
        &s,
        &program,
        "streaming schedule, streaming stores, first use",
    );
}

/// The operands (A, B, C) whose lines `ops` prefetch, following the argument registers
/// through copies.
fn prefetched_operands(ops: &[Op]) -> BTreeSet<Gpr> {
    fn walk(ops: &[Op], origin: &mut HashMap<Gpr, Gpr>, out: &mut BTreeSet<Gpr>) {
        for op in ops {
            match op {
                Op::Copy { dst, src } => match origin.get(src).copied() {
                    Some(o) => {
                        origin.insert(*dst, o);
                    }
                    None => {
                        origin.remove(dst);
                    }
                },
                Op::Prefetch { addr } => {
                    out.insert(origin[&addr.base]);
                }
                Op::Loop { body, .. } => walk(body, origin, out),
                _ => {}
            }
        }
    }
    let mut origin: HashMap<Gpr, Gpr> = [Gpr::A, Gpr::B, Gpr::C].map(|g| (g, g)).into();
    let mut out = BTreeSet::new();
    walk(ops, &mut origin, &mut out);
    out
}
