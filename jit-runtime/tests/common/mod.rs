//! Shared by the integration tests: run one spec through the JIT and through the Program
//! interpreter on the same data, check both against the reference and each other.

use smallgemm::{Dtype, Element, GemmSpec, Jit, Schedule};
use smallgemm_ir::reference::TestData;

/// The alpha and beta values a spec's kinds call for (arbitrary ones for `Runtime`).
pub fn scalars(spec: &GemmSpec) -> (f64, f64) {
    (
        spec.alpha().value().unwrap_or(1.375),
        spec.beta().value().unwrap_or(-0.625),
    )
}

/// Runs `spec` on a random batch with the JIT, checks it against the reference and the
/// sentinels, and checks that the interpreter of the same Program produces the same bits.
pub fn check_spec<T: Element>(jit: &Jit, spec: &GemmSpec, batch: usize, seed: u64) {
    check_spec_with::<T>(jit, spec, None, batch, seed)
}

/// [`check_spec_with`] at the spec's own element type (f64 or f32: the CPU's).
pub fn check_schedule(
    jit: &Jit,
    spec: &GemmSpec,
    schedule: Option<&Schedule>,
    batch: usize,
    seed: u64,
) {
    match spec.dtype() {
        Dtype::F64 => check_spec_with::<f64>(jit, spec, schedule, batch, seed),
        Dtype::F32 => check_spec_with::<f32>(jit, spec, schedule, batch, seed),
        Dtype::F16 => unreachable!("CPU tests cover f32 and f64"),
    }
}

/// As [`check_spec`], with `schedule` instead of the planner's (or the tuned) one.
pub fn check_spec_with<T: Element>(
    jit: &Jit,
    spec: &GemmSpec,
    schedule: Option<&Schedule>,
    batch: usize,
    seed: u64,
) {
    let kernel = match schedule {
        Some(s) => jit.kernel_with_schedule(spec, s),
        None => jit.kernel(spec),
    }
    .unwrap_or_else(|e| panic!("{}: {e}", spec.name()));
    let (alpha, beta) = scalars(spec);
    let (alpha_t, beta_t) = (T::from_f64(alpha), T::from_f64(beta));
    let mut data = TestData::<T>::new(spec, batch, seed);
    let (a, b) = (data.a.clone(), data.b.clone());
    kernel
        .run(&a, &b, data.c_mut(), batch, alpha_t, beta_t)
        .unwrap_or_else(|e| panic!("{}: {e}", spec.name()));
    let report = data.check(alpha_t.to_f64(), beta_t.to_f64());
    assert!(
        report.passed(),
        "{} on {} (schedule {:?}, batch {batch}, seed {seed}): {}",
        spec.name(),
        jit.target(),
        kernel.schedule(),
        report.failure.as_deref().unwrap_or("")
    );
    // The interpreter on the same Program and data must give the same bits.
    let machine = data.c().to_vec();
    data.reset_c();
    // The code that ran: a batch past the L2 cache may run a variant blocked otherwise.
    let ran = kernel.schedule_for(batch, data.c().as_ptr().cast());
    let generated = smallgemm::generate(spec, jit.target(), Some(&ran)).unwrap();
    let mut params = Vec::new();
    for p in &generated.program.params {
        params.push(match p {
            smallgemm_ir::Param::Alpha => alpha_t,
            smallgemm_ir::Param::Beta => beta_t,
        });
    }
    let (ka, kb) = if spec.col_major().swap_operands {
        (&b, &a)
    } else {
        (&a, &b)
    };
    smallgemm_ir::interpret(&generated.program, ka, kb, data.c_mut(), batch, &params)
        .unwrap_or_else(|e| panic!("{}: interpreter: {e}", spec.name()));
    let mismatch = machine
        .iter()
        .zip(data.c())
        .position(|(x, y)| x.bits() != y.bits());
    assert!(
        mismatch.is_none(),
        "{} on {}: machine code and interpreter differ at C element {}: {} vs {}",
        spec.name(),
        jit.target(),
        mismatch.unwrap(),
        machine[mismatch.unwrap()],
        data.c()[mismatch.unwrap()]
    );
}
