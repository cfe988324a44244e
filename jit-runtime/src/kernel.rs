//! `Kernel`: one compiled, executable GEMM kernel and its checked entry points.

use std::time::{Duration, Instant};

use smallgemm_codegen_x86::MachineCode;
use smallgemm_ir::{compile_program, Element, GemmSpec, Operand, Param, Program, Schedule, Target};

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
    let code = smallgemm_codegen_x86::emit(&program, target.isa)?;
    Ok(Generated {
        schedule,
        program,
        code,
    })
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
        smallgemm_codegen_x86::listing(&self.code)
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
