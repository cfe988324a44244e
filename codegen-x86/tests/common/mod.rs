//! Runs x86 kernels in the emulator (`../emu`) and checks them as the hardware matrix
//! (`jit-runtime/tests/correctness.rs`) does: against the double-double reference
//! (sentinels in and around C, NaN in C when beta = 0) and bit for bit against the `Program`
//! interpreter. The emulator also checks the calling convention (the callee-saved
//! registers, the stack pointer, the caller's frame) and every memory access: A, B, C and
//! the pointer arrays each fill a region of their own, and any access outside them fails.

#![allow(dead_code)]

use std::collections::BTreeMap;

use smallgemm_codegen_x86::CallConv;
use smallgemm_ir::reference::{from_le_bytes, to_le_bytes, TestData};
use smallgemm_ir::{
    compile_program, interpret, interpret_pointer_arrays, BatchForm, Dtype, Element, GemmSpec,
    MachineCode, Param, Program, Schedule, Target,
};

use crate::emu::{Cpu, Flags, Machine, Memory, Region, Trace, Zmm, RSP};

const CODE: u64 = 0x40_0000;
/// Where the kernel's `ret` goes: no region, so nothing runs there.
const RETURN: u64 = 0xdead_0000;
const STACK_END: u64 = 0x7fff_f000_0000;
/// A, B, C end at these page boundaries (unless C must start aligned: see `run_emulated`).
const OPERAND_ENDS: [u64; 3] = [0x1000_0000_0000, 0x2000_0000_0000, 0x3000_0000_0000];
/// The arrays of pointers of pointer-array batches end at these.
const POINTER_ENDS: [u64; 3] = [0x4000_0000_0000, 0x5000_0000_0000, 0x6000_0000_0000];
/// The caller's frame above the entry stack pointer: the return address, Win64's 32-byte
/// shadow space and its two stack arguments, padding to 16 bytes. The entry stack pointer
/// is 8 below a multiple of 16, as both conventions have it after the call.
const CALLER_FRAME: u64 = 72;
/// The most instructions one kernel may run (the largest run a few million).
const STEP_LIMIT: u64 = 200_000_000;

/// Instruction forms executed, over any number of runs.
pub type Coverage = BTreeMap<String, u64>;

pub fn merge(into: &mut Coverage, trace: &Trace) {
    for (form, n) in &trace.forms {
        *into.entry(form.clone()).or_insert(0) += n;
    }
}

/// A recognisable value for register `n` (the same for each run, so that failures repeat).
fn junk(n: u64) -> u64 {
    0x5a5a_0000_0000_0011 | n << 12
}

/// A region of `bytes` that ends at `end`.
fn ending_at(name: &'static str, end: u64, bytes: Vec<u8>, writable: bool) -> Region {
    Region {
        name,
        base: end - bytes.len() as u64,
        bytes,
        writable,
    }
}

/// One call of a kernel in the emulator.
pub struct Call<'a, T: Element> {
    pub code: &'a MachineCode,
    pub conv: CallConv,
    pub a: &'a [T],
    pub b: &'a [T],
    pub c: &'a mut [T],
    /// For pointer-array batches: element offsets of each matrix in a, b, c.
    pub pointers: Option<[&'a [usize]; 3]>,
    pub batch: usize,
    pub params: &'a [T],
    /// C's first byte must be aligned to this (non-temporal stores), or 0.
    pub c_align: u64,
    /// Bytes of stack the kernel may use below its entry stack pointer.
    pub stack_bytes: usize,
}

/// Runs `call`, updating its C; checks the calling convention.
pub fn run_emulated<T: Element>(call: Call<'_, T>) -> Result<Trace, String> {
    let machine = Machine::new(&call.code.bytes, call.code.code_len, CODE)?;
    let mut memory = Memory::default();
    // The stack, its top holding the caller's frame (filled with junk, checked afterwards).
    let stack_len = call.stack_bytes + CALLER_FRAME as usize;
    let mut stack = vec![0xa5; stack_len];
    let entry_sp = STACK_END - CALLER_FRAME;
    let frame_at = stack_len - CALLER_FRAME as usize;
    stack[frame_at..frame_at + 8].copy_from_slice(&RETURN.to_le_bytes());
    let stack = ending_at("the stack", STACK_END, stack, true);
    // Each operand fills its region, ending at a page boundary, or starting aligned when the
    // kernel needs C aligned.
    let names = ["A", "B", "C"];
    let buffers = [
        to_le_bytes(call.a),
        to_le_bytes(call.b),
        to_le_bytes(call.c),
    ];
    let mut starts = [0u64; 3];
    for (i, bytes) in buffers.into_iter().enumerate() {
        let mut end = OPERAND_ENDS[i];
        if i == 2 && call.c_align > 0 {
            end = OPERAND_ENDS[i] + bytes.len() as u64;
        }
        let region = ending_at(names[i], end, bytes, i == 2);
        starts[i] = region.base;
        memory.regions.push(region);
    }
    if call.c_align > 0 {
        assert_eq!(starts[2] % call.c_align, 0);
    }
    let mut arguments = starts;
    if let Some(offsets) = call.pointers {
        let elt = T::DTYPE.size() as u64;
        let lists = ["A's pointers", "B's pointers", "C's pointers"];
        for (i, list) in offsets.iter().enumerate() {
            let bytes: Vec<u8> = list
                .iter()
                .flat_map(|&o| (starts[i] + o as u64 * elt).to_le_bytes())
                .collect();
            let region = ending_at(lists[i], POINTER_ENDS[i], bytes, false);
            arguments[i] = region.base;
            memory.regions.push(region);
        }
    }
    memory.regions.push(stack);
    // Junk everywhere the kernel may not rely on anything, then the arguments.
    let mut cpu = Cpu::default();
    for n in 0..16 {
        cpu.gpr[n] = junk(n as u64);
    }
    for (n, z) in cpu.zmm.iter_mut().enumerate() {
        *z = std::array::from_fn(|q| junk(100 + 8 * n as u64 + q as u64));
    }
    for (n, k) in cpu.k.iter_mut().enumerate() {
        *k = junk(400 + n as u64);
    }
    cpu.flags = Flags {
        cf: true,
        zf: true,
        sf: true,
        of: true,
    };
    cpu.gpr[RSP] = entry_sp;
    let bits = |p: &T| match T::DTYPE {
        Dtype::F64 => p.bits(),
        _ => p.bits() | junk(500) << 32,
    };
    let (argument_regs, callee_saved, vectors_saved): (_, &[usize], _) = match call.conv {
        // rdi, rsi, rdx, rcx; rbx, rbp, r12-r15.
        CallConv::SysV => ([7, 6, 2, 1], &[3, 5, 12, 13, 14, 15], 0..0),
        // rcx, rdx, r8, r9; rbx, rbp, rdi, rsi, r12-r15, xmm6-xmm15.
        CallConv::Win64 => ([1, 2, 8, 9], &[3, 5, 6, 7, 12, 13, 14, 15], 6..16),
    };
    for (r, value) in argument_regs.iter().zip(arguments) {
        cpu.gpr[*r] = value;
    }
    cpu.gpr[argument_regs[3]] = call.batch as u64;
    for (i, p) in call.params.iter().enumerate() {
        match call.conv {
            // In the low lane of xmm0 and xmm1; the rest of the registers is junk.
            CallConv::SysV => match T::DTYPE {
                Dtype::F64 => cpu.zmm[i][0] = p.bits(),
                _ => cpu.zmm[i][0] = cpu.zmm[i][0] & !0xFFFF_FFFF | p.bits(),
            },
            // The fifth and sixth arguments' 8-byte slots, above the shadow space (an f32
            // in the low half, junk above it).
            CallConv::Win64 => {
                let at = entry_sp + 40 + 8 * i as u64;
                memory.write(at, &bits(p).to_le_bytes())?;
            }
        }
    }
    // Looked up in order: the operands first, the most accessed.
    memory.regions.push(Region {
        name: "the code",
        base: CODE,
        bytes: call.code.bytes.clone(),
        writable: false,
    });
    let before = cpu.clone();
    let frame_before = memory.read(entry_sp, CALLER_FRAME as usize)?.to_vec();
    let trace = machine.run(&mut cpu, &mut memory, RETURN, STEP_LIMIT)?;
    for &r in callee_saved {
        if cpu.gpr[r] != before.gpr[r] {
            return Err(format!(
                "general register {r} not preserved: {:#x}",
                cpu.gpr[r]
            ));
        }
    }
    for v in vectors_saved {
        let low = |z: &Zmm| [z[0], z[1]];
        if low(&cpu.zmm[v]) != low(&before.zmm[v]) {
            return Err(format!("xmm{v} not preserved"));
        }
    }
    if cpu.gpr[RSP] != entry_sp + 8 {
        return Err(format!(
            "rsp {:#x} after the return, expected {:#x}",
            cpu.gpr[RSP],
            entry_sp + 8
        ));
    }
    if memory.read(entry_sp, CALLER_FRAME as usize)? != frame_before {
        return Err("the caller's frame above the entry stack pointer changed".into());
    }
    let c = memory.region("C").expect("C's region");
    call.c.copy_from_slice(&from_le_bytes::<T>(&c.bytes));
    Ok(trace)
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

/// Runs `code` (compiled from `program` for `spec`) in the emulator on `data`, whose C it
/// updates.
pub fn emulate<T: Element>(
    spec: &GemmSpec,
    program: &Program,
    code: &MachineCode,
    conv: CallConv,
    data: &mut TestData<T>,
) -> Result<Trace, String> {
    let (alpha, beta) = scalars(spec);
    let params = params(program, T::from_f64(alpha), T::from_f64(beta));
    let (a, b) = (data.a.clone(), data.b.clone());
    let offsets = data.offsets.clone();
    // Row-major specs run as column-major with the operands exchanged.
    let swap = spec.col_major().swap_operands;
    let (ka, kb) = if swap { (&b, &a) } else { (&a, &b) };
    let (oa, ob) = if swap {
        (&offsets[1], &offsets[0])
    } else {
        (&offsets[0], &offsets[1])
    };
    let pointers = (spec.batch_form() == BatchForm::PointerArrays).then_some([
        oa.as_slice(),
        ob.as_slice(),
        offsets[2].as_slice(),
    ]);
    let batch = data.batch;
    run_emulated(Call {
        code,
        conv,
        a: ka,
        b: kb,
        c: data.c_mut(),
        pointers,
        batch,
        params: &params,
        c_align: if program.stores_streaming() {
            program.vector_bytes() as u64
        } else {
            0
        },
        stack_bytes: program.scratch_bytes as usize + 4096,
    })
}

/// What to compile: a spec on a target, with the planner's schedule or a given one, the
/// stores of C made non-temporal or not, in a calling convention.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub spec: GemmSpec,
    pub target: Target,
    pub schedule: Option<Schedule>,
    pub stream_store: bool,
    pub conv: CallConv,
}

impl Case {
    pub fn new(spec: GemmSpec, target: Target) -> Case {
        Case {
            spec,
            target,
            schedule: None,
            stream_store: false,
            conv: CallConv::SysV,
        }
    }

    pub fn schedule(self, schedule: Schedule) -> Case {
        Case {
            schedule: Some(schedule),
            ..self
        }
    }

    /// The program and its machine code.
    pub fn compile(&self) -> (Schedule, Program, MachineCode) {
        let name = self.spec.name();
        let (schedule, mut program) =
            compile_program(&self.spec, self.target, self.schedule.as_ref())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        if self.stream_store {
            assert!(
                smallgemm_ir::stream_store::apply(&mut program),
                "{name} {schedule:?}: no streaming stores"
            );
        }
        let code = smallgemm_codegen_x86::emit_with(&program, self.target.isa, self.conv)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        (schedule, program, code)
    }

    /// Compiles, runs on a random batch in the emulator, checks against the reference and
    /// the sentinels, and checks that the interpreter gives the same bits.
    pub fn check(&self, batch: usize, seed: u64) -> Trace {
        self.check_compiled(&self.compile(), batch, seed, None).0
    }

    /// [`Case::check`] of code already compiled by [`Case::compile`]; also returns the bits
    /// of C (the whole slice the kernel got). With `checked`, the bits of C that another
    /// kernel left on the same data and that passed the reference check: the same bits
    /// pass it too, and it is not repeated.
    pub fn check_compiled(
        &self,
        compiled: &(Schedule, Program, MachineCode),
        batch: usize,
        seed: u64,
        checked: Option<&[u64]>,
    ) -> (Trace, Vec<u64>) {
        match self.spec.dtype() {
            Dtype::F64 => self.check_as::<f64>(compiled, batch, seed, checked),
            _ => self.check_as::<f32>(compiled, batch, seed, checked),
        }
    }

    fn check_as<T: Element>(
        &self,
        (schedule, program, code): &(Schedule, Program, MachineCode),
        batch: usize,
        seed: u64,
        checked: Option<&[u64]>,
    ) -> (Trace, Vec<u64>) {
        let (spec, target) = (&self.spec, self.target);
        let what = || {
            format!(
                "{} on {target} ({:?}, schedule {schedule:?}, streaming stores {}, batch {batch}, seed {seed})",
                spec.name(),
                self.conv,
                self.stream_store
            )
        };
        let mut data = TestData::<T>::new(spec, batch, seed);
        let trace = emulate(spec, program, code, self.conv, &mut data).unwrap_or_else(|e| {
            panic!("{}: {e}\n{}", what(), smallgemm_codegen_x86::listing(code))
        });
        let (alpha, beta) = scalars(spec);
        let (alpha, beta) = (T::from_f64(alpha), T::from_f64(beta));
        let emulated = data.c().to_vec();
        let bits: Vec<u64> = emulated.iter().map(|x| x.bits()).collect();
        if checked != Some(&bits) {
            let report = data.check(alpha.to_f64(), beta.to_f64());
            assert!(
                report.passed(),
                "{}: {}",
                what(),
                report.failure.as_deref().unwrap_or("")
            );
        }
        data.reset_c();
        let params = params(program, alpha, beta);
        let (a, b) = (data.a.clone(), data.b.clone());
        let swap = spec.col_major().swap_operands;
        let (ka, kb) = if swap { (&b, &a) } else { (&a, &b) };
        let offsets = data.offsets.clone();
        let (oa, ob) = if swap {
            (&offsets[1], &offsets[0])
        } else {
            (&offsets[0], &offsets[1])
        };
        match spec.batch_form() {
            BatchForm::Strided => interpret(program, ka, kb, data.c_mut(), batch, &params),
            BatchForm::PointerArrays => {
                let p = [oa.as_slice(), ob.as_slice(), offsets[2].as_slice()];
                interpret_pointer_arrays(program, ka, kb, data.c_mut(), p, batch, &params)
            }
        }
        .unwrap_or_else(|e| panic!("{}: interpreter: {e}", what()));
        let mismatch = emulated
            .iter()
            .zip(data.c())
            .position(|(x, y)| x.bits() != y.bits());
        if let Some(i) = mismatch {
            panic!(
                "{}: emulated code and interpreter differ at C element {i}: {} vs {}",
                what(),
                emulated[i],
                data.c()[i]
            );
        }
        (trace, bits)
    }
}
