//! Every batch form a BLAS user brings, split across threads: strided, pointer arrays,
//! MKL's grouped batches and MAGMA's variable-size batches. Everything is validated (specs
//! built, kernels compiled, lengths checked) before any kernel runs, so an error leaves every
//! C untouched. Each matrix is computed by one kernel call on one thread, so results are bit
//! for bit the same for any thread count.

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;
use smallgemm_ir::{BatchForm, Dtype, Element, GemmSpec, Layout, Operand, Scalar, Trans};

use crate::kernel::Kernel;
use crate::{Error, Jit};

/// Work (flops) one chunk should carry at least, so that the cost of handing it to a thread
/// (about a microsecond) stays negligible.
const MIN_CHUNK_FLOPS: f64 = 256.0 * 1024.0;

/// Chunks per thread: a few, so that uneven chunks (groups of different sizes) balance.
const CHUNKS_PER_THREAD: usize = 4;

/// One group of a grouped batch (MKL's `cblas_?gemm_batch` convention): `size` products
/// with the same shape, transposes, leading dimensions and scalars. Sizes may be 0 (the
/// group does nothing); k = 0 scales C by beta, as BLAS does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmGroup<T> {
    pub trans_a: Trans,
    pub trans_b: Trans,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: T,
    pub lda: usize,
    pub ldb: usize,
    pub beta: T,
    pub ldc: usize,
    /// Products in this group; their pointers follow the previous groups' in the arrays.
    pub size: usize,
}

impl<T: Element> GemmGroup<T> {
    /// The pointer-array spec of this group's products, or `None` when BLAS returns at once.
    fn spec(&self, layout: Layout) -> Result<Option<GemmSpec>, Error> {
        blas_spec(
            T::DTYPE,
            layout,
            (self.trans_a, self.trans_b),
            (self.m, self.n, self.k),
            (self.lda, self.ldb, self.ldc),
            self.alpha.to_f64(),
            self.beta.to_f64(),
            None,
        )
    }
}

/// Shape and leading dimensions of one product of a variable-size batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatrixShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

/// The spec for a BLAS-style call, or `None` when BLAS returns at once (m or n is 0, or
/// beta = 1 with nothing to add). k = 0 becomes alpha = 0 on a k = 1 spec that never reads A
/// or B: C = beta C. `strides` (elements of A, B, C) makes a strided spec; `None` a
/// pointer-array one.
#[allow(clippy::too_many_arguments)]
pub fn blas_spec(
    dtype: Dtype,
    layout: Layout,
    (trans_a, trans_b): (Trans, Trans),
    (m, n, k): (usize, usize, usize),
    (lda, ldb, ldc): (usize, usize, usize),
    alpha: f64,
    beta: f64,
    strides: Option<[usize; 3]>,
) -> Result<Option<GemmSpec>, Error> {
    let nothing_to_add = k == 0 || alpha == 0.0;
    if m == 0 || n == 0 || (nothing_to_add && beta == 1.0) {
        return Ok(None);
    }
    let alpha_kind = if nothing_to_add {
        Scalar::Zero
    } else {
        Scalar::from_value(alpha)
    };
    let mut builder = GemmSpec::builder(dtype, m, n, k.max(1))
        .layout(layout)
        .trans_a(trans_a)
        .trans_b(trans_b)
        .lda(lda)
        .ldb(ldb)
        .ldc(ldc)
        .alpha(alpha_kind)
        .beta(Scalar::from_value(beta));
    builder = match strides {
        Some([a, b, c]) => builder.stride_a(a).stride_b(b).stride_c(c),
        None => builder.pointer_arrays(),
    };
    Ok(Some(builder.build()?))
}

/// A raw address that may cross to a worker thread: the batch functions check every
/// pointer's validity before they create one.
#[derive(Clone, Copy)]
struct Address(*const u8);
// SAFETY: the addresses point to memory the caller lends for the whole call; chunks of one
// call write disjoint C matrices.
unsafe impl Send for Address {}
unsafe impl Sync for Address {}

/// `count` matrices for one kernel: its first three arguments, and how many bytes each
/// advances per matrix (the strides, or 8 for pointer arrays).
struct Task<T> {
    kernel: Arc<Kernel>,
    args: [Address; 3],
    step: [usize; 3],
    count: usize,
    alpha: T,
    beta: T,
}

/// A contiguous run of one task's matrices: what one thread runs at a time.
struct Chunk<'a, T> {
    task: &'a Task<T>,
    start: usize,
    len: usize,
}

impl<T: Element> Chunk<'_, T> {
    /// Safety: the task's arguments were checked for its whole batch.
    unsafe fn run(&self) {
        let t = self.task;
        let at = |i: usize| t.args[i].0.add(self.start * t.step[i]);
        // The kernel and scalars were checked when the task was made; `call` cannot fail
        // on a host that compiled the kernel.
        let _ = t.kernel.call_part(
            at(0),
            at(1),
            at(2) as *mut u8,
            self.len,
            t.count,
            t.alpha,
            t.beta,
        );
    }
}

impl<T: Element> Task<T> {
    fn new(
        kernel: Arc<Kernel>,
        args: [*const u8; 3],
        count: usize,
        alpha: T,
        beta: T,
    ) -> Result<Self, Error> {
        let spec = *kernel.spec();
        // `blas_spec` turns k = 0 into alpha = 0: the product term vanishes whatever alpha.
        let alpha = if spec.alpha() == Scalar::Zero {
            T::default()
        } else {
            alpha
        };
        kernel.check_call(spec.batch_form(), alpha, beta)?;
        let elt = spec.dtype().size();
        let step = match spec.batch_form() {
            BatchForm::Strided => {
                [Operand::A, Operand::B, Operand::C].map(|o| spec.stride(o) * elt)
            }
            BatchForm::PointerArrays => [std::mem::size_of::<*const T>(); 3],
        };
        Ok(Task {
            kernel,
            args: args.map(Address),
            step,
            count,
            alpha,
            beta,
        })
    }
}

impl Jit {
    /// Runs every task, split into chunks across this JIT's threads. Safety: each task's
    /// arguments are valid for its whole batch and tasks write disjoint C matrices.
    unsafe fn run_tasks<T: Element>(&self, tasks: &[Task<T>]) -> Result<(), Error> {
        let flops: f64 = tasks
            .iter()
            .map(|t| t.kernel.spec().flops() * t.count as f64)
            .sum();
        let threads = self.threads();
        let target = (flops / (threads * CHUNKS_PER_THREAD) as f64).max(MIN_CHUNK_FLOPS);
        let mut chunks = Vec::new();
        for task in tasks {
            let per_chunk = ((target / task.kernel.spec().flops()).ceil() as usize).max(1);
            let mut start = 0;
            while start < task.count {
                let len = per_chunk.min(task.count - start);
                chunks.push(Chunk { task, start, len });
                start += len;
            }
        }
        if threads <= 1 || chunks.len() <= 1 {
            for chunk in &chunks {
                chunk.run();
            }
            return Ok(());
        }
        let run = |chunk: &Chunk<'_, T>| {
            // SAFETY: as this function's contract; chunks cover disjoint matrices.
            unsafe { chunk.run() }
        };
        self.pool()?.install(|| chunks.par_iter().for_each(run));
        Ok(())
    }

    /// Strided batch across threads: as [`Kernel::run`], with the batch split into chunks.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batch_strided<T: Element>(
        &self,
        spec: &GemmSpec,
        a: &[T],
        b: &[T],
        c: &mut [T],
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        let kernel = self.kernel(spec)?;
        kernel.check_call(BatchForm::Strided, alpha, beta)?;
        kernel.check_lengths([a.len(), b.len(), c.len()], batch)?;
        if batch == 0 {
            return Ok(());
        }
        let args = [
            a.as_ptr().cast(),
            b.as_ptr().cast(),
            c.as_mut_ptr().cast::<u8>() as *const u8,
        ];
        let task = Task::new(kernel, args, batch, alpha, beta)?;
        // SAFETY: the slices hold the whole batch; C matrices of a strided spec do not overlap.
        unsafe { self.run_tasks(&[task]) }
    }

    /// Strided batch across threads at raw pointers (the C ABI's entry point).
    ///
    /// # Safety
    ///
    /// As [`Kernel::run_raw`]: each pointer holds `spec.required_len(X, batch)` elements
    /// (A and B may be null when `spec`'s alpha is zero: they are never read).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_batch_strided_raw<T: Element>(
        &self,
        spec: &GemmSpec,
        a: *const T,
        b: *const T,
        c: *mut T,
        batch: usize,
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        let kernel = self.kernel(spec)?;
        let task = Task::new(
            kernel,
            [a.cast(), b.cast(), c.cast::<u8>()],
            batch,
            alpha,
            beta,
        )?;
        if batch == 0 {
            return Ok(());
        }
        self.run_tasks(&[task])
    }

    /// Pointer-array batch across threads: `spec` must be built with `pointer_arrays()`;
    /// product i uses `a[i]`, `b[i]`, `c[i]`.
    pub fn gemm_batch_pointers<T: Element>(
        &self,
        spec: &GemmSpec,
        a: &[&[T]],
        b: &[&[T]],
        c: &mut [&mut [T]],
        alpha: T,
        beta: T,
    ) -> Result<(), Error> {
        let kernel = self.kernel(spec)?;
        kernel.check_call(BatchForm::PointerArrays, alpha, beta)?;
        let arrays = PointerArrays::new(a, b, c)?;
        arrays.check(spec, 0..arrays.len())?;
        if arrays.len() == 0 {
            return Ok(());
        }
        let task = Task::new(kernel, arrays.args(0), arrays.len(), alpha, beta)?;
        // SAFETY: every matrix was checked above; Rust's borrows keep the C matrices apart.
        unsafe { self.run_tasks(&[task]) }
    }

    /// MKL's grouped batch over slices: group g covers the next `groups[g].size` entries of
    /// `a`, `b` and `c`, and runs its own specialised kernel; all groups form one parallel
    /// job. Every group is validated before any product runs.
    pub fn gemm_batch_grouped<T: Element>(
        &self,
        layout: Layout,
        groups: &[GemmGroup<T>],
        a: &[&[T]],
        b: &[&[T]],
        c: &mut [&mut [T]],
    ) -> Result<(), Error> {
        let arrays = PointerArrays::new(a, b, c)?;
        let total: usize = groups.iter().map(|g| g.size).sum();
        if total != arrays.len() {
            return Err(Error::GroupSizes {
                groups: total,
                matrices: arrays.len(),
            });
        }
        let mut tasks = Vec::new();
        let mut start = 0;
        for g in groups {
            let range = start..start + g.size;
            start += g.size;
            let Some(spec) = g.spec(layout)? else {
                continue;
            };
            arrays.check(&spec, range.clone())?;
            if g.size > 0 {
                tasks.push(Task::new(
                    self.kernel(&spec)?,
                    arrays.args(range.start),
                    g.size,
                    g.alpha,
                    g.beta,
                )?);
            }
        }
        // SAFETY: every matrix of every group was checked; borrows keep the C matrices apart.
        unsafe { self.run_tasks(&tasks) }
    }

    /// MAGMA's variable-size batch: product i has its own shape and leading dimensions
    /// (`shapes[i]`), all share layout, transposes and scalars. Products of equal shape are
    /// grouped and each group runs one specialised pointer-array kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batch_variable<T: Element>(
        &self,
        layout: Layout,
        trans: (Trans, Trans),
        shapes: &[MatrixShape],
        alpha: T,
        a: &[&[T]],
        b: &[&[T]],
        beta: T,
        c: &mut [&mut [T]],
    ) -> Result<(), Error> {
        let arrays = PointerArrays::new(a, b, c)?;
        if shapes.len() != arrays.len() {
            return Err(Error::GroupSizes {
                groups: shapes.len(),
                matrices: arrays.len(),
            });
        }
        let mut by_shape: BTreeMap<MatrixShape, Vec<usize>> = BTreeMap::new();
        for (i, s) in shapes.iter().enumerate() {
            by_shape.entry(*s).or_default().push(i);
        }
        // Gather each shape's pointers into arrays of its own, validated first.
        let mut gathered = Vec::new();
        for (s, indices) in &by_shape {
            let Some(spec) = blas_spec(
                T::DTYPE,
                layout,
                trans,
                (s.m, s.n, s.k),
                (s.lda, s.ldb, s.ldc),
                alpha.to_f64(),
                beta.to_f64(),
                None,
            )?
            else {
                continue;
            };
            for &i in indices {
                arrays.check(&spec, i..i + 1)?;
            }
            let pick = |which: usize| {
                indices
                    .iter()
                    .map(|&i| arrays.ptrs[which][i])
                    .collect::<Vec<_>>()
            };
            gathered.push((self.kernel(&spec)?, [pick(0), pick(1), pick(2)]));
        }
        let tasks = gathered
            .iter()
            .map(|(kernel, ptrs)| {
                let args = ptrs.each_ref().map(|p| p.as_ptr().cast::<u8>());
                Task::new(kernel.clone(), args, ptrs[2].len(), alpha, beta)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // SAFETY: every matrix was checked; borrows keep the C matrices apart; the gathered
        // arrays outlive the call.
        unsafe { self.run_tasks(&tasks) }
    }

    /// MKL's grouped batch over raw pointer arrays (the C ABI's entry point).
    ///
    /// # Safety
    ///
    /// `a`, `b`, `c` each point to Σ size pointers; for every group, its pointers point to
    /// matrices of the footprint its shape and leading dimensions describe, valid for the
    /// call; no C matrix overlaps another or any A or B matrix. `groups` must have been
    /// validated by the caller for null arrays where work exists.
    pub unsafe fn gemm_batch_grouped_raw<T: Element>(
        &self,
        layout: Layout,
        groups: &[GemmGroup<T>],
        a: *const *const T,
        b: *const *const T,
        c: *const *mut T,
    ) -> Result<(), Error> {
        let mut tasks = Vec::new();
        let mut start = 0;
        for g in groups {
            let first = start;
            start += g.size;
            let Some(spec) = g.spec(layout)? else {
                continue;
            };
            if g.size > 0 {
                let args = [
                    // Groups that never read A or B may come with null arrays: no `add`.
                    a.wrapping_add(first).cast(),
                    b.wrapping_add(first).cast(),
                    c.wrapping_add(first).cast::<u8>(),
                ];
                tasks.push(Task::new(
                    self.kernel(&spec)?,
                    args,
                    g.size,
                    g.alpha,
                    g.beta,
                )?);
            }
        }
        self.run_tasks(&tasks)
    }
}

/// The pointers of a pointer-array batch given as slices, with their lengths for checking.
struct PointerArrays<T> {
    ptrs: [Vec<*const T>; 3],
    lens: [Vec<usize>; 3],
}

impl<T: Element> PointerArrays<T> {
    fn new(a: &[&[T]], b: &[&[T]], c: &mut [&mut [T]]) -> Result<Self, Error> {
        if a.len() != c.len() || b.len() != c.len() {
            return Err(Error::BatchLengths {
                a: a.len(),
                b: b.len(),
                c: c.len(),
            });
        }
        let c_ptrs: Vec<*const T> = c.iter_mut().map(|x| x.as_mut_ptr() as *const T).collect();
        Ok(PointerArrays {
            ptrs: [
                a.iter().map(|x| x.as_ptr()).collect(),
                b.iter().map(|x| x.as_ptr()).collect(),
                c_ptrs,
            ],
            lens: [
                a.iter().map(|x| x.len()).collect(),
                b.iter().map(|x| x.len()).collect(),
                c.iter().map(|x| x.len()).collect(),
            ],
        })
    }

    fn len(&self) -> usize {
        self.ptrs[2].len()
    }

    /// Checks that matrices `range` are long enough for `spec`.
    fn check(&self, spec: &GemmSpec, range: std::ops::Range<usize>) -> Result<(), Error> {
        for (o, operand) in [Operand::A, Operand::B, Operand::C].into_iter().enumerate() {
            let required = spec.footprint(operand);
            // With alpha = 0 (k = 0) A and B are never read.
            if operand != Operand::C && spec.alpha() == Scalar::Zero {
                continue;
            }
            for index in range.clone() {
                let len = self.lens[o][index];
                if len < required {
                    return Err(Error::MatrixTooShort {
                        operand,
                        index,
                        len,
                        required,
                    });
                }
            }
        }
        Ok(())
    }

    /// The kernel's first three arguments for the products from `start` on.
    fn args(&self, start: usize) -> [*const u8; 3] {
        // `start` may equal the length for an empty tail; `wrapping_add` keeps that defined.
        [0, 1, 2].map(|o| self.ptrs[o].as_ptr().wrapping_add(start).cast())
    }
}
