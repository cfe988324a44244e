//! The NEON cost report of `docs/perf-notes.md`: per square size, the loads, stores and
//! FMAs one matrix costs in each kernel (`Program::op_counts`) and the FMA fraction, NEON
//! beside AVX2 and AVX-512, for C = A B + C with A and B not transposed and for B
//! transposed. There is no AArch64 hardware here, so operation counts stand in for
//! timings.
//!
//! `cargo run -p smallgemm-codegen-arm --example cost_report`

use smallgemm_ir::{compile_program, Dtype, GemmSpec, OpCounts, Scalar, Target, Trans};

fn counts(dtype: Dtype, n: usize, trans_b: Trans, target: Target) -> (String, OpCounts) {
    let spec = GemmSpec::builder(dtype, n, n, n)
        .trans_b(trans_b)
        .beta(Scalar::One)
        .build()
        .expect("a valid square spec");
    let (schedule, program) = compile_program(&spec, target, None).expect("it lowers");
    (
        format!(
            "{}x{}",
            schedule.m_vectors * target.lanes(dtype),
            schedule.n_cols
        ),
        program.op_counts(),
    )
}

/// loads (broadcasts included) / stores / FMAs, and FMAs as a share of every operation.
fn cell(c: &OpCounts) -> String {
    let loads = c.loads + c.broadcasts;
    let all = loads + c.stores + c.fmas + c.other;
    format!(
        "{} / {} / {} ({:.0}%)",
        loads,
        c.stores,
        c.fmas,
        100.0 * c.fmas as f64 / all as f64
    )
}

fn main() {
    for (dtype, name) in [(Dtype::F64, "f64"), (Dtype::F32, "f32")] {
        for trans_b in [Trans::N, Trans::T] {
            let tb = if trans_b == Trans::N { "NN" } else { "NT" };
            println!("\n{name}, {tb}, C = A B + C: loads / stores / FMAs (FMA share), register block rows x cols\n");
            println!("| n | NEON | block | AVX2 | block | AVX-512 | block |");
            println!("|---:|---|---|---|---|---|---|");
            for n in [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 20, 24, 28, 31, 32] {
                let mut row = format!("| {n} |");
                for target in [Target::NEON, Target::AVX2, Target::AVX512] {
                    let (block, c) = counts(dtype, n, trans_b, target);
                    row.push_str(&format!(" {} | {block} |", cell(&c)));
                }
                println!("{row}");
            }
        }
    }
}
