//! The AVX-512 correctness matrix, executed in an x86-64 emulator (`emu/`), so that it runs
//! on machines without AVX-512 (`jit-runtime/tests/correctness.rs` skips it there): every
//! kernel against the double-double reference with sentinels in and around C, NaN in C when
//! beta = 0, bit-for-bit agreement with the `Program` interpreter, the calling convention,
//! and every memory access inside A, B, C, the pointer arrays or the stack. The same
//! shapes, transposes, scalar kinds, padding, gaps and batch lengths as the hardware matrix,
//! plus AVX-512's own paths (dot-product tails, lane packing with full permutes, streaming
//! variants, non-temporal stores, narrow vectors), on Intel's target and on Zen 4's
//! (`Target::AVX512_HALVES`), whose kernels run where their code differs from Intel's.

mod common;
mod emu;

use common::{merge, Case, Coverage};
use smallgemm_codegen_x86::CallConv;
use smallgemm_ir::reference::{
    dot_tail_cases, dot_tail_schedules, lane_packed_specs, padded_spec, rectangular_cases,
    square_cases, variant_cases, MatrixCase, MATRIX_ALPHAS, MATRIX_BATCHES, MATRIX_BETAS,
    MATRIX_TRANS,
};
use smallgemm_ir::{Dtype, GemmSpec, Layout, Scalar, Schedule, Target, Trans};

const TARGETS: [Target; 2] = [Target::AVX512, Target::AVX512_HALVES];

/// Runs cases on both AVX-512 targets, counting the kernels and the instruction forms.
#[derive(Default)]
struct Runner {
    /// Kernel runs per target of `TARGETS` (a kernel may run on several batches).
    kernels: [usize; 2],
    /// Zen 4 kernels not run because their code is Intel's, byte for byte.
    same_code: usize,
    coverage: Coverage,
}

impl Runner {
    /// Checks the case `case(target)` gives on each target (None: not on that one), all on
    /// the same data.
    fn run(&mut self, case: impl Fn(Target) -> Option<Case>, batch: usize, seed: u64) {
        // The first target's code and the bits of C it left, which passed the reference.
        let mut first: Option<(Vec<u8>, Vec<u64>)> = None;
        for (t, &target) in TARGETS.iter().enumerate() {
            let Some(case) = case(target) else { continue };
            let compiled = case.compile();
            if first
                .as_ref()
                .is_some_and(|(code, _)| *code == compiled.2.bytes)
            {
                self.same_code += 1;
                continue;
            }
            let checked = first.as_ref().map(|(_, c)| c.as_slice());
            let (trace, c) = case.check_compiled(&compiled, batch, seed, checked);
            merge(&mut self.coverage, &trace);
            first.get_or_insert((compiled.2.bytes, c));
            self.kernels[t] += 1;
        }
    }

    /// `spec` with the planner's schedule.
    fn planned(&mut self, spec: GemmSpec, batch: usize, seed: u64) {
        self.run(|target| Some(Case::new(spec, target)), batch, seed);
    }

    /// Prints the counts; checks that at least `min` kernels ran on Intel's target and that
    /// each of `forms` executed (a form name starts with one of them).
    fn finish(&self, name: &str, min: usize, forms: &[&str]) {
        eprintln!(
            "{name}: {} runs on {}, {} on {} ({} more with the same code)",
            self.kernels[0], TARGETS[0], self.kernels[1], TARGETS[1], self.same_code
        );
        assert!(self.kernels[0] >= min, "{name}: {:?}", self.kernels);
        for form in forms {
            assert!(
                self.coverage.keys().any(|f| f.starts_with(form)),
                "{name}: no {form} executed: {:?}",
                self.coverage
            );
        }
    }
}

/// Every square size 1..=32 with every transpose and alpha/beta combination.
fn squares(dtype: Dtype) -> Runner {
    let mut runner = Runner::default();
    for case in square_cases(dtype) {
        runner.planned(case.spec, case.batch, case.seed);
    }
    runner
}

#[test]
fn squares_f64() {
    squares(Dtype::F64).finish(
        "squares f64",
        32 * 36,
        &[
            "vmovupd zmm {k}{z}",
            "vmovupd store zmm {k}",
            "vfmadd231pd zmm {1toN}",
            "vfnmadd231pd",
        ],
    );
}

#[test]
fn squares_f32() {
    squares(Dtype::F32).finish(
        "squares f32",
        32 * 36,
        &[
            "vmovups zmm {k}{z}",
            "vmovups store zmm {k}",
            "vfmadd231ps zmm {1toN}",
        ],
    );
}

fn rectangular(dtype: Dtype) -> Runner {
    let mut runner = Runner::default();
    for case in rectangular_cases(dtype) {
        runner.planned(case.spec, case.batch, case.seed);
    }
    runner
}

#[test]
fn rectangular_f64() {
    rectangular(Dtype::F64).finish("rectangular f64", 325 * 4, &["vmovupd store zmm {k}"]);
}

#[test]
fn rectangular_f32() {
    rectangular(Dtype::F32).finish("rectangular f32", 325 * 4, &["vmovups store zmm {k}"]);
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
    let mut runner = Runner::default();
    let mut seed = 50_000;
    for (alpha, beta) in others {
        for shape in [(1, 1, 1), (9, 4, 3), (17, 17, 17), (33, 5, 8)] {
            for trans in MATRIX_TRANS {
                seed += 1;
                let spec = padded_spec(Dtype::F64, Layout::ColMajor, shape, trans, alpha, beta, 1);
                runner.planned(spec, 3, seed);
                let spec = padded_spec(Dtype::F32, Layout::RowMajor, shape, trans, alpha, beta, 2);
                runner.planned(spec, 3, seed);
            }
        }
    }
    runner.finish("other scalar kinds", 6 * 4 * 4 * 2, &["vsubp", "vaddp"]);
}

/// Shapes above 64, up to 256 in every dimension: blocks and k become loops, scratch
/// panels grow past the immediate offsets of loads and stores.
#[test]
fn large_shapes() {
    let mut runner = Runner::default();
    let mut seed = 90_000;
    for (shape, trans) in [
        ((256, 256, 256), (Trans::N, Trans::N)),
        ((256, 256, 256), (Trans::T, Trans::T)),
        ((129, 200, 97), (Trans::T, Trans::N)),
        ((100, 3, 256), (Trans::N, Trans::T)),
        ((3, 250, 130), (Trans::N, Trans::N)),
    ] {
        seed += 1;
        let (rt, one, zero) = (Scalar::Runtime, Scalar::One, Scalar::Zero);
        let spec = padded_spec(Dtype::F64, Layout::ColMajor, shape, trans, rt, rt, 1);
        runner.planned(spec, 2, seed);
        let spec = padded_spec(Dtype::F32, Layout::RowMajor, shape, trans, one, zero, 2);
        runner.planned(spec, 2, seed);
    }
    runner.finish("large shapes", 10, &["vfmadd231pd zmm", "vfmadd231ps zmm"]);
}

/// Batch strides of 0 reuse one A or B for every matrix; a batch of 0 runs nothing.
#[test]
fn zero_strides_and_empty_batches() {
    let mut runner = Runner::default();
    let spec = GemmSpec::builder(Dtype::F64, 7, 5, 3)
        .stride_a(0)
        .beta(Scalar::One)
        .build()
        .unwrap();
    runner.planned(spec, 5, 7);
    let spec = GemmSpec::builder(Dtype::F32, 7, 5, 3)
        .stride_b(0)
        .build()
        .unwrap();
    runner.planned(spec, 5, 8);
    runner.planned(spec, 0, 9);
    runner.finish("zero strides", 3, &[]);
}

/// Pointer-array batches: the kernel loads each matrix's address from the arrays.
#[test]
fn pointer_arrays() {
    let mut runner = Runner::default();
    let mut seed = 70_000;
    for (shape, trans) in [
        ((5, 3, 4), (Trans::N, Trans::N)),
        ((9, 7, 5), (Trans::T, Trans::N)),
        ((12, 12, 12), (Trans::N, Trans::N)),
        ((16, 16, 16), (Trans::N, Trans::T)),
        ((17, 9, 8), (Trans::N, Trans::T)),
        ((100, 40, 90), (Trans::T, Trans::T)),
    ] {
        for (alpha, beta) in [
            (Scalar::Runtime, Scalar::Runtime),
            (Scalar::One, Scalar::Zero),
            (Scalar::Zero, Scalar::One),
        ] {
            seed += 1;
            let spec = |dtype, layout| {
                GemmSpec::builder(dtype, shape.0, shape.1, shape.2)
                    .layout(layout)
                    .trans_a(trans.0)
                    .trans_b(trans.1)
                    .alpha(alpha)
                    .beta(beta)
                    .pointer_arrays()
                    .build()
                    .unwrap()
            };
            for batch in [1, 5] {
                runner.planned(spec(Dtype::F64, Layout::ColMajor), batch, seed);
                runner.planned(spec(Dtype::F32, Layout::RowMajor), batch + 2, seed);
            }
        }
    }
    runner.finish("pointer arrays", 6 * 3 * 4, &[]);
}

/// Dot-product tails (`Schedule::dot_tail`): C's last rows as dot products summed across
/// lanes by transpose-adds (vshuff32x4 / vshuff64x2, vshufps / vshufpd), with m one or two
/// more than a multiple of the lanes (m = 1 and 2 too), k below, at and past a vector, n
/// past the lanes; the planned blocks for the other rows and a looped, batch-unrolled,
/// prefetching form; every alpha and beta kind, A transposed or not, padding.
#[test]
fn dot_product_tails() {
    let mut runner = Runner::default();
    for case in dot_tail_cases() {
        let schedules = |target| {
            let (planned, _) = smallgemm_ir::compile_program(&case.spec, target, None).unwrap();
            dot_tail_schedules(planned)
        };
        for i in 0..2 {
            runner.run(
                |t| Some(Case::new(case.spec, t).schedule(schedules(t)[i])),
                case.batch,
                case.seed,
            );
        }
    }
    runner.finish(
        "dot-product tails",
        10 * 13 * 2,
        &[
            "vshuff32x4 zmm",
            "vshuff64x2 zmm",
            "vshufps zmm",
            "vshufpd zmm",
        ],
    );
}

/// Lane-packed kernels (2x2x2, 3x3x3 and 4x4xk, `Schedule::lane_pack`): every vector width
/// they run at, one to three vector groups per trip, batch lengths that leave every
/// remainder, each scalar kind, row-major specs, and gaps between the matrices wherever one
/// vector holds at most one matrix. 3x3x3 permutes across the whole vector (vpermps /
/// vpermpd by indices zero-extended from constants after the code).
#[test]
fn lane_packed_kernels() {
    let mut runner = Runner::default();
    let mut seed = 300_000;
    for spec in lane_packed_specs() {
        let problem = spec.col_major();
        for &width in Target::AVX512.vector_widths() {
            for batch_unroll in [0, 2, 3] {
                let schedule = |target| {
                    let (_, packed) = smallgemm_ir::lane_pack::plan(&problem, target)?;
                    let s = Schedule {
                        vector_bytes: width,
                        batch_unroll,
                        ..packed
                    };
                    s.validate(&problem, target).ok().map(|_| s)
                };
                for batch in [1, 2, 3, 5, 8, 13, 17] {
                    seed += 1;
                    let case = |t| Some(Case::new(spec, t).schedule(schedule(t)?));
                    runner.run(case, batch, seed);
                }
            }
        }
    }
    // 230 kernels (as the hardware test counts them), 7 batch lengths each.
    runner.finish(
        "lane-packed kernels",
        230 * 7,
        &[
            "vpermps zmm",
            "vpermpd zmm",
            "vpmovzxbd zmm",
            "vpmovzxbq zmm",
            "vpermilps",
            "vbroadcastf32x4",
            "vbroadcastf64x4",
            "vinsertf32x4",
            "vinsertf64x4",
        ],
    );
}

/// The variants that run batches streaming from memory: the planned schedule prefetching
/// the next matrices, and `plan_streaming`'s (blocks as tall as m, lane-packed shapes in
/// plain blocks): every square size and a fifth of the rectangular shapes.
#[test]
fn streaming_variants() {
    let mut runner = Runner::default();
    for MatrixCase { spec, batch, seed } in variant_cases() {
        let planned = |target| {
            smallgemm_ir::compile_program(&spec, target, None)
                .unwrap()
                .0
        };
        let prefetching = |target| Schedule {
            prefetch: true,
            ..planned(target)
        };
        let streaming =
            |target| smallgemm_ir::plan_streaming(&spec.col_major(), target, &planned(target));
        runner.run(
            |t| Some(Case::new(spec, t).schedule(prefetching(t))),
            batch,
            seed,
        );
        runner.run(
            |t| Some(Case::new(spec, t).schedule(streaming(t))),
            batch,
            seed,
        );
    }
    runner.finish("streaming variants", 2 * 2 * 97, &["prefetcht0"]);
}

/// Non-temporal stores of C (`smallgemm_ir::stream_store`): every kernel whose stores of C
/// can all be whole aligned vectors, at every vector width, prefetching or not, with C
/// aligned to the vector width in the emulated memory (a misaligned vmovntpd/ps fails), and
/// an sfence before the return.
#[test]
fn streaming_stores() {
    let mut runner = Runner::default();
    let mut seed = 400_000;
    let specs = [
        (Dtype::F64, (4, 4, 5), Layout::ColMajor),
        (Dtype::F64, (8, 8, 8), Layout::ColMajor),
        (Dtype::F64, (16, 16, 16), Layout::ColMajor),
        (Dtype::F64, (24, 24, 5), Layout::ColMajor),
        (Dtype::F64, (32, 32, 32), Layout::ColMajor),
        (Dtype::F64, (16, 8, 4), Layout::RowMajor),
        (Dtype::F64, (2, 2, 2), Layout::ColMajor),
        (Dtype::F32, (8, 8, 5), Layout::ColMajor),
        (Dtype::F32, (16, 16, 16), Layout::ColMajor),
        (Dtype::F32, (12, 12, 12), Layout::ColMajor),
        (Dtype::F32, (24, 24, 5), Layout::ColMajor),
        (Dtype::F32, (32, 32, 32), Layout::ColMajor),
        (Dtype::F32, (4, 4, 4), Layout::ColMajor),
    ];
    for (dtype, (m, n, k), layout) in specs {
        for (alpha, trans) in [
            (Scalar::Runtime, (Trans::N, Trans::N)),
            (Scalar::MinusOne, (Trans::T, Trans::T)),
        ] {
            let spec = GemmSpec::builder(dtype, m, n, k)
                .layout(layout)
                .trans_a(trans.0)
                .trans_b(trans.1)
                .alpha(alpha)
                .beta(Scalar::Zero)
                .build()
                .unwrap();
            let problem = spec.col_major();
            for &vector_bytes in Target::AVX512.vector_widths() {
                for prefetch in [false, true] {
                    seed += 1;
                    let case = |target| {
                        let planned = smallgemm_ir::plan(&problem, target);
                        let s = Schedule {
                            vector_bytes,
                            prefetch,
                            ..planned
                        };
                        s.validate(&problem, target).ok()?;
                        let mut program = smallgemm_ir::lower(&problem, target, &s).ok()?;
                        smallgemm_ir::stream_store::apply(&mut program).then_some(())?;
                        Some(Case {
                            stream_store: true,
                            ..Case::new(spec, target).schedule(s)
                        })
                    };
                    runner.run(case, MATRIX_BATCHES[seed as usize % 4], seed);
                }
            }
        }
    }
    runner.finish(
        "streaming stores",
        40,
        &[
            "vmovntpd store zmm",
            "vmovntps store zmm",
            "vmovntpd store ymm",
            "vmovntps store xmm",
            "sfence",
        ],
    );
}

/// Narrower vectors than zmm (`Schedule::vector_bytes` 16 and 32: EVEX xmm/ymm forms, the
/// registers above 15 included) and register blocks with a masked tail too wide for C to
/// fit in the free registers: every square size at each width, and the wide tails with
/// every scalar kind.
#[test]
fn narrow_vectors_and_wide_tails() {
    let mut runner = Runner::default();
    let mut seed = 140_000;
    for n in 1..=32 {
        for dtype in [Dtype::F64, Dtype::F32] {
            let i = n + dtype.size();
            let (trans, alpha, beta) = (
                MATRIX_TRANS[i % 4],
                MATRIX_ALPHAS[i % 3],
                MATRIX_BETAS[(i / 3) % 3],
            );
            let spec = padded_spec(
                dtype,
                Layout::ColMajor,
                (n, n, n),
                trans,
                alpha,
                beta,
                n % 3,
            );
            for vector_bytes in [16, 32] {
                seed += 1;
                let schedule = |target| {
                    let planned = smallgemm_ir::plan(&spec.col_major(), target);
                    let s = Schedule {
                        vector_bytes,
                        lane_pack: false,
                        dot_tail: false,
                        ..planned
                    };
                    s.validate(&spec.col_major(), target).ok().map(|_| s)
                };
                let case = |t| Some(Case::new(spec, t).schedule(schedule(t)?));
                runner.run(case, MATRIX_BATCHES[n % 4], seed);
            }
        }
    }
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
    let cases = [
        (Dtype::F32, 28, 30, 9, wide(2, 14)),
        (Dtype::F32, 18, 25, 7, wide(2, 12)),
        (Dtype::F64, 13, 26, 5, wide(2, 12)),
        (Dtype::F64, 23, 13, 6, wide(3, 8)),
    ];
    let scalars = MATRIX_ALPHAS
        .into_iter()
        .flat_map(|alpha| MATRIX_BETAS.map(|beta| (alpha, beta)))
        .chain([
            (Scalar::fixed(2.5).unwrap(), Scalar::MinusOne),
            (Scalar::Runtime, Scalar::fixed(-0.5).unwrap()),
            (Scalar::MinusOne, Scalar::MinusOne),
        ]);
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
            runner.run(
                |t| Some(Case::new(spec, t).schedule(s)),
                MATRIX_BATCHES[i % 4],
                seed,
            );
        }
    }
    runner.finish(
        "narrow vectors and wide tails",
        2 * 2 * 28 + 12 * 4,
        &[
            "vmovupd xmm",
            "vmovupd ymm",
            "vmovups xmm",
            "vmovups ymm",
            "vfmadd231pd ymm",
            "vfmadd231ps xmm",
        ],
    );
}

/// The Microsoft x64 convention: arguments in rcx, rdx, r8, r9, the scalars on the stack,
/// rdi, rsi and xmm6–xmm15 callee-saved (the kernels use most of the 32 registers, so they
/// save and restore the ten).
#[test]
fn microsoft_x64_convention() {
    let mut runner = Runner::default();
    let mut seed = 500_000;
    let shapes = [
        (1, 1, 1),
        (7, 5, 3),
        (16, 16, 16),
        (17, 9, 20),
        (33, 31, 9),
        (4, 4, 8),
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        for dtype in [Dtype::F64, Dtype::F32] {
            for (alpha, beta) in [
                (Scalar::Runtime, Scalar::Runtime),
                (Scalar::One, Scalar::Runtime),
                (Scalar::MinusOne, Scalar::Zero),
            ] {
                seed += 1;
                let spec = padded_spec(
                    dtype,
                    Layout::ColMajor,
                    shape,
                    MATRIX_TRANS[i % 4],
                    alpha,
                    beta,
                    i % 3,
                );
                let case = |t| {
                    Some(Case {
                        conv: CallConv::Win64,
                        ..Case::new(spec, t)
                    })
                };
                runner.run(case, MATRIX_BATCHES[i % 4], seed);
                // Tight, so that lane-packed and pointer-array kernels come too.
                let builder = GemmSpec::builder(dtype, shape.0, shape.1, shape.2)
                    .alpha(alpha)
                    .beta(beta);
                for spec in [
                    builder.build().unwrap(),
                    builder.pointer_arrays().build().unwrap(),
                ] {
                    let case = |t| {
                        Some(Case {
                            conv: CallConv::Win64,
                            ..Case::new(spec, t)
                        })
                    };
                    runner.run(case, 5, seed);
                }
            }
        }
    }
    runner.finish("microsoft x64", 6 * 2 * 3 * 3, &["vmovdqu store xmm"]);
}

/// The emulator itself: instruction semantics on hand-assembled snippets, with the expected
/// values written out from the Intel SDM's definitions, and the checks that make kernels
/// fail (memory outside the regions, read-only operands, callee-saved registers, the
/// caller's frame, alignment and fencing of non-temporal stores, unsupported forms).
mod emulator {
    use crate::common::{run_emulated, Call};
    use crate::emu::{Cpu, Machine, Memory, Region, Zmm, RSP};
    use iced_x86::code_asm::*;
    use smallgemm_codegen_x86::CallConv;
    use smallgemm_ir::{Dtype, GemmSpec, MachineCode, Scalar, Target};

    const CODE: u64 = 0x1000;
    const RETURN: u64 = 0xdead_0000;
    const STACK_END: u64 = 0x9000;

    type Asm = dyn Fn(&mut CodeAssembler) -> Result<(), IcedError>;

    fn assemble(asm: &Asm) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        asm(&mut a).unwrap();
        a.ret().unwrap();
        a.assemble(CODE).unwrap()
    }

    /// Runs `asm` then `ret` on `cpu` over `regions` (and a stack).
    fn run(asm: &Asm, mut cpu: Cpu, regions: Vec<Region>) -> Result<(Cpu, Memory), String> {
        let code = assemble(asm);
        let machine = Machine::new(&code, code.len(), CODE)?;
        let mut memory = Memory::new(regions);
        let mut stack = vec![0; 0x100];
        stack[0xF0..0xF8].copy_from_slice(&RETURN.to_le_bytes());
        memory.regions.push(Region {
            name: "the stack",
            base: STACK_END - 0x100,
            bytes: stack,
            writable: true,
        });
        cpu.gpr[RSP] = STACK_END - 0x10;
        machine.run(&mut cpu, &mut memory, RETURN, 1000)?;
        Ok((cpu, memory))
    }

    fn region(name: &'static str, base: u64, bytes: Vec<u8>, writable: bool) -> Region {
        Region {
            name,
            base,
            bytes,
            writable,
        }
    }

    fn pd(x: [f64; 8]) -> Zmm {
        x.map(f64::to_bits)
    }

    fn dwords(x: [u32; 16]) -> Zmm {
        std::array::from_fn(|i| x[2 * i] as u64 | (x[2 * i + 1] as u64) << 32)
    }

    fn as_dwords(z: &Zmm) -> [u32; 16] {
        std::array::from_fn(|i| (z[i / 2] >> (32 * (i % 2))) as u32)
    }

    fn f64_bytes(x: &[f64]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A CPU whose registers hold `junk` everywhere.
    fn junk_cpu() -> Cpu {
        let mut cpu = Cpu::default();
        for (n, z) in cpu.zmm.iter_mut().enumerate() {
            *z = [0x7ff8_dead_0000_0000 | n as u64; 8];
        }
        cpu
    }

    /// Merge masking keeps the disabled lanes, zeroing clears them; xmm and ymm results
    /// clear everything above them, VEX and EVEX alike.
    #[test]
    fn masks_and_upper_bits() {
        let mut cpu = junk_cpu();
        cpu.zmm[1] = pd([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        cpu.zmm[2] = pd([10.0; 8]);
        cpu.k[1] = 0b1010_0101;
        let old = cpu.zmm[0];
        let (cpu, _) = run(
            &|a| {
                a.vaddpd(zmm0.k1(), zmm1, zmm2)?;
                a.vaddpd(zmm3.k1().z(), zmm1, zmm2)?;
                a.vaddpd(xmm4, xmm1, xmm2)?;
                a.vxorps(xmm5, xmm5, xmm5)?;
                a.vmovupd(zmm6, zmm1)?;
                a.vfmadd231pd(zmm6.k1().z(), zmm1, zmm2)?;
                // EVEX forms of xmm and ymm.
                a.set_prefer_vex(false);
                a.vaddpd(ymm20, ymm1, ymm2)?;
                a.vmulps(xmm21, xmm1, xmm2)
            },
            cpu,
            vec![],
        )
        .unwrap();
        let lanes = |z: &Zmm| z.map(f64::from_bits);
        let sum = |x: f64| x.to_bits();
        let merged = [
            sum(11.0),
            old[1],
            sum(13.0),
            old[3],
            old[4],
            sum(16.0),
            old[6],
            sum(18.0),
        ];
        assert_eq!(cpu.zmm[0], merged);
        assert_eq!(
            lanes(&cpu.zmm[3]),
            [11.0, 0.0, 13.0, 0.0, 0.0, 16.0, 0.0, 18.0]
        );
        assert_eq!(
            lanes(&cpu.zmm[4]),
            [11.0, 12.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(
            lanes(&cpu.zmm[20]),
            [11.0, 12.0, 13.0, 14.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(cpu.zmm[21][2..], [0; 6]);
        assert_eq!(cpu.zmm[5], [0; 8]);
        // x * 10 + x where enabled, else zero.
        let fma = [11.0, 0.0, 33.0, 0.0, 0.0, 66.0, 0.0, 88.0];
        assert_eq!(lanes(&cpu.zmm[6]), fma);
    }

    /// Fused multiply-adds round once: (1 + 2^-30)(1 - 2^-30) - 1 is -2^-60, not the 0 of a
    /// rounded product; vfnmadd231 negates the product.
    #[test]
    fn fused_multiply_add_rounds_once() {
        let e = 2f64.powi(-30);
        let mut cpu = junk_cpu();
        cpu.zmm[1] = pd([1.0 + e; 8]);
        cpu.zmm[2] = pd([1.0 - e; 8]);
        cpu.zmm[0] = pd([-1.0; 8]);
        cpu.zmm[3] = pd([1.0; 8]);
        let f = 2f32.powi(-13);
        cpu.zmm[4] = dwords([(1.0 + f).to_bits(); 16]);
        cpu.zmm[5] = dwords([(1.0 - f).to_bits(); 16]);
        cpu.zmm[6] = dwords([(-1f32).to_bits(); 16]);
        let (cpu, _) = run(
            &|a| {
                a.vfmadd231pd(zmm0, zmm1, zmm2)?;
                a.vfnmadd231pd(ymm3, ymm1, ymm2)?;
                a.vfmadd231ps(zmm6, zmm4, zmm5)
            },
            cpu,
            vec![],
        )
        .unwrap();
        assert_eq!(cpu.zmm[0], pd([-(e * e); 8]));
        assert_eq!(cpu.zmm[3][..4], pd([e * e; 8])[..4]);
        assert_eq!(cpu.zmm[3][4..], [0; 4]);
        assert_eq!(as_dwords(&cpu.zmm[6]), [(-(f * f)).to_bits(); 16]);
    }

    /// Masked loads read only their enabled lanes (no fault past the region for disabled
    /// ones), masked stores write only theirs, broadcasts read one element; AVX2's
    /// vmaskmov masks by each lane's sign bit.
    #[test]
    fn masked_memory_and_broadcasts() {
        let a = region("A", 0x10_0000, f64_bytes(&[1.0, 2.0, 3.0]), false);
        let c = region("C", 0x20_0000, f64_bytes(&[-9.0; 8]), true);
        let mut cpu = junk_cpu();
        cpu.gpr[7] = 0x10_0000;
        cpu.gpr[6] = 0x20_0000;
        cpu.k[2] = 0b111;
        cpu.k[3] = 0b1000_0110;
        cpu.zmm[9] = pd([5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        // Lanes 1 and 2 by their sign bits; lane 3, past A, is not read.
        cpu.zmm[10] = [0, !0, 1 << 63, 1 << 62, 0, 0, 0, 0];
        let asm = |a: &mut CodeAssembler| {
            a.vmovupd(zmm0.k2().z(), zmmword_ptr(rdi))?;
            a.vmovupd(zmmword_ptr(rsi).k3(), zmm9)?;
            a.vbroadcastsd(zmm1, qword_ptr(rdi + 16))?;
            a.vfmadd231pd(zmm9, zmm9, qword_bcst(rdi + 8))?;
            a.vmaskmovpd(ymm2, ymm10, ymmword_ptr(rdi))?;
            a.vmaskmovpd(ymmword_ptr(rsi), ymm10, ymm9)
        };
        let (cpu, memory) = run(&asm, cpu, vec![a.clone(), c.clone()]).unwrap();
        let lanes = |z: &Zmm| z.map(f64::from_bits);
        assert_eq!(lanes(&cpu.zmm[0]), [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(lanes(&cpu.zmm[1]), [3.0; 8]);
        let fma = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0].map(|x: f64| x.mul_add(2.0, x));
        assert_eq!(lanes(&cpu.zmm[9]), fma);
        assert_eq!(lanes(&cpu.zmm[2]), [0.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let stored: Vec<f64> = memory
            .region("C")
            .unwrap()
            .bytes
            .chunks(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(stored, [-9.0, fma[1], fma[2], -9.0, -9.0, -9.0, -9.0, 12.0]);
        // One more enabled lane reads past A.
        let mut cpu = junk_cpu();
        cpu.gpr[7] = 0x10_0000;
        cpu.k[2] = 0b1111;
        let e = run(
            &|a| a.vmovupd(zmm0.k2().z(), zmmword_ptr(rdi)),
            cpu,
            vec![a],
        )
        .unwrap_err();
        assert!(e.contains("past the end of A"), "{e}");
    }

    /// Permutes, shuffles, inserts, block broadcasts and zero extensions, on lanes labelled
    /// by their numbers.
    #[test]
    fn permutes_and_shuffles() {
        let bytes: Vec<u8> = (0..64).map(|i| 40 + i as u8).collect();
        let m = region("M", 0x30_0000, bytes, false);
        let mut cpu = junk_cpu();
        cpu.gpr[7] = 0x30_0000;
        cpu.zmm[1] = dwords(std::array::from_fn(|i| 100 + i as u32));
        cpu.zmm[2] = dwords(std::array::from_fn(|i| 200 + i as u32));
        cpu.zmm[3] = std::array::from_fn(|i| 10 + i as u64);
        cpu.zmm[4] = std::array::from_fn(|i| 20 + i as u64);
        // Indices: reversed, with bits above the lane number set (ignored).
        cpu.zmm[5] = dwords(std::array::from_fn(|i| (15 - i as u32) | 0x30));
        cpu.zmm[6] = [7, 0, 9, 2, 3, 12, 5, 6];
        let asm = |a: &mut CodeAssembler| {
            a.vshuff32x4(zmm10, zmm1, zmm2, 0x9C)?;
            a.vshuff64x2(zmm11, zmm3, zmm4, 0x4E)?;
            a.vshufps(zmm12, zmm1, zmm2, 0x1B)?;
            a.vshufpd(zmm13, zmm3, zmm4, 0xA6)?;
            a.vpermps(zmm14, zmm5, zmm1)?;
            a.vpermpd(zmm15, zmm6, zmm3)?;
            a.vpermilps(zmm16, zmm1, 0x36)?;
            a.vpermpd(zmm17, zmm3, 0x1B)?;
            a.vinsertf64x4(zmm18, zmm3, ymmword_ptr(rdi), 1)?;
            a.vinsertf32x4(zmm19, zmm1, xmmword_ptr(rdi + 16), 2)?;
            a.vbroadcastf32x4(zmm20, xmmword_ptr(rdi))?;
            a.vbroadcastf64x4(zmm21, ymmword_ptr(rdi + 32))?;
            a.vpmovzxbd(zmm22, xmmword_ptr(rdi))?;
            a.vpmovzxbq(zmm23, qword_ptr(rdi + 8))?;
            a.vshuff32x4(ymm24, ymm1, ymm2, 0b10)?;
            // AVX2's transpose-adds: 128-bit halves, and elements in 256-bit vectors.
            a.vperm2f128(ymm7, ymm3, ymm4, 0x31)?;
            a.vperm2f128(ymm8, ymm3, ymm4, 0x28)?;
            a.vshufpd(ymm9, ymm3, ymm4, 0x6)?;
            a.vshufps(ymm0, ymm1, ymm2, 0x1B)
        };
        let (cpu, _) = run(&asm, cpu, vec![m.clone()]).unwrap();
        let d = |r: usize| as_dwords(&cpu.zmm[r]);
        let range = |from: u32| -> Vec<u32> { (from..from + 4).collect() };
        let blocks = [range(100), range(112), range(204), range(208)].concat();
        assert_eq!(d(10).to_vec(), blocks);
        assert_eq!(cpu.zmm[11], [14, 15, 16, 17, 20, 21, 22, 23]);
        let shufps: Vec<u32> = (0..4)
            .flat_map(|g| [103 + 4 * g, 102 + 4 * g, 201 + 4 * g, 200 + 4 * g])
            .collect();
        assert_eq!(d(12).to_vec(), shufps);
        assert_eq!(cpu.zmm[13], [10, 21, 13, 22, 14, 25, 16, 27]);
        assert_eq!(d(14), std::array::from_fn(|i| 115 - i as u32));
        assert_eq!(cpu.zmm[15], [17, 10, 11, 12, 13, 14, 15, 16]);
        let permilps: Vec<u32> = (0..4)
            .flat_map(|g| [102 + 4 * g, 101 + 4 * g, 103 + 4 * g, 100 + 4 * g])
            .collect();
        assert_eq!(d(16).to_vec(), permilps);
        assert_eq!(cpu.zmm[17], [13, 12, 11, 10, 17, 16, 15, 14]);
        let q = |at: usize| u64::from_le_bytes(m.bytes[at..at + 8].try_into().unwrap());
        assert_eq!(cpu.zmm[18], [10, 11, 12, 13, q(0), q(8), q(16), q(24)]);
        assert_eq!(
            cpu.zmm[19],
            [
                cpu.zmm[1][0],
                cpu.zmm[1][1],
                cpu.zmm[1][2],
                cpu.zmm[1][3],
                q(16),
                q(24),
                cpu.zmm[1][6],
                cpu.zmm[1][7]
            ]
        );
        assert_eq!(
            cpu.zmm[20],
            [q(0), q(8), q(0), q(8), q(0), q(8), q(0), q(8)]
        );
        assert_eq!(
            cpu.zmm[21],
            [q(32), q(40), q(48), q(56), q(32), q(40), q(48), q(56)]
        );
        assert_eq!(d(22), std::array::from_fn(|i| 40 + i as u32));
        assert_eq!(cpu.zmm[23], std::array::from_fn(|i| 48 + i as u64));
        let ymm = [range(100), range(204)].concat();
        assert_eq!(d(24)[..8].to_vec(), ymm);
        assert_eq!(cpu.zmm[24][4..], [0; 4]);
        assert_eq!(cpu.zmm[7], [12, 13, 22, 23, 0, 0, 0, 0]);
        assert_eq!(cpu.zmm[8], [0, 0, 20, 21, 0, 0, 0, 0]);
        assert_eq!(cpu.zmm[9], [10, 21, 13, 22, 0, 0, 0, 0]);
        assert_eq!(d(0)[..8].to_vec(), shufps[..8].to_vec());
        assert_eq!(cpu.zmm[0][4..], [0; 4]);
    }

    /// Scalar loads zero every lane above the element, EVEX forms of registers 16-31 too;
    /// scalar stores write one element.
    #[test]
    fn scalar_moves() {
        let a = region("A", 0x10_0000, f64_bytes(&[2.5, -1.0]), false);
        let c = region("C", 0x20_0000, vec![0xEE; 12], true);
        let mut cpu = junk_cpu();
        cpu.gpr[7] = 0x10_0000;
        cpu.gpr[6] = 0x20_0000;
        let asm = |a: &mut CodeAssembler| {
            a.vmovsd(xmm3, qword_ptr(rdi))?;
            a.set_prefer_vex(false);
            a.vmovsd(xmm17, qword_ptr(rdi + 8))?;
            a.vmovss(xmm18, dword_ptr(rdi + 4))?;
            a.vmovsd(qword_ptr(rsi), xmm17)?;
            a.vmovss(dword_ptr(rsi + 8), xmm18)
        };
        let (cpu, memory) = run(&asm, cpu, vec![a, c]).unwrap();
        assert_eq!(cpu.zmm[3], [2.5f64.to_bits(), 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(cpu.zmm[17], [(-1f64).to_bits(), 0, 0, 0, 0, 0, 0, 0]);
        let high = (2.5f64.to_bits() >> 32) as u32;
        assert_eq!(cpu.zmm[18], [high as u64, 0, 0, 0, 0, 0, 0, 0]);
        let mut expected = (-1f64).to_le_bytes().to_vec();
        expected.extend(high.to_le_bytes());
        assert_eq!(memory.region("C").unwrap().bytes, expected);
    }

    /// A non-temporal store faults unless aligned to its width, and must be fenced before
    /// the return.
    #[test]
    fn streaming_stores_are_aligned_and_fenced() {
        let c = || region("C", 0x20_0000, vec![0; 128], true);
        let mut cpu = junk_cpu();
        cpu.gpr[6] = 0x20_0000;
        let ok = |a: &mut CodeAssembler| {
            a.vmovntpd(zmmword_ptr(rsi + 64), zmm1)?;
            a.vmovntps(ymmword_ptr(rsi + 32), ymm1)?;
            a.sfence()
        };
        run(&ok, cpu.clone(), vec![c()]).unwrap();
        let misaligned = |a: &mut CodeAssembler| {
            a.vmovntpd(zmmword_ptr(rsi + 32), zmm1)?;
            a.sfence()
        };
        let e = run(&misaligned, cpu.clone(), vec![c()]).unwrap_err();
        assert!(e.contains("not aligned"), "{e}");
        let unfenced = |a: &mut CodeAssembler| a.vmovntpd(zmmword_ptr(rsi), zmm1);
        let e = run(&unfenced, cpu, vec![c()]).unwrap_err();
        assert!(e.contains("sfence"), "{e}");
    }

    /// Instructions and forms the backend does not emit are errors at decoding, even where
    /// they would be easy to guess.
    #[test]
    fn unsupported_instructions_are_errors() {
        let cases: [&Asm; 7] = [
            &|a| a.addpd(xmm0, xmm1),
            &|a| a.vfmadd213pd(zmm0, zmm1, zmm2),
            &|a| a.vmovapd(zmm0, zmmword_ptr(rdi)),
            &|a| a.vpermilps(ymm0, ymm1, ymm2),
            &|a| a.vpermps(zmm0.k1(), zmm1, zmmword_ptr(rdi)),
            &|a| a.vmovddup(ymm0, ymmword_ptr(rdi)),
            &|a| a.add(qword_ptr(rdi), 1),
        ];
        for (i, asm) in cases.into_iter().enumerate() {
            let code = assemble(asm);
            let result = Machine::new(&code, code.len(), CODE);
            assert!(result.is_err(), "case {i} decoded");
        }
    }

    /// The harness's checks: the registers a convention preserves, the stack pointer, the
    /// caller's frame, writes to read-only operands.
    #[test]
    fn calling_convention_and_read_only_operands() {
        let call = |asm: &Asm, conv| {
            let bytes = assemble(asm);
            let code = MachineCode {
                code_len: bytes.len(),
                bytes,
            };
            let (a, b, mut c) = ([1.0f64; 4], [2.0f64; 4], [0.0f64; 4]);
            run_emulated(Call {
                code: &code,
                conv,
                a: &a,
                b: &b,
                c: &mut c,
                pointers: None,
                batch: 1,
                params: &[],
                c_align: 0,
                stack_bytes: 256,
            })
        };
        let fine = |a: &mut CodeAssembler| {
            a.push(rbx)?;
            a.mov(rbx, rdi)?;
            a.vxorps(xmm6, xmm6, xmm6)?;
            a.pop(rbx)
        };
        call(&fine, CallConv::SysV).unwrap();
        let cases: [(&Asm, CallConv, &str); 6] = [
            (
                &|a| a.mov(rbx, rdi),
                CallConv::SysV,
                "register 3 not preserved",
            ),
            (
                &|a| a.mov(r15, rdi),
                CallConv::SysV,
                "register 15 not preserved",
            ),
            (
                &|a| a.mov(rdi, rcx),
                CallConv::Win64,
                "register 7 not preserved",
            ),
            (
                &|a| a.vxorps(xmm6, xmm6, xmm6),
                CallConv::Win64,
                "xmm6 not preserved",
            ),
            (
                &|a| a.mov(qword_ptr(rsp + 8), rdi),
                CallConv::SysV,
                "caller's frame",
            ),
            (
                &|a| a.vmovupd(ymmword_ptr(rdi), ymm0),
                CallConv::SysV,
                "read-only A",
            ),
        ];
        for (asm, conv, message) in cases {
            let e = call(asm, conv).unwrap_err();
            assert!(e.contains(message), "{message}: {e}");
        }
    }

    /// A real kernel given a C one element short writes past the end of C's region, and one
    /// given an A one element short reads past A's: every operand ends at its region's end.
    #[test]
    fn kernels_stay_inside_their_operands() {
        let spec = GemmSpec::builder(Dtype::F64, 13, 3, 5)
            .beta(Scalar::One)
            .build()
            .unwrap();
        let (_, program, code) = crate::Case::new(spec, Target::AVX512).compile();
        // 13x5 A, 5x3 B, 13x3 C.
        let (a, b, c) = (vec![1.0f64; 65], vec![1.0f64; 15], vec![1.0f64; 39]);
        let run = |a_len: usize, c_len: usize| {
            let mut c = c[..c_len].to_vec();
            run_emulated(Call {
                code: &code,
                conv: CallConv::SysV,
                a: &a[..a_len],
                b: &b,
                c: &mut c,
                pointers: None,
                batch: 1,
                params: &[],
                c_align: 0,
                stack_bytes: program.scratch_bytes as usize + 4096,
            })
        };
        run(65, 39).unwrap();
        for (a_len, c_len, region) in [(65, 38, "C"), (64, 39, "A")] {
            let e = run(a_len, c_len).unwrap_err();
            assert!(e.contains(&format!("past the end of {region}")), "{e}");
        }
    }
}
