//! The emulator (`emu/`) against this CPU: AVX2 kernels of both AVX2 targets (Intel's,
//! with masked stores and cross-lane permutes; AMD's, with tails of C stored in pieces), run
//! natively by the runtime and in the emulator on the same data, must leave the same bits in
//! all of C. That checks the semantics the AVX-512 kernels share with them — FMA rounding,
//! xmm/ymm writes zeroing the bits above, loads, stores, broadcasts, permutes, inserts,
//! extracts, masked moves, the flags of the loop branches — against the hardware; what only
//! AVX-512 has is checked by `emulated.rs` against the reference and the interpreter.

mod common;
mod emu;

use common::{emulate, merge, scalars, Coverage};
use smallgemm::{Element, Jit};
use smallgemm_codegen_x86::CallConv;
use smallgemm_ir::reference::{padded_spec, rectangular_shapes, TestData};
use smallgemm_ir::{BatchForm, Dtype, GemmSpec, Layout, Operand, Scalar, Schedule, Target, Trans};

const ALPHAS: [Scalar; 3] = [Scalar::One, Scalar::MinusOne, Scalar::Runtime];
const BETAS: [Scalar; 3] = [Scalar::Zero, Scalar::One, Scalar::Runtime];
const TRANS: [(Trans, Trans); 4] = [
    (Trans::N, Trans::N),
    (Trans::N, Trans::T),
    (Trans::T, Trans::N),
    (Trans::T, Trans::T),
];
const BATCHES: [usize; 4] = [1, 3, 7, 13];

/// Runs kernels both ways and compares them.
struct Compare {
    jit: Jit,
    kernels: usize,
    coverage: Coverage,
}

impl Compare {
    fn new(target: Target) -> Option<Compare> {
        match Jit::with_target(target) {
            Ok(jit) => Some(Compare {
                jit,
                kernels: 0,
                coverage: Coverage::new(),
            }),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    /// `spec` with `schedule` (the planner's when None).
    fn check(&mut self, spec: &GemmSpec, schedule: Option<&Schedule>, batch: usize, seed: u64) {
        match spec.dtype() {
            Dtype::F64 => self.check_as::<f64>(spec, schedule, batch, seed),
            _ => self.check_as::<f32>(spec, schedule, batch, seed),
        }
    }

    fn check_as<T: Element>(
        &mut self,
        spec: &GemmSpec,
        schedule: Option<&Schedule>,
        batch: usize,
        seed: u64,
    ) {
        let (jit, name) = (&self.jit, spec.name());
        let kernel = match schedule {
            Some(s) => jit.kernel_with_schedule(spec, s),
            None => jit.kernel(spec),
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut emulated = TestData::<T>::new(spec, batch, seed);
        let mut native = emulated.clone();
        // The code that runs: a batch past the L2 cache runs the streaming variant, compiled
        // from its own schedule (never with non-temporal stores for batches this small).
        let c = native.c().as_ptr().cast();
        assert!(!kernel.stores_streaming(batch, c), "{name}");
        let ran = kernel.schedule_for(batch, c);
        let generated = smallgemm::generate(spec, jit.target(), Some(&ran)).unwrap();
        if ran == *kernel.schedule() {
            assert!(generated.code == *kernel.code(), "{name}: other code");
        }
        let what = format!(
            "{name} on {} (schedule {ran:?}, batch {batch}, seed {seed})",
            jit.target(),
        );
        let (alpha, beta) = scalars(spec);
        let (alpha, beta) = (T::from_f64(alpha), T::from_f64(beta));
        let (a, b) = (native.a.clone(), native.b.clone());
        match spec.batch_form() {
            BatchForm::Strided => kernel.run(&a, &b, native.c_mut(), batch, alpha, beta),
            BatchForm::PointerArrays => {
                let offsets = native.offsets.clone();
                let (al, bl) = (
                    matrices(&a, spec.footprint(Operand::A), &offsets[0]),
                    matrices(&b, spec.footprint(Operand::B), &offsets[1]),
                );
                let mut cl = disjoint(native.c_mut(), &offsets[2], spec.footprint(Operand::C));
                kernel.run_pointers(&al, &bl, &mut cl, alpha, beta)
            }
        }
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let trace = emulate(
            spec,
            &generated.program,
            &generated.code,
            CallConv::SysV,
            &mut emulated,
        )
        .unwrap_or_else(|e| {
            let listing = smallgemm_codegen_x86::listing(&generated.code);
            panic!("{what}: {e}\n{listing}")
        });
        let mismatch = emulated
            .c()
            .iter()
            .zip(native.c())
            .position(|(x, y)| x.bits() != y.bits());
        if let Some(i) = mismatch {
            panic!(
                "{what}: the emulator and this CPU differ at C element {i}: {} vs {}",
                emulated.c()[i],
                native.c()[i]
            );
        }
        merge(&mut self.coverage, &trace);
        self.kernels += 1;
    }
}

/// The matrices at element offsets `at` of `x`, `len` elements each.
fn matrices<'a, T>(x: &'a [T], len: usize, at: &[usize]) -> Vec<&'a [T]> {
    at.iter().map(|&i| &x[i..i + len]).collect()
}

/// The matrices of C at element offsets `at`, `len` elements each, as separate slices.
fn disjoint<'a, T>(mut c: &'a mut [T], at: &[usize], len: usize) -> Vec<&'a mut [T]> {
    let mut order: Vec<usize> = (0..at.len()).collect();
    order.sort_by_key(|&i| at[i]);
    let mut slots: Vec<Option<&'a mut [T]>> = (0..at.len()).map(|_| None).collect();
    let mut here = 0;
    for i in order {
        let (_, rest) = std::mem::take(&mut c).split_at_mut(at[i] - here);
        let (matrix, rest) = rest.split_at_mut(len);
        slots[i] = Some(matrix);
        c = rest;
        here = at[i] + len;
    }
    slots.into_iter().map(Option::unwrap).collect()
}

/// A spread of kernels on `target`: the planned kernels of every square size and an eighth
/// of the rectangular shapes, 128-bit vectors, lane-packed kernels, B-resident blocks,
/// prefetching and streaming variants, pointer arrays, other scalar kinds.
fn spread(target: Target) -> Option<Compare> {
    let mut cmp = Compare::new(target)?;
    let mut seed = 700_000;
    let squares = (1..=32).map(|n| (n, n, n));
    let shapes: Vec<_> = squares
        .chain(rectangular_shapes().into_iter().step_by(8))
        .collect();
    for (i, &shape) in shapes.iter().enumerate() {
        for dtype in [Dtype::F64, Dtype::F32] {
            seed += 1;
            let j = i + dtype.size();
            let (trans, alpha, beta) = (TRANS[j % 4], ALPHAS[j % 3], BETAS[(j / 3) % 3]);
            let layout = if j % 5 == 0 {
                Layout::RowMajor
            } else {
                Layout::ColMajor
            };
            let spec = padded_spec(dtype, layout, shape, trans, alpha, beta, j % 3);
            let batch = BATCHES[j % 4];
            cmp.check(&spec, None, batch, seed);
            let problem = spec.col_major();
            let planned = smallgemm_ir::plan(&problem, target);
            // The same blocks in 128-bit vectors, with B in registers, prefetching, and the
            // streaming variant.
            let variants = [
                Schedule {
                    vector_bytes: 16,
                    ..planned
                },
                Schedule {
                    b_resident: true,
                    ..planned
                },
                Schedule {
                    prefetch: true,
                    ..planned
                },
                smallgemm_ir::plan_streaming(&problem, target, &planned),
            ];
            for (v, s) in variants.iter().enumerate() {
                // A fourth of the shapes for each, the squares all.
                if (i < 32 || (i + v) % 4 == 0) && s.validate(&problem, target).is_ok() {
                    cmp.check(&spec, Some(s), batch, seed);
                }
            }
        }
    }
    // Lane-packed kernels at both widths, one to three vector groups a trip (f64 ones only
    // where cross-lane permutes are not slow).
    for dtype in [Dtype::F64, Dtype::F32] {
        for (side, depth) in [(2, 2), (4, 4), (4, 8), (4, 12)] {
            for (alpha, beta) in [
                (Scalar::One, Scalar::Zero),
                (Scalar::Runtime, Scalar::Runtime),
            ] {
                let spec = GemmSpec::builder(dtype, side, side, depth)
                    .alpha(alpha)
                    .beta(beta)
                    .build()
                    .unwrap();
                let problem = spec.col_major();
                let Some((_, packed)) = smallgemm_ir::lane_pack::plan(&problem, target) else {
                    continue;
                };
                for &vector_bytes in target.vector_widths() {
                    for batch_unroll in [0, 2, 3] {
                        let s = Schedule {
                            vector_bytes,
                            batch_unroll,
                            ..packed
                        };
                        if s.validate(&problem, target).is_ok() {
                            seed += 1;
                            cmp.check(&spec, Some(&s), [5, 13][seed as usize % 2], seed);
                        }
                    }
                }
            }
        }
    }
    // Pointer arrays and other scalar kinds.
    for (shape, alpha, beta) in [
        ((5, 3, 4), Scalar::Runtime, Scalar::Runtime),
        ((9, 7, 5), Scalar::One, Scalar::Zero),
        ((17, 9, 8), Scalar::Zero, Scalar::One),
        (
            (12, 12, 12),
            Scalar::fixed(0.75).unwrap(),
            Scalar::fixed(-2.5).unwrap(),
        ),
        ((33, 5, 8), Scalar::MinusOne, Scalar::MinusOne),
    ] {
        for dtype in [Dtype::F64, Dtype::F32] {
            seed += 1;
            let builder = GemmSpec::builder(dtype, shape.0, shape.1, shape.2)
                .trans_a(TRANS[seed as usize % 4].0)
                .alpha(alpha)
                .beta(beta);
            cmp.check(&builder.pointer_arrays().build().unwrap(), None, 5, seed);
            cmp.check(&builder.build().unwrap(), None, 3, seed);
        }
    }
    Some(cmp)
}

/// Intel's AVX2 target: masked loads and stores of tails through vmaskmov, lane-packed f64
/// through vpermpd ymm.
#[test]
fn avx2_kernels_match_the_hardware() {
    let Some(cmp) = spread(Target::AVX2) else {
        return;
    };
    eprintln!("{} kernels on {}", cmp.kernels, Target::AVX2);
    assert!(cmp.kernels >= 300, "{}", cmp.kernels);
    for form in [
        "vmaskmovpd ymm",
        "vmaskmovpd store ymm",
        "vmaskmovps ymm",
        "vmaskmovps store ymm",
        "vmaskmovps xmm",
        "vpermpd ymm",
        "vpermilps ymm",
        "vpermilps xmm",
        "vbroadcastf128 ymm",
        "vinsertf128 ymm",
        "vbroadcastsd ymm",
        "vbroadcastss ymm",
        "vbroadcastss xmm",
        "vmovddup xmm",
        "vmovdqu ymm",
        "vfmadd231pd ymm",
        "vfmadd231ps xmm",
        "vfnmadd231pd ymm",
        "vfnmadd231ps ymm",
        "vmulpd ymm",
        "vaddps ymm",
        "vsubpd",
        "vmovsd xmm",
        "vmovss store xmm",
        "prefetcht0",
    ] {
        assert!(
            cmp.coverage.keys().any(|f| f.starts_with(form)),
            "no {form} executed: {:?}",
            cmp.coverage
        );
    }
}

/// AMD's: tails of C stored in pieces (vextractf128, vextractps, vmovsd, vmovss), no
/// lane-packed f64.
#[test]
fn avx2_amd_kernels_match_the_hardware() {
    let Some(cmp) = spread(Target::AVX2_AMD) else {
        return;
    };
    eprintln!("{} kernels on {}", cmp.kernels, Target::AVX2_AMD);
    assert!(cmp.kernels >= 300, "{}", cmp.kernels);
    for form in [
        "vextractf128 ymm",
        "vextractps store",
        "vmovsd store xmm",
        "vmovss store xmm",
        "vmovupd store xmm",
        "vmovups store xmm",
        "vmaskmovpd ymm",
    ] {
        assert!(
            cmp.coverage.keys().any(|f| f.starts_with(form)),
            "no {form} executed: {:?}",
            cmp.coverage
        );
    }
}
