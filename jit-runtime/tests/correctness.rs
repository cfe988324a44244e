//! The correctness matrix: every kernel against the double-double reference, with sentinels
//! around and inside C (ld padding, gaps between batch entries), NaN in C when beta = 0, and
//! the Program interpreter agreeing bit for bit with the machine code.

mod common;

use smallgemm::{Dtype, GemmSpec, Isa, Jit, Layout, Operand, Scalar, Schedule, Target, Trans};
use smallgemm_ir::reference::{
    dot_tail_cases, dot_tail_schedules, lane_packed_specs, padded_spec, rectangular_cases,
    rectangular_shapes, square_cases, variant_cases, MatrixCase, MATRIX_ALPHAS, MATRIX_BATCHES,
    MATRIX_BETAS, MATRIX_TRANS,
};

fn jit(isa: Isa) -> Option<Jit> {
    match Jit::with_isa(isa) {
        Ok(jit) => Some(jit),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A JIT for AVX2 as the other vendor's CPUs get it (`Target::masked_stores_slow`,
/// `Target::cross_lane_permutes_slow`): the tests with `jit(Isa::Avx2)` cover the kernels
/// this CPU gets, these the other vendor's tails of C (in whole pieces on AMD, through masks
/// elsewhere) and its lane-packed f64 kernels (Intel only).
fn avx2_other_stores() -> Option<Jit> {
    let here = jit(Isa::Avx2)?.target();
    let other = Target {
        masked_stores_slow: !here.masked_stores_slow,
        cross_lane_permutes_slow: !here.cross_lane_permutes_slow,
        ..here
    };
    Some(Jit::with_target(other).expect("AVX2 runs here"))
}

/// Every square size 1..=32 with every transpose and alpha/beta combination.
fn squares(isa: Isa, dtype: Dtype) {
    let Some(jit) = jit(isa) else { return };
    squares_on(&jit, dtype, |_| true);
}

/// [`squares`] on `jit`, for the sizes `n` that `sizes` keeps.
fn squares_on(jit: &Jit, dtype: Dtype, sizes: impl Fn(usize) -> bool) {
    for case in square_cases(dtype).iter().filter(|c| sizes(c.spec.m())) {
        check_case(jit, case);
    }
}

/// Checks one case of the shared matrix on `jit`.
fn check_case(jit: &Jit, case: &MatrixCase) {
    let MatrixCase { spec, batch, seed } = *case;
    match spec.dtype() {
        Dtype::F64 => common::check_spec::<f64>(jit, &spec, batch, seed),
        Dtype::F32 => common::check_spec::<f32>(jit, &spec, batch, seed),
        Dtype::F16 => unreachable!("CPU tests cover f32 and f64"),
    }
}

#[test]
fn squares_avx512_f64() {
    squares(Isa::Avx512, Dtype::F64)
}
#[test]
fn squares_avx512_f32() {
    squares(Isa::Avx512, Dtype::F32)
}
#[test]
fn squares_avx2_f64() {
    squares(Isa::Avx2, Dtype::F64)
}
#[test]
fn squares_avx2_f32() {
    squares(Isa::Avx2, Dtype::F32)
}

/// The square sizes whose columns end in a tail of C on AVX2 (m not a multiple of the
/// lanes), with the other kind of masked stores than this CPU's.
fn squares_avx2_other_stores(dtype: Dtype) {
    let Some(jit) = avx2_other_stores() else {
        return;
    };
    let lanes = jit.target().lanes(dtype);
    squares_on(&jit, dtype, |n| n % lanes != 0);
}

#[test]
fn squares_avx2_other_stores_f64() {
    squares_avx2_other_stores(Dtype::F64)
}
#[test]
fn squares_avx2_other_stores_f32() {
    squares_avx2_other_stores(Dtype::F32)
}

fn rectangular(isa: Isa, dtype: Dtype) {
    let Some(jit) = jit(isa) else { return };
    for case in &rectangular_cases(dtype) {
        check_case(&jit, case);
    }
}

#[test]
fn rectangular_avx512_f64() {
    rectangular(Isa::Avx512, Dtype::F64)
}
#[test]
fn rectangular_avx512_f32() {
    rectangular(Isa::Avx512, Dtype::F32)
}
#[test]
fn rectangular_avx2_f64() {
    rectangular(Isa::Avx2, Dtype::F64)
}
#[test]
fn rectangular_avx2_f32() {
    rectangular(Isa::Avx2, Dtype::F32)
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
    for isa in [Isa::Avx512, Isa::Avx2] {
        let Some(jit) = jit(isa) else { continue };
        let mut seed = 50_000;
        for (alpha, beta) in others {
            for shape in [(1, 1, 1), (9, 4, 3), (17, 17, 17), (33, 5, 8)] {
                for trans in MATRIX_TRANS {
                    seed += 1;
                    let spec =
                        padded_spec(Dtype::F64, Layout::ColMajor, shape, trans, alpha, beta, 1);
                    common::check_spec::<f64>(&jit, &spec, 3, seed);
                    let spec =
                        padded_spec(Dtype::F32, Layout::RowMajor, shape, trans, alpha, beta, 2);
                    common::check_spec::<f32>(&jit, &spec, 3, seed);
                }
            }
        }
    }
}

/// Shapes above 64, up to 256 in every dimension: blocks and k become loops.
#[test]
fn large_shapes() {
    for isa in [Isa::Avx512, Isa::Avx2] {
        let Some(jit) = jit(isa) else { continue };
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
            common::check_spec::<f64>(&jit, &spec, 2, seed);
            let spec = padded_spec(
                Dtype::F32,
                Layout::RowMajor,
                shape,
                trans,
                Scalar::One,
                Scalar::Zero,
                2,
            );
            common::check_spec::<f32>(&jit, &spec, 2, seed);
        }
    }
}

/// Kernels that prefetch the next matrices, and the schedules the JIT runs batches that
/// stream from memory with, compute the same results: every square size and a fifth of
/// the rectangular shapes, with all transposes, scalar kinds, padding and gaps.
fn prefetching(isa: Isa) {
    let Some(jit) = jit(isa) else { return };
    for MatrixCase { spec, batch, seed } in variant_cases() {
        let planned = smallgemm::generate(&spec, jit.target(), None)
            .unwrap()
            .schedule;
        let s = Schedule {
            prefetch: true,
            ..planned
        };
        // And the streaming variant the JIT runs for batches larger than L2 (blocks as
        // tall as m where the registers allow).
        let streaming = smallgemm_ir::plan_streaming(&spec.col_major(), jit.target(), &planned);
        for s in [s, streaming] {
            common::check_schedule(&jit, &spec, Some(&s), batch, seed);
        }
    }
}

#[test]
fn prefetching_kernels_avx512() {
    prefetching(Isa::Avx512)
}
#[test]
fn prefetching_kernels_avx2() {
    prefetching(Isa::Avx2)
}

/// Register blocks with a masked tail too wide for C to fit in the free registers: their
/// epilogue folds C into the accumulators before storing any of it (a masked store would
/// hold up the next column's load of C). Every alpha and beta kind, transposes, padding.
fn wide_tail_blocks(isa: Isa) {
    let Some(jit) = jit(isa) else { return };
    wide_tail_blocks_on(&jit);
    if isa == Isa::Avx2 {
        let other = avx2_other_stores().expect("AVX2 runs here");
        wide_tail_blocks_on(&other);
    }
}

fn wide_tail_blocks_on(jit: &Jit) {
    let isa = jit.target().isa;
    let wide = |m_vectors, n_cols| Schedule {
        m_vectors,
        n_cols,
        k_unroll: 4,
        unroll_m_blocks: false,
        unroll_n_blocks: false,
        vector_bytes: 0,
        batch_unroll: 0,
        prefetch: false,
        split_tail: false,
        interleave: false,
        lane_pack: false,
        dot_tail: false,
        b_resident: false,
    };
    // (dtype, m, n, k, schedule): m leaves a tail of more and of less than half a vector.
    let cases = match isa {
        Isa::Avx512 => [
            (Dtype::F32, 28, 30, 9, wide(2, 14)),
            (Dtype::F32, 18, 25, 7, wide(2, 12)),
            (Dtype::F64, 13, 26, 5, wide(2, 12)),
            (Dtype::F64, 23, 13, 6, wide(3, 8)),
        ],
        _ => [
            (Dtype::F32, 13, 14, 9, wide(2, 6)),
            (Dtype::F32, 10, 7, 5, wide(2, 5)),
            (Dtype::F64, 7, 13, 6, wide(2, 6)),
            (Dtype::F64, 11, 9, 7, wide(3, 3)),
        ],
    };
    let scalars = MATRIX_ALPHAS
        .into_iter()
        .flat_map(|alpha| MATRIX_BETAS.map(|beta| (alpha, beta)))
        .chain([
            (Scalar::fixed(2.5).unwrap(), Scalar::MinusOne),
            (Scalar::Runtime, Scalar::fixed(-0.5).unwrap()),
            (Scalar::MinusOne, Scalar::MinusOne),
        ]);
    let mut seed = 140_000;
    for (i, (alpha, beta)) in scalars.enumerate() {
        for (dtype, m, n, k, s) in cases {
            seed += 1;
            let spec = padded_spec(
                dtype,
                Layout::ColMajor,
                (m, n, k),
                MATRIX_TRANS[i % 4],
                alpha,
                beta,
                i % 3,
            );
            let batch = MATRIX_BATCHES[i % MATRIX_BATCHES.len()];
            common::check_schedule(jit, &spec, Some(&s), batch, seed);
        }
    }
}

#[test]
fn wide_tail_blocks_avx512() {
    wide_tail_blocks(Isa::Avx512)
}
#[test]
fn wide_tail_blocks_avx2() {
    wide_tail_blocks(Isa::Avx2)
}

/// Blocks with op(B) in registers and A through one register (`Schedule::b_resident`),
/// taller than AVX2's A-resident blocks can be: every square size and a third of the
/// rectangular shapes, looped and unrolled, one and several matrices a trip, with all
/// transposes, scalar kinds, padding and gaps, on both AVX2 targets.
#[test]
fn b_resident_blocks_avx2() {
    let Some(jit) = jit(Isa::Avx2) else { return };
    let other = avx2_other_stores().expect("AVX2 runs here");
    let block = |m_vectors, n_cols, k_unroll, batch_unroll| Schedule {
        m_vectors,
        n_cols,
        k_unroll,
        unroll_m_blocks: k_unroll == 0,
        unroll_n_blocks: k_unroll == 0,
        vector_bytes: 0,
        batch_unroll,
        prefetch: false,
        split_tail: false,
        interleave: false,
        lane_pack: false,
        dot_tail: false,
        b_resident: true,
    };
    let blocks = [
        block(4, 3, 4, 0),
        block(6, 2, 0, 0),
        block(5, 2, 2, 2),
        block(3, 3, 0, 3),
    ];
    let shapes = (1..=32)
        .map(|n| (n, n, n))
        .chain(rectangular_shapes().into_iter().step_by(3));
    let (mut seed, mut ran) = (160_000, 0);
    for (i, shape) in shapes.enumerate() {
        let (trans, alpha, beta) = (
            MATRIX_TRANS[i % 4],
            MATRIX_ALPHAS[i % 3],
            MATRIX_BETAS[(i / 3) % 3],
        );
        let batch = MATRIX_BATCHES[i % MATRIX_BATCHES.len()];
        for dtype in [Dtype::F64, Dtype::F32] {
            seed += 1;
            let spec = padded_spec(dtype, Layout::ColMajor, shape, trans, alpha, beta, i % 3);
            let s = blocks[(i + dtype.size()) % blocks.len()];
            // A 4x3 or 6x2 block leaves no register for a tail mask or run-time scalars.
            if s.validate(&spec.col_major(), jit.target()).is_err() {
                continue;
            }
            let jit = if i % 2 == 0 { &jit } else { &other };
            common::check_schedule(jit, &spec, Some(&s), batch, seed);
            ran += 1;
        }
    }
    assert!(ran >= 100, "{ran}");
}

/// Checks every case of `dot_tail_cases` under both schedules of `dot_tail_schedules` that
/// `jit`'s target takes; returns how many ran and how many it refused.
fn dot_tail_cases_on(jit: &Jit) -> (usize, usize) {
    let target = jit.target();
    let (mut ran, mut refused) = (0, 0);
    for case in dot_tail_cases() {
        let problem = case.spec.col_major();
        let planned = smallgemm::generate(&case.spec, target, None)
            .unwrap()
            .schedule;
        for s in dot_tail_schedules(planned) {
            if s.validate(&problem, target).is_err() {
                refused += 1;
                continue;
            }
            common::check_schedule(jit, &case.spec, Some(&s), case.batch, case.seed);
            ran += 1;
        }
    }
    (ran, refused)
}

/// Dot-product tails (`Schedule::dot_tail`, AVX-512): C's last rows as dot products summed
/// across lanes by transpose-adds, with m one or two more than a multiple of the lanes (m =
/// 1 and 2 too), k below, at and past a vector, n past the lanes; the planned blocks for the
/// other rows and a looped, batch-unrolled, prefetching form; every alpha and beta kind, A
/// transposed or not, padding, batches of several lengths.
#[test]
fn dot_product_tails_avx512() {
    let Some(jit) = jit(Isa::Avx512) else { return };
    let (_, refused) = dot_tail_cases_on(&jit);
    assert_eq!(refused, 0);
}

/// Dot-product tails on AVX2: the cases of `dot_product_tails_avx512` that AVX2 takes (one
/// row past a multiple of the lanes, two in f32; A not transposed; k at least a vector, its
/// partial last chunk overlapping the one before), on this CPU's AVX2 target and the other
/// vendor's.
#[test]
fn dot_product_tails_avx2() {
    let Some(here) = jit(Isa::Avx2) else { return };
    let other = avx2_other_stores().expect("AVX2 runs here");
    let ran: usize = [here, other]
        .iter()
        .map(|jit| dot_tail_cases_on(jit).0)
        .sum();
    assert!(ran >= 100, "{ran}");
}

/// Lane-packed kernels (2x2x2, 3x3x3 and 4x4xk, `Schedule::lane_pack`): every vector width they
/// run at, one to three vector groups per trip, batch lengths that leave every remainder,
/// each scalar kind, row-major specs, and gaps between the matrices (whose sentinels catch
/// stray writes) wherever one vector holds at most one matrix; half of them prefetching.
fn lane_packed(isa: Isa) {
    let Some(jit) = jit(isa) else { return };
    // AMD's AVX2 target packs no f64 (its cross-lane permutes are slow): the kernels it
    // would refuse run on the same ISA without that property.
    let jit = Jit::with_target(Target {
        cross_lane_permutes_slow: false,
        ..jit.target()
    })
    .expect("the ISA runs here");
    let target = jit.target();
    let (mut seed, mut kernels) = (300_000, 0);
    for spec in lane_packed_specs() {
        let problem = spec.col_major();
        let side = problem.m;
        let gaps = problem.stride_c != side * side;
        let Some((_, packed)) = smallgemm_ir::lane_pack::plan(&problem, target) else {
            let transposed = problem.trans_a == Trans::T || problem.trans_b == Trans::T;
            // 3x3x3 needs 512-bit full permutes.
            let no_3x3 = isa != Isa::Avx512;
            assert!(
                gaps || (side == 4 && transposed) || (side == 3 && no_3x3),
                "{} is not lane-packed on {target}",
                spec.name()
            );
            continue;
        };
        for &width in target.vector_widths() {
            for batch_unroll in [0, 2, 3] {
                // Every other one prefetches the next matrices (the streaming variant).
                let s = Schedule {
                    vector_bytes: width,
                    batch_unroll,
                    prefetch: (kernels + batch_unroll) % 2 == 1,
                    ..packed
                };
                if s.validate(&problem, target).is_err() {
                    continue;
                }
                kernels += 1;
                for batch in [1, 2, 3, 5, 8, 13, 17] {
                    seed += 1;
                    common::check_schedule(&jit, &spec, Some(&s), batch, seed);
                }
            }
        }
    }
    // f64 2x2 at 16 bytes, packed batches of several matrices per vector with gaps, and
    // unrolls beyond the registers are refused; everything else runs.
    let expected = if isa == Isa::Avx512 { 230 } else { 85 };
    assert!(
        kernels >= expected,
        "only {kernels} lane-packed kernels on {target}"
    );
}

#[test]
fn lane_packed_kernels_avx512() {
    lane_packed(Isa::Avx512)
}
#[test]
fn lane_packed_kernels_avx2() {
    lane_packed(Isa::Avx2)
}

/// Every schedule of the shipped tuning database, whatever this CPU's model (the JIT uses
/// them only on the model they were tuned on), with every transpose, scalar kinds and
/// padding the schedule's registers allow.
#[test]
fn shipped_schedules() {
    let mut checked = 0;
    for (machine, shapes) in &smallgemm::tuning::shipped().cpu {
        let isa: Isa = machine
            .rsplit(" | ")
            .next()
            .and_then(|isa| isa.parse().ok())
            .unwrap_or_else(|| panic!("machine key {machine:?}"));
        let Some(jit) = jit(isa) else { continue };
        for (i, (shape, schedule)) in shapes.iter().enumerate() {
            let (dtype, m, n, k) = parse_shape(shape);
            let checked_before = checked;
            // The padded specs of every transpose, and the tight one (lane-packed kernels
            // need contiguous matrices).
            for j in 0..=MATRIX_TRANS.len() {
                let (alpha, beta) = (MATRIX_ALPHAS[(i + j) % 3], MATRIX_BETAS[(i + 2 * j) % 3]);
                let spec = match MATRIX_TRANS.get(j) {
                    Some(&trans) => padded_spec(
                        dtype,
                        Layout::ColMajor,
                        (m, n, k),
                        trans,
                        alpha,
                        beta,
                        j % 3,
                    ),
                    None => GemmSpec::builder(dtype, m, n, k)
                        .alpha(alpha)
                        .beta(beta)
                        .build()
                        .unwrap(),
                };
                if schedule.validate(&spec.col_major(), jit.target()).is_err() {
                    continue;
                }
                let (batch, seed) = (
                    MATRIX_BATCHES[j % MATRIX_BATCHES.len()],
                    130_000 + (5 * i + j) as u64,
                );
                common::check_schedule(&jit, &spec, Some(schedule), batch, seed);
                checked += 1;
            }
            // A shipped schedule that fits none of its shape's specs would never be used.
            assert!(checked > checked_before, "{machine}: {shape} fits no spec");
        }
    }
    eprintln!("{checked} shipped schedules checked");
}

/// (dtype, m, n, k) of a tuning database's shape key, `"f64 16x16x16 nn"`; the transposes
/// are left to the caller.
fn parse_shape(key: &str) -> (Dtype, usize, usize, usize) {
    let mut words = key.split(' ');
    let dtype = match words.next() {
        Some("f64") => Dtype::F64,
        Some("f32") => Dtype::F32,
        other => panic!("dtype {other:?} in {key:?}"),
    };
    let sizes: Vec<usize> = words
        .next()
        .map(|s| s.split('x').map(|v| v.parse().unwrap()).collect())
        .unwrap_or_default();
    assert_eq!(sizes.len(), 3, "sizes in {key:?}");
    (dtype, sizes[0], sizes[1], sizes[2])
}

/// Batches far beyond a core's L2 run the prefetching variant, and it computes the
/// reference too.
#[test]
fn streaming_batches_run_the_streaming_variant() {
    let Ok(jit) = Jit::new() else { return };
    for (n, dtype) in [(16, Dtype::F64), (24, Dtype::F32)] {
        let spec = padded_spec(
            dtype,
            Layout::ColMajor,
            (n, n, n),
            (Trans::N, Trans::T),
            Scalar::Runtime,
            Scalar::One,
            1,
        );
        let per_matrix = [Operand::A, Operand::B, Operand::C]
            .map(|o| spec.stride(o) * dtype.size())
            .iter()
            .sum::<usize>();
        let batch = (24 << 20) / per_matrix;
        let kernel = jit.kernel(&spec).unwrap();
        assert!(kernel.streams(batch), "{} x {batch}", spec.name());
        assert!(!kernel.streams(1), "{}", spec.name());
        match dtype {
            Dtype::F64 => common::check_spec::<f64>(&jit, &spec, batch, 77),
            _ => common::check_spec::<f32>(&jit, &spec, batch, 78),
        }
    }
}

/// A tuned schedule that prefetches still streams through a variant where it has a packed
/// or dot-product tail (those stream slower), and that variant computes the reference.
#[test]
fn prefetching_tails_stream_through_a_variant() {
    let Some(jit) = jit(Isa::Avx512) else { return };
    for (dtype, n) in [(Dtype::F64, 20), (Dtype::F32, 17)] {
        let spec = GemmSpec::builder(dtype, n, n, n)
            .beta(Scalar::One)
            .build()
            .unwrap();
        let planned = smallgemm::generate(&spec, jit.target(), None)
            .unwrap()
            .schedule;
        let tuned = Schedule {
            prefetch: true,
            ..smallgemm_ir::reference::with_dot_tail(planned)
        };
        let mut db = smallgemm::tuning::TuningDb::default();
        db.insert(jit.target().isa, &spec, tuned);
        let jit = Jit::with_target(jit.target()).unwrap().with_tuning(db);
        let kernel = jit.kernel(&spec).unwrap();
        assert_eq!(*kernel.schedule(), tuned, "{}", spec.name());
        let batch = (24 << 20) / (3 * n * n * dtype.size());
        assert!(kernel.streams(batch), "{} x {batch}", spec.name());
        match dtype {
            Dtype::F64 => common::check_spec::<f64>(&jit, &spec, batch, 79),
            _ => common::check_spec::<f32>(&jit, &spec, batch, 80),
        }
    }
}

/// Batch strides of 0 reuse one A or B for every matrix.
/// Batches of small matrices that the hot schedule lane-packs stream through a plain register
/// block on AVX-512 where its columns need no masked access (f64 2x2x2, 4x4x4), and stay
/// lane-packed where they would (f32 3x3x3), prefetching where that pays.
#[test]
fn small_lane_packed_matrices_stream_through_plain_blocks() {
    let Some(jit) = jit(Isa::Avx512) else { return };
    // The planner's schedules: a tuned entry may block a shape the planner lane-packs (the
    // AMD machine's f64 4x4x4).
    let jit = jit.with_tuning(smallgemm::tuning::TuningDb::default());
    for (n, dtype, plain_block) in [
        (2, Dtype::F64, true),
        (4, Dtype::F64, true),
        (3, Dtype::F32, false),
    ] {
        // Tight: lane packing needs packed matrices (padded_spec pads B and C even at 0).
        let spec = GemmSpec::builder(dtype, n, n, n)
            .beta(Scalar::One)
            .build()
            .unwrap();
        let kernel = jit.kernel(&spec).unwrap();
        assert!(
            kernel.schedule().lane_pack,
            "{}: {:?}",
            spec.name(),
            kernel.schedule()
        );
        let per_matrix = 3 * n * n * dtype.size();
        let batch = (24 << 20) / per_matrix;
        let prefetches = smallgemm_ir::prefetch_pays(&spec.col_major(), jit.target());
        assert_eq!(
            kernel.streams(batch),
            plain_block || prefetches,
            "{} x {batch}",
            spec.name()
        );
        let planned =
            smallgemm_ir::plan_streaming(&spec.col_major(), jit.target(), kernel.schedule());
        assert_eq!(planned.lane_pack, !plain_block, "{planned:?}");
        assert_eq!(planned.prefetch, prefetches, "{planned:?}");
        match dtype {
            Dtype::F64 => common::check_spec::<f64>(&jit, &spec, batch, 79),
            _ => common::check_spec::<f32>(&jit, &spec, batch, 80),
        }
    }
}

#[test]
fn zero_strides_broadcast_an_operand() {
    let Ok(jit) = Jit::new() else { return };
    let spec = GemmSpec::builder(Dtype::F64, 7, 5, 3)
        .stride_a(0)
        .beta(Scalar::One)
        .build()
        .unwrap();
    common::check_spec::<f64>(&jit, &spec, 5, 7);
    let spec = GemmSpec::builder(Dtype::F32, 7, 5, 3)
        .stride_b(0)
        .build()
        .unwrap();
    common::check_spec::<f32>(&jit, &spec, 5, 8);
}

/// A batch with beta = 0 larger than the last-level cache writes C with non-temporal stores
/// where every store of C is a whole vector at an aligned address and C is aligned (f64
/// 8x8x8 and f32 16x16x16 on AVX-512; f64 12x12x12 and a row-major f64 16x8x4 on AVX2),
/// through `Kernel::run` and split across threads; with C one element off, or a column
/// tail (f64 12x12x12 on AVX-512), it stores as usual. Every result is checked against the reference and the sentinels, C
/// starting as NaN.
#[test]
fn streaming_stores_of_c_past_the_last_level_cache() {
    for isa in [Isa::Avx512, Isa::Avx2] {
        let Some(jit) = jit(isa) else { continue };
        let row_major = GemmSpec::builder(Dtype::F64, 16, 8, 4)
            .layout(Layout::RowMajor)
            .alpha(Scalar::Runtime)
            .beta(Scalar::Zero)
            .build()
            .unwrap();
        let square = |dtype, n| {
            GemmSpec::builder(dtype, n, n, n)
                .alpha(Scalar::Runtime)
                .beta(Scalar::Zero)
                .build()
                .unwrap()
        };
        let cases = match isa {
            Isa::Avx512 => vec![
                (square(Dtype::F64, 8), true),
                (square(Dtype::F32, 16), true),
                (square(Dtype::F64, 12), false),
            ],
            _ => vec![(square(Dtype::F64, 12), true), (row_major, true)],
        };
        for (spec, streams) in cases {
            match spec.dtype() {
                Dtype::F64 => check_streaming_stores::<f64>(&jit, &spec, streams),
                _ => check_streaming_stores::<f32>(&jit, &spec, streams),
            }
        }
    }
}

fn check_streaming_stores<T: smallgemm::Element>(jit: &Jit, spec: &GemmSpec, streams: bool) {
    use smallgemm_ir::reference::TestData;
    let kernel = jit.kernel(spec).unwrap();
    let aligned = 4096 as *const u8;
    // The smallest power-of-two batch that qualifies: larger than the last-level cache.
    let per_matrix: usize = [Operand::A, Operand::B, Operand::C]
        .iter()
        .map(|&o| spec.stride(o) * spec.dtype().size())
        .sum();
    let mut batch = 1;
    while !kernel.stores_streaming(batch, aligned) && batch * per_matrix < (1 << 30) {
        batch *= 2;
    }
    assert_eq!(
        kernel.stores_streaming(batch, aligned),
        streams,
        "{}",
        spec.name()
    );
    if !streams {
        // Sized as if it streamed: past a 32 MiB last-level cache.
        batch = (40 << 20) / per_matrix;
    }
    let alpha = T::from_f64(1.375);
    let mut data = TestData::<T>::new(spec, batch, 91);
    let (a, b) = (data.a.clone(), data.b.clone());
    let len = data.c().len();
    let lanes = 64 / std::mem::size_of::<T>();
    let guard = 2 * lanes;
    let sentinel = T::from_f64(-7.75);
    for (skew, threads) in [(0, false), (0, true), (1, false)] {
        // C copied to a 64-byte-aligned place (`skew` elements past it), guards around it.
        let mut buffer = vec![sentinel; len + 2 * guard + lanes];
        let start = buffer.as_ptr().align_offset(64) + guard + skew;
        data.reset_c();
        buffer[start..start + len].copy_from_slice(data.c());
        let c = &mut buffer[start..start + len];
        let expect_nt = streams && skew == 0;
        assert_eq!(
            kernel.stores_streaming(batch, c.as_ptr().cast()),
            expect_nt,
            "{} skew {skew}",
            spec.name()
        );
        if threads {
            jit.gemm_batch_strided(spec, &a, &b, c, batch, alpha, T::default())
                .unwrap();
        } else {
            kernel.run(&a, &b, c, batch, alpha, T::default()).unwrap();
        }
        let outside = buffer[..start].iter().chain(&buffer[start + len..]);
        assert!(
            outside.into_iter().all(|x| x.to_f64() == -7.75),
            "{}: a write outside C",
            spec.name()
        );
        data.c_mut().copy_from_slice(&buffer[start..start + len]);
        let report = data.check(1.375, 0.0);
        assert!(
            report.passed(),
            "{} on {} (batch {batch}, skew {skew}, threads {threads}): {}",
            spec.name(),
            jit.target(),
            report.failure.as_deref().unwrap_or("")
        );
    }
}
