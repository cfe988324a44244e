//! How far ahead the prefetches of the streaming variants reach: `Target::prefetch_trips`
//! trips of the batch loop, or more where that is fewer than
//! `Target::prefetch_min_bytes_ahead` bytes of A, B and C.

use std::collections::HashMap;

use smallgemm_ir::{compile_program, plan, Dtype, GemmSpec, Gpr, Isa, Op, Schedule, Target};

/// The offsets of every prefetch in `ops`, loops included, from the address the register
/// it goes through held when the program reached it the first time (0 for the argument
/// registers and their copies): a walking register's distance ahead counts
/// (`Target::prefetch_spread`).
fn prefetch_offsets(ops: &[Op], out: &mut Vec<i32>) {
    fn walk(ops: &[Op], moved: &mut HashMap<Gpr, i32>, out: &mut Vec<i32>) {
        for op in ops {
            match op {
                Op::Loop { body, .. } => walk(body, moved, out),
                Op::Prefetch { addr } => {
                    out.push(moved.get(&addr.base).copied().unwrap_or(0) + addr.offset)
                }
                Op::Copy { dst, src } => {
                    let m = moved.get(src).copied().unwrap_or(0);
                    moved.insert(*dst, m);
                }
                // Only the walking registers move before their first prefetch.
                Op::AddImm { dst, imm } if ![Gpr::A, Gpr::B, Gpr::C].contains(dst) => {
                    *moved.entry(*dst).or_default() += imm;
                }
                _ => {}
            }
        }
    }
    walk(ops, &mut HashMap::new(), out);
}

/// The nearest prefetch of a packed n x n x n batch, one matrix a trip: the first line of
/// the next matrices to be prefetched sits this many bytes past the current one's.
fn nearest_prefetch(dtype: Dtype, n: usize, target: Target) -> i32 {
    let spec = GemmSpec::builder(dtype, n, n, n).build().unwrap();
    let problem = spec.col_major();
    let schedule = Schedule {
        prefetch: true,
        batch_unroll: 0,
        lane_pack: false,
        ..plan(&problem, target)
    };
    let (_, program) = compile_program(&spec, target, Some(&schedule)).unwrap();
    let mut offsets = Vec::new();
    prefetch_offsets(&program.ops, &mut offsets);
    *offsets.iter().min().expect("the schedule prefetches")
}

#[test]
fn small_matrices_are_prefetched_several_trips_ahead() {
    let intel = Target::new(Isa::Avx512);
    assert_eq!(intel.prefetch_min_bytes_ahead, 4096);
    // f64 5x5x5: 600 bytes a matrix, 200 of each operand; 7 trips reach 4200 bytes.
    assert_eq!(nearest_prefetch(Dtype::F64, 5, intel), 7 * 200);
    // f32 12x12x12: 1728 bytes, 3 trips.
    assert_eq!(nearest_prefetch(Dtype::F32, 12, intel), 3 * 576);
    // f64 32x32x32: 24 KiB a matrix, one trip is far enough (walking registers there).
    assert!(intel.prefetch_spread);
    assert_eq!(nearest_prefetch(Dtype::F64, 32, intel), 8192);
    // AMD Zen 3 keeps its four trips whatever the size.
    assert_eq!(nearest_prefetch(Dtype::F64, 5, Target::AVX2_AMD), 4 * 200);
    assert_eq!(nearest_prefetch(Dtype::F64, 32, Target::AVX2_AMD), 4 * 8192);
    // No minimum distance: one trip.
    let one_trip = Target {
        prefetch_min_bytes_ahead: 0,
        ..intel
    };
    assert_eq!(nearest_prefetch(Dtype::F64, 5, one_trip), 200);
}

#[test]
fn lane_packed_kernels_prefetch_too() {
    let intel = Target::new(Isa::Avx512);
    // f32 3x3x3: 36 bytes of each operand a matrix, in one vector of C.
    let spec = GemmSpec::builder(Dtype::F32, 3, 3, 3).build().unwrap();
    let hot = plan(&spec.col_major(), intel);
    assert!(hot.lane_pack, "{hot:?}");
    let schedule = Schedule {
        prefetch: true,
        ..hot
    };
    let (_, program) = compile_program(&spec, intel, Some(&schedule)).unwrap();
    let mut offsets = Vec::new();
    prefetch_offsets(&program.ops, &mut offsets);
    let nearest = *offsets
        .iter()
        .min()
        .expect("the lane-packed kernel prefetches");
    // A third of the 4 KiB ahead in each of A, B and C, whole matrices ahead.
    assert!(nearest >= 4096 / 3 && nearest % 36 == 0, "{nearest}");
}
