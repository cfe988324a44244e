//! SMALLGEMM_PERF_MAP=1 appends each compiled kernel to /tmp/perf-<pid>.map, in the format
//! `perf report` reads: start and size in hex, then a name that encodes the spec.

use smallgemm::{Dtype, GemmSpec, Jit, Trans};

#[test]
fn kernels_are_named_in_the_perf_map() {
    // Set before the first compilation in this process (this test binary has one test).
    std::env::set_var("SMALLGEMM_PERF_MAP", "1");
    let Ok(jit) = Jit::new() else { return };
    let spec = GemmSpec::builder(Dtype::F32, 3, 5, 7)
        .trans_b(Trans::T)
        .build()
        .unwrap();
    let kernel = jit.kernel(&spec).unwrap();
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let map = std::fs::read_to_string(&path).unwrap();
    let line = map
        .lines()
        .find(|l| l.ends_with(&spec.name()))
        .unwrap_or_else(|| panic!("no entry for {} in {map}", spec.name()));
    let mut fields = line.split(' ');
    let start = usize::from_str_radix(fields.next().unwrap(), 16).unwrap();
    let size = usize::from_str_radix(fields.next().unwrap(), 16).unwrap();
    assert_ne!(start, 0);
    assert_eq!(size, kernel.code().bytes.len());
    assert_eq!(
        fields.next().unwrap(),
        format!("smallgemm_{}_{}", jit.target().isa, spec.name())
    );
    let _ = std::fs::remove_file(path);
}
