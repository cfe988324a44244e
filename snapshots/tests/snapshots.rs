//! Disassembly of the fixed specs on both x86 ISAs, and the lowered Program of a few, as
//! insta file snapshots. Code generation does not depend on the host CPU, so these run
//! everywhere.

use smallgemm::{generate, listing, GemmSpec, Isa, Target};
use smallgemm_snapshots::fixed_specs;

fn check(isa: Isa) {
    for (name, spec) in fixed_specs() {
        let generated = generate(&spec, Target::new(isa), None).unwrap();
        let text = listing(isa, &generated.code);
        assert!(!text.contains("call"), "{name}: kernels make no calls");
        let header = format!(
            "{}\nschedule: {:?}\nparams: {:?}\n\n",
            spec.name(),
            generated.schedule,
            generated.program.params
        );
        insta::assert_snapshot!(format!("{}_{name}", isa.name()), header + &text);
    }
}

#[test]
fn avx512_disassembly() {
    check(Isa::Avx512);
}

#[test]
fn avx2_disassembly() {
    check(Isa::Avx2);
}

/// AArch64 NEON (AAPCS64), disassembled by yaxpeax-arm.
#[test]
fn neon_disassembly() {
    check(Isa::Neon);
}

/// The NEON lowering of the first specs: B loaded as vectors and FMAs by element.
#[test]
fn neon_lowered_programs() {
    for (name, spec) in fixed_specs().into_iter().take(3) {
        let generated = generate(&spec, Target::NEON, None).unwrap();
        insta::assert_snapshot!(
            format!("program_neon_{name}"),
            generated.program.to_string()
        );
    }
}

/// The fixed spec named `name`.
fn fixed_spec(name: &str) -> GemmSpec {
    fixed_specs()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, spec)| spec)
        .unwrap_or_else(|| panic!("no fixed spec {name}"))
}

#[test]
fn neon_has_fmla_by_element_paired_loads_and_partial_tails() {
    let find = |wanted: &str| {
        let spec = fixed_spec(wanted);
        listing(
            Isa::Neon,
            &generate(&spec, Target::NEON, None).unwrap().code,
        )
    };
    let text = find("d_13x3x5_tails_runtime");
    // B as vectors, multiplied by one lane; A in pairs; the odd row of m = 13 as one d.
    assert!(text.contains("fmla v") && text.contains(".d[1]"), "{text}");
    assert!(text.contains("ldp q"), "{text}");
    assert!(text.contains("ldr d"), "{text}");
    assert!(!text.contains("ld4"), "{text}");
    // f32 with m = 9: a one-lane tail; B transposed: its rows are the vectors.
    let text = find("s_9x4x3_nt_fixed");
    assert!(text.contains("fmla v") && text.contains(".s[3]"), "{text}");
    assert!(text.contains("ldr s"), "{text}");
}

#[test]
fn avx512_has_zmm_fmas_and_opmasks_on_tails() {
    let spec = fixed_spec("d_13x3x5_tails_runtime");
    let text = listing(
        Isa::Avx512,
        &generate(&spec, Target::AVX512, None).unwrap().code,
    );
    assert!(text.contains("vfmadd231pd zmm"), "{text}");
    // C is read (run-time beta), so the planner splits the 5-row tail into 4 + 1 rows that
    // plain moves store exactly rather than store it through {k1}.
    assert!(text.contains("vmovsd") && !text.contains("{k1}"), "{text}");
    let text = listing(
        Isa::Avx2,
        &generate(&spec, Target::AVX2, None).unwrap().code,
    );
    assert!(text.contains("vfmadd231pd ymm"), "{text}");
    // 13 = 3 x 4 + 1: the one-lane tail is a plain vmovsd, not a vmaskmovpd.
    assert!(text.contains("vmovsd"), "{text}");
    assert!(!text.contains("vmaskmovpd"), "{text}");
}

#[test]
fn lowered_programs() {
    for (name, spec) in fixed_specs().into_iter().take(3) {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let generated = generate(&spec, Target::new(isa), None).unwrap();
            insta::assert_snapshot!(
                format!("program_{}_{name}", isa.name()),
                generated.program.to_string()
            );
        }
    }
}

/// f64 9x12x9 on AVX-512: the ninth row as dot products of A's gathered row with B's
/// columns, summed across lanes by 128-bit block and element shuffles with adds.
#[test]
fn avx512_sums_the_dot_tail_across_lanes() {
    let spec = fixed_spec("d_9x12x9_dot_tail");
    let generated = generate(&spec, Target::new(Isa::Avx512), None).unwrap();
    assert!(generated.schedule.dot_tail, "{:?}", generated.schedule);
    let text = listing(Isa::Avx512, &generated.code);
    for wanted in ["vshuff64x2", "vshufpd", "vaddpd"] {
        assert!(text.contains(wanted), "{wanted}: {text}");
    }
    insta::assert_snapshot!(
        "program_avx512_d_9x12x9_dot_tail",
        generated.program.to_string()
    );
}

/// f64 9x6x7 on AVX2 (AMD's target) with a dot-product tail: the ninth row gathered with
/// k's last chunk moved up to overlap the one before (its repeated lane zeroed once, in the
/// setup), B's last chunk loaded from k - 4 instead of through a mask, and the sums folded
/// by vperm2f128 and vshufpd with adds.
#[test]
fn avx2_sums_the_dot_tail_with_an_overlapping_last_chunk() {
    let spec = GemmSpec::builder(smallgemm::Dtype::F64, 9, 6, 7)
        .beta(smallgemm::Scalar::One)
        .build()
        .unwrap();
    let planned = generate(&spec, Target::AVX2_AMD, None).unwrap().schedule;
    let dot = smallgemm::Schedule {
        dot_tail: true,
        ..planned
    };
    let generated = generate(&spec, Target::AVX2_AMD, Some(&dot)).unwrap();
    let text = listing(Isa::Avx2, &generated.code);
    for wanted in ["vperm2f128", "vshufpd", "vaddpd"] {
        assert!(text.contains(wanted), "{wanted}: {text}");
    }
    assert!(!text.contains("vmaskmov"), "{text}");
    insta::assert_snapshot!(
        "program_avx2_amd_d_9x6x7_dot_tail",
        generated.program.to_string()
    );
}

/// f64 12x6x5 on AVX-512 with a packed tail: rows 8..11 as one vector per column whose
/// lanes pair each row with two steps of k (A's two columns loaded whole, inserted and
/// permuted; B's two steps broadcast as a 128-bit group), the last pair overlapping the one
/// before with its first step zero (k odd); one transpose-add and a permute per two
/// columns sum the steps into column order.
#[test]
fn avx512_packs_the_tail_rows_with_steps_of_k() {
    let spec = GemmSpec::builder(smallgemm::Dtype::F64, 12, 6, 5)
        .beta(smallgemm::Scalar::One)
        .build()
        .unwrap();
    let target = Target::new(Isa::Avx512);
    let planned = generate(&spec, target, None).unwrap().schedule;
    let packed = smallgemm::Schedule {
        dot_tail: true,
        ..planned
    };
    let generated = generate(&spec, target, Some(&packed)).unwrap();
    let text = listing(Isa::Avx512, &generated.code);
    for wanted in ["vbroadcastf64x2", "vinsertf64x4", "vpermpd", "vshufpd"] {
        assert!(text.contains(wanted), "{wanted}: {text}");
    }
    insta::assert_snapshot!(
        "program_avx512_d_12x6x5_packed_tail",
        generated.program.to_string()
    );
}

/// AVX2 on AMD (`Target::AVX2_AMD`): masked stores are microcoded there, so the tails of C
/// leave in whole pieces: f64 7 rows as 4 + 3 (16 bytes, the upper half moved down, 8
/// bytes), f32 3 rows (one masked vector, not the planner's split) as 8 bytes and lane 2 by
/// vextractps. The tails' loads keep their masks.
#[test]
fn avx2_on_amd_stores_tails_in_pieces() {
    for (name, wanted) in [
        ("d_7x6x4_tn_padded", "vextractf128"),
        ("s_3x3x3_nn_beta1", "vextractps"),
    ] {
        let spec = fixed_spec(name);
        let planned = generate(&spec, Target::AVX2_AMD, None).unwrap().schedule;
        let masked = smallgemm::Schedule {
            split_tail: false,
            ..planned
        };
        let generated = generate(&spec, Target::AVX2_AMD, Some(&masked)).unwrap();
        let text = listing(Isa::Avx2, &generated.code);
        assert!(text.contains(wanted), "{name}: {text}");
        let masked_stores = text
            .lines()
            .filter(|l| l.contains("vmaskmov") && l.contains("], ymm"))
            .count();
        assert_eq!(masked_stores, 0, "{name}: {text}");
        insta::assert_snapshot!(format!("avx2_amd_{name}"), text);
    }
}
