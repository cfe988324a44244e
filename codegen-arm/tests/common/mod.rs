//! Runs NEON kernels in unicorn's AArch64 emulator and checks them like the x86 matrix does:
//! against the double-double reference (sentinels in and around C, NaN in C when beta = 0)
//! and bit for bit against the `Program` interpreter. The emulator also checks the calling
//! convention: x19..x28, x29, d8..d15 and sp come back unchanged.

#![allow(dead_code)]

use smallgemm_ir::reference::{from_le_bytes, to_le_bytes, TestData};
use smallgemm_ir::{
    compile_program, interpret, interpret_pointer_arrays, BatchForm, Dtype, Element, GemmSpec,
    Param, Program, Target,
};
use unicorn_engine::unicorn_const::{Arch, Mode, Prot};
use unicorn_engine::{RegisterARM64, Unicorn};

const PAGE: u64 = 0x1000;
const CODE: u64 = 0x10_0000;
/// Where `ret` lands: emulation stops on reaching it.
const RETURN: u64 = 0x8_0000;
const STACK_TOP: u64 = 0x40_0000;
const STACK_SIZE: u64 = 0x20_0000;
/// A, B and C each get their own region, ending at a page boundary followed by an unmapped
/// page: reading or writing one byte past the end of any of them faults.
const REGIONS: [u64; 3] = [0x1000_0000, 0x2000_0000, 0x3000_0000];
/// The arrays of pointers of pointer-array batches, one region each.
const POINTERS: u64 = 0x4000_0000;
/// Longest a kernel may run in the emulator (the largest take well under a second).
const TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE).max(1) * PAGE
}

fn x(n: u8) -> i32 {
    match n {
        29 => RegisterARM64::X29 as i32,
        30 => RegisterARM64::X30 as i32,
        n => RegisterARM64::X0 as i32 + n as i32,
    }
}

fn d(n: u8) -> i32 {
    RegisterARM64::D0 as i32 + n as i32
}

fn s(n: u8) -> i32 {
    RegisterARM64::S0 as i32 + n as i32
}

/// Runs `code` as `kernel(a, b, c, batch, params...)` in the emulator; `c` is updated.
/// With `pointers` (element offsets of each matrix in a, b, c) the kernel gets arrays of
/// the matrices' addresses instead (pointer-array batches).
pub fn run_emulated<T: Element>(
    code: &[u8],
    a: &[T],
    b: &[T],
    c: &mut [T],
    pointers: Option<[&[usize]; 3]>,
    batch: usize,
    params: &[T],
) -> Result<(), String> {
    let err = |what: &str, e: unicorn_engine::unicorn_const::uc_error| format!("{what}: {e:?}");
    let mut emu = Unicorn::new(Arch::ARM64, Mode::LITTLE_ENDIAN).map_err(|e| err("new", e))?;
    emu.mem_map(CODE, pages(code.len() as u64), Prot::READ | Prot::EXEC)
        .map_err(|e| err("map code", e))?;
    emu.mem_write(CODE, code)
        .map_err(|e| err("write code", e))?;
    emu.mem_map(RETURN, PAGE, Prot::READ | Prot::EXEC)
        .map_err(|e| err("map return", e))?;
    emu.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE, Prot::READ | Prot::WRITE)
        .map_err(|e| err("map stack", e))?;
    let buffers = [to_le_bytes(a), to_le_bytes(b), to_le_bytes(c)];
    let mut starts = [0u64; 3];
    for (i, bytes) in buffers.iter().enumerate() {
        let size = pages(bytes.len() as u64);
        emu.mem_map(REGIONS[i], size, Prot::READ | Prot::WRITE)
            .map_err(|e| err("map data", e))?;
        starts[i] = REGIONS[i] + size - bytes.len() as u64;
        emu.mem_write(starts[i], bytes)
            .map_err(|e| err("write data", e))?;
    }
    let mut arguments = starts;
    if let Some(offsets) = pointers {
        let elt = T::DTYPE.size() as u64;
        for (i, list) in offsets.iter().enumerate() {
            let bytes: Vec<u8> = list
                .iter()
                .flat_map(|&o| (starts[i] + o as u64 * elt).to_le_bytes())
                .collect();
            let size = pages(bytes.len() as u64);
            let at = POINTERS + i as u64 * 0x100_0000;
            emu.mem_map(at, size, Prot::READ)
                .map_err(|e| err("map pointers", e))?;
            arguments[i] = at + size - bytes.len() as u64;
            emu.mem_write(arguments[i], &bytes)
                .map_err(|e| err("write pointers", e))?;
        }
    }
    for (i, argument) in arguments.iter().enumerate() {
        emu.reg_write(x(i as u8), *argument).unwrap();
    }
    emu.reg_write(x(3), batch as u64).unwrap();
    for (i, p) in params.iter().enumerate() {
        match T::DTYPE {
            Dtype::F64 => emu.reg_write(d(i as u8), p.bits()).unwrap(),
            _ => emu.reg_write(s(i as u8), p.bits()).unwrap(),
        }
    }
    // Sentinels in everything the callee must preserve.
    let sentinel = |n: u8| 0x5a5a_0000_0000_0000 | (n as u64) << 8 | 0x11;
    for n in 19..=29 {
        emu.reg_write(x(n), sentinel(n)).unwrap();
    }
    for n in 8..=15 {
        emu.reg_write(d(n), sentinel(n + 100)).unwrap();
    }
    let sp = STACK_TOP - 0x100;
    emu.reg_write(RegisterARM64::SP, sp).unwrap();
    emu.reg_write(RegisterARM64::X30, RETURN).unwrap();
    // Under parallel tests unicorn now and then stops early without an error; the state is
    // intact, so carry on from where it stopped until the kernel returns or time is up.
    let start = std::time::Instant::now();
    let mut pc = CODE;
    while pc != RETURN {
        let left = TIME_LIMIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(format!(
                "the kernel did not return within {TIME_LIMIT:?} (pc {:#x})",
                pc.wrapping_sub(CODE)
            ));
        }
        emu.emu_start(pc, RETURN, left.as_micros().max(1) as u64, 0)
            .map_err(|e| {
                let pc = emu.reg_read(RegisterARM64::PC).unwrap_or(0);
                format!("emulation failed at pc {:#x}: {e:?}", pc.wrapping_sub(CODE))
            })?;
        pc = emu.reg_read(RegisterARM64::PC).unwrap();
    }
    for n in 19..=29 {
        let v = emu.reg_read(x(n)).unwrap();
        if v != sentinel(n) {
            return Err(format!("x{n} not preserved: {v:#x}"));
        }
    }
    for n in 8..=15 {
        let v = emu.reg_read(d(n)).unwrap();
        if v != sentinel(n + 100) {
            return Err(format!("d{n} not preserved: {v:#x}"));
        }
    }
    let now = emu.reg_read(RegisterARM64::SP).unwrap();
    if now != sp {
        return Err(format!("sp changed from {sp:#x} to {now:#x}"));
    }
    let mut out = vec![0u8; buffers[2].len()];
    emu.mem_read(starts[2], &mut out)
        .map_err(|e| err("read C", e))?;
    c.copy_from_slice(&from_le_bytes::<T>(&out));
    Ok(())
}

/// The alpha and beta values a spec's kinds call for (arbitrary ones for `Runtime`).
pub fn scalars(spec: &GemmSpec) -> (f64, f64) {
    (
        spec.alpha().value().unwrap_or(1.375),
        spec.beta().value().unwrap_or(-0.625),
    )
}

/// The run-time scalars of `program`, in argument order.
pub fn params<T: Element>(program: &Program, alpha: T, beta: T) -> Vec<T> {
    program
        .params
        .iter()
        .map(|p| match p {
            Param::Alpha => alpha,
            Param::Beta => beta,
        })
        .collect()
}

/// Compiles `spec` for NEON, runs it on a random batch in the emulator, checks it against
/// the reference and the sentinels, and checks that the interpreter of the same Program
/// gives the same bits.
pub fn check_spec<T: Element>(spec: &GemmSpec, batch: usize, seed: u64) {
    let name = spec.name();
    let (schedule, program) =
        compile_program(spec, Target::NEON, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let code = smallgemm_codegen_arm::emit(&program).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (alpha, beta) = scalars(spec);
    let (alpha, beta) = (T::from_f64(alpha), T::from_f64(beta));
    let params = params(&program, alpha, beta);
    let mut data = TestData::<T>::new(spec, batch, seed);
    let (a, b) = (data.a.clone(), data.b.clone());
    // Row-major specs run as column-major with the operands exchanged.
    let (ka, kb) = if spec.col_major().swap_operands {
        (&b, &a)
    } else {
        (&a, &b)
    };
    let offsets = data.offsets.clone();
    let (oa, ob) = if spec.col_major().swap_operands {
        (&offsets[1], &offsets[0])
    } else {
        (&offsets[0], &offsets[1])
    };
    let pointers = (spec.batch_form() == BatchForm::PointerArrays).then_some([
        oa.as_slice(),
        ob.as_slice(),
        offsets[2].as_slice(),
    ]);
    run_emulated(&code.bytes, ka, kb, data.c_mut(), pointers, batch, &params).unwrap_or_else(|e| {
        panic!(
            "{name} (schedule {schedule:?}, batch {batch}, seed {seed}): {e}\n{}",
            smallgemm_codegen_arm::listing(&code)
        )
    });
    let report = data.check(alpha.to_f64(), beta.to_f64());
    assert!(
        report.passed(),
        "{name} on neon (schedule {schedule:?}, batch {batch}, seed {seed}): {}",
        report.failure.as_deref().unwrap_or("")
    );
    let machine = data.c().to_vec();
    data.reset_c();
    match pointers {
        None => interpret(&program, ka, kb, data.c_mut(), batch, &params),
        Some(p) => interpret_pointer_arrays(&program, ka, kb, data.c_mut(), p, batch, &params),
    }
    .unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    let mismatch = machine
        .iter()
        .zip(data.c())
        .position(|(x, y)| x.bits() != y.bits());
    if let Some(i) = mismatch {
        panic!(
            "{name} on neon: emulated code and interpreter differ at C element {i}: {} vs {}",
            machine[i],
            data.c()[i]
        );
    }
}
