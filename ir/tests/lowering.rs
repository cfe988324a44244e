//! The lowering, checked through the `Program` interpreter against the reference: no
//! backend involved. Covers planned schedules and schedules forced into every loop form.

use smallgemm_ir::reference::TestData;
use smallgemm_ir::{
    compile_program, interpret, Dtype, Element, GemmSpec, Layout, Op, Scalar, Schedule, Target,
    Trans,
};

fn run_case<T: Element>(spec: &GemmSpec, target: Target, schedule: Option<&Schedule>, seed: u64) {
    let (schedule, program) =
        compile_program(spec, target, schedule).unwrap_or_else(|e| panic!("{}: {e}", spec.name()));
    let batch = 3;
    let mut data = TestData::<T>::new(spec, batch, seed);
    let (alpha, beta) = (
        spec.alpha().value().unwrap_or(1.375),
        spec.beta().value().unwrap_or(-0.625),
    );
    let mut params = Vec::new();
    if spec.alpha() == Scalar::Runtime {
        params.push(T::from_f64(alpha));
    }
    if spec.beta() == Scalar::Runtime {
        params.push(T::from_f64(beta));
    }
    let (a, b) = if spec.col_major().swap_operands {
        (data.b.clone(), data.a.clone())
    } else {
        (data.a.clone(), data.b.clone())
    };
    interpret(&program, &a, &b, data.c_mut(), batch, &params).unwrap_or_else(|e| {
        panic!(
            "{} on {target} with {schedule:?}: {e}\n{program}",
            spec.name()
        )
    });
    let report = data.check(alpha, beta);
    assert!(
        report.passed(),
        "{} on {target} with {schedule:?}: {}",
        spec.name(),
        report.failure.unwrap()
    );
}

/// Runs the cases of [`specs`] of both element types that `s` fits on `target`, each with
/// the next seed; returns how many ran.
fn run_fitting(
    (m, n, k): (usize, usize, usize),
    target: Target,
    s: &Schedule,
    seed: &mut u64,
) -> usize {
    let fits = |spec: &GemmSpec| s.validate(&spec.col_major(), target).is_ok();
    let f64_specs = specs(Dtype::F64, m, n, k).into_iter().filter(fits);
    let f32_specs = specs(Dtype::F32, m, n, k).into_iter().filter(fits);
    let mut ran = 0;
    for spec in f64_specs {
        *seed += 1;
        run_case::<f64>(&spec, target, Some(s), *seed);
        ran += 1;
    }
    for spec in f32_specs {
        *seed += 1;
        run_case::<f32>(&spec, target, Some(s), *seed);
        ran += 1;
    }
    ran
}

/// The x86 targets, each lowering its own way (AMD's AVX2, Zen 4's 512-bit halves).
const X86_TARGETS: [Target; 4] = [
    Target::AVX2,
    Target::AVX2_AMD,
    Target::AVX512,
    Target::AVX512_HALVES,
];

fn specs(dtype: Dtype, m: usize, n: usize, k: usize) -> Vec<GemmSpec> {
    let mut out = Vec::new();
    let scalars = [
        (Scalar::One, Scalar::Zero),
        (Scalar::MinusOne, Scalar::One),
        (Scalar::Runtime, Scalar::Runtime),
        (Scalar::One, Scalar::MinusOne),
        (Scalar::fixed(2.5).unwrap(), Scalar::One),
        (Scalar::Runtime, Scalar::Zero),
        (Scalar::Zero, Scalar::Runtime),
    ];
    for (i, ta) in [Trans::N, Trans::T].into_iter().enumerate() {
        for (j, tb) in [Trans::N, Trans::T].into_iter().enumerate() {
            for layout in [Layout::ColMajor, Layout::RowMajor] {
                let (alpha, beta) = scalars[(i * 2 + j + m + n + k) % scalars.len()];
                let pad = (m + k) % 3;
                let b = GemmSpec::builder(dtype, m, n, k)
                    .layout(layout)
                    .trans_a(ta)
                    .trans_b(tb)
                    .alpha(alpha)
                    .beta(beta);
                let base = b.build().unwrap();
                let lda = base.stored_dims(smallgemm_ir::Operand::A).0 + pad;
                let ldc = base.stored_dims(smallgemm_ir::Operand::C).0 + 1;
                let spec = b.lda(lda).ldc(ldc).build().unwrap();
                let stride_c = spec.footprint(smallgemm_ir::Operand::C) + 5;
                out.push(b.lda(lda).ldc(ldc).stride_c(stride_c).build().unwrap());
            }
        }
    }
    out
}

#[test]
fn planned_schedules_compute_the_reference() {
    let shapes = [
        (1, 1, 1),
        (2, 2, 2),
        (3, 5, 7),
        (4, 4, 4),
        (7, 3, 2),
        (8, 8, 8),
        (9, 9, 9),
        (13, 1, 5),
        (16, 16, 16),
        (17, 5, 3),
        (1, 17, 4),
        (23, 29, 31),
        (32, 32, 32),
        (33, 7, 40),
        (70, 40, 70),
    ];
    let mut seed = 1;
    for (m, n, k) in shapes {
        for target in X86_TARGETS {
            for spec in specs(Dtype::F64, m, n, k) {
                seed += 1;
                run_case::<f64>(&spec, target, None, seed);
            }
            for spec in specs(Dtype::F32, m, n, k) {
                seed += 1;
                run_case::<f32>(&spec, target, None, seed);
            }
        }
    }
}

#[test]
fn b_resident_blocks_compute_the_reference() {
    // op(B) in registers, A through one register (`Schedule::b_resident`): blocks taller
    // than AVX2's A-resident ones fit, looped and unrolled, with split and masked tails,
    // several matrices a trip, every transpose and scalar kind.
    let block = |m_vectors, n_cols, k_unroll, unrolled, batch_unroll, split_tail| Schedule {
        m_vectors,
        n_cols,
        k_unroll,
        unroll_m_blocks: unrolled,
        unroll_n_blocks: unrolled,
        vector_bytes: 0,
        batch_unroll,
        prefetch: batch_unroll == 0,
        split_tail,
        interleave: batch_unroll > 1,
        lane_pack: false,
        dot_tail: false,
        b_resident: true,
    };
    let (mut seed, mut ran) = (5000, 0);
    for (m, n, k) in [(37, 23, 19), (16, 16, 16), (7, 5, 9), (25, 3, 4)] {
        for target in [Target::AVX2, Target::AVX2_AMD, Target::AVX512] {
            for s in [
                block(4, 3, 4, false, 0, false),
                block(6, 2, 0, true, 2, false),
                block(3, 3, 3, false, 0, true),
            ] {
                // A 4x3 block has no register left for AVX2's tail mask.
                ran += run_fitting((m, n, k), target, &s, &mut seed);
            }
        }
    }
    assert!(ran >= 500, "{ran}");
    // Where B is not broadcast into a register it cannot be held there.
    let spec = GemmSpec::builder(Dtype::F64, 8, 8, 8).build().unwrap();
    let one_vector = block(1, 4, 0, true, 0, false);
    for target in [Target::AVX512, Target::NEON] {
        assert!(one_vector.validate(&spec.col_major(), target).is_err());
    }
}

#[test]
fn looped_schedules_compute_the_reference() {
    let mut seed = 1000;
    for (m, n, k) in [(37, 23, 19), (20, 9, 11), (8, 8, 9), (5, 13, 33)] {
        for target in X86_TARGETS {
            for s in [
                Schedule {
                    m_vectors: 1,
                    n_cols: 2,
                    k_unroll: 4,
                    unroll_m_blocks: false,
                    unroll_n_blocks: false,
                    vector_bytes: 0,
                    batch_unroll: 0,
                    prefetch: false,
                    split_tail: true,
                    interleave: false,
                    lane_pack: false,
                    dot_tail: false,
                    b_resident: false,
                },
                Schedule {
                    m_vectors: 2,
                    n_cols: 3,
                    k_unroll: 3,
                    unroll_m_blocks: true,
                    unroll_n_blocks: false,
                    vector_bytes: 0,
                    batch_unroll: 3,
                    prefetch: true,
                    split_tail: false,
                    interleave: true,
                    lane_pack: false,
                    dot_tail: false,
                    b_resident: false,
                },
                Schedule {
                    m_vectors: 1,
                    n_cols: 4,
                    k_unroll: 0,
                    unroll_m_blocks: false,
                    unroll_n_blocks: true,
                    vector_bytes: 0,
                    batch_unroll: 16,
                    prefetch: false,
                    split_tail: false,
                    interleave: true,
                    lane_pack: false,
                    dot_tail: false,
                    b_resident: false,
                },
                Schedule {
                    m_vectors: 2,
                    n_cols: 1,
                    k_unroll: 5,
                    unroll_m_blocks: true,
                    unroll_n_blocks: true,
                    vector_bytes: 0,
                    batch_unroll: 2,
                    prefetch: true,
                    split_tail: false,
                    interleave: false,
                    lane_pack: false,
                    dot_tail: false,
                    b_resident: false,
                },
            ] {
                for spec in specs(Dtype::F64, m, n, k) {
                    seed += 1;
                    run_case::<f64>(&spec, target, Some(&s), seed);
                }
                for spec in specs(Dtype::F32, m, n, k) {
                    seed += 1;
                    run_case::<f32>(&spec, target, Some(&s), seed);
                }
            }
        }
    }
}

#[test]
fn large_shapes_plan_loops_within_budget() {
    for target in [Target::AVX2, Target::AVX512] {
        let spec = GemmSpec::builder(Dtype::F64, 256, 256, 256)
            .trans_a(Trans::T)
            .build()
            .unwrap();
        let (s, program) = compile_program(&spec, target, None).unwrap();
        assert!(s.k_unroll > 0 || !s.unroll_n_blocks, "{s:?}");
        assert!(
            program.op_counts().static_ops < 2 * smallgemm_ir::UNROLL_BUDGET as u64,
            "{s:?}: {} ops",
            program.op_counts().static_ops
        );
    }
}

#[test]
fn planner_respects_register_file() {
    for target in [Target::AVX2, Target::AVX512] {
        for n in 1..=40 {
            for dtype in [Dtype::F32, Dtype::F64] {
                let spec = GemmSpec::builder(dtype, n, n, n)
                    .alpha(Scalar::Runtime)
                    .beta(Scalar::Runtime)
                    .build()
                    .unwrap();
                let (s, p) = compile_program(&spec, target, None).unwrap();
                assert!(p.vregs <= target.vector_registers(), "{s:?}");
            }
        }
    }
}

/// Operations of `ops`, loop bodies included, for which `counts` holds, given the width of
/// their `Narrow` prefix if they have one.
fn count_ops(ops: &[Op], counts: &dyn Fn(Option<u32>, &Op) -> bool) -> usize {
    smallgemm_ir::narrowed_ops(ops)
        .map(|unit| match unit.expect("no stray Narrow prefix") {
            (_, Op::Loop { body, .. }) => count_ops(body, counts),
            (bytes, op) => counts(bytes, op) as usize,
        })
        .sum()
}

#[test]
fn f64_is_not_lane_packed_in_256_bits_where_cross_lane_permutes_are_slow() {
    // A group of four f64 lanes is a whole ymm, its permutes cross 128-bit lanes (vpermpd):
    // on AMD's AVX2 target the register blocks take 2x2x2 and 4x4xk, elsewhere lane packing.
    for (m, k) in [(2, 2), (4, 4), (4, 8), (4, 32)] {
        for dtype in [Dtype::F64, Dtype::F32] {
            let spec = GemmSpec::builder(dtype, m, m, k).build().unwrap();
            let problem = spec.col_major();
            let packed = |target| smallgemm_ir::lane_pack::plan(&problem, target).is_some();
            assert!(packed(Target::AVX2), "{}", spec.name());
            assert_eq!(
                packed(Target::AVX2_AMD),
                dtype == Dtype::F32,
                "{}",
                spec.name()
            );
            assert!(packed(Target::AVX512), "{}", spec.name());
        }
    }
}

#[test]
fn tails_go_in_pieces_where_masked_stores_are_slow_or_reach_the_next_matrix() {
    // AVX2's masked stores are microcoded on AMD (a ymm one took 15 TSC cycles on Zen 3):
    // there every masked tail of C is stored in whole pieces. On Intel's cores only the tail
    // of a matrix's last column, and only where C is read: its masked store's whole vector
    // reaches into the next matrix's C, whose first load would wait for the store to commit.
    // Every square and two rectangles a size, each transpose of A, beta 0 and 1.
    let mut pieces = [0; 3];
    for (t, target) in [Target::AVX2_AMD, Target::AVX2, Target::AVX512]
        .into_iter()
        .enumerate()
    {
        for dtype in [Dtype::F64, Dtype::F32] {
            for n in 1..=33 {
                for (i, (m, k)) in [(n, n), (n, 3), (n + 5, 17)].into_iter().enumerate() {
                    let beta = [Scalar::One, Scalar::Zero][(n + i) % 2];
                    let spec = GemmSpec::builder(dtype, m, n, k)
                        .trans_a([Trans::N, Trans::T][i % 2])
                        .beta(beta)
                        .build()
                        .unwrap();
                    let (schedule, program) = compile_program(&spec, target, None).unwrap();
                    let masked_tail =
                        |lanes: u32| target.masked_tail(lanes as usize * dtype.size());
                    let masked = count_ops(&program.ops, &|_, op| match op {
                        Op::Store { mask: Some(m), .. } => program
                            .masks
                            .iter()
                            .any(|d| d.mask == *m && masked_tail(d.lanes)),
                        _ => false,
                    });
                    let in_pieces =
                        count_ops(&program.ops, &|_, op| matches!(op, Op::StorePieces { .. }));
                    let what = || format!("{} on {target}:\n{program}", spec.name());
                    if target.masked_stores_slow {
                        assert_eq!(masked, 0, "{}", what());
                    } else if beta == Scalar::Zero {
                        assert_eq!(in_pieces, 0, "{}", what());
                    } else {
                        // One tail vector of the last column a matrix: each matrix of an
                        // unrolled batch trip, and the one-matrix loop after it.
                        assert!(in_pieces <= schedule.batch_unroll.max(1) + 1, "{}", what());
                    }
                    pieces[t] += in_pieces;
                }
            }
        }
    }
    assert!(pieces[0] > 300, "{pieces:?}");
    assert!(pieces[1] > 10 && pieces[2] > 10, "{pieces:?}");
    // f64 5x5x5 with C read (one masked zmm a column): only the last column's store.
    let spec = GemmSpec::builder(Dtype::F64, 5, 5, 5)
        .beta(Scalar::One)
        .build()
        .unwrap();
    let schedule = Schedule {
        batch_unroll: 0,
        interleave: false,
        ..smallgemm_ir::plan(&spec.col_major(), Target::AVX512)
    };
    let (_, program) = compile_program(&spec, Target::AVX512, Some(&schedule)).unwrap();
    let count = |f: &dyn Fn(&Op) -> bool| count_ops(&program.ops, &|_, op| f(op));
    assert_eq!(
        count(&|op| matches!(op, Op::StorePieces { lanes: 5, .. })),
        1,
        "{program}"
    );
    assert_eq!(
        count(&|op| matches!(op, Op::Store { mask: Some(_), .. })),
        4,
        "{program}"
    );
}

/// Operations run narrowed (after an `Op::Narrow` prefix), loop bodies included.
fn narrow_ops(ops: &[Op]) -> usize {
    count_ops(ops, &|bytes, _| bytes.is_some())
}

#[test]
fn lone_tails_narrow_only_where_512_bit_operations_run_as_halves() {
    // f64 9x9x9 plans one-vector blocks: 8 rows, then a block of the ninth row alone, whose
    // 81 FMAs, 9 A loads and the C loads and stores run as xmm on Zen 4 and as zmm on Intel.
    let spec = GemmSpec::builder(Dtype::F64, 9, 9, 9).build().unwrap();
    let schedule = Schedule {
        m_vectors: 1,
        dot_tail: false,
        ..smallgemm_ir::plan(&spec.col_major(), Target::AVX512)
    };
    let narrow = |target| {
        let (_, program) = compile_program(&spec, target, Some(&schedule)).unwrap();
        narrow_ops(&program.ops)
    };
    assert_eq!(narrow(Target::AVX512), 0);
    assert!(
        narrow(Target::AVX512_HALVES) >= 81,
        "{}",
        narrow(Target::AVX512_HALVES)
    );
    // Beside a full vector the tail narrows on both.
    let two = Schedule {
        m_vectors: 2,
        ..schedule
    };
    for target in [Target::AVX512, Target::AVX512_HALVES] {
        let (_, program) = compile_program(&spec, target, Some(&two)).unwrap();
        assert!(narrow_ops(&program.ops) >= 81);
    }
}

#[test]
fn narrowed_tails_load_and_store_at_their_width() {
    // A tail vector whose FMAs run narrowed loads A and C and stores C at that width too: a
    // masked zmm move runs as two halves on Zen 4 (f32 19 and 21-23 gained 8-12% hot). Every
    // square the planner blocks (not lane-packed) with one row tail, on every x86 target.
    let mut checked = 0;
    for target in [Target::AVX2, Target::AVX512, Target::AVX512_HALVES] {
        for dtype in [Dtype::F64, Dtype::F32] {
            for n in 2..=32 {
                let spec = GemmSpec::builder(dtype, n, n, n)
                    .beta(Scalar::One)
                    .build()
                    .unwrap();
                let (schedule, program) = compile_program(&spec, target, None).unwrap();
                if schedule.lane_pack {
                    continue;
                }
                let narrowed = count_ops(&program.ops, &|bytes, op| {
                    bytes.is_some() && matches!(op, Op::Fma { .. } | Op::FmaBroadcast { .. })
                });
                let wide = count_ops(&program.ops, &|bytes, op| {
                    bytes.is_none()
                        && matches!(
                            op,
                            Op::Load { mask: Some(_), .. } | Op::Store { mask: Some(_), .. }
                        )
                });
                if narrowed > 0 {
                    checked += 1;
                    assert_eq!(wide, 0, "{} on {target}: {schedule:?}", spec.name());
                }
            }
        }
    }
    // (Fewer where the last row is a dot-product tail: 1 + a multiple of the lanes.)
    assert!(checked >= 15, "only {checked} kernels with narrowed tails");
}

/// A looped, batch-unrolled, interleaved, prefetching schedule with a dot-product tail.
const DOT_TAIL_LOOPED: Schedule = Schedule {
    m_vectors: 1,
    n_cols: 2,
    k_unroll: 4,
    unroll_m_blocks: false,
    unroll_n_blocks: false,
    vector_bytes: 0,
    batch_unroll: 3,
    prefetch: true,
    split_tail: false,
    interleave: true,
    lane_pack: false,
    dot_tail: true,
    b_resident: false,
};

/// Runs the column-major specs of `specs` (B not transposed) for a shape through the
/// interpreter on `target`, with the planner's blocks and a dot-product tail and with
/// `looped`; `refused` says which problems the target must refuse (they are skipped).
/// Returns how many ran.
fn dot_tail_cases_through_the_interpreter(
    target: Target,
    (dtype, m, n, k): (Dtype, usize, usize, usize),
    looped: Schedule,
    seed: &mut u64,
    refused: impl Fn(&smallgemm_ir::ColMajorProblem) -> bool,
) -> usize {
    let planned = smallgemm_ir::plan(
        &GemmSpec::builder(dtype, m, n, k)
            .build()
            .unwrap()
            .col_major(),
        target,
    );
    let mut ran = 0;
    for s in [smallgemm_ir::reference::with_dot_tail(planned), looped] {
        for spec in specs(dtype, m, n, k) {
            let problem = spec.col_major();
            if problem.trans_b == Trans::T || problem.m != m {
                continue;
            }
            let refuses = refused(&problem);
            assert_eq!(
                s.validate(&problem, target).is_err(),
                refuses,
                "{} on {target}",
                spec.name()
            );
            if refuses {
                continue;
            }
            *seed += 1;
            ran += 1;
            match dtype {
                Dtype::F64 => run_case::<f64>(&spec, target, Some(&s), *seed),
                _ => run_case::<f32>(&spec, target, Some(&s), *seed),
            }
        }
    }
    ran
}

/// AVX2's dot-product tails through the interpreter: m one more than a multiple of the
/// lanes (two in f32; m = 1 and 2 too), k a multiple of the lanes or not (its last chunk
/// overlapping the one before, whose lanes A's gathered row has zero), more columns than
/// lanes, all alpha and beta kinds, padded leading dimensions, blocks in every loop form;
/// on both vendors' AVX2 targets. Transposed A and k below the lanes are refused there.
#[test]
fn dot_product_tails_on_avx2_compute_the_reference() {
    let mut seed = 7000;
    let mut lowered = 0;
    for target in [Target::AVX2, Target::AVX2_AMD] {
        for (dtype, lanes) in [(Dtype::F64, 4), (Dtype::F32, 8)] {
            let mut shapes = vec![
                (lanes + 1, lanes + 1, lanes + 1),
                (1, 5, lanes + 3),
                (lanes + 1, 3, 2 * lanes + 5),
                (2 * lanes + 1, 2 * lanes + 3, lanes),
                (lanes + 1, 1, lanes),
                (4 * lanes + 1, 9, 3 * lanes - 1),
                (4 * lanes + 1, 33, 61),
            ];
            if dtype == Dtype::F32 {
                shapes.extend([
                    (lanes + 2, lanes + 2, lanes + 2),
                    (2, 5, lanes + 1),
                    (18, 3, 13),
                ]);
            }
            for (m, n, k) in shapes {
                // Transposed A is refused on AVX2 (its rows are read in place, with nowhere
                // to zero the overlapping chunk's lanes).
                lowered += dot_tail_cases_through_the_interpreter(
                    target,
                    (dtype, m, n, k),
                    DOT_TAIL_LOOPED,
                    &mut seed,
                    |problem| problem.trans_a == Trans::T,
                );
            }
        }
    }
    assert!(lowered >= 60, "only {lowered} cases");
}

/// Dot-product tails (`Schedule::dot_tail`) through the interpreter: m one or two more than
/// a multiple of the lanes (m = 1 and 2 included), k short of, equal to and past a vector, more
/// columns than lanes, every transpose of A, all alpha and beta kinds, pointer-free strided
/// batches with padded leading dimensions, and blocks in every loop form. Packed tails the
/// same way: four rows past a multiple (and m = 4), eight in f32, k a multiple of the
/// group's steps or not (the last group overlapping), at the group, and more columns than
/// one block of sums holds.
#[test]
fn dot_product_tails_compute_the_reference() {
    let mut seed = 5000;
    let mut lowered = 0;
    for target in [Target::AVX512, Target::AVX512_HALVES] {
        for (dtype, lanes) in [(Dtype::F64, 8), (Dtype::F32, 16)] {
            for (m, n, k) in [
                (lanes + 1, lanes + 1, lanes + 1),
                (1, 5, 3),
                (lanes + 1, 3, 2 * lanes + 5),
                (2 * lanes + 1, 2 * lanes + 3, lanes),
                (lanes + 1, 1, 1),
                (lanes + 1, 9, lanes - 1),
                (lanes + 2, lanes + 2, lanes + 2),
                (2, 5, 3),
                (2 * lanes + 2, 3, lanes + 5),
                (lanes + 2, lanes / 2 + 3, lanes - 1),
                (2, 1, 2 * lanes + 1),
                (lanes + 4, lanes + 4, lanes + 4),
                (4, 27, 5),
                (2 * lanes + 4, 7, lanes / 4),
                (lanes + 4, 1, 2 * lanes + 3),
                (lanes * 3 / 2, 26, 3),
                (lanes * 3 / 2, 3, 2),
                // Past the unrolling budget: the looped schedule loops the groups too.
                (lanes + 4, 33, 61),
            ] {
                lowered += dot_tail_cases_through_the_interpreter(
                    target,
                    (dtype, m, n, k),
                    DOT_TAIL_LOOPED,
                    &mut seed,
                    |_| false,
                );
            }
        }
    }
    assert!(lowered >= 100, "only {lowered} cases");
}

#[test]
fn short_row_panels_take_more_columns() {
    // f64 21x21x21 in 2x11 blocks: rows 16..20 are one vector tall, so their panel takes
    // all 21 columns in one block (one masked A load per step of k, not two), and on
    // AVX-512 its FMAs take B from memory (no broadcast register for one FMA each).
    let spec = GemmSpec::builder(Dtype::F64, 21, 21, 21)
        .beta(Scalar::Zero)
        .build()
        .unwrap();
    let schedule = Schedule {
        m_vectors: 2,
        n_cols: 11,
        k_unroll: 0,
        unroll_m_blocks: true,
        unroll_n_blocks: true,
        ..smallgemm_ir::plan(&spec.col_major(), Target::AVX512)
    };
    let (_, program) = compile_program(&spec, Target::AVX512, Some(&schedule)).unwrap();
    let count = |f: &dyn Fn(&Op) -> bool| count_ops(&program.ops, &|_, op| f(op));
    assert_eq!(
        count(&|op| matches!(op, Op::Load { mask: Some(_), .. })),
        21,
        "{program}"
    );
    assert_eq!(
        count(&|op| matches!(op, Op::FmaBroadcast { .. })),
        21 * 21,
        "{program}"
    );
    assert_eq!(count(&|op| matches!(op, Op::Fma { .. })), 2 * 21 * 21);

    // Every transpose and scalar kind, panels one and two vectors short of the blocks,
    // looped and unrolled, with dot-product rows, interleaved pairs and B in registers
    // (which keeps its columns).
    let block =
        |m_vectors, n_cols, k_unroll, unrolled, dot_tail, interleave, b_resident| Schedule {
            m_vectors,
            n_cols,
            k_unroll,
            unroll_m_blocks: unrolled,
            unroll_n_blocks: unrolled,
            vector_bytes: 0,
            batch_unroll: if interleave { 2 } else { 0 },
            prefetch: !unrolled,
            split_tail: false,
            interleave,
            lane_pack: false,
            dot_tail,
            b_resident,
        };
    let (mut seed, mut ran) = (7000, 0);
    for (m, n, k) in [(21, 21, 21), (37, 23, 19), (20, 30, 5), (41, 9, 3)] {
        for target in X86_TARGETS {
            for s in [
                block(2, 11, 2, false, false, false, false),
                block(3, 4, 0, true, false, false, false),
                block(2, 5, 3, false, true, false, false),
                block(2, 3, 0, true, false, true, false),
                block(3, 3, 4, false, false, false, true),
            ] {
                ran += run_fitting((m, n, k), target, &s, &mut seed);
            }
        }
    }
    assert!(ran >= 300, "{ran}");
}
