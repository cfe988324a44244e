//! Finding and running NVIDIA's `ptxas` to check generated PTX without a GPU.

use std::path::PathBuf;
use std::process::Command;

use smallgemm_ir::Sm;

/// The environment variable that names the `ptxas` to use (`scripts/test.sh` sets it).
pub const PTXAS_ENV: &str = "SMALLGEMM_PTXAS";

/// `ptxas` from `$SMALLGEMM_PTXAS`, else `PATH`, else the PyPI package `nvidia-cuda-nvcc`
/// (`<site-packages>/nvidia/cu13/bin/ptxas`) found through `python3`.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(PTXAS_ENV) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    if let Ok(out) = Command::new("ptxas").arg("--version").output() {
        if out.status.success() {
            return Some(PathBuf::from("ptxas"));
        }
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))",
        ])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

/// Assembles `ptx` for `sm` with `ptxas` (into a temporary cubin, then removed); the error
/// is ptxas's diagnostics.
pub fn assemble(ptxas: &std::path::Path, ptx: &str, sm: Sm) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!(
        "smallgemm-ptxas-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let src = dir.join("kernel.ptx");
    let cubin = dir.join("kernel.cubin");
    std::fs::write(&src, ptx).map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", sm.name()))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}
