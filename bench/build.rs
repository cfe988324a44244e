//! Links the optional competitors. Each does something only when its feature is on, so the
//! default build needs no system library; with a feature on and its library missing, the
//! build stops with the command that installs it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBXSMM_LIB_DIR");
    println!("cargo:rerun-if-env-changed=MKL_LIB_DIR");
    println!("cargo:rerun-if-env-changed=OPENBLAS_LIB_DIR");
    let feature = |f: &str| env::var_os(format!("CARGO_FEATURE_{}", f.to_uppercase())).is_some();
    // OpenBLAS first: it also provides the BLAS that LIBXSMM falls back to.
    if feature("openblas") {
        let dir = find(&["libopenblas.so"], "OPENBLAS_LIB_DIR").unwrap_or_else(|| {
            fail(
                "openblas",
                "libopenblas.so",
                "apt-get install libopenblas-dev",
            )
        });
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=dylib=openblas");
    }
    if feature("libxsmm") {
        let dir = find(&["libxsmm.a"], "LIBXSMM_LIB_DIR")
            .unwrap_or_else(|| fail("libxsmm", "libxsmm.a", "apt-get install libxsmm-dev"));
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=xsmm");
        // Without OpenBLAS, LIBXSMM's stub BLAS (never called for the small shapes).
        if !feature("openblas") {
            println!("cargo:rustc-link-lib=static=xsmmnoblas");
        }
        for lib in ["pthread", "rt", "dl", "m"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        let version = std::fs::read_to_string(dir.join("pkgconfig/libxsmm.pc"))
            .ok()
            .and_then(|pc| {
                pc.lines()
                    .find_map(|l| l.strip_prefix("Version:").map(|v| v.trim().to_string()))
            })
            .unwrap_or_default();
        println!("cargo:rustc-env=SMALLGEMM_LIBXSMM_VERSION={version}");
    }
    if feature("mkl") {
        // Loaded at run time (see src/ffi/mkl.rs); here we only record where pip put it.
        let dir = mkl_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        if dir.is_empty() {
            println!(
                "cargo:warning=libmkl_rt not found at build time (pip install mkl mkl-devel); \
                 the bench will look for it at run time (MKL_LIB_DIR)"
            );
        }
        println!("cargo:rustc-env=SMALLGEMM_MKL_LIB_DIR={dir}");
    }
}

fn fail(feature: &str, file: &str, install: &str) -> ! {
    panic!("feature `{feature}` needs {file}: {install}")
}

/// The first of the usual library folders (or `$var`) that holds one of `files`.
fn find(files: &[&str], var: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os(var).map(PathBuf::from).into_iter().collect();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    dirs.into_iter()
        .find(|d| files.iter().any(|f| d.join(f).exists()))
}

fn has_mkl_rt(dir: &Path) -> bool {
    ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"]
        .iter()
        .any(|f| dir.join(f).exists())
}

/// Where pip installed libmkl_rt: `$MKL_LIB_DIR`, else `<python prefix>/lib`, else the
/// usual oneAPI and system folders.
fn mkl_dir() -> Option<PathBuf> {
    if let Some(d) = env::var_os("MKL_LIB_DIR").map(PathBuf::from) {
        if has_mkl_rt(&d) {
            return Some(d);
        }
    }
    let prefixes = ["python3", "python"].iter().filter_map(|py| {
        let out = Command::new(py)
            .args(["-c", "import sys; print(sys.prefix)"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib"))
    });
    let fixed = [
        "/opt/intel/oneapi/mkl/latest/lib",
        "/opt/intel/oneapi/mkl/latest/lib/intel64",
        "/usr/local/lib",
        "/usr/lib/x86_64-linux-gnu",
    ]
    .map(PathBuf::from);
    prefixes.chain(fixed).find(|d| has_mkl_rt(d))
}
