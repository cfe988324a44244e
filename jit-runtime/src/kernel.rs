//! `Kernel`: one compiled, executable GEMM kernel and its checked entry points.

use std::time::{Duration, Instant};

use smallgemm_ir::{
    compile_program, Element, GemmSpec, Isa, MachineCode, Operand, Param, Program, Schedule, Target,
};

use crate::exec::ExecutableCode;
use crate::Error;

/// What code generation produced for a spec, before it is mapped executable.
#[derive(Clone, Debug)]
pub struct Generated {
    pub schedule: Schedule,
    pub program: Program,
    pub code: MachineCode,
}

/// Plans (unless `schedule` is given), lowers and encodes `spec` for `target`. Works for
/// any target, whether or not this CPU can run it (offline emission).
pub fn generate(
    spec: &GemmSpec,
    target: Target,
    schedule: Option<&Schedule>,
) -> Result<Generated, Error> {
    let (schedule, program) = compile_program(spec, target, schedule)?;
    let code = match target.isa {
        Isa::Avx2 | Isa::Avx512 => smallgemm_codegen_x86::emit(&program, target.isa)?,
    };
    Ok(Generated {
        schedule,
        program,
        code,
    })
}

/// The listing of machine code for `isa`: offsets, bytes and assembly, then constants.
pub fn listing(isa: Isa, code: &MachineCode) -> String {
    match isa {
        Isa::Avx2 | Isa::Avx512 => smallgemm_codegen_x86::listing(code),
    }
}

/// A compiled kernel for one spec on one target: call it with [`Kernel::run`] on slices or
/// [`Kernel::run_raw`] on pointers. It runs the whole batch in one call.
#[derive(Debug)]
pub struct Kernel {
    spec: GemmSpec,
    target: Target,
    schedule: Schedule,
    code: MachineCode,
    params: Vec<Param>,
    exec: ExecutableCode,
    compile_time: Duration,
}

impl Kernel {
    /// Compiles `spec` for `target`. The caller guarantees this CPU runs `target`
    /// (`Jit` checks it once).
    pub(crate) fn compile(
        spec: &GemmSpec,
        target: Target,
        schedule: Option<&Schedule>,
    ) -> Result<Kernel, Error> {
        let start = Instant::now();
        let generated = generate(spec, target, schedule)?;
        let exec = ExecutableCode::new(&generated.code.bytes)?;
        Ok(Kernel {
            spec: *spec,
            target,
            schedule: generated.schedule,
            params: generated.program.params.clone(),
            code: generated.code,
            exec,
            compile_time: start.elapsed(),
        })
    }

    pub fn spec(&self) -> &GemmSpec {
        &self.spec
    }
    pub fn target(&self) -> Target {
        self.target
    }
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
    /// The machine code (instructions, then constants).
    pub fn code(&self) -> &MachineCode {
        &self.code
    }
    /// Intel-syntax listing of the machine code.
    pub fn listing(&self) -> String {
        listing(self.target.isa, &self.code)
    }
    /// Time from spec to callable code (plan, lower, encode, map).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Runs the GEMM on `batch` matrices of the slices: matrix i of A starts at
    /// `a[i * stride_a]`, and likewise for B and C. Checks the element type, that alpha and
    /// beta match the kinds the kernel was compiled for (any value for `Scalar::Runtime`),
    /// and that every slice holds the whole batch, before anything runs. A batch of 0 is a
    /// no-op.
    pub fn run<T: Element>(
        &self,
        a: &[T],
        b: &[T],
        c: &mut [T],
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        self.check_call(alpha, beta)?;
        for (operand, len) in [
            (Operand::A, a.len()),
            (Operand::B, b.len()),
            (Operand::C, c.len()),
        ] {
            let required = self.spec.required_len(operand, batch);
            if len < required {
                return Err(Error::SliceTooShort {
                    operand,
                    len,
                    required,
                    batch,
                });
            }
        }
        if batch == 0 {
            return Ok(());
        }
        // SAFETY: the slices hold the whole batch (checked above), are aligned, and Rust's
        // borrows keep C from aliasing A or B.
        unsafe { self.call(a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), batch, alpha, beta) }
    }

    /// Runs the GEMM on `batch` matrices at raw pointers.
    ///
    /// Checks the element type, alpha and beta (as [`Kernel::run`]), null and misaligned
    /// pointers, and returns at once when `batch` is 0.
    ///
    /// # Safety
    ///
    /// For each operand X of A, B, C: `x` points to `spec.required_len(X, batch)` elements
    /// of T that are valid to read (and, for C, to write) for the whole call. C's elements
    /// do not overlap A's or B's, and no other thread reads or writes the C elements the
    /// GEMM writes (the m x n block of each matrix) during the call. Elements of C outside
    /// those blocks (ld padding, gaps between matrices) are neither read nor written.
    pub unsafe fn run_raw<T: Element>(
        &self,
        a: *const T,
        b: *const T,
        c: *mut T,
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        self.check_call(alpha, beta)?;
        if batch == 0 {
            return Ok(());
        }
        for (operand, p) in [
            (Operand::A, a as usize),
            (Operand::B, b as usize),
            (Operand::C, c as usize),
        ] {
            if p == 0 {
                return Err(Error::NullPointer { operand });
            }
            if p % std::mem::align_of::<T>() != 0 {
                return Err(Error::Misaligned { operand });
            }
        }
        self.call(a, b, c, batch, alpha, beta)
    }

    fn check_call<T: Element>(&self, alpha: T, beta: T) -> Result<(), Error> {
        if T::DTYPE != self.spec.dtype() {
            return Err(Error::DtypeMismatch {
                kernel: self.spec.dtype(),
                given: T::DTYPE,
            });
        }
        for (which, kind, given) in [
            ("alpha", self.spec.alpha(), alpha),
            ("beta", self.spec.beta(), beta),
        ] {
            if let Some(compiled) = kind.value() {
                if T::from_f64(compiled) != given {
                    return Err(Error::ScalarMismatch {
                        which,
                        compiled,
                        given: given.to_f64(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Calls the machine code. Safety: as `run_raw`, with batch > 0 and the call checked.
    unsafe fn call<T: Element>(
        &self,
        a: *const T,
        b: *const T,
        c: *mut T,
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        // Row-major specs run as column-major with the operands exchanged.
        let (a, b) = if self.spec.col_major().swap_operands {
            (b, a)
        } else {
            (a, b)
        };
        // The run-time scalars go in argument order; the kernel ignores extra ones.
        let (x0, x1) = match self.params.as_slice() {
            [Param::Beta, ..] => (beta, alpha),
            _ => (alpha, beta),
        };
        #[cfg(target_arch = "x86_64")]
        {
            type Entry<T> = unsafe extern "sysv64" fn(*const T, *const T, *mut T, usize, T, T);
            // SAFETY: the code was emitted for this signature (System V, see codegen-x86) on
            // a target this CPU runs, and stays mapped while `self` lives.
            let entry: Entry<T> = std::mem::transmute::<*const u8, Entry<T>>(self.exec.entry());
            entry(a, b, c, batch, x0, x1);
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, b, c, batch, x0, x1);
            Err(Error::NoSupportedIsa)
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use smallgemm_ir::{Dtype, Scalar, Trans};

    /// Calls the kernel with sentinels in every callee-saved general register and returns a
    /// bit per register (rbx, rbp, r12, r13, r14, r15) that came back changed.
    unsafe fn call_checking_callee_saved(
        kernel: &Kernel,
        a: *const f64,
        b: *const f64,
        c: *mut f64,
        batch: usize,
    ) -> u64 {
        let changed: u64;
        std::arch::asm!(
            "push rbx", "push rbp", "push r12", "push r13", "push r14", "push r15",
            // Align the stack for the call; remember where it was.
            "mov rax, rsp", "and rsp, -16", "push rax", "push rax",
            "mov rbx, 0x1111", "mov rbp, 0x2222", "mov r12, 0x3333",
            "mov r13, 0x4444", "mov r14, 0x5555", "mov r15, 0x6666",
            "call r11",
            "xor r8, r8",
            "cmp rbx, 0x1111", "setne al", "movzx rax, al", "or r8, rax",
            "cmp rbp, 0x2222", "setne al", "movzx rax, al", "shl rax, 1", "or r8, rax",
            "cmp r12, 0x3333", "setne al", "movzx rax, al", "shl rax, 2", "or r8, rax",
            "cmp r13, 0x4444", "setne al", "movzx rax, al", "shl rax, 3", "or r8, rax",
            "cmp r14, 0x5555", "setne al", "movzx rax, al", "shl rax, 4", "or r8, rax",
            "cmp r15, 0x6666", "setne al", "movzx rax, al", "shl rax, 5", "or r8, rax",
            "pop rax", "pop rax", "mov rsp, rax",
            "pop r15", "pop r14", "pop r13", "pop r12", "pop rbp", "pop rbx",
            in("rdi") a, in("rsi") b, in("rdx") c, in("rcx") batch,
            in("xmm0") 1.25f64, in("xmm1") 0.5f64,
            in("r11") kernel.exec.entry(),
            out("r8") changed,
            clobber_abi("sysv64"),
        );
        changed
    }

    #[test]
    fn callee_saved_registers_survive() {
        for isa in crate::supported_isas() {
            let target = Target::new(isa);
            // Large and transposed enough to loop over blocks and k (many general registers)
            // and to need scratch memory (a frame).
            for (m, n, k, ta) in [
                (256, 256, 256, Trans::T),
                (200, 150, 100, Trans::N),
                (3, 3, 3, Trans::N),
            ] {
                let spec = GemmSpec::builder(Dtype::F64, m, n, k)
                    .trans_a(ta)
                    .alpha(Scalar::Runtime)
                    .beta(Scalar::Runtime)
                    .build()
                    .unwrap();
                let kernel = Kernel::compile(&spec, target, None).unwrap();
                let a = vec![1.0; spec.required_len(smallgemm_ir::Operand::A, 2)];
                let b = vec![1.0; spec.required_len(smallgemm_ir::Operand::B, 2)];
                let mut c = vec![1.0; spec.required_len(smallgemm_ir::Operand::C, 2)];
                // SAFETY: the buffers hold a batch of 2; the trampoline restores everything.
                let changed = unsafe {
                    call_checking_callee_saved(&kernel, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 2)
                };
                assert_eq!(
                    changed, 0,
                    "{isa:?} {m}x{n}x{k}: callee-saved registers changed: {changed:#b}"
                );
                assert_eq!(c[0], 1.25 * k as f64 + 0.5, "{isa:?}");
            }
        }
    }
}
