#!/usr/bin/env bash
# C-level tests, with only the system cc: the C ABI (libsmallgemm.so and .a) against a
# reference, and kernels emitted as ELF objects linked into a C driver with no smallgemm
# library. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/c-tests
mkdir -p "$out"
# The dev profile, with the tests' feature set: `cargo test --workspace` has already built
# all of it. Building only these two packages would resolve the dependencies' features
# without the dev-dependencies (object's `read`, syn's `visit-mut`, ...) and recompile most
# of them; a release build would compile the whole workspace a third time.
cargo build -q --workspace --lib --bins --tests
lib=target/debug
flags=(-O2 -Wall -Wextra -Werror -std=c11 -D_DEFAULT_SOURCE)

cc "${flags[@]}" -I capi/include capi/tests/test_capi.c -L "$lib" -l:libsmallgemm.so \
    -Wl,-rpath,"$PWD/$lib" -lm -o "$out/test_capi_shared"
"$out/test_capi_shared"
cc "${flags[@]}" -I capi/include capi/tests/test_capi.c "$lib/libsmallgemm.a" \
    -lpthread -ldl -lm -o "$out/test_capi_static"
"$out/test_capi_static"

for isa in avx2 avx512; do
    "$lib/smallgemm" emit --isa "$isa" --format obj --target x86_64-linux \
        --list object-emit/tests/kernels.list --header "$out/kernels.h" -o "$out/kernels_$isa.o"
    define=()
    [ "$isa" = avx512 ] && define=(-DNEEDS_AVX512)
    cc "${flags[@]}" "${define[@]}" -I "$out" object-emit/tests/object_driver.c \
        "$out/kernels_$isa.o" -lm -o "$out/object_driver_$isa"
    echo "objects ($isa): $("$out/object_driver_$isa")"
done
