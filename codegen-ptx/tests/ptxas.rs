//! Every kernel shape the GPU tests run, plus a spread of others, assembled by `ptxas` for
//! sm_80 and sm_90. CI installs ptxas (scripts/test.sh), so a missing ptxas fails the test.

use smallgemm_codegen_ptx::{combine, generate, ptxas, BatchKind, PtxKernel};
use smallgemm_ir::{Dtype, GemmSpec, GpuSchedule, GpuTarget, Layout, Scalar, Sm, Staging, Trans};

fn specs() -> Vec<(GemmSpec, BatchKind)> {
    let mut out = Vec::new();
    for dtype in [Dtype::F64, Dtype::F32, Dtype::F16] {
        let top = if dtype == Dtype::F16 { 128 } else { 32 };
        for n in (1..=top).filter(|&n| n <= 34 || n % 16 == 0 || [58, 79, 100].contains(&n)) {
            out.push((
                GemmSpec::builder(dtype, n, n, n)
                    .alpha(Scalar::fixed(1.5).unwrap())
                    .beta(Scalar::fixed(0.5).unwrap())
                    .build()
                    .unwrap(),
                BatchKind::Strided,
            ));
        }
        for (m, n, k) in [(3, 5, 7), (17, 9, 4), (24, 20, 33), (1, 30, 2)] {
            for (ta, tb) in [
                (Trans::N, Trans::T),
                (Trans::T, Trans::N),
                (Trans::T, Trans::T),
            ] {
                for (alpha, beta) in [
                    (Scalar::Runtime, Scalar::Runtime),
                    (Scalar::MinusOne, Scalar::One),
                    (Scalar::One, Scalar::MinusOne),
                    (Scalar::Zero, Scalar::Fixed(2.5f64.to_bits())),
                ] {
                    let spec = GemmSpec::builder(dtype, m, n, k)
                        .trans_a(ta)
                        .trans_b(tb)
                        .layout(if m % 2 == 0 {
                            Layout::RowMajor
                        } else {
                            Layout::ColMajor
                        })
                        .lda(40)
                        .ldb(41)
                        .ldc(42)
                        .alpha(alpha)
                        .beta(beta)
                        .build()
                        .unwrap();
                    for kind in [
                        BatchKind::Strided,
                        BatchKind::PointerArray,
                        BatchKind::VariableSize,
                    ] {
                        out.push((spec, kind));
                    }
                }
            }
        }
    }
    out
}

/// The tensor-core schedules the GPU tests try besides the planned ones: both fragment
/// loaders, padded and flat staging (C too with `FlatC`), with and without the C prefetch,
/// one tile at a time and (2 and 8 warps) in groups of 2 and 3 tiles (`mma_group`), A and
/// B copied verbatim with 16-bit fragment loads (`flat_fragments`), the verbatim copies
/// through `cp.async` (`async_copies`; A and B straight into their slots, `slot_copies`),
/// A and B realigned in shared memory (`realign_in_shared`; with 16-byte vectors,
/// `realign_vectors`), the epilogue's lanes in swapped order (`epilogue_swaps`),
/// C's padded copy element by element in the epilogue (`element_epilogue`), the epilogue's
/// loads of C before its stores, in groups of tiles (`epilogue_loads_first`), the last k
/// step as a full `m16n8k16` (`full_last_k_step`),
/// column tiles in groups where each warp keeps a row of tiles (`row_group`) or two
/// (`row_pairs`), their A fragments loaded at each step (`stream_a`), and whole columns of
/// tiles a warp (`column_sweep`).
fn mma_variants() -> Vec<GpuSchedule> {
    let mut out = Vec::new();
    for (warps, tba) in [(1, 1), (2, 3), (8, 1)] {
        for ldmatrix in [false, true] {
            for stage in [Staging::Padded, Staging::Flat, Staging::FlatC] {
                for prefetch_c in [false, true] {
                    let groups: &[u32] = if warps == 1 { &[0] } else { &[0, 2, 3] };
                    for &mma_group in groups {
                        out.push(GpuSchedule {
                            stage,
                            prefetch_c,
                            mma_group,
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        });
                    }
                    if stage == Staging::FlatC {
                        // C's verbatim copy through `cp.async`; A and B too, straight into
                        // their slots (`slot_copies`), as they are and beside C over A.
                        for (slot_copies, c_over_a) in [(false, false), (true, false), (true, true)]
                        {
                            out.push(GpuSchedule {
                                stage,
                                async_copies: true,
                                slot_copies,
                                c_over_a,
                                realign_in_shared: slot_copies,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                    }
                    if stage != Staging::Padded {
                        // A and B realigned from verbatim copies in their slots, by words
                        // where the banks allow and with 16-byte vectors everywhere
                        // (`realign_vectors`).
                        for realign_vectors in [false, true] {
                            out.push(GpuSchedule {
                                stage,
                                prefetch_c,
                                async_copies: prefetch_c,
                                realign_in_shared: true,
                                realign_vectors,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                    }
                    if stage == Staging::FlatC && !prefetch_c {
                        // C's padded copy element by element (not by `ldmatrix` and
                        // `stmatrix` tiles on sm_90).
                        out.push(GpuSchedule {
                            stage,
                            element_epilogue: true,
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        });
                        // The epilogue's loads of C before its stores, in groups where
                        // there are several warps.
                        out.push(GpuSchedule {
                            stage,
                            epilogue_loads_first: true,
                            mma_group: groups[groups.len() - 1],
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        });
                        // The last k step a full m16n8k16 where at most 8 of k are left.
                        out.push(GpuSchedule {
                            stage,
                            full_last_k_step: true,
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        });
                        // The epilogue's lanes in swapped order, one tile at a time and in
                        // groups (the prefetch is moot under `FlatC`).
                        for &mma_group in groups {
                            out.push(GpuSchedule {
                                stage,
                                mma_group,
                                epilogue_swaps: true,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                    }
                    if warps > 1 {
                        // Column tiles in groups where the warps keep one row of tiles,
                        // and two (`row_pairs`).
                        for row_pairs in [false, true] {
                            out.push(GpuSchedule {
                                stage,
                                prefetch_c,
                                row_group: 2 + prefetch_c as u32,
                                row_pairs,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                            // A loaded at each k step of each group (`stream_a`).
                            out.push(GpuSchedule {
                                stage,
                                prefetch_c,
                                row_group: 8,
                                row_pairs,
                                stream_a: true,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                    }
                    if warps < 8 && !prefetch_c {
                        // Column sweep: whole columns of tiles a warp, every row tile's A
                        // fragments held (with flat fragments below).
                        out.push(GpuSchedule {
                            stage,
                            column_sweep: true,
                            ..GpuSchedule::mma(warps, tba, ldmatrix)
                        });
                    }
                    if !ldmatrix && stage != Staging::Padded {
                        // A and B verbatim, fragments by 16-bit loads; their copies (and
                        // C's under `FlatC`) also through `cp.async`.
                        for async_copies in [false, true] {
                            out.push(GpuSchedule {
                                stage,
                                prefetch_c,
                                flat_fragments: true,
                                async_copies,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                        if warps < 8 {
                            out.push(GpuSchedule {
                                stage,
                                prefetch_c,
                                flat_fragments: true,
                                async_copies: true,
                                column_sweep: true,
                                ..GpuSchedule::mma(warps, tba, ldmatrix)
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// The planned kernel of every spec, and the f16 tensor-core variants on the f16 specs.
fn kernels(target: &GpuTarget) -> Vec<PtxKernel> {
    let mut out = Vec::new();
    for (i, (spec, kind)) in specs().into_iter().enumerate() {
        out.push(generate(&spec, target, None, kind).unwrap());
        // The variants on the transposed shapes and a few odd and even squares (all of
        // them on every spec would take ptxas many minutes).
        let square = spec.m() == spec.n() && spec.n() == spec.k();
        // FMA kernels with vector reads of A and B (`vector_reads`) and with the staging
        // through `cp.async` (`async_copies`), every tile, on the f32/f64 shapes that are
        // not squares (the transposes, k not a multiple of 4; every fourth spec in turn)
        // and four squares.
        let vr_square = square && [5, 17, 24, 32].contains(&spec.n());
        if spec.dtype() != Dtype::F16 && ((!square && i % 4 == 0) || vr_square) {
            for (j, (rm, rn)) in [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4)]
                .into_iter()
                .enumerate()
            {
                let s = GpuSchedule {
                    vector_reads: j % 2 == 0,
                    async_copies: j % 3 != 1,
                    ..GpuSchedule::fma(rm, rn, 1, Staging::Padded)
                };
                if s.validate(&spec.col_major(), target).is_ok() {
                    let k = generate(&spec, target, Some(&s), kind).unwrap();
                    if out.iter().all(|o| o.entry != k.entry) {
                        out.push(k);
                    }
                }
            }
        }
        if spec.dtype() != Dtype::F16
            || kind == BatchKind::VariableSize
            || spec.m().max(spec.n()) < 8
            || (square && ![17, 24, 33, 58, 79].contains(&spec.n()))
        {
            continue;
        }
        // Squares: every variant; the other shapes: every eighth, in turn. The squares also
        // with each count of blocks per SM for ptxas (`min_blocks`, a tuner dimension).
        let mut variants = mma_variants();
        if square {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), target).unwrap();
            variants.extend((1..=4).map(|b| GpuSchedule {
                min_blocks: b,
                ..planned
            }));
        }
        for (j, s) in variants.into_iter().enumerate() {
            if (square || j % 8 == i % 8) && s.validate(&spec.col_major(), target).is_ok() {
                let k = generate(&spec, target, Some(&s), kind).unwrap();
                // One definition per entry (a variant may be the planned kernel).
                if out.iter().all(|o| o.entry != k.entry) {
                    out.push(k);
                }
            }
        }
    }
    // C's copy in A's place (`c_over_a`): squares whose warps keep one row of tiles each,
    // flat C (odd) and C's padded copy (even), beta 0 and not, 8 and 16 warps, the code
    // generator's blocks per SM and 2 and 3 (these two with column tiles in groups of as
    // many, `row_group`).
    for (n, ta, beta) in [
        (113, Trans::N, 0.5),
        (120, Trans::N, 0.0),
        (127, Trans::T, 0.5),
        (128, Trans::N, 0.5),
        (57, Trans::N, 0.0),
        (64, Trans::T, 0.5),
    ] {
        let spec = GemmSpec::builder(Dtype::F16, n, n, n)
            .trans_a(ta)
            .beta(if beta == 0.0 {
                Scalar::Zero
            } else {
                Scalar::fixed(beta).unwrap()
            })
            .build()
            .unwrap();
        for warps in [8, 16] {
            for min_blocks in [0, 2, 3] {
                let s = GpuSchedule {
                    stage: Staging::FlatC,
                    c_over_a: true,
                    min_blocks,
                    row_group: min_blocks,
                    ..GpuSchedule::mma(warps, 1, true)
                };
                let k = generate(&spec, target, Some(&s), BatchKind::Strided).unwrap();
                if out.iter().all(|o| o.entry != k.entry) {
                    out.push(k);
                }
            }
        }
    }
    out
}

/// C's copy in A's place: the block needs the bytes of A and B alone (at 113 and 128 at
/// most 75 KiB: three blocks per SM on an H100), C read after the A fragments.
#[test]
fn c_over_a_needs_only_a_and_b() {
    let target = GpuTarget::new(Sm::Sm90);
    for n in [113, 120, 127, 128] {
        let spec = GemmSpec::builder(Dtype::F16, n, n, n)
            .beta(Scalar::fixed(0.5).unwrap())
            .build()
            .unwrap();
        let plain = GpuSchedule {
            stage: Staging::FlatC,
            ..GpuSchedule::mma(16, 1, true)
        };
        let over = GpuSchedule {
            c_over_a: true,
            ..plain
        };
        let k0 = generate(&spec, &target, Some(&plain), BatchKind::Strided).unwrap();
        let k1 = generate(&spec, &target, Some(&over), BatchKind::Strided).unwrap();
        let layout = plain.shared_layout(&spec.col_major());
        assert_eq!(
            k1.shared_bytes,
            (layout.a_len + layout.b_len) * 2,
            "n = {n}"
        );
        assert!(k0.shared_bytes > k1.shared_bytes, "n = {n}");
        assert!(k1.shared_bytes + 1024 <= 228 * 1024 / 3, "n = {n}");
        assert!(k1.entry.ends_with("_ca"), "n = {n}");
        // Three barriers before the copy back (A and B staged, A fragments loaded, C in).
        assert_eq!(k1.ptx.matches("bar.sync").count(), 4, "n = {n}");
    }
}

#[test]
fn ptxas_accepts_every_kernel() {
    let ptxas = ptxas::find().expect(
        "ptxas not found: set SMALLGEMM_PTXAS or `pip install nvidia-cuda-nvcc` (scripts/test.sh does)",
    );
    // The two architectures on two threads: ptxas takes minutes on one core.
    std::thread::scope(|scope| {
        for sm in [Sm::Sm80, Sm::Sm90] {
            let ptxas = &ptxas;
            scope.spawn(move || {
                let target = GpuTarget::new(sm);
                let kernels = kernels(&target);
                let refs: Vec<&PtxKernel> = kernels.iter().collect();
                // One module per chunk keeps ptxas runs few and failures readable.
                for chunk in refs.chunks(64) {
                    let module = combine(sm, chunk);
                    if let Err(e) = ptxas::assemble(ptxas, &module, sm) {
                        let first: Vec<&str> = e.lines().take(20).collect();
                        let line = first
                            .iter()
                            .find_map(|l| l.split("line ").nth(1))
                            .and_then(|t| t.split(';').next())
                            .and_then(|t| t.trim().parse::<usize>().ok());
                        let context = line
                            .map(|l| {
                                module
                                    .lines()
                                    .skip(l.saturating_sub(3))
                                    .take(5)
                                    .collect::<Vec<_>>()
                                    .join("\n")
                            })
                            .unwrap_or_default();
                        panic!(
                            "ptxas rejected {sm} module:\n{}\n---\n{context}",
                            first.join("\n")
                        );
                    }
                }
            });
        }
    });
}

#[test]
fn f16_from_sixteen_uses_tensor_cores() {
    let target = GpuTarget::new(Sm::Sm90);
    for n in [16, 32, 64, 128] {
        let spec = GemmSpec::builder(Dtype::F16, n, n, n).build().unwrap();
        let k = generate(&spec, &target, None, BatchKind::Strided).unwrap();
        assert!(k.ptx.contains("mma.sync.aligned.m16n8k16"), "n = {n}");
    }
    let small = GemmSpec::builder(Dtype::F16, 4, 4, 4).build().unwrap();
    let k = generate(&small, &target, None, BatchKind::Strided).unwrap();
    assert!(!k.ptx.contains("mma.sync"));
}
