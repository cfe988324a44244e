#!/usr/bin/env bash
# The whole test suite: formatting, lints, every crate's tests (correctness matrix on both
# x86 ISAs, interpreter oracle, snapshots, API contract), then the CLI sweep.
# Runs on a fresh Debian machine that has the Rust toolchain (cargo, rustfmt, clippy).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests need, installed when missing (none beyond Rust and a C
# toolchain yet; later backends add theirs here).
need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
# The NEON tests' AArch64 emulator (unicorn-engine, a dev-dependency) builds its bundled C
# library with cmake and generates its bindings with libclang.
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi

# ptxas (PyPI package nvidia-cuda-nvcc) assembles every generated PTX kernel in
# codegen-ptx's tests, which fail without it: install it under target/ when missing.
if [ -z "${SMALLGEMM_PTXAS:-}" ]; then
    ptxas=target/ptxas-pip/nvidia/cu13/bin/ptxas
    if [ ! -x "$ptxas" ]; then
        python3 -m pip --version >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq python3-pip; }
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps \
            --target target/ptxas-pip nvidia-cuda-nvcc
    fi
    export SMALLGEMM_PTXAS="$PWD/$ptxas"
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Snapshots must match what is committed (insta writes no files on CI).
CI=true cargo test --workspace
# The C ABI and emitted object files, from C with only cc.
./scripts/c-tests.sh
# The main job (the README's first command), as a smoke run on the dev-profile binary that
# c-tests.sh built (`cargo run -p smallgemm-cli` would resolve features anew and rebuild).
target/debug/smallgemm run --reps 5
