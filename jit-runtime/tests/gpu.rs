//! GPU correctness matrix: random operands, sentinels in C's padding and between batch
//! entries, NaN in C for beta = 0, every transpose and layout, alpha/beta kinds, strided,
//! pointer-array, variable-size and grouped launches; f16 against an f64 reference with an
//! f16 tolerance. Without a CUDA driver or device (CI) each test prints that it was skipped.

#![cfg(feature = "cuda")]

use rayon::prelude::*;
use smallgemm::cuda::cudarc::driver::{CudaSlice, DevicePtr};
use smallgemm::cuda::{self, f16, BatchKind, CudaError, Gpu, GpuElement, Group};
use smallgemm::{Dtype, GemmSpec, Layout, Operand, Scalar, Trans};
use smallgemm_ir::reference::{SplitMix64, TestData};
use smallgemm_ir::{row_tile_warps, GpuSchedule, Staging};

fn gpu(test: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e @ (CudaError::NoDriver | CudaError::NoDevice { .. })) => {
            println!("{test}: skipped, no GPU ({e})");
            None
        }
        Err(e) => panic!("{test}: cannot open the GPU: {e}"),
    }
}

/// Values of alpha/beta the kernels receive for each kind.
fn value(s: Scalar, runtime: f64) -> f64 {
    s.value().unwrap_or(runtime)
}

/// The environment variable that runs one shard of a test's jobs (`i/n`: those whose index
/// is i mod n) in a child process of [`in_parallel`].
const SHARD: &str = "SMALLGEMM_GPU_TEST_SHARD";

/// The environment variable that sets how many processes [`in_parallel`] spreads a test's
/// jobs over (default: a quarter of the host's cores, at most 8; 1 runs them in this one).
const PROCESSES: &str = "SMALLGEMM_GPU_TEST_PROCESSES";

/// What a shard prints for each failure, and once when it has run all its jobs (after
/// libtest's "test name ... ", not at a line's start).
const FAILED_JOB: &str = "smallgemm-failed-job: ";
const SHARD_DONE: &str = "smallgemm-shard-done: ";

/// Runs `check` on every job of `test` (the name of the calling test) and returns the
/// failures, shard by shard. The jobs are spread over child processes of this test binary,
/// each running `test` alone on its shard (every n-th job), each shard's jobs on rayon's
/// threads. Compiling the kernels, not running them, takes the tests' time, and the driver
/// seems to compile one process's modules one at a time: on an H200 the 19 tests in one
/// process, their jobs on 16 threads, had not finished after 440 s. A child that fails
/// without reporting its jobs, or never reports finishing them, is a failure too.
fn in_parallel<J: Sync>(
    test: &str,
    jobs: &[J],
    check: impl Fn(&J) -> Result<(), String> + Sync,
) -> Vec<String> {
    let run = |mine: &(dyn Fn(usize) -> bool + Sync)| -> Vec<String> {
        jobs.par_iter()
            .enumerate()
            .filter(|(i, _)| mine(*i))
            .filter_map(|(_, j)| check(j).err())
            .collect()
    };
    if let Ok(shard) = std::env::var(SHARD) {
        let (i, n) = shard
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .unwrap_or_else(|| panic!("{SHARD}={shard} is not i/n"));
        let failures = run(&|j| j % n == i);
        for f in &failures {
            println!("{FAILED_JOB}{}", f.replace('\n', " | "));
        }
        println!("{SHARD_DONE}{shard}");
        return failures;
    }
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let processes = std::env::var(PROCESSES)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or((cores / 4).clamp(1, 8));
    if processes <= 1 {
        return run(&|_| true);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..processes)
        .map(|i| {
            std::process::Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads", "1"])
                .env(SHARD, format!("{i}/{processes}"))
                .env_remove(PROCESSES)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()))
        })
        .collect();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("a shard's output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let reported: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.split_once(FAILED_JOB).map(|(_, f)| f.to_string()))
            .collect();
        let done = stdout.contains(SHARD_DONE);
        if !done || (reported.is_empty() && !out.status.success()) {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
            failures.push(format!(
                "{test}: shard {i}/{processes} ({}) did not finish its jobs: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        failures.extend(reported);
    }
    failures
}

fn specs(dtype: Dtype) -> Vec<GemmSpec> {
    let mut out = Vec::new();
    let sizes: Vec<(usize, usize, usize)> = match dtype {
        Dtype::F16 => vec![
            (1, 1, 1),
            (2, 3, 4),
            (5, 5, 5),
            (8, 8, 8),
            (9, 7, 12),
            (10, 10, 10),
            (16, 16, 16),
            (17, 9, 33),
            (24, 24, 24),
            (32, 32, 32),
            (40, 8, 20),
            (64, 64, 64),
            (100, 37, 50),
            (128, 128, 128),
        ],
        _ => vec![
            (1, 1, 1),
            (2, 2, 2),
            (3, 5, 7),
            (4, 4, 4),
            (8, 8, 8),
            (7, 16, 3),
            (12, 12, 12),
            (16, 16, 16),
            (17, 19, 20),
            (21, 21, 21),
            (24, 24, 24),
            (25, 30, 27),
            (31, 33, 32),
            (32, 32, 32),
            (1, 32, 5),
        ],
    };
    let scalars = [
        (Scalar::One, Scalar::Zero),
        (Scalar::Runtime, Scalar::Runtime),
        (Scalar::MinusOne, Scalar::One),
        (Scalar::fixed(1.5).unwrap(), Scalar::MinusOne),
        (Scalar::One, Scalar::fixed(0.5).unwrap()),
    ];
    for (i, &(m, n, k)) in sizes.iter().enumerate() {
        for (j, (ta, tb)) in [
            (Trans::N, Trans::N),
            (Trans::T, Trans::N),
            (Trans::N, Trans::T),
            (Trans::T, Trans::T),
        ]
        .into_iter()
        .enumerate()
        {
            let (alpha, beta) = scalars[(i + j) % scalars.len()];
            let layout = if (i + j) % 3 == 2 {
                Layout::RowMajor
            } else {
                Layout::ColMajor
            };
            let mut b = GemmSpec::builder(dtype, m, n, k)
                .trans_a(ta)
                .trans_b(tb)
                .layout(layout)
                .alpha(alpha)
                .beta(beta);
            if (i + j) % 2 == 1 {
                // Padded leading dimensions and a gap between the C matrices.
                let base = GemmSpec::builder(dtype, m, n, k)
                    .trans_a(ta)
                    .trans_b(tb)
                    .layout(layout)
                    .build()
                    .unwrap();
                let pad = |o: Operand| base.ld(o) + 3;
                b = b
                    .lda(pad(Operand::A))
                    .ldb(pad(Operand::B))
                    .ldc(pad(Operand::C));
                let probe = b.build().unwrap();
                b = b.stride_c(probe.footprint(Operand::C) + 5);
            }
            out.push(b.build().unwrap());
        }
    }
    out
}

fn run_f<T: GpuElement + smallgemm::Element>(
    gpu: &Gpu,
    spec: &GemmSpec,
    seed: u64,
) -> Result<(), String> {
    run_f_with::<T>(gpu, spec, seed, None)
}

fn run_f_with<T: GpuElement + smallgemm::Element>(
    gpu: &Gpu,
    spec: &GemmSpec,
    seed: u64,
    schedule: Option<&GpuSchedule>,
) -> Result<(), String> {
    let batch = 37 + (seed as usize % 50);
    let mut data = TestData::<T>::new(spec, batch, seed);
    let (alpha, beta) = (value(spec.alpha(), 1.25), value(spec.beta(), -0.75));
    let err = |e: CudaError| format!("{}: {e}", spec.name());
    let a = gpu.upload(&data.a).map_err(err)?;
    let b = gpu.upload(&data.b).map_err(err)?;
    let mut c = gpu.upload(data.c_mut()).map_err(err)?;
    let k = match schedule {
        Some(s) => gpu.kernel_with_schedule(spec, BatchKind::Strided, s),
        None => gpu.kernel(spec, BatchKind::Strided),
    }
    .map_err(err)?;
    k.launch_strided(gpu.stream(), &a, &b, &mut c, batch, alpha, beta)
        .map_err(err)?;
    let out = gpu.download(&c).map_err(err)?;
    data.c_mut().copy_from_slice(&out);
    let report = data.check(alpha, beta);
    match report.failure {
        None => Ok(()),
        Some(f) => Err(format!(
            "{} (seed {seed}, {:?}): {f}",
            spec.name(),
            k.ptx().schedule
        )),
    }
}

#[test]
fn f64_and_f32_strided_match_the_reference() {
    let Some(gpu) = gpu("f64_and_f32_strided") else {
        return;
    };
    let jobs: Vec<(u64, GemmSpec)> = [(Dtype::F64, 0), (Dtype::F32, 1000)]
        .into_iter()
        .flat_map(|(d, base)| (base..).zip(specs(d)))
        .collect();
    let count = jobs.len();
    let failures = in_parallel(
        "f64_and_f32_strided_match_the_reference",
        &jobs,
        |(seed, spec)| match spec.dtype() {
            Dtype::F64 => run_f::<f64>(&gpu, spec, *seed),
            _ => run_f::<f32>(&gpu, spec, *seed),
        },
    );
    println!("{count} f64/f32 specs checked, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every staging (padded, flat A/B, flat A/B/C) under several tiles and block sizes, on
/// packed batches (the flat spans) with transposes, row-major layouts and beta = 0 / != 0;
/// batch lengths are not multiples of tba, so the last block's span ends early.
#[test]
fn every_staging_matches() {
    let Some(gpu) = gpu("every_staging") else {
        return;
    };
    let mut jobs = Vec::new();
    let shapes = [
        (1, 1, 1),
        (2, 2, 2),
        (3, 3, 3),
        (3, 5, 7),
        (5, 5, 5),
        (7, 7, 7),
        (9, 9, 9),
        (13, 13, 13),
        (17, 19, 20),
        (24, 24, 24),
        (30, 30, 30),
        (32, 32, 32),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for d in [Dtype::F64, Dtype::F32, Dtype::F16] {
            let (ta, tb) = [
                (Trans::N, Trans::N),
                (Trans::T, Trans::N),
                (Trans::N, Trans::T),
                (Trans::T, Trans::T),
            ][i % 4];
            let (alpha, beta) = if i % 3 == 1 {
                (Scalar::One, Scalar::Zero)
            } else {
                (Scalar::fixed(1.5).unwrap(), Scalar::fixed(0.5).unwrap())
            };
            let spec = GemmSpec::builder(d, m, n, k)
                .trans_a(ta)
                .trans_b(tb)
                .layout(if i % 5 == 2 {
                    Layout::RowMajor
                } else {
                    Layout::ColMajor
                })
                .alpha(alpha)
                .beta(beta)
                .build()
                .unwrap();
            let p = spec.col_major();
            for (rm, rn) in [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4)] {
                // Padded staging also with vector reads of A and B (`vector_reads`), and
                // through `cp.async` (`async_copies`) with and without them; the flat
                // spans also through `cp.async`.
                for (stage, vr, cpa) in [
                    (Staging::Padded, false, false),
                    (Staging::Flat, false, false),
                    (Staging::FlatC, false, false),
                    (Staging::Padded, true, false),
                    (Staging::Padded, false, true),
                    (Staging::Padded, true, true),
                    (Staging::Flat, false, true),
                    (Staging::FlatC, false, true),
                ] {
                    if ((rm, rn) == (8, 4) && !vr) || (vr && d == Dtype::F16) {
                        continue;
                    }
                    for threads in [96u32, 512] {
                        let mut s = GpuSchedule::fma(rm, rn, 1, stage);
                        s.vector_reads = vr;
                        s.async_copies = cpa;
                        s.tba = (threads / s.fma_threads(&p)).max(1);
                        if s.validate(&p, gpu.target()).is_err() {
                            continue;
                        }
                        jobs.push((jobs.len() as u64 + 1, spec, s));
                    }
                }
            }
        }
    }
    let failures = in_parallel(
        "every_staging_matches",
        &jobs,
        |(seed, spec, s)| match spec.dtype() {
            Dtype::F64 => run_f_with::<f64>(&gpu, spec, *seed, Some(s)),
            Dtype::F32 => run_f_with::<f32>(&gpu, spec, *seed, Some(s)),
            Dtype::F16 => run_f16_with(&gpu, spec, *seed, Some(s)),
        },
    );
    let count = jobs.len();
    println!("{count} staged kernels checked, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_square_size_matches() {
    let Some(gpu) = gpu("every_square_size") else {
        return;
    };
    let square = |d, n| {
        GemmSpec::builder(d, n, n, n)
            .alpha(Scalar::fixed(1.5).unwrap())
            .beta(Scalar::fixed(0.5).unwrap())
            .build()
            .unwrap()
    };
    let jobs: Vec<(u64, GemmSpec)> = (1..=40)
        .flat_map(|n| {
            [
                (n + 1, square(Dtype::F64, n)),
                (n + 2, square(Dtype::F32, n)),
            ]
        })
        .chain((1..=128).map(|n| (n, square(Dtype::F16, n))))
        .map(|(seed, spec)| (seed as u64, spec))
        .collect();
    let failures = in_parallel(
        "every_square_size_matches",
        &jobs,
        |(seed, spec)| match spec.dtype() {
            Dtype::F64 => run_f::<f64>(&gpu, spec, *seed),
            Dtype::F32 => run_f::<f32>(&gpu, spec, *seed),
            Dtype::F16 => run_f16(&gpu, spec, *seed, BatchKind::Strided),
        },
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// f16 sentinel: any value the kernel cannot produce by accident.
const H_SENTINEL: f64 = -777.0;

/// f16 harness: operands rounded to f16, reference in f64 from the same f16 values (the
/// products are exact; the f64 sum is far more accurate than the f16 tolerance).
fn run_f16(gpu: &Gpu, spec: &GemmSpec, seed: u64, kind: BatchKind) -> Result<(), String> {
    run_f16_kernel(gpu, spec, seed, kind, None)
}

fn run_f16_with(
    gpu: &Gpu,
    spec: &GemmSpec,
    seed: u64,
    schedule: Option<&GpuSchedule>,
) -> Result<(), String> {
    run_f16_kernel(gpu, spec, seed, BatchKind::Strided, schedule)
}

fn run_f16_kernel(
    gpu: &Gpu,
    spec: &GemmSpec,
    seed: u64,
    kind: BatchKind,
    schedule: Option<&GpuSchedule>,
) -> Result<(), String> {
    let batch = 21 + (seed as usize % 30);
    let mut rng = SplitMix64::new(seed);
    let mut random =
        |n: usize| -> Vec<f16> { (0..n).map(|_| f16::from_f64(rng.nonzero())).collect() };
    let a = random(spec.required_len(Operand::A, batch));
    let b = random(spec.required_len(Operand::B, batch));
    let clen = spec.required_len(Operand::C, batch) + 64;
    let mut c = vec![f16::from_f64(H_SENTINEL); clen];
    let fill = random(spec.m() * spec.n() * batch);
    let nan_c = spec.beta() == Scalar::Zero;
    let mut inside = vec![false; clen];
    for i in 0..batch {
        for col in 0..spec.n() {
            for row in 0..spec.m() {
                let at = i * spec.stride(Operand::C) + spec.index(Operand::C, row, col);
                c[at] = if nan_c {
                    f16::NAN
                } else {
                    fill[(i * spec.n() + col) * spec.m() + row]
                };
                inside[at] = true;
            }
        }
    }
    let before = c.clone();
    let (alpha, beta) = (value(spec.alpha(), 1.25), value(spec.beta(), -0.75));
    let err = |e: CudaError| format!("{}: {e}", spec.name());
    let da = gpu.upload(&a).map_err(err)?;
    let db = gpu.upload(&b).map_err(err)?;
    let mut dc = gpu.upload(&c).map_err(err)?;
    let k = match schedule {
        Some(s) => gpu.kernel_with_schedule(spec, kind, s),
        None => gpu.kernel(spec, kind),
    }
    .map_err(err)?;
    match kind {
        BatchKind::Strided => k
            .launch_strided(gpu.stream(), &da, &db, &mut dc, batch, alpha, beta)
            .map_err(err)?,
        _ => {
            let (pa, pb, pc) = pointer_arrays(gpu, spec, batch, &da, &db, &dc).map_err(err)?;
            // SAFETY: pointers address the spec's matrices inside the uploaded buffers.
            unsafe {
                k.launch_pointer_array::<f16>(gpu.stream(), &pa, &pb, &pc, batch, alpha, beta)
            }
            .map_err(err)?
        }
    }
    let out = gpu.download(&dc).map_err(err)?;
    let tol = 2.0 * (spec.k() as f64 + 3.0) * Dtype::F16.unit_roundoff();
    for i in 0..batch {
        for col in 0..spec.n() {
            for row in 0..spec.m() {
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for p in 0..spec.k() {
                    let x =
                        a[i * spec.stride(Operand::A) + spec.index(Operand::A, row, p)].to_f64();
                    let y =
                        b[i * spec.stride(Operand::B) + spec.index(Operand::B, p, col)].to_f64();
                    sum += x * y;
                    mag += (x * y).abs();
                }
                let at = i * spec.stride(Operand::C) + spec.index(Operand::C, row, col);
                let mut exact = alpha * sum;
                let mut scale = alpha.abs() * mag;
                if beta != 0.0 {
                    exact += beta * before[at].to_f64();
                    scale += (beta * before[at].to_f64()).abs();
                }
                let got = out[at].to_f64();
                let rounded = f16::from_f64(exact).to_f64();
                let e = (got - rounded).abs() / scale.max(f64::MIN_POSITIVE);
                // NaN (a leaked NaN from C) fails too.
                if e.is_nan() || e > tol {
                    return Err(format!(
                        "{} ({:?}): C[{row},{col}] of {i}: got {got}, expected {exact} (error {e:.3e} > {tol:.3e})",
                        spec.name(),
                        k.ptx().schedule
                    ));
                }
            }
        }
    }
    for (i, (now, was)) in out.iter().zip(&before).enumerate() {
        if !inside[i] && now.to_bits() != was.to_bits() {
            return Err(format!(
                "{}: element {i} outside every C changed from {was} to {now}",
                spec.name()
            ));
        }
    }
    Ok(())
}

#[test]
fn f16_matches_the_reference() {
    let Some(gpu) = gpu("f16") else {
        return;
    };
    let all: Vec<(usize, GemmSpec)> = specs(Dtype::F16).into_iter().enumerate().collect();
    let failures = in_parallel("f16_matches_the_reference", &all, |(i, spec)| {
        let kind = if i % 4 == 3 {
            BatchKind::PointerArray
        } else {
            BatchKind::Strided
        };
        run_f16(&gpu, spec, 500 + *i as u64, kind)
    });
    println!("{} f16 specs checked, {} failed", all.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A tensor-core schedule variant the GPU tests run: (ldmatrix, staging, C prefetch, tiles
/// per warp group, flat fragments, cp.async).
/// A tensor-core variant for `check_mma_variants` (which sets its warps and problems per
/// block): the fragment loader, the staging, the C prefetch and the tiles per group.
fn variant(ldmatrix: bool, stage: Staging, prefetch_c: bool, mma_group: u32) -> GpuSchedule {
    GpuSchedule {
        stage,
        prefetch_c,
        mma_group,
        ..GpuSchedule::mma(1, 1, ldmatrix)
    }
}

/// The f16 specs the tensor-core variants run on: the correctness matrix's f16 specs from
/// 8 up, every seventh square size from 16 to 128, padded and tight shapes.
fn mma_variant_specs() -> Vec<GemmSpec> {
    let mut all: Vec<GemmSpec> = specs(Dtype::F16)
        .into_iter()
        .filter(|s| s.m().max(s.n()) >= 8)
        .collect();
    for n in (16..=128).step_by(7) {
        all.push(
            GemmSpec::builder(Dtype::F16, n, n, n)
                .alpha(Scalar::fixed(1.5).unwrap())
                .beta(Scalar::fixed(0.5).unwrap())
                .build()
                .unwrap(),
        );
    }
    // C's columns whole 16-byte vectors under a padded leading dimension, with a gap
    // between the C matrices: C goes through shared memory column by column (`FlatC`).
    for (m, n, k, ta, beta) in [
        (24, 40, 17, Trans::T, Scalar::fixed(0.5).unwrap()),
        (64, 24, 33, Trans::N, Scalar::Zero),
    ] {
        let b = GemmSpec::builder(Dtype::F16, m, n, k)
            .trans_a(ta)
            .alpha(Scalar::fixed(1.5).unwrap())
            .beta(beta)
            .ldc(m + 8);
        let probe = b.build().unwrap();
        all.push(b.stride_c(probe.footprint(Operand::C) + 8).build().unwrap());
    }
    // Flat A and B with whole-vector stores (`load_realigned`): tight, packed operands
    // whose sides are no multiples of 8 and differ, every transpose, beta = 0 with NaN in C.
    for (m, n, k, ta, tb, beta) in [
        (37, 53, 29, Trans::N, Trans::T, Scalar::fixed(0.5).unwrap()),
        (70, 45, 91, Trans::T, Trans::N, Scalar::Zero),
        (99, 66, 13, Trans::T, Trans::T, Scalar::fixed(0.5).unwrap()),
        (21, 90, 115, Trans::N, Trans::N, Scalar::Zero),
    ] {
        all.push(
            GemmSpec::builder(Dtype::F16, m, n, k)
                .trans_a(ta)
                .trans_b(tb)
                .alpha(Scalar::fixed(1.5).unwrap())
                .beta(beta)
                .build()
                .unwrap(),
        );
    }
    all
}

/// Runs every variant under 1, 2 (3 problems per block), 8 and 16 warps on every spec of
/// `mma_variant_specs` (where the schedule fits), against the reference; panics with the
/// failures.
fn check_mma_variants(test: &str, gpu: &Gpu, variants: &[GpuSchedule], seed: u64) {
    let mut jobs = Vec::new();
    for (i, spec) in mma_variant_specs().iter().enumerate() {
        let p = spec.col_major();
        for (warps, tba) in [(1, 1), (2, 3), (8, 1), (16, 1)] {
            for v in variants {
                // Groups at the warp counts of the grouped defaults (8 and 16).
                if (warps == 16 && !v.ldmatrix) || (warps < 8 && v.mma_group > 0) {
                    continue;
                }
                let s = GpuSchedule { warps, tba, ..*v };
                if s.validate(&p, gpu.target()).is_err() {
                    continue;
                }
                let count = jobs.len() + 1;
                jobs.push((seed + (i * 7 + count) as u64, *spec, s));
            }
        }
    }
    let failures = in_parallel(test, &jobs, |(seed, spec, s)| {
        run_f16_with(gpu, spec, *seed, Some(s)).map_err(|e| format!("{s:?}: {e}"))
    });
    println!(
        "{} f16 mma kernels checked, {} failed",
        jobs.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Both tensor-core fragment loaders (16/32-bit shared loads and `ldmatrix`), the flat
/// staging of A and B (and of C), and the prefetch of C, under several warp counts and problems per
/// block, every transpose, padded leading dimensions, and the square sizes 16..=128.
#[test]
fn f16_mma_loaders_match() {
    let Some(gpu) = gpu("f16_mma_loaders") else {
        return;
    };
    // Both loaders as before, then the flat staging of A and B and the C prefetch, alone
    // and together.
    let variants = [
        variant(false, Staging::Padded, false, 0),
        variant(true, Staging::Padded, false, 0),
        variant(true, Staging::Flat, false, 0),
        variant(true, Staging::Padded, true, 0),
        variant(true, Staging::Flat, true, 0),
        variant(false, Staging::Flat, true, 0),
        // C through shared memory (16-byte copies of the block's span; the prefetch is moot).
        variant(true, Staging::FlatC, false, 0),
        variant(false, Staging::FlatC, true, 0),
        // Tiles of one row tile in groups sharing A's fragments (`mma_group`; a row's last
        // group may hang over its last column tile), C in shared and in global memory.
        variant(true, Staging::FlatC, false, 3),
        variant(true, Staging::Padded, true, 2),
        variant(false, Staging::Flat, false, 2),
        // A and B copied verbatim, fragments by 16-bit loads with the k padding predicated
        // off (`flat_fragments`), with the C prefetch and with C through shared memory.
        GpuSchedule {
            flat_fragments: true,
            ..variant(false, Staging::Flat, true, 0)
        },
        GpuSchedule {
            flat_fragments: true,
            ..variant(false, Staging::FlatC, false, 0)
        },
        GpuSchedule {
            flat_fragments: true,
            ..variant(false, Staging::FlatC, false, 2)
        },
    ];
    check_mma_variants("f16_mma_loaders_match", &gpu, &variants, 900);
}

/// The verbatim copies into shared memory through `cp.async` (`GpuSchedule::async_copies`)
/// on the specs and warp counts of `f16_mma_loaders_match` (its own test, so that the two
/// can run side by side).
#[test]
fn f16_async_copies_match() {
    let Some(gpu) = gpu("f16_async_copies") else {
        return;
    };
    let with_async = |v: GpuSchedule| GpuSchedule {
        async_copies: true,
        ..v
    };
    // The verbatim copies through `cp.async` (`async_copies`): C's (FlatC, m odd), also
    // with groups, and A's and B's with flat fragments.
    let variants = [
        with_async(variant(true, Staging::FlatC, false, 0)),
        with_async(variant(true, Staging::FlatC, false, 3)),
        with_async(GpuSchedule {
            flat_fragments: true,
            ..variant(false, Staging::FlatC, false, 0)
        }),
    ];
    check_mma_variants("f16_async_copies_match", &gpu, &variants, 1900);
}

/// A and B copied verbatim into their slots through `cp.async` and realigned there
/// (`GpuSchedule::realign_in_shared`; the 3-problem blocks with a named barrier per
/// problem) on the specs and warp counts of `f16_mma_loaders_match`: both fragment
/// loaders, C in shared memory (with and without its copies through `cp.async`, and in
/// groups) and in global memory with the C prefetch.
#[test]
fn f16_realign_in_shared_matches() {
    let Some(gpu) = gpu("f16_realign_in_shared") else {
        return;
    };
    let in_shared = |v: GpuSchedule| GpuSchedule {
        realign_in_shared: true,
        ..v
    };
    let variants = [
        in_shared(variant(true, Staging::FlatC, false, 0)),
        in_shared(GpuSchedule {
            async_copies: true,
            ..variant(true, Staging::FlatC, false, 3)
        }),
        in_shared(variant(false, Staging::FlatC, false, 0)),
        in_shared(variant(true, Staging::Flat, true, 0)),
    ];
    check_mma_variants("f16_realign_in_shared_matches", &gpu, &variants, 2300);
}

/// C's copy in A's place (`GpuSchedule::c_over_a`): 8 and 16 warps and the multiples of the
/// row tiles from 4 to 16 (also `FlatC` as it is there: warp counts that are no power of
/// two), one problem per block, with the code generator's blocks per SM and with 2 and 3,
/// and with A and B realigned in shared memory (`realign_in_shared`), on squares and shapes
/// whose warps keep one row of tiles each (m in 113..=128 at 8 and 16 warps, 49..=64, 17..=32),
/// flat C (tight, m odd) and C's padded copy (m even, also with a padded ldc and a gap
/// between the C matrices), every transpose, beta 0 with NaN in C; and shapes where C's
/// copy is larger than A's (the flag then changes nothing).
#[test]
fn f16_c_over_a_matches() {
    let Some(gpu) = gpu("f16_c_over_a") else {
        return;
    };
    let mut jobs = Vec::new();
    let half = Scalar::fixed(0.5).unwrap();
    let mut all = Vec::new();
    for (m, n, k, ta, tb, beta, ldc) in [
        (113, 113, 113, Trans::N, Trans::N, half, 0),
        (120, 120, 120, Trans::N, Trans::N, half, 0),
        (127, 127, 127, Trans::N, Trans::N, Scalar::Zero, 0),
        (128, 128, 128, Trans::N, Trans::N, half, 0),
        (121, 121, 121, Trans::T, Trans::T, half, 0),
        (126, 126, 126, Trans::N, Trans::T, Scalar::Zero, 0),
        (115, 97, 123, Trans::T, Trans::N, half, 0),
        (118, 124, 100, Trans::N, Trans::N, half, 0),
        (124, 99, 128, Trans::N, Trans::N, half, 128),
        (57, 61, 59, Trans::N, Trans::N, half, 0),
        (64, 64, 64, Trans::T, Trans::N, Scalar::Zero, 0),
        (25, 29, 31, Trans::N, Trans::T, half, 0),
        // C larger than A: the flag takes no effect.
        (20, 120, 16, Trans::N, Trans::N, half, 0),
    ] {
        let mut b = GemmSpec::builder(Dtype::F16, m, n, k)
            .trans_a(ta)
            .trans_b(tb)
            .alpha(Scalar::fixed(1.5).unwrap())
            .beta(beta);
        if ldc > 0 {
            b = b.ldc(ldc);
            let probe = b.build().unwrap();
            b = b.stride_c(probe.footprint(Operand::C) + 8);
        }
        all.push(b.build().unwrap());
    }
    // Warp counts that are no power of two (multiples of the row tiles: 6 at 81..96, 7 and
    // 14 at 97..112, 5, 10 and 15 at 65..80), with and without C over A.
    for (m, n, k, ta, beta) in [
        (97, 97, 97, Trans::N, half),
        (105, 111, 99, Trans::T, Scalar::Zero),
        (90, 90, 90, Trans::N, half),
        (83, 85, 81, Trans::N, half),
        (71, 71, 71, Trans::T, half),
        (80, 77, 66, Trans::N, Scalar::Zero),
    ] {
        all.push(
            GemmSpec::builder(Dtype::F16, m, n, k)
                .trans_a(ta)
                .alpha(Scalar::fixed(1.5).unwrap())
                .beta(beta)
                .build()
                .unwrap(),
        );
    }
    for (i, spec) in all.iter().enumerate() {
        let p = spec.col_major();
        for warps in row_tile_warps(&p) {
            for (c_over_a, min_blocks, realign_in_shared) in [
                (false, 0, false),
                (true, 0, false),
                (true, 2, false),
                (true, 3, false),
                (false, 0, true),
                (true, 0, true),
            ] {
                let s = GpuSchedule {
                    stage: Staging::FlatC,
                    c_over_a,
                    min_blocks,
                    realign_in_shared,
                    ..GpuSchedule::mma(warps, 1, true)
                };
                if s.validate(&p, gpu.target()).is_err() {
                    continue;
                }
                let count = jobs.len() + 1;
                jobs.push((1700 + (i * 5 + count) as u64, *spec, s));
            }
        }
    }
    let failures = in_parallel("f16_c_over_a_matches", &jobs, |(seed, spec, s)| {
        run_f16_with(&gpu, spec, *seed, Some(s)).map_err(|e| format!("{s:?}: {e}"))
    });
    println!(
        "{} f16 c_over_a kernels checked, {} failed",
        jobs.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The f16 specs of the schedule-flag tests, one for each m of `ms` (index i): squares every
/// third, else n and k off the tile multiples (partial row and column tiles); transposes,
/// alpha and beta of each kind in turn (beta 0 with NaN in C).
fn f16_flag_cases(ms: impl Iterator<Item = usize>) -> Vec<(usize, GemmSpec)> {
    let trans = [Trans::N, Trans::T];
    let alphas = [
        Scalar::fixed(1.5).unwrap(),
        Scalar::MinusOne,
        Scalar::Runtime,
        Scalar::One,
    ];
    let betas = [
        Scalar::Zero,
        Scalar::fixed(0.5).unwrap(),
        Scalar::Runtime,
        Scalar::One,
    ];
    ms.enumerate()
        .map(|(i, m)| {
            let (n, k) = if i % 3 == 0 {
                (m, m)
            } else {
                (9 + (m * 7) % 119, 5 + (m * 3) % 123)
            };
            let spec = GemmSpec::builder(Dtype::F16, m, n, k)
                .trans_a(trans[i % 2])
                .trans_b(trans[(i / 2) % 2])
                .alpha(alphas[i % 4])
                .beta(betas[(i / 4) % 4])
                .build()
                .unwrap();
            (i, spec)
        })
        .collect()
}

/// The epilogue's lanes in swapped order (`GpuSchedule::epilogue_swaps`) at every odd m
/// from 17 to 127 (C's verbatim copy: each leading dimension mod 32 has its own order):
/// the planned schedule with the flag, and `FlatC` with 2 warps in groups of 3 and 2
/// problems per block (the second copy at another alignment), 8 warps in groups of 2, and
/// flat fragments at the sizes to 40; n and k varied (partial row and column tiles, so
/// that the swapped guards matter), every transpose, alpha and beta of each kind, beta 0
/// with NaN in C.
#[test]
fn f16_epilogue_swaps_match() {
    let Some(gpu) = gpu("f16_epilogue_swaps") else {
        return;
    };
    let cases = f16_flag_cases((17..=127usize).step_by(2));
    check_flag_cases(
        "f16_epilogue_swaps_match",
        &gpu,
        "epilogue_swaps",
        cases,
        (2700, 5),
        |_, spec| {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).unwrap();
            let flatc = |warps, tba, mma_group, flat_fragments| GpuSchedule {
                stage: Staging::FlatC,
                mma_group,
                flat_fragments,
                ..GpuSchedule::mma(warps, tba, !flat_fragments)
            };
            let mut variants = vec![planned, flatc(2, 2, 3, false), flatc(8, 1, 2, false)];
            if spec.m() <= 40 {
                variants.push(flatc(2, 2, 0, true));
            }
            variants
                .into_iter()
                .map(|v| GpuSchedule {
                    epilogue_swaps: true,
                    ..v
                })
                .filter(|s| s.epilogue_swaps_apply())
                .collect()
        },
    );
}

/// The epilogue's loads before its stores (`GpuSchedule::epilogue_loads_first`: each
/// tile's element by element, a group's whole tiles on sm_90) at every fourth m from 9 to
/// 125, odd and even: the planned schedule with the flag, `FlatC` with 2 warps in groups of
/// 3 and 2 problems per block and 8 warps in groups of 2, each with tiles moved whole (m
/// even, sm_90) and element by element (`element_epilogue`), and padded staging with C in
/// global memory; n and k varied, every transpose, alpha and beta of each kind, beta 0
/// with NaN in C.
#[test]
fn f16_epilogue_loads_first_matches() {
    let Some(gpu) = gpu("f16_epilogue_loads_first") else {
        return;
    };
    let cases = f16_flag_cases((9..=125usize).step_by(4));
    check_flag_cases(
        "f16_epilogue_loads_first_matches",
        &gpu,
        "epilogue_loads_first",
        cases,
        (4700, 7),
        |_, spec| {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).unwrap();
            let flatc = |warps, tba, mma_group, element_epilogue| GpuSchedule {
                stage: Staging::FlatC,
                mma_group,
                element_epilogue,
                ..GpuSchedule::mma(warps, tba, true)
            };
            let padded = GpuSchedule::mma(4, 1, true);
            [
                planned,
                flatc(2, 2, 3, false),
                flatc(8, 1, 2, false),
                flatc(2, 2, 3, true),
                flatc(8, 1, 2, true),
                padded,
            ]
            .into_iter()
            .map(|v| GpuSchedule {
                epilogue_loads_first: true,
                ..v
            })
            .filter(|s| s.epilogue_loads_first_apply())
            .collect()
        },
    );
}

/// The last k step as a full `m16n8k16` (`GpuSchedule::full_last_k_step`) where at most 8
/// of k are left (k mod 16 in 1..=8; elsewhere the kernels are the default ones): the
/// planned schedule, `FlatC` with 8 warps in groups of 2 and with 2 problems a block, and
/// padded staging, with `ldmatrix` and without; n and k varied, every transpose, alpha and
/// beta of each kind, beta 0 with NaN in C.
#[test]
fn f16_full_last_k_step_matches() {
    let Some(gpu) = gpu("f16_full_last_k_step") else {
        return;
    };
    let cases = f16_flag_cases((17..=125usize).step_by(3))
        .into_iter()
        .filter(|(_, spec)| (1..=8).contains(&(spec.k() % 16)))
        .collect();
    check_flag_cases(
        "f16_full_last_k_step_matches",
        &gpu,
        "full_last_k_step",
        cases,
        (4900, 7),
        |_, spec| {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).unwrap();
            let flatc = |warps, tba, mma_group| GpuSchedule {
                stage: Staging::FlatC,
                mma_group,
                ..GpuSchedule::mma(warps, tba, true)
            };
            [
                planned,
                flatc(8, 1, 2),
                flatc(2, 2, 0),
                GpuSchedule::mma(4, 1, true),
                GpuSchedule::mma(4, 1, false),
            ]
            .into_iter()
            .map(|v| GpuSchedule {
                full_last_k_step: true,
                ..v
            })
            .filter(|s| s.full_last_k_step_apply())
            .collect()
        },
    );
}

/// A and B realigned in shared memory with 16-byte vectors where the bank rule would read
/// words (`GpuSchedule::realign_vectors`): the planned schedule with `realign_in_shared`,
/// `FlatC` with 5 and 8 warps (in groups of 2), C's copies through `cp.async` or not, 2
/// problems a block, and `Flat` with the C prefetch, each with the flag; m from 17 to 127
/// (no multiple of 8: A realigned), n and k varied, every transpose, alpha and beta of each
/// kind, beta 0 with NaN in C.
#[test]
fn f16_realign_vectors_matches() {
    let Some(gpu) = gpu("f16_realign_vectors") else {
        return;
    };
    let cases = f16_flag_cases((17..=127usize).step_by(4));
    check_flag_cases(
        "f16_realign_vectors_matches",
        &gpu,
        "realign_vectors",
        cases,
        (8700, 7),
        |_, spec| {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).unwrap();
            let flatc = |warps, tba, mma_group, async_copies| GpuSchedule {
                stage: Staging::FlatC,
                mma_group,
                async_copies,
                ..GpuSchedule::mma(warps, tba, true)
            };
            [
                planned,
                flatc(5, 1, 0, true),
                flatc(8, 1, 2, false),
                flatc(2, 2, 0, true),
                GpuSchedule {
                    stage: Staging::Flat,
                    prefetch_c: true,
                    ..GpuSchedule::mma(4, 1, true)
                },
            ]
            .into_iter()
            .map(|v| GpuSchedule {
                realign_in_shared: true,
                realign_vectors: true,
                ..v
            })
            .filter(|s| s.realign_vectors_apply())
            .collect()
        },
    );
}

/// Column sweep (`GpuSchedule::column_sweep`): each warp takes whole columns of tiles with
/// every row tile's A fragments held for all k steps. Sizes 9 to 64 and a few above; the
/// planned schedule, it with 1, 2 and 4 warps and 2 problems per block, with and without
/// the C prefetch and flat fragments; n and k off the tile multiples, every transpose,
/// alpha and beta of each kind, beta 0 with NaN in C.
#[test]
fn f16_column_sweep_matches() {
    let Some(gpu) = gpu("f16_column_sweep") else {
        return;
    };
    let cases = f16_flag_cases((9..=64usize).chain([65, 80, 97, 128]));
    // Not vacuous: 736 kernels fit on an H100.
    check_flag_cases(
        "f16_column_sweep_matches",
        &gpu,
        "column_sweep",
        cases,
        (3700, 13),
        |_, spec| {
            let planned = smallgemm_ir::plan_gpu(&spec.col_major(), gpu.target()).unwrap();
            let mut variants = vec![planned];
            for (warps, tba) in [(1, 1), (2, 2), (4, 1)] {
                for (stage, prefetch_c, flat_fragments) in [
                    (Staging::FlatC, false, false),
                    (Staging::FlatC, false, true),
                    (Staging::Flat, true, false),
                    (Staging::Padded, false, false),
                ] {
                    variants.push(GpuSchedule {
                        stage,
                        prefetch_c,
                        flat_fragments,
                        epilogue_swaps: spec.m() % 2 == 1,
                        ..GpuSchedule::mma(warps, tba, !flat_fragments)
                    });
                }
            }
            variants
                .into_iter()
                .map(|v| GpuSchedule {
                    column_sweep: true,
                    ..v
                })
                .filter(|s| s.column_sweep_apply())
                .collect()
        },
    );
}

/// Column tiles in groups where each warp keeps one row of tiles (`GpuSchedule::row_group`):
/// groups of 2, 3 and 4 at 1, 2 and 3 warps a row tile (with 2 and 3 the last group may
/// hang over the last column tile: computed, never stored), C in shared memory (with C
/// over A and A and B realigned in shared memory; with the epilogue swaps where m is odd)
/// and in global memory with the C prefetch, both fragment loaders; m from 9 to 128, n and
/// k off the tile multiples, every transpose, alpha and beta of each kind, beta 0 with NaN
/// in C.
#[test]
fn f16_row_group_matches() {
    let Some(gpu) = gpu("f16_row_group") else {
        return;
    };
    let cases = f16_flag_cases((9..=128usize).step_by(4).chain([120, 127, 128]));
    check_flag_cases(
        "f16_row_group_matches",
        &gpu,
        "row_group",
        cases,
        (4700, 11),
        |i, spec| {
            let m = spec.m();
            let mt = m.div_ceil(16) as u32;
            let mut variants = Vec::new();
            for per_row in [1, 2, 3] {
                for (stage, ldmatrix, prefetch_c, c_over_a, realign) in [
                    (Staging::FlatC, true, false, false, false),
                    (Staging::FlatC, true, false, true, true),
                    (Staging::Flat, true, true, false, false),
                    (Staging::Padded, false, false, false, false),
                ] {
                    variants.push(GpuSchedule {
                        stage,
                        prefetch_c,
                        c_over_a,
                        realign_in_shared: realign,
                        async_copies: realign,
                        epilogue_swaps: m % 2 == 1,
                        row_group: 2 + (variants.len() + i) as u32 % 3,
                        ..GpuSchedule::mma(mt * per_row, 1, ldmatrix)
                    });
                }
            }
            variants
        },
    );
}

/// A and B straight into their padded slots through `cp.async` (`GpuSchedule::slot_copies`):
/// m from 9 to 128 in steps of 3 (columns of 4-, 8- and 16-byte vectors, and odd ones that
/// keep the realigning copy), one warp a row tile with column tiles in groups, 2 warps and
/// 2 problems a block (the second problem's copy at another alignment), C over A with A
/// and B realigned in shared memory where their columns are odd, 4 warps without
/// `ldmatrix`; n and k off the tile multiples, every transpose, alpha and beta of each
/// kind, beta 0 with NaN in C.
#[test]
fn f16_slot_copies_match() {
    let Some(gpu) = gpu("f16_slot_copies") else {
        return;
    };
    let cases = f16_flag_cases((9..=128usize).step_by(3).chain([120, 128]));
    check_flag_cases(
        "f16_slot_copies_match",
        &gpu,
        "slot_copies",
        cases,
        (5700, 7),
        |i, spec| {
            let m = spec.m();
            let mt = m.div_ceil(16) as u32;
            let flatc = |warps, tba, ldmatrix| GpuSchedule {
                stage: Staging::FlatC,
                async_copies: true,
                slot_copies: true,
                epilogue_swaps: m % 2 == 1,
                ..GpuSchedule::mma(warps, tba, ldmatrix)
            };
            vec![
                GpuSchedule {
                    row_group: 2 + i as u32 % 3,
                    ..flatc(mt, 1, true)
                },
                GpuSchedule {
                    mma_group: 2,
                    ..flatc(2, 2, true)
                },
                GpuSchedule {
                    c_over_a: true,
                    realign_in_shared: true,
                    min_blocks: 2,
                    ..flatc(2 * mt, 1, true)
                },
                flatc(4, 1, false),
            ]
            .into_iter()
            .filter(|s| s.slot_copies_apply())
            .collect()
        },
    );
}

/// Two row tiles a warp (`GpuSchedule::row_pairs`: both rows' A fragments held, each B
/// fragment loaded once for both): m from 17 to 128 in steps of 3 (odd row tile counts,
/// whose last pair's second tile lies past m), each multiple of the pairs up to 16 warps
/// (groups of column tiles with 2 and 3 a warp, also 2 problems a block), C in shared
/// memory (with the epilogue swaps where m is odd, with C over A and A and B realigned
/// in shared memory) and in global memory with the C prefetch, both fragment loaders;
/// n and k off the tile multiples, every transpose, alpha and beta of each kind, beta 0
/// with NaN in C.
#[test]
fn f16_row_pairs_match() {
    let Some(gpu) = gpu("f16_row_pairs") else {
        return;
    };
    let cases = f16_flag_cases((17..=128usize).step_by(3).chain([113, 127, 128]));
    check_flag_cases(
        "f16_row_pairs_match",
        &gpu,
        "row_pairs",
        cases,
        (6700, 11),
        |i, spec| {
            let m = spec.m();
            let pairs = m.div_ceil(32) as u32;
            let mut variants = Vec::new();
            for warps in (1..=16 / pairs).map(|x| x * pairs) {
                let (stage, ldmatrix, prefetch_c, c_over_a, realign) = [
                    (Staging::FlatC, true, false, false, false),
                    (Staging::FlatC, true, false, true, true),
                    (Staging::Flat, true, true, false, false),
                    (Staging::Padded, false, false, false, false),
                ][(i + warps as usize) % 4];
                for (tba, row_group) in [(1, 2 + (i as u32 + warps) % 2), (2, 0)] {
                    variants.push(GpuSchedule {
                        stage,
                        prefetch_c,
                        c_over_a,
                        realign_in_shared: realign,
                        async_copies: realign,
                        epilogue_swaps: m % 2 == 1,
                        row_group,
                        row_pairs: true,
                        min_blocks: 1,
                        ..GpuSchedule::mma(warps, tba, ldmatrix)
                    });
                }
            }
            variants
        },
    );
}

/// A's fragments loaded at each k step of each group (`GpuSchedule::stream_a`) by warps that
/// keep one row tile or two (`row_pairs`): m from 17 to 128 in steps of 5 (odd row tile
/// counts among them), the warps a multiple of the row tiles or of the pairs, one group of
/// all a warp's column tiles and groups of 2, C in shared memory (with the epilogue swaps
/// where m is odd: the slots made just before each tile's epilogue) and in global memory
/// with the C prefetch (the slots made first), both fragment loaders; n and k off the tile
/// multiples, every transpose, alpha and beta of each kind, beta 0 with NaN in C.
#[test]
fn f16_stream_a_matches() {
    let Some(gpu) = gpu("f16_stream_a") else {
        return;
    };
    let cases = f16_flag_cases((17..=128usize).step_by(5).chain([113, 127]));
    check_flag_cases(
        "f16_stream_a_matches",
        &gpu,
        "stream_a",
        cases,
        (7700, 13),
        |i, spec| {
            let m = spec.m();
            let mt = m.div_ceil(16) as u32;
            let mut variants = Vec::new();
            for (row_pairs, warps) in [
                (false, mt),
                (true, mt.div_ceil(2)),
                (true, 2 * mt.div_ceil(2)),
            ] {
                for (stage, ldmatrix, prefetch_c, row_group) in [
                    (Staging::FlatC, true, false, 8),
                    (Staging::FlatC, true, false, 2),
                    (Staging::Flat, true, true, 8),
                    (Staging::Padded, false, false, 3),
                ] {
                    variants.push(GpuSchedule {
                        stage,
                        prefetch_c,
                        realign_in_shared: stage == Staging::FlatC && i % 2 == 0,
                        async_copies: stage == Staging::FlatC,
                        epilogue_swaps: m % 2 == 1,
                        row_group,
                        row_pairs,
                        stream_a: true,
                        min_blocks: 1,
                        ..GpuSchedule::mma(warps, 1, ldmatrix)
                    });
                }
            }
            variants
                .into_iter()
                .filter(|s| s.effective(&spec.col_major()).stream_a)
                .collect()
        },
    );
}

/// Runs on each case `(i, spec)` the schedules `variants(i, spec)` gives (those that fit),
/// against the reference, with seeds `base + i * step + count`; panics with the failures,
/// or where no schedule fits at all.
fn check_flag_cases(
    test: &str,
    gpu: &Gpu,
    what: &str,
    cases: Vec<(usize, GemmSpec)>,
    (base, step): (u64, u64),
    variants: impl Fn(usize, &GemmSpec) -> Vec<GpuSchedule>,
) {
    let mut jobs = Vec::new();
    for (i, spec) in cases {
        let p = spec.col_major();
        for s in variants(i, &spec) {
            if s.validate(&p, gpu.target()).is_err() {
                continue;
            }
            let count = jobs.len() as u64 + 1;
            jobs.push((base + i as u64 * step + count, spec, s));
        }
    }
    let failures = in_parallel(test, &jobs, |(seed, spec, s)| {
        run_f16_with(gpu, spec, *seed, Some(s)).map_err(|e| {
            let (m, n, k) = (spec.m(), spec.n(), spec.k());
            format!("{m}x{n}x{k} {s:?}: {e}")
        })
    });
    println!(
        "{} f16 {what} kernels checked, {} failed",
        jobs.len(),
        failures.len()
    );
    assert!(!jobs.is_empty(), "no {what} kernel fits");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

type Pointers = (CudaSlice<u64>, CudaSlice<u64>, CudaSlice<u64>);

fn pointer_arrays<T: GpuElement>(
    gpu: &Gpu,
    spec: &GemmSpec,
    batch: usize,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    c: &CudaSlice<T>,
) -> Result<Pointers, CudaError> {
    let elt = spec.dtype().size() as u64;
    let s = gpu.stream();
    let (ba, bb, bc) = (a.device_ptr(s).0, b.device_ptr(s).0, c.device_ptr(s).0);
    // Reverse order: pointer arrays need not follow memory order.
    let at = |base: u64, o: Operand| -> Vec<u64> {
        (0..batch)
            .rev()
            .map(|i| base + (i * spec.stride(o)) as u64 * elt)
            .collect()
    };
    let (pa, pb, pc) = (at(ba, Operand::A), at(bb, Operand::B), at(bc, Operand::C));
    Ok((
        gpu.upload_raw(&pa)?,
        gpu.upload_raw(&pb)?,
        gpu.upload_raw(&pc)?,
    ))
}

#[test]
fn pointer_arrays_match() {
    let Some(gpu) = gpu("pointer_arrays") else {
        return;
    };
    let mut failures = Vec::new();
    for (i, spec) in specs(Dtype::F64)
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
    {
        let batch = 45;
        let mut data = TestData::<f64>::new(spec, batch, 77 + i as u64);
        let (alpha, beta) = (value(spec.alpha(), 1.25), value(spec.beta(), -0.75));
        let r = (|| -> Result<(), CudaError> {
            let a = gpu.upload(&data.a)?;
            let b = gpu.upload(&data.b)?;
            let c = gpu.upload(data.c_mut())?;
            let (pa, pb, pc) = pointer_arrays(&gpu, spec, batch, &a, &b, &c)?;
            let k = gpu.kernel(spec, BatchKind::PointerArray)?;
            // SAFETY: pointers address the spec's matrices inside the uploaded buffers.
            unsafe {
                k.launch_pointer_array::<f64>(gpu.stream(), &pa, &pb, &pc, batch, alpha, beta)?
            };
            let out = gpu.download(&c)?;
            data.c_mut().copy_from_slice(&out);
            Ok(())
        })();
        if let Err(e) = r {
            failures.push(format!("{}: {e}", spec.name()));
            continue;
        }
        if let Some(f) = data.check(alpha, beta).failure {
            failures.push(format!("{}: {f}", spec.name()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn variable_size_batches_match() {
    let Some(gpu) = gpu("variable_size") else {
        return;
    };
    let mut failures = Vec::new();
    for (dtype, layout, ta, tb) in [
        (Dtype::F64, Layout::ColMajor, Trans::N, Trans::N),
        (Dtype::F64, Layout::RowMajor, Trans::T, Trans::N),
        (Dtype::F32, Layout::ColMajor, Trans::N, Trans::T),
        (Dtype::F32, Layout::RowMajor, Trans::T, Trans::T),
    ] {
        for (alpha, beta) in [
            (Scalar::One, Scalar::Zero),
            (Scalar::Runtime, Scalar::Runtime),
        ] {
            let max = 32;
            let spec = GemmSpec::builder(dtype, max, max, max)
                .layout(layout)
                .trans_a(ta)
                .trans_b(tb)
                .alpha(alpha)
                .beta(beta)
                .build()
                .unwrap();
            for packed in [false, true] {
                if let Err(e) = match dtype {
                    Dtype::F64 => variable::<f64>(&gpu, &spec, packed),
                    _ => variable::<f32>(&gpu, &spec, packed),
                } {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each problem is its own spec, checked with TestData; all run in one launch. `packed`:
/// A and B of all problems back to back in one buffer each (most not 16-byte aligned: the
/// kernels' flat 16-byte loader), and every fourth problem with leading dimensions past
/// its extents (the element-wise loader); else each matrix in its own buffer, tight.
fn variable<T: GpuElement + smallgemm::Element>(
    gpu: &Gpu,
    spec: &GemmSpec,
    packed: bool,
) -> Result<(), String> {
    let mut rng = SplitMix64::new(spec.m() as u64 + 99 + u64::from(packed));
    let (alpha, beta) = (value(spec.alpha(), 1.25), value(spec.beta(), -0.75));
    let mut problems = Vec::new();
    let mut dims = Vec::new();
    for i in 0..200 {
        let mut pick = |max: usize| 1 + (rng.next_u64() % max as u64) as usize;
        let (m, n, k) = (pick(spec.m()), pick(spec.n()), pick(spec.k()));
        let mut sub = GemmSpec::builder(spec.dtype(), m, n, k)
            .layout(spec.layout())
            .trans_a(spec.trans_a())
            .trans_b(spec.trans_b())
            .alpha(spec.alpha())
            .beta(spec.beta())
            .build()
            .unwrap();
        if packed && i % 4 == 3 {
            sub = GemmSpec::builder(spec.dtype(), m, n, k)
                .layout(spec.layout())
                .trans_a(spec.trans_a())
                .trans_b(spec.trans_b())
                .lda(sub.ld(Operand::A) + 1 + (i % 3) as usize)
                .ldb(sub.ld(Operand::B) + 2)
                .ldc(sub.ld(Operand::C) + 1)
                .alpha(spec.alpha())
                .beta(spec.beta())
                .build()
                .unwrap();
        }
        dims.extend(
            [
                m,
                n,
                k,
                sub.ld(Operand::A),
                sub.ld(Operand::B),
                sub.ld(Operand::C),
            ]
            .map(|v| v as u32),
        );
        problems.push(TestData::<T>::new(&sub, 1, 3000 + i));
    }
    cuda::check_dims(spec, &dims).map_err(|e| e.to_string())?;
    let err = |e: CudaError| format!("{}: {e}", spec.name());
    let mut bufs = Vec::new();
    for p in problems.iter_mut() {
        bufs.push((
            gpu.upload(&p.a).map_err(err)?,
            gpu.upload(&p.b).map_err(err)?,
            gpu.upload(p.c_mut()).map_err(err)?,
        ));
    }
    let s = gpu.stream();
    let mut pa: Vec<u64> = bufs.iter().map(|b| b.0.device_ptr(s).0).collect();
    let mut pb: Vec<u64> = bufs.iter().map(|b| b.1.device_ptr(s).0).collect();
    // Packed: A and B again, back to back, element offsets of any alignment.
    let mut flat = Vec::new();
    if packed {
        let elt = std::mem::size_of::<T>() as u64;
        for (i, ptrs) in [&mut pa, &mut pb].into_iter().enumerate() {
            let all: Vec<T> = problems
                .iter()
                .flat_map(|p| if i == 0 { p.a.clone() } else { p.b.clone() })
                .collect();
            let buf = gpu.upload(&all).map_err(err)?;
            let mut at = buf.device_ptr(s).0;
            for (p, ptr) in problems.iter().zip(ptrs.iter_mut()) {
                *ptr = at;
                at += elt * if i == 0 { p.a.len() } else { p.b.len() } as u64;
            }
            flat.push(buf);
        }
    }
    let pc: Vec<u64> = bufs.iter().map(|b| b.2.device_ptr(s).0).collect();
    let (da, db, dc) = (
        gpu.upload_raw(&pa).map_err(err)?,
        gpu.upload_raw(&pb).map_err(err)?,
        gpu.upload_raw(&pc).map_err(err)?,
    );
    let dd = gpu.upload_raw(&dims).map_err(err)?;
    // A second set of C matrices (the same initial values) for the bucketed launches.
    let c_init: Vec<Vec<T>> = problems.iter_mut().map(|p| p.c_mut().to_vec()).collect();
    let mut c2 = Vec::new();
    for c in &c_init {
        c2.push(gpu.upload(c).map_err(err)?);
    }
    let pc2: Vec<u64> = c2.iter().map(|c| c.device_ptr(s).0).collect();
    let buckets = gpu
        .bucket_variable(spec, &pa, &pb, &pc2, &dims)
        .map_err(err)?;
    let k = gpu.kernel(spec, BatchKind::VariableSize).map_err(err)?;
    // SAFETY: each pointer addresses its own problem's buffers, checked by check_dims.
    unsafe { k.launch_variable::<T>(s, &da, &db, &dc, &dd, problems.len(), alpha, beta) }
        .map_err(err)?;
    for (p, b) in problems.iter_mut().zip(&bufs) {
        let out = gpu.download(&b.2).map_err(err)?;
        p.c_mut().copy_from_slice(&out);
        if let Some(f) = p.check(alpha, beta).failure {
            return Err(format!(
                "{} in variable batch {}: {f}",
                p.spec.name(),
                spec.name()
            ));
        }
    }
    // The bucketed batch five times, C reset before each: issued bucket by bucket, captured
    // as a graph, replayed, then (where the scalars are run-time values) other scalars
    // issued and captured again.
    let other = |s: Scalar, v: f64, runtime: f64| if s.value().is_some() { v } else { runtime };
    let (alpha2, beta2) = (
        other(spec.alpha(), alpha, -0.5),
        other(spec.beta(), beta, 2.0),
    );
    let rounds = [(alpha, beta); 3].into_iter().chain([(alpha2, beta2); 2]);
    for (round, (a, b)) in rounds.enumerate() {
        for (c, init) in c2.iter_mut().zip(&c_init) {
            s.memcpy_htod(init, c).map_err(|e| err(e.into()))?;
        }
        // SAFETY: as above, with the second set of C matrices.
        unsafe { buckets.launch::<T>(s, a, b) }.map_err(err)?;
        for (p, c) in problems.iter_mut().zip(&c2) {
            let out = gpu.download(c).map_err(err)?;
            p.c_mut().copy_from_slice(&out);
            if let Some(f) = p.check(a, b).failure {
                return Err(format!(
                    "{} in bucketed variable batch {} ({} buckets), launch {round}: {f}",
                    p.spec.name(),
                    spec.name(),
                    buckets.buckets()
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn grouped_launches_and_streams() {
    let Some(gpu) = gpu("grouped") else {
        return;
    };
    let stream = gpu.new_stream().unwrap();
    let s1 = GemmSpec::builder(Dtype::F64, 4, 4, 4).build().unwrap();
    let s2 = GemmSpec::builder(Dtype::F64, 20, 10, 7)
        .beta(Scalar::Runtime)
        .build()
        .unwrap();
    let mut d1 = TestData::<f64>::new(&s1, 100, 1);
    let mut d2 = TestData::<f64>::new(&s2, 60, 2);
    let (a1, b1, mut c1) = (
        gpu.upload(&d1.a).unwrap(),
        gpu.upload(&d1.b).unwrap(),
        gpu.upload(d1.c_mut()).unwrap(),
    );
    let (a2, b2, mut c2) = (
        gpu.upload(&d2.a).unwrap(),
        gpu.upload(&d2.b).unwrap(),
        gpu.upload(d2.c_mut()).unwrap(),
    );
    gpu.synchronize().unwrap();
    let mut groups = [
        Group {
            spec: s1,
            a: &a1,
            b: &b1,
            c: &mut c1,
            batch: 100,
            alpha: 1.0,
            beta: 0.0,
        },
        Group {
            spec: s2,
            a: &a2,
            b: &b2,
            c: &mut c2,
            batch: 60,
            alpha: 1.0,
            beta: 0.25,
        },
    ];
    gpu.launch_grouped(&stream, &mut groups).unwrap();
    stream.synchronize().unwrap();
    d1.c_mut().copy_from_slice(&gpu.download(&c1).unwrap());
    d2.c_mut().copy_from_slice(&gpu.download(&c2).unwrap());
    assert_eq!(d1.check(1.0, 0.0).failure, None);
    assert_eq!(d2.check(1.0, 0.25).failure, None);
    // The cache compiled each spec once.
    let before = gpu.compilations();
    gpu.kernel(&s1, BatchKind::Strided).unwrap();
    assert_eq!(gpu.compilations(), before);
}

#[test]
fn misuse_is_an_error() {
    let Some(gpu) = gpu("misuse") else {
        return;
    };
    let spec = GemmSpec::builder(Dtype::F64, 4, 4, 4).build().unwrap();
    let k = gpu.kernel(&spec, BatchKind::Strided).unwrap();
    let a = gpu.upload(&[1.0f64; 32]).unwrap();
    let mut c = gpu.upload(&[1.0f64; 32]).unwrap();
    assert!(matches!(
        k.launch_strided(gpu.stream(), &a, &a, &mut c, 3, 1.0, 0.0),
        Err(CudaError::BufferTooShort { .. })
    ));
    assert!(matches!(
        k.launch_strided(gpu.stream(), &a, &a, &mut c, 2, 2.0, 0.0),
        Err(CudaError::ScalarMismatch { .. })
    ));
    let af = gpu.upload(&[1.0f32; 32]).unwrap();
    let mut cf = gpu.upload(&[1.0f32; 32]).unwrap();
    assert!(matches!(
        k.launch_strided(gpu.stream(), &af, &af, &mut cf, 2, 1.0, 0.0),
        Err(CudaError::DtypeMismatch { .. })
    ));
    assert!(k
        .launch_strided(gpu.stream(), &a, &a, &mut c, 2, 1.0, 0.0)
        .is_ok());
}

#[test]
fn no_driver_is_a_clean_error() {
    if cuda::driver_present() {
        println!("no_driver: skipped, a driver is present");
        return;
    }
    assert_eq!(Gpu::new(0).unwrap_err(), CudaError::NoDriver);
    assert_eq!(cuda::device_count(), Err(CudaError::NoDriver));
}
