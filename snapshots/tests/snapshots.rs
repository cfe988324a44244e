//! Disassembly of the fixed specs on both x86 ISAs, and the lowered Program of a few, as
//! insta file snapshots. Code generation does not depend on the host CPU, so these run
//! everywhere.

use smallgemm::{generate, listing, Isa, Target};
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

#[test]
fn avx512_has_zmm_fmas_and_opmasks_on_tails() {
    let (_, spec) = fixed_specs()
        .into_iter()
        .find(|(n, _)| *n == "d_13x3x5_tails_runtime")
        .unwrap();
    let text = listing(
        Isa::Avx512,
        &generate(&spec, Target::AVX512, None).unwrap().code,
    );
    assert!(text.contains("vfmadd231pd zmm"), "{text}");
    assert!(text.contains("{k1}"), "{text}");
    let text = listing(
        Isa::Avx2,
        &generate(&spec, Target::AVX2, None).unwrap().code,
    );
    assert!(text.contains("vfmadd231pd ymm"), "{text}");
    assert!(text.contains("vmaskmovpd"), "{text}");
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
