//! `Kernel`: one compiled, executable GEMM kernel and its checked entry points.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smallgemm_ir::{
    compile_program, BatchForm, Element, GemmSpec, Isa, MachineCode, Operand, Param, Program,
    Scalar, Schedule, Target,
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

/// The calling convention of generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Abi {
    /// The usual one of the ISA's Unix systems: System V on x86-64 (what the JIT runs).
    #[default]
    Native,
    /// Microsoft x64 (Windows objects): arguments in rcx, rdx, r8, r9 and on the stack,
    /// xmm6–xmm15 preserved.
    Windows,
}

/// Plans (unless `schedule` is given), lowers and encodes `spec` for `target`. Works for
/// any target, whether or not this CPU can run it (offline emission).
pub fn generate(
    spec: &GemmSpec,
    target: Target,
    schedule: Option<&Schedule>,
) -> Result<Generated, Error> {
    generate_with_abi(spec, target, schedule, Abi::Native)
}

/// As [`generate`], for the calling convention `abi`.
pub fn generate_with_abi(
    spec: &GemmSpec,
    target: Target,
    schedule: Option<&Schedule>,
    abi: Abi,
) -> Result<Generated, Error> {
    let (schedule, program) = compile_program(spec, target, schedule)?;
    let code = emit(&program, target, abi)?;
    Ok(Generated {
        schedule,
        program,
        code,
    })
}

/// Encodes `program` for `target` in the calling convention `abi`.
fn emit(program: &Program, target: Target, abi: Abi) -> Result<MachineCode, Error> {
    let conv = match abi {
        Abi::Native => smallgemm_codegen_x86::CallConv::SysV,
        Abi::Windows => smallgemm_codegen_x86::CallConv::Win64,
    };
    Ok(match target.isa {
        Isa::Avx2 | Isa::Avx512 => smallgemm_codegen_x86::emit_with(program, target.isa, conv)?,
        Isa::Neon => smallgemm_codegen_arm::emit(program)?,
    })
}

/// The first of the A, B, C addresses that is null, as an error.
fn check_non_null(addresses: [usize; 3]) -> Result<(), Error> {
    for (operand, p) in [Operand::A, Operand::B, Operand::C]
        .into_iter()
        .zip(addresses)
    {
        if p == 0 {
            return Err(Error::NullPointer { operand });
        }
    }
    Ok(())
}

/// The listing of machine code for `isa`: offsets, bytes and assembly, then constants.
pub fn listing(isa: Isa, code: &MachineCode) -> String {
    match isa {
        Isa::Avx2 | Isa::Avx512 => smallgemm_codegen_x86::listing(code),
        Isa::Neon => smallgemm_codegen_arm::listing(code),
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
    /// The variant that prefetches the next matrices, for batches that stream from memory:
    /// compiled on the first such call; None where it does not pay, where it would be the
    /// kernel's own code (no prefetching on this CPU, no re-blocking), or where it failed to
    /// compile (the kernel's own code then runs, correct and a little slower).
    streaming: OnceLock<Option<Variant>>,
    /// `streaming` with C written by non-temporal stores, for beta = 0 (see
    /// [`smallgemm_ir::stream_store`]): run only on calls whose C is aligned as the variant
    /// needs and whose batch outgrows the last-level cache. None where no store qualifies.
    streaming_stores: OnceLock<Option<Variant>>,
    /// Whether `streaming` may block differently from `schedule` (see [`Kernel::compile`]).
    stream_blocks: bool,
    /// The fewest matrices a call needs to run `streaming` (usize::MAX: never).
    streaming_batch: usize,
    /// The fewest matrices a call needs to run `streaming_stores` (usize::MAX: never).
    streaming_stores_batch: usize,
    compile_time: Duration,
}

/// Code compiled from another schedule than the kernel's own, for some calls.
#[derive(Debug)]
struct Variant {
    code: ExecutableCode,
    schedule: Schedule,
    /// The alignment of C its streaming stores need (the vector width in bytes).
    c_align: usize,
}

/// `code` mapped executable and named in the perf map.
fn map_named(code: &MachineCode, name: impl FnOnce() -> String) -> Result<ExecutableCode, Error> {
    let exec = ExecutableCode::new(&code.bytes)?;
    crate::perfmap::register(exec.entry(), code.bytes.len(), name);
    Ok(exec)
}

/// Bytes a strided batch of `spec` spans per matrix: its A, B and C strides.
fn batch_bytes_per_matrix(spec: &GemmSpec) -> usize {
    [Operand::A, Operand::B, Operand::C]
        .map(|o| spec.stride(o).saturating_mul(spec.dtype().size()))
        .iter()
        .fold(0usize, |sum, &x| sum.saturating_add(x))
}

/// The fewest matrices for which a strided batch of `spec` is larger than this core's L2
/// cache, where a variant of `schedule` for batches that stream from memory pays
/// ([`smallgemm_ir::streams_differently`]); usize::MAX where no such variant is wanted. A
/// schedule that prefetches already streams as it is, unless it has a dot-product or
/// packed tail, which streams slower (f64 20 and 26 lost 2.3 points of the bound with
/// theirs, f32 24 3).
fn streaming_batch(spec: &GemmSpec, target: Target, schedule: &Schedule, reblock: bool) -> usize {
    let per_matrix = batch_bytes_per_matrix(spec);
    if spec.batch_form() != BatchForm::Strided
        || (schedule.prefetch && !schedule.dot_tail)
        || per_matrix == 0
        || !smallgemm_ir::streams_differently(&spec.col_major(), target, schedule, reblock)
    {
        return usize::MAX;
    }
    // batch * per_matrix > L2  <=>  batch > L2 / per_matrix (rounded down).
    (crate::cpu::l2_bytes() / per_matrix).saturating_add(1)
}

/// The fewest matrices for which a strided batch of `spec` with beta = 0 is larger than
/// the last-level cache, where non-temporal stores of C pay: below it the caller's next read
/// of C would come from memory instead of the cache. usize::MAX where they do not apply.
fn streaming_stores_batch(spec: &GemmSpec, target: Target) -> usize {
    let per_matrix = batch_bytes_per_matrix(spec);
    if spec.batch_form() != BatchForm::Strided
        || spec.beta() != Scalar::Zero
        || target.isa == Isa::Neon
        || per_matrix == 0
    {
        return usize::MAX;
    }
    (crate::cpu::last_level_cache_bytes() / per_matrix).saturating_add(1)
}

impl Kernel {
    /// Compiles `spec` for `target`. The caller guarantees this CPU runs `target`
    /// (`Jit` checks it once).
    /// With `stream_blocks` the variant for batches that stream from memory may block
    /// differently ([`smallgemm_ir::plan_streaming`]); without, it is this schedule with
    /// prefetches (a schedule the caller chose keeps its blocking).
    pub(crate) fn compile(
        spec: &GemmSpec,
        target: Target,
        schedule: Option<&Schedule>,
        stream_blocks: bool,
    ) -> Result<Kernel, Error> {
        let start = Instant::now();
        let generated = generate(spec, target, schedule)?;
        let exec = map_named(&generated.code, || {
            format!("{}_{}", target.isa, spec.name())
        })?;
        Ok(Kernel {
            spec: *spec,
            target,
            schedule: generated.schedule,
            params: generated.program.params.clone(),
            code: generated.code,
            exec,
            streaming: OnceLock::new(),
            streaming_stores: OnceLock::new(),
            stream_blocks,
            streaming_batch: streaming_batch(spec, target, &generated.schedule, stream_blocks),
            streaming_stores_batch: streaming_stores_batch(spec, target),
            compile_time: start.elapsed(),
        })
    }

    /// Whether a call on `batch` matrices runs the variant for batches that stream from
    /// memory: strided batches larger than this core's L2 cache, of matrices for which one
    /// may pay ([`smallgemm_ir::streams_differently`]: prefetching, blocks as tall as m, or
    /// a plain block instead of lane packing). Where the variant's schedule comes out as the
    /// kernel's own, the call runs the kernel's code. Batches that sit in cache run without
    /// prefetches, which would cost them about 10%.
    pub fn streams(&self, batch: usize) -> bool {
        batch >= self.streaming_batch
    }

    /// Whether a call on `batch` matrices with C at `c` writes C with non-temporal stores,
    /// which leave it in memory rather than in the caches: for beta = 0, strided batches
    /// larger than the last-level cache, where every store of C is a whole vector aligned
    /// to the vector width when `c` is (columns and matrices a multiple of it apart), and
    /// `c` is. The first such query or call compiles that variant.
    pub fn stores_streaming(&self, batch: usize, c: *const u8) -> bool {
        self.streaming_stores_variant(batch, c).is_some()
    }

    /// The variant with non-temporal stores of C, where a call on `batch` matrices with C
    /// at `c` runs it (see [`Kernel::stores_streaming`]).
    fn streaming_stores_variant(&self, batch: usize, c: *const u8) -> Option<&Variant> {
        if batch < self.streaming_stores_batch {
            return None;
        }
        let v = self
            .streaming_stores
            .get_or_init(|| self.variant(self.streaming_stores_schedule(), "stream_nt", true))
            .as_ref()?;
        (c as usize % v.c_align == 0).then_some(v)
    }

    /// A variant of the kernel compiled from `schedule`, named in the perf map with `suffix`;
    /// with `stream_stores`, only where every store of C can stream
    /// ([`smallgemm_ir::stream_store`]). None where it cannot be made: the caller then runs
    /// other code, correct and a little slower.
    fn variant(&self, schedule: Schedule, suffix: &str, stream_stores: bool) -> Option<Variant> {
        let (_, mut program) = compile_program(&self.spec, self.target, Some(&schedule)).ok()?;
        if stream_stores && !smallgemm_ir::stream_store::apply(&mut program) {
            return None;
        }
        let code = emit(&program, self.target, Abi::Native).ok()?;
        let exec = map_named(&code, || {
            format!("{}_{}_{suffix}", self.target.isa, self.spec.name())
        })
        .ok()?;
        Some(Variant {
            code: exec,
            schedule,
            c_align: program.vector_bytes(),
        })
    }

    /// The schedule of the variant with non-temporal stores of C: the streaming variant's
    /// where it has one, else the kernel's own.
    fn streaming_stores_schedule(&self) -> Schedule {
        if self.streaming_batch == usize::MAX {
            self.schedule
        } else {
            self.streaming_schedule()
        }
    }

    /// The schedule of the variant for batches that stream from memory: re-blocked
    /// ([`smallgemm_ir::plan_streaming`]) unless the caller chose the schedule, prefetching
    /// where that pays ([`smallgemm_ir::prefetch_pays`]).
    fn streaming_schedule(&self) -> Schedule {
        let problem = self.spec.col_major();
        if self.stream_blocks {
            smallgemm_ir::plan_streaming(&problem, self.target, &self.schedule)
        } else {
            Schedule {
                prefetch: smallgemm_ir::prefetch_pays(&problem, self.target),
                ..self.schedule
            }
        }
    }

    /// The code to run `batch` matrices, part of a batch of `whole`, with C at `c`: with
    /// beta = 0 and a whole batch larger than the last-level cache, a variant that writes C
    /// with non-temporal stores where they apply and `c` is aligned for them; else the
    /// streaming variant when the batch streams; else the kernel's own. Variants are
    /// compiled on the first call that runs them.
    fn entry(&self, batch: usize, whole: usize, c: *const u8) -> *const u8 {
        self.code_for(batch, whole, c).0
    }

    /// The entry [`Kernel::entry`] picks, and the schedule its code was compiled from.
    fn code_for(&self, batch: usize, whole: usize, c: *const u8) -> (*const u8, Schedule) {
        if let Some(v) = self.streaming_stores_variant(whole, c) {
            return (v.code.entry(), v.schedule);
        }
        if !self.streams(batch) {
            return (self.exec.entry(), self.schedule);
        }
        let variant = self.streaming.get_or_init(|| {
            // Planned here, on the first streaming call: most kernels never stream.
            let schedule = self.streaming_schedule();
            if schedule == self.schedule {
                // Not prefetching and not re-blocked: the kernel's own code.
                return None;
            }
            self.variant(schedule, "stream", false)
        });
        match variant {
            Some(v) => (v.code.entry(), v.schedule),
            None => (self.exec.entry(), self.schedule),
        }
    }

    /// The schedule of the code that a call on `batch` matrices with C at `c` runs: the
    /// kernel's own, or that of a variant for batches that stream from memory (see
    /// [`Kernel::streams`] and [`Kernel::stores_streaming`]). Variants block differently and
    /// may round differently (within the same error bounds); compiles the variant if no
    /// call has yet.
    pub fn schedule_for(&self, batch: usize, c: *const u8) -> Schedule {
        self.code_for(batch, batch, c).1
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
        self.check_call(BatchForm::Strided, alpha, beta)?;
        self.check_lengths([a.len(), b.len(), c.len()], batch)?;
        if batch == 0 {
            return Ok(());
        }
        // SAFETY: the slices hold the whole batch (checked above), are aligned, and Rust's
        // borrows keep C from aliasing A or B.
        unsafe {
            self.call(
                a.as_ptr().cast(),
                b.as_ptr().cast(),
                c.as_mut_ptr().cast(),
                batch,
                alpha,
                beta,
            )
        }
    }

    /// Runs the GEMM on a pointer-array batch given as slices, one per matrix: C_i =
    /// alpha op(A_i) op(B_i) + beta C_i for i in 0..c.len(). For kernels compiled with
    /// `GemmSpecBuilder::pointer_arrays`. A and B entries may repeat (the same matrix for
    /// several products); Rust's borrows keep the C matrices apart. Everything is checked
    /// before anything runs.
    pub fn run_pointers<T: Element>(
        &self,
        a: &[&[T]],
        b: &[&[T]],
        c: &mut [&mut [T]],
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        self.check_call(BatchForm::PointerArrays, alpha, beta)?;
        if a.len() != c.len() || b.len() != c.len() {
            return Err(Error::BatchLengths {
                a: a.len(),
                b: b.len(),
                c: c.len(),
            });
        }
        let check = |operand: Operand, lens: &mut dyn Iterator<Item = usize>| {
            let required = self.spec.footprint(operand);
            match lens.enumerate().find(|&(_, len)| len < required) {
                Some((index, len)) => Err(Error::MatrixTooShort {
                    operand,
                    index,
                    len,
                    required,
                }),
                None => Ok(()),
            }
        };
        check(Operand::A, &mut a.iter().map(|x| x.len()))?;
        check(Operand::B, &mut b.iter().map(|x| x.len()))?;
        check(Operand::C, &mut c.iter().map(|x| x.len()))?;
        if c.is_empty() {
            return Ok(());
        }
        let a: Vec<*const T> = a.iter().map(|x| x.as_ptr()).collect();
        let b: Vec<*const T> = b.iter().map(|x| x.as_ptr()).collect();
        let c: Vec<*mut T> = c.iter_mut().map(|x| x.as_mut_ptr()).collect();
        // SAFETY: every matrix is long enough (checked above); the arrays live for the call.
        unsafe {
            self.call(
                a.as_ptr().cast(),
                b.as_ptr().cast(),
                c.as_ptr().cast::<u8>().cast_mut(),
                c.len(),
                alpha,
                beta,
            )
        }
    }

    /// Runs the GEMM on `batch` matrices given by arrays of pointers (a pointer-array kernel).
    ///
    /// Checks the element type, the batch form, alpha and beta, and null arrays; returns at
    /// once when `batch` is 0.
    ///
    /// # Safety
    ///
    /// `a`, `b`, `c` each point to `batch` pointers. Each `a[i]`, `b[i]`, `c[i]` is non-null,
    /// aligned and points to `spec.footprint(X)` elements valid to read (C: and write) for the
    /// whole call. No C matrix overlaps another C matrix or any A or B matrix, and no other
    /// thread accesses the written C elements during the call.
    pub unsafe fn run_pointers_raw<T: Element>(
        &self,
        a: *const *const T,
        b: *const *const T,
        c: *const *mut T,
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        self.check_call(BatchForm::PointerArrays, alpha, beta)?;
        if batch == 0 {
            return Ok(());
        }
        check_non_null([a as usize, b as usize, c as usize])?;
        self.call(
            a.cast(),
            b.cast(),
            c.cast::<u8>().cast_mut(),
            batch,
            alpha,
            beta,
        )
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
        self.check_call(BatchForm::Strided, alpha, beta)?;
        if batch == 0 {
            return Ok(());
        }
        check_non_null([a as usize, b as usize, c as usize])?;
        for (operand, p) in [
            (Operand::A, a as usize),
            (Operand::B, b as usize),
            (Operand::C, c as usize),
        ] {
            if p % std::mem::align_of::<T>() != 0 {
                return Err(Error::Misaligned { operand });
            }
        }
        self.call(a.cast(), b.cast(), c.cast(), batch, alpha, beta)
    }

    /// Checks that slices of `lens` elements (A, B, C) hold a strided batch of `batch`.
    pub(crate) fn check_lengths(&self, lens: [usize; 3], batch: usize) -> Result<(), Error> {
        for (operand, len) in [Operand::A, Operand::B, Operand::C].into_iter().zip(lens) {
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
        Ok(())
    }

    pub(crate) fn check_call<T: Element>(
        &self,
        form: BatchForm,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        if form != self.spec.batch_form() {
            return Err(Error::BatchForm {
                kernel: self.spec.batch_form(),
                called: form,
            });
        }
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

    /// Calls the machine code with the kernel's first three arguments: the first matrices
    /// (strided) or the pointer arrays. Safety: as `run_raw` / `run_pointers_raw` for the
    /// kernel's batch form, with batch > 0 and `check_call` passed.
    pub(crate) unsafe fn call<T: Element>(
        &self,
        a: *const u8,
        b: *const u8,
        c: *mut u8,
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        self.call_part(a, b, c, batch, batch, alpha, beta)
    }

    /// As [`Kernel::call`] on `batch` matrices that are part of a batch of `whole` split
    /// across threads: whether C's stores bypass the caches depends on the whole batch's
    /// size (see [`Kernel::stores_streaming`]), the other variants on the part's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn call_part<T: Element>(
        &self,
        a: *const u8,
        b: *const u8,
        c: *mut u8,
        batch: usize,
        whole: usize,
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
            type Entry<T> = unsafe extern "sysv64" fn(*const u8, *const u8, *mut u8, usize, T, T);
            // SAFETY: the code was emitted for this signature (System V, see codegen-x86) on
            // a target this CPU runs, and stays mapped while `self` lives.
            let entry: Entry<T> =
                std::mem::transmute::<*const u8, Entry<T>>(self.entry(batch, whole, c));
            entry(a, b, c, batch, x0, x1);
            Ok(())
        }
        #[cfg(target_arch = "aarch64")]
        {
            // SAFETY: the code was emitted for this signature (AAPCS64: pointers and batch
            // in x0..x3, scalars in v0, v1; see codegen-arm) for NEON, the only ISA an
            // AArch64 JIT compiles for, and stays mapped while `self` lives.
            let entry: unsafe extern "C" fn(_, _, _, usize, T, T) =
                std::mem::transmute::<*const u8, _>(self.entry(batch, whole, c));
            entry(a, b, c, batch, x0, x1);
            Ok(())
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
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
                let kernel = Kernel::compile(&spec, target, None, true).unwrap();
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

/// The Microsoft x64 convention, run here through a trampoline (objects for Windows use it).
#[cfg(all(test, target_arch = "x86_64"))]
mod win64_tests {
    use super::*;
    use smallgemm_ir::reference::TestData;
    use smallgemm_ir::{Dtype, Scalar, Trans};

    /// Calls a Win64 kernel (a, b, c, batch in rcx, rdx, r8, r9; alpha, beta as the 5th and
    /// 6th arguments on the stack above the 32-byte shadow space) with sentinels in every
    /// Win64 callee-saved register; returns a bit per register that came back changed
    /// (xmm6..xmm15 bits 0..9, then rbx, rsi, rdi, r12, r13, r14, r15).
    unsafe fn call_win64(
        entry: *const u8,
        a: *const u8,
        b: *const u8,
        c: *mut u8,
        batch: usize,
        alpha: f64,
        beta: f64,
    ) -> u64 {
        let changed: u64;
        std::arch::asm!(
            "push rbx", "push rbp", "push rsi", "push rdi", "push r12", "push r13", "push r14", "push r15",
            "mov rbp, rsp", "and rsp, -16", "sub rsp, 64",
            "mov [rsp + 32], r10", "mov [rsp + 40], rax",
            "mov rax, 0x0606060606060606", "vmovq xmm6, rax",
            "mov rax, 0x0707070707070707", "vmovq xmm7, rax",
            "mov rax, 0x0808080808080808", "vmovq xmm8, rax",
            "mov rax, 0x0909090909090909", "vmovq xmm9, rax",
            "mov rax, 0x1010101010101010", "vmovq xmm10, rax",
            "mov rax, 0x1111111111111111", "vmovq xmm11, rax",
            "mov rax, 0x1212121212121212", "vmovq xmm12, rax",
            "mov rax, 0x1313131313131313", "vmovq xmm13, rax",
            "mov rax, 0x1414141414141414", "vmovq xmm14, rax",
            "mov rax, 0x1515151515151515", "vmovq xmm15, rax",
            "mov rbx, 0xb1", "mov rsi, 0xb2", "mov rdi, 0xb3",
            "mov r12, 0xb4", "mov r13, 0xb5", "mov r14, 0xb6", "mov r15, 0xb7",
            "call r11",
            "xor r8, r8",
            "vmovq rax, xmm6", "mov rdx, 0x0606060606060606", "cmp rax, rdx", "setne al", "movzx rax, al", "or r8, rax",
            "vmovq rax, xmm7", "mov rdx, 0x0707070707070707", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 1", "or r8, rax",
            "vmovq rax, xmm8", "mov rdx, 0x0808080808080808", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 2", "or r8, rax",
            "vmovq rax, xmm9", "mov rdx, 0x0909090909090909", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 3", "or r8, rax",
            "vmovq rax, xmm10", "mov rdx, 0x1010101010101010", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 4", "or r8, rax",
            "vmovq rax, xmm11", "mov rdx, 0x1111111111111111", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 5", "or r8, rax",
            "vmovq rax, xmm12", "mov rdx, 0x1212121212121212", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 6", "or r8, rax",
            "vmovq rax, xmm13", "mov rdx, 0x1313131313131313", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 7", "or r8, rax",
            "vmovq rax, xmm14", "mov rdx, 0x1414141414141414", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 8", "or r8, rax",
            "vmovq rax, xmm15", "mov rdx, 0x1515151515151515", "cmp rax, rdx", "setne al", "movzx rax, al", "shl rax, 9", "or r8, rax",
            "cmp rbx, 0xb1", "setne al", "movzx rax, al", "shl rax, 10", "or r8, rax",
            "cmp rsi, 0xb2", "setne al", "movzx rax, al", "shl rax, 11", "or r8, rax",
            "cmp rdi, 0xb3", "setne al", "movzx rax, al", "shl rax, 12", "or r8, rax",
            "cmp r12, 0xb4", "setne al", "movzx rax, al", "shl rax, 13", "or r8, rax",
            "cmp r13, 0xb5", "setne al", "movzx rax, al", "shl rax, 14", "or r8, rax",
            "cmp r14, 0xb6", "setne al", "movzx rax, al", "shl rax, 15", "or r8, rax",
            "cmp r15, 0xb7", "setne al", "movzx rax, al", "shl rax, 16", "or r8, rax",
            "mov rsp, rbp",
            "pop r15", "pop r14", "pop r13", "pop r12", "pop rdi", "pop rsi", "pop rbp", "pop rbx",
            in("rcx") a, in("rdx") b, in("r8") c, in("r9") batch,
            in("r10") alpha.to_bits(), in("rax") beta.to_bits(), in("r11") entry,
            lateout("r8") changed,
            clobber_abi("sysv64"),
        );
        changed
    }

    #[test]
    fn windows_kernels_follow_the_microsoft_convention() {
        for isa in crate::supported_isas() {
            // Small (no frame needed on System V) and large (loops, scratch, many registers).
            for (m, n, k, ta) in [
                (5, 3, 2, Trans::N),
                (40, 33, 70, Trans::T),
                (16, 16, 16, Trans::N),
            ] {
                for (alpha, beta) in [
                    (Scalar::Runtime, Scalar::Runtime),
                    (Scalar::One, Scalar::Runtime),
                    (Scalar::Runtime, Scalar::Zero),
                ] {
                    let spec = GemmSpec::builder(Dtype::F64, m, n, k)
                        .trans_a(ta)
                        .alpha(alpha)
                        .beta(beta)
                        .build()
                        .unwrap();
                    let g = generate_with_abi(&spec, Target::new(isa), None, Abi::Windows).unwrap();
                    let exec = ExecutableCode::new(&g.code.bytes).unwrap();
                    let (av, bv) = (alpha.value().unwrap_or(0.75), beta.value().unwrap_or(-1.5));
                    // The kernel takes its run-time scalars in order: alpha first if present.
                    let (x0, x1) = match g.program.params.as_slice() {
                        [Param::Beta] => (bv, 0.0),
                        _ => (av, bv),
                    };
                    let batch = 3;
                    let mut data = TestData::<f64>::new(&spec, batch, 5);
                    let (a, b) = (data.a.clone(), data.b.clone());
                    // SAFETY: the buffers hold the batch; the trampoline restores everything.
                    let changed = unsafe {
                        call_win64(
                            exec.entry(),
                            a.as_ptr().cast(),
                            b.as_ptr().cast(),
                            data.c_mut().as_mut_ptr().cast(),
                            batch,
                            x0,
                            x1,
                        )
                    };
                    assert_eq!(
                        changed,
                        0,
                        "{isa:?} {}: callee-saved registers changed: {changed:#b}",
                        spec.name()
                    );
                    let report = data.check(av, bv);
                    assert!(
                        report.passed(),
                        "{isa:?} {}: {}",
                        spec.name(),
                        report.failure.unwrap()
                    );
                }
            }
        }
    }
}
