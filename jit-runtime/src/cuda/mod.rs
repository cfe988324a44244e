//! The CUDA runtime (feature `cuda`): PTX kernels from `smallgemm-codegen-ptx`, loaded
//! through the driver API (cudarc, loaded dynamically: the library builds and runs without
//! CUDA installed and reports [`CudaError::NoDriver`] instead of panicking).
//!
//! ```no_run
//! use smallgemm::cuda::{BatchKind, Gpu};
//! use smallgemm::{Dtype, GemmSpec, Scalar};
//!
//! # fn main() -> Result<(), smallgemm::cuda::CudaError> {
//! let gpu = Gpu::new(0)?; // Err(NoDriver) on a machine without a GPU
//! let spec = GemmSpec::builder(Dtype::F64, 8, 8, 8).beta(Scalar::Runtime).build()?;
//! let batch = 1000;
//! let a = gpu.upload(&vec![1.0f64; 64 * batch])?;
//! let b = gpu.upload(&vec![2.0f64; 64 * batch])?;
//! let mut c = gpu.upload(&vec![0.5f64; 64 * batch])?;
//! let kernel = gpu.kernel(&spec, BatchKind::Strided)?; // compiled once per (spec, device)
//! kernel.launch_strided(gpu.stream(), &a, &b, &mut c, batch, 1.0, 2.0)?;
//! let c = gpu.download(&c)?;
//! assert_eq!(c[0], 8.0 * 2.0 + 1.0);
//! # Ok(())
//! # }
//! ```

pub mod bench;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use smallgemm_ir::{Dtype, GemmSpec, GpuSchedule, GpuTarget, Operand, Sm, SpecError};
use thiserror::Error;

pub use cudarc;
pub use half::f16;
pub use smallgemm_codegen_ptx::{BatchKind, ExtraParam, PtxError, PtxKernel};

/// Why a GPU operation failed.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum CudaError {
    #[error("no CUDA driver (libcuda.so cannot be loaded): the GPU backend is unavailable")]
    NoDriver,
    #[error("no cuBLAS library (libcublas.so.13/.12 cannot be loaded)")]
    NoCublas,
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoDevice { ordinal: usize, count: usize },
    #[error(
        "compute capability {major}.{minor} is below 8.0; smallgemm's PTX needs sm_80 or later"
    )]
    Architecture { major: i32, minor: i32 },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("cuBLAS: {0}")]
    Cublas(String),
    #[error("invalid GEMM: {0}")]
    Spec(#[from] SpecError),
    #[error("cannot generate the kernel: {0}")]
    Ptx(#[from] PtxError),
    #[error("the kernel computes {kernel:?} but the buffers hold {given:?}")]
    DtypeMismatch { kernel: Dtype, given: Dtype },
    #[error("the kernel was compiled for {kind:?} batches, not {called:?}")]
    KindMismatch { kind: BatchKind, called: BatchKind },
    #[error("the kernel was compiled for {which} = {compiled}, but {which} = {given} was passed")]
    ScalarMismatch {
        which: &'static str,
        compiled: f64,
        given: f64,
    },
    #[error("{what} holds {len} elements; a batch of {batch} needs {required}")]
    BufferTooShort {
        what: String,
        len: usize,
        required: usize,
        batch: usize,
    },
    #[error("problem {index} of the variable-size batch: {reason}")]
    Dims { index: usize, reason: String },
    #[error("a batch of {0} problems exceeds the 2^31 - 1 a launch addresses")]
    BatchTooLarge(usize),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Cublas(e.to_string())
    }
}

/// Element types of GPU buffers: f64, f32 and [`f16`].
pub trait GpuElement:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static
{
    const DTYPE: Dtype;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl GpuElement for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl GpuElement for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl GpuElement for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

/// True when the CUDA driver library can be loaded (probing never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when cuBLAS can be loaded.
pub fn cublas_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Number of CUDA devices; `Err(NoDriver)` without a driver.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    Ok(CudaContext::device_count()?.max(0) as usize)
}

type CacheKey = (GemmSpec, BatchKind, Option<GpuSchedule>);

/// One CUDA device: its context, a default stream, and the kernels compiled for it.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    target: GpuTarget,
    name: String,
    cache: Mutex<HashMap<CacheKey, Arc<GpuKernel>>>,
    compilations: AtomicUsize,
    /// This device's entries of the tuning database (`smallgemm tune --gpu`), by key
    /// ([`gpu_tuning_key`]).
    tuned: HashMap<String, GpuSchedule>,
}

/// The key of a GPU schedule in the tuning database's `gpu` section: the device's name,
/// the batch form and the shape key of the CPU entries ([`crate::tuning::shape_key`]:
/// dtype, sizes and transposes of the column-major problem).
pub fn gpu_tuning_key(device: &str, spec: &GemmSpec, kind: BatchKind) -> String {
    let form = match kind {
        BatchKind::Strided => "strided",
        BatchKind::PointerArray => "pointers",
        BatchKind::VariableSize => "variable",
    };
    format!("{device} | {form} {}", crate::tuning::shape_key(spec))
}

/// The entries of `db`'s `gpu` section that belong to `device` and parse as schedules.
pub fn tuned_schedules(db: &crate::tuning::TuningDb, device: &str) -> HashMap<String, GpuSchedule> {
    let prefix = format!("{device} | ");
    db.gpu
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter_map(|(k, v)| Some((k.clone(), serde_json::from_value(v.clone()).ok()?)))
        .collect()
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu({} {}, {})",
            self.ctx.ordinal(),
            self.name,
            self.target.sm
        )
    }
}

impl Gpu {
    /// Opens device `ordinal`. Fails cleanly without a driver, device or sm_80.
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let sm = Sm::from_compute_capability(major.max(0) as u32, minor.max(0) as u32)
            .ok_or(CudaError::Architecture { major, minor })?;
        let mut target = GpuTarget::new(sm);
        use cudarc::driver::sys::CUdevice_attribute as A;
        if let Ok(v) = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) {
            target.shared_bytes_per_block = v.max(48 * 1024) as usize;
        }
        let name = ctx.name()?;
        let stream = ctx.default_stream();
        // Tuned schedules of this device: the shipped database's, then the user's, whose
        // entries win (an unreadable database is ignored: the planner's defaults are
        // always valid).
        let mut tuned = tuned_schedules(crate::tuning::shipped(), &name);
        if let Some(db) =
            crate::tuning::default_path().and_then(|p| crate::tuning::TuningDb::load(&p).ok())
        {
            tuned.extend(tuned_schedules(&db, &name));
        }
        Ok(Gpu {
            ctx,
            stream,
            target,
            name,
            cache: Mutex::new(HashMap::new()),
            compilations: AtomicUsize::new(0),
            tuned,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn target(&self) -> &GpuTarget {
        &self.target
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The default stream: launches through it are ordered with the uploads and downloads.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// A new stream for concurrent work.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        Ok(self.ctx.new_stream()?)
    }
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }
    /// Copies `data` to a new device buffer.
    pub fn upload<T: GpuElement>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(data)?)
    }
    /// Copies raw u64 / u32 data (pointer arrays, dims) to the device.
    pub fn upload_raw<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(data)?)
    }
    /// A zeroed device buffer of `len` elements.
    pub fn alloc<T: GpuElement>(&self, len: usize) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.alloc_zeros(len)?)
    }
    /// Copies a device buffer back.
    pub fn download<T: GpuElement>(&self, data: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        Ok(self.stream.clone_dtoh(data)?)
    }

    /// The kernel for `spec` and `kind`, compiled on first use: with the schedule the tuning
    /// database holds for this device and shape, else the planned one.
    pub fn kernel(&self, spec: &GemmSpec, kind: BatchKind) -> Result<Arc<GpuKernel>, CudaError> {
        if let Some(s) = self.tuned_schedule(spec, kind) {
            // A tuned entry that does not fit this spec (other leading dimensions, say)
            // falls back to the planner.
            if let Ok(k) = self.get_or_compile((*spec, kind, Some(s))) {
                return Ok(k);
            }
        }
        self.get_or_compile((*spec, kind, None))
    }

    /// The tuning database's schedule for `spec` and `kind` on this device, if it has one
    /// (it may not fit the spec: [`Gpu::kernel`] then plans).
    pub fn tuned_schedule(&self, spec: &GemmSpec, kind: BatchKind) -> Option<GpuSchedule> {
        self.tuned
            .get(&gpu_tuning_key(&self.name, spec, kind))
            .copied()
    }

    /// Replaces this device's tuned schedules (normally read from the tuning database when
    /// the `Gpu` is opened); an empty map makes every kernel use the planner's schedule.
    pub fn set_tuned(&mut self, tuned: HashMap<String, GpuSchedule>) {
        self.tuned = tuned;
    }

    /// The kernel with an explicit schedule (for tuning), cached separately.
    pub fn kernel_with_schedule(
        &self,
        spec: &GemmSpec,
        kind: BatchKind,
        schedule: &GpuSchedule,
    ) -> Result<Arc<GpuKernel>, CudaError> {
        self.get_or_compile((*spec, kind, Some(*schedule)))
    }

    /// Kernels compiled so far (cache misses; one that two threads compiled at once counts
    /// once).
    pub fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }

    fn get_or_compile(&self, key: CacheKey) -> Result<Arc<GpuKernel>, CudaError> {
        // A poisoned lock only means another thread panicked mid-insert; the map is intact.
        let cache = || self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache().get(&key) {
            return Ok(k.clone());
        }
        // Compiled outside the lock: the driver's PTX compiler takes 0.1-0.5 s for a large
        // kernel, and other threads' kernels need not wait for it. Two threads that miss
        // the same key both compile it; the first one inserted is kept.
        let (spec, kind, schedule) = key;
        let ptx = smallgemm_codegen_ptx::generate(&spec, &self.target, schedule.as_ref(), kind)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx.clone()))?;
        let func = module.load_function(&ptx.entry)?;
        if ptx.shared_bytes > 48 * 1024 {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ptx.shared_bytes as i32,
            )?;
        }
        let compiled = Arc::new(GpuKernel {
            spec,
            ptx,
            func,
            _module: module,
        });
        let mut cache = cache();
        let kernel = cache.entry(key).or_insert_with(|| {
            self.compilations.fetch_add(1, Ordering::Relaxed);
            compiled
        });
        Ok(kernel.clone())
    }

    /// Runs several strided batches (of possibly different specs) back to back on `stream`.
    pub fn launch_grouped<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        groups: &mut [Group<'_, T>],
    ) -> Result<(), CudaError> {
        for g in groups.iter_mut() {
            let k = self.kernel(&g.spec, BatchKind::Strided)?;
            k.launch_strided(stream, g.a, g.b, g.c, g.batch, g.alpha, g.beta)?;
        }
        Ok(())
    }
}

/// One strided batch of a grouped launch.
pub struct Group<'a, T: GpuElement> {
    pub spec: GemmSpec,
    pub a: &'a CudaSlice<T>,
    pub b: &'a CudaSlice<T>,
    pub c: &'a mut CudaSlice<T>,
    pub batch: usize,
    pub alpha: f64,
    pub beta: f64,
}

/// A loaded kernel: launch it on any stream of its device.
pub struct GpuKernel {
    spec: GemmSpec,
    ptx: PtxKernel,
    func: CudaFunction,
    _module: Arc<CudaModule>,
}

impl std::fmt::Debug for GpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuKernel({})", self.ptx.entry)
    }
}

impl GpuKernel {
    pub fn spec(&self) -> &GemmSpec {
        &self.spec
    }
    /// The generated PTX and its launch geometry.
    pub fn ptx(&self) -> &PtxKernel {
        &self.ptx
    }

    fn config(&self, batch: usize) -> Result<LaunchConfig, CudaError> {
        let blocks = u32::try_from(self.ptx.blocks(batch))
            .ok()
            .filter(|&b| b < i32::MAX as u32)
            .ok_or(CudaError::BatchTooLarge(batch))?;
        Ok(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (self.ptx.threads_per_block, 1, 1),
            shared_mem_bytes: self.ptx.shared_bytes as u32,
        })
    }

    fn check<T: GpuElement>(
        &self,
        kind: BatchKind,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        if T::DTYPE != self.spec.dtype() {
            return Err(CudaError::DtypeMismatch {
                kernel: self.spec.dtype(),
                given: T::DTYPE,
            });
        }
        if kind != self.ptx.kind {
            return Err(CudaError::KindMismatch {
                kind: self.ptx.kind,
                called: kind,
            });
        }
        for (which, s, v) in [
            ("alpha", self.spec.alpha(), alpha),
            ("beta", self.spec.beta(), beta),
        ] {
            if let Some(compiled) = s.value() {
                // Fixed kinds are baked in: the value passed must be that value.
                if compiled != v {
                    return Err(CudaError::ScalarMismatch {
                        which,
                        compiled,
                        given: v,
                    });
                }
            } else if !v.is_finite() {
                return Err(CudaError::Spec(SpecError::NonFiniteScalar { value: v }));
            }
        }
        Ok(())
    }

    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        pointers: [u64; 3],
        dims: Option<u64>,
        batch: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        if batch == 0 {
            return Ok(());
        }
        let cfg = self.config(batch)?;
        let batch32 = batch as u32;
        let wide = self.spec.dtype() == Dtype::F64;
        let (a32, b32) = (alpha as f32, beta as f32);
        let mut lb = stream.launch_builder(&self.func);
        lb.arg(&pointers[0]).arg(&pointers[1]).arg(&pointers[2]);
        if let Some(d) = &dims {
            lb.arg(d);
        }
        lb.arg(&batch32);
        for p in &self.ptx.extra {
            match (p, wide) {
                (ExtraParam::Alpha, true) => lb.arg(&alpha),
                (ExtraParam::Alpha, false) => lb.arg(&a32),
                (ExtraParam::Beta, true) => lb.arg(&beta),
                (ExtraParam::Beta, false) => lb.arg(&b32),
                (ExtraParam::Dims, _) => &mut lb,
            };
        }
        // SAFETY: the argument list matches the entry's parameters (generated together);
        // callers checked (or, for the raw entry points, promised) the buffers' extents.
        unsafe { lb.launch(cfg) }?;
        Ok(())
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for the strided batch, checked: dtype, batch
    /// kind, scalar kinds and buffer lengths. Asynchronous on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_strided<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        c: &mut CudaSlice<T>,
        batch: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        self.check::<T>(BatchKind::Strided, alpha, beta)?;
        if batch > i32::MAX as usize {
            return Err(CudaError::BatchTooLarge(batch));
        }
        for (operand, len) in [
            (Operand::A, a.len()),
            (Operand::B, b.len()),
            (Operand::C, c.len()),
        ] {
            let required = self.spec.required_len(operand, batch);
            if len < required {
                return Err(CudaError::BufferTooShort {
                    what: operand.to_string(),
                    len,
                    required,
                    batch,
                });
            }
        }
        let (pa, _ga) = cudarc::driver::DevicePtr::device_ptr(a, stream);
        let (pb, _gb) = cudarc::driver::DevicePtr::device_ptr(b, stream);
        let (pc, _gc) = cudarc::driver::DevicePtrMut::device_ptr_mut(c, stream);
        self.launch(stream, [pa, pb, pc], None, batch, alpha, beta)
    }

    /// Pointer-array batch: `a_ptrs[i]`, `b_ptrs[i]`, `c_ptrs[i]` are device pointers to
    /// matrix i with the spec's leading dimensions.
    ///
    /// # Safety
    /// Every pointer must address a matrix of the spec's extent on this device, and the C
    /// matrices must not overlap.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_pointer_array<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        a_ptrs: &CudaSlice<u64>,
        b_ptrs: &CudaSlice<u64>,
        c_ptrs: &CudaSlice<u64>,
        batch: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        self.check::<T>(BatchKind::PointerArray, alpha, beta)?;
        check_arrays(a_ptrs, b_ptrs, c_ptrs, batch)?;
        let (pa, _ga) = cudarc::driver::DevicePtr::device_ptr(a_ptrs, stream);
        let (pb, _gb) = cudarc::driver::DevicePtr::device_ptr(b_ptrs, stream);
        let (pc, _gc) = cudarc::driver::DevicePtr::device_ptr(c_ptrs, stream);
        self.launch(stream, [pa, pb, pc], None, batch, alpha, beta)
    }

    /// Variable-size batch: pointer arrays plus six u32 per problem in `dims` (`m, n, k,
    /// lda, ldb, ldc`, each size at most the spec's; see [`check_dims`]).
    ///
    /// # Safety
    /// As [`Self::launch_pointer_array`], with each matrix of its own problem's extent.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_variable<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        a_ptrs: &CudaSlice<u64>,
        b_ptrs: &CudaSlice<u64>,
        c_ptrs: &CudaSlice<u64>,
        dims: &CudaSlice<u32>,
        batch: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        self.check::<T>(BatchKind::VariableSize, alpha, beta)?;
        check_arrays(a_ptrs, b_ptrs, c_ptrs, batch)?;
        if dims.len() < 6 * batch {
            return Err(CudaError::BufferTooShort {
                what: "dims".into(),
                len: dims.len(),
                required: 6 * batch,
                batch,
            });
        }
        let (pa, _ga) = cudarc::driver::DevicePtr::device_ptr(a_ptrs, stream);
        let (pb, _gb) = cudarc::driver::DevicePtr::device_ptr(b_ptrs, stream);
        let (pc, _gc) = cudarc::driver::DevicePtr::device_ptr(c_ptrs, stream);
        let (pd, _gd) = cudarc::driver::DevicePtr::device_ptr(dims, stream);
        self.launch(stream, [pa, pb, pc], Some(pd), batch, alpha, beta)
    }
}

fn check_arrays(
    a: &CudaSlice<u64>,
    b: &CudaSlice<u64>,
    c: &CudaSlice<u64>,
    batch: usize,
) -> Result<(), CudaError> {
    if batch > i32::MAX as usize {
        return Err(CudaError::BatchTooLarge(batch));
    }
    for (what, len) in [
        ("a_ptrs", a.len()),
        ("b_ptrs", b.len()),
        ("c_ptrs", c.len()),
    ] {
        if len < batch {
            return Err(CudaError::BufferTooShort {
                what: what.into(),
                len,
                required: batch,
                batch,
            });
        }
    }
    Ok(())
}

/// Checks host-side variable-size dims (`m, n, k, lda, ldb, ldc` per problem) against the
/// spec's maxima and transposes/layout: what [`GpuKernel::launch_variable`] relies on.
pub fn check_dims(spec: &GemmSpec, dims: &[u32]) -> Result<(), CudaError> {
    for (index, d) in dims.chunks(6).enumerate() {
        let fail = |reason: String| Err(CudaError::Dims { index, reason });
        if d.len() < 6 {
            return fail("fewer than six values".into());
        }
        let (m, n, k) = (d[0] as usize, d[1] as usize, d[2] as usize);
        if m > spec.m() || n > spec.n() || k > spec.k() {
            return fail(format!(
                "{m}x{n}x{k} exceeds the kernel's {}x{}x{}",
                spec.m(),
                spec.n(),
                spec.k()
            ));
        }
        if m == 0 || n == 0 || k == 0 {
            continue;
        }
        let sub = GemmSpec::builder(spec.dtype(), m, n, k)
            .layout(spec.layout())
            .trans_a(spec.trans_a())
            .trans_b(spec.trans_b())
            .lda(d[3] as usize)
            .ldb(d[4] as usize)
            .ldc(d[5] as usize)
            .build();
        if let Err(e) = sub {
            return fail(e.to_string());
        }
    }
    Ok(())
}

/// One bucket of a [`BucketedBatch`]: its kernel and its problems' arrays on the device.
struct Bucket {
    kernel: Arc<GpuKernel>,
    /// The pointer arrays of A, B and C and the dims, owned here; launched by the
    /// addresses in `raw`.
    _arrays: (
        CudaSlice<u64>,
        CudaSlice<u64>,
        CudaSlice<u64>,
        CudaSlice<u32>,
    ),
    /// The device addresses of `_arrays`, for launches that skip cudarc's per-argument
    /// event bookkeeping (see [`BucketedBatch::launch`]).
    raw: [u64; 4],
    len: usize,
}

/// A variable-size batch split by size for repeated launches: each problem goes to the
/// bucket of its m and n rounded up to a multiple of [`BUCKET_MN`] and its k to one of
/// [`BUCKET_K`], and each bucket runs the variable-size kernel sized by its bound, up to
/// four buckets at a time on their own streams. A single launch sized by the largest
/// problem gives every small problem the threads and shared memory of the largest; here a
/// problem's slot is at most 15 rows and columns larger than the problem.
pub struct BucketedBatch {
    buckets: Vec<Bucket>,
    /// Streams the buckets run on concurrently (the tail of one bucket's grid overlaps the
    /// next bucket's blocks); joined back into the caller's stream after each launch.
    lanes: Vec<Arc<CudaStream>>,
    /// The stream the launches are captured on (the graph then runs on the caller's).
    replay_stream: Arc<CudaStream>,
    replay: Mutex<Replay>,
}

/// What [`BucketedBatch::launch`] keeps to replay its launches as one CUDA graph. Issuing
/// a bucket costs the host about 5 µs: 120-190 µs for the 32 buckets of sizes uniform in
/// 1..32, against 450 µs on the GPU for 256 MiB of operands, and smaller batches wait on
/// the host (measured on the H100, docs/gpu-notes.md, version 23). A graph launch is one
/// driver call.
#[derive(Default)]
struct Replay {
    /// The scalars (bits of alpha and beta) and element type of the last launch.
    last: Option<(u64, u64, Dtype)>,
    /// The launches captured for `last`: taken at its second launch in a row, so that a
    /// batch launched once pays no capture.
    graph: Option<Graph>,
    /// An event after the latest replay on each stream the graph was launched on, for
    /// `Drop` to wait on (the graph runs on the caller's stream, not on the lanes).
    replayed: Vec<(Arc<CudaStream>, CudaEvent)>,
}

/// A captured graph, moved between threads only inside [`BucketedBatch::replay`]'s mutex.
struct Graph(cudarc::driver::CudaGraph);

// SAFETY: CUDA graph handles are not tied to a thread; the driver only requires that one
// graph is not used from two threads at once, which the mutex around it guarantees.
unsafe impl Send for Graph {}

impl std::fmt::Debug for BucketedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BucketedBatch({} buckets)", self.buckets.len())
    }
}

impl Drop for BucketedBatch {
    /// Waits for launched buckets before their arrays are freed: the launches read them
    /// through raw addresses, which cudarc's stream bookkeeping does not see.
    fn drop(&mut self) {
        // An error here means the context is gone, and the arrays with it. (Nothing runs on
        // the replay stream: it only captures.)
        for lane in &self.lanes {
            let _ = lane.synchronize();
        }
        let replay = self.replay.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, event) in &replay.replayed {
            let _ = event.synchronize();
        }
    }
}

impl BucketedBatch {
    /// Buckets (kernel launches per call).
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Launches every bucket, ordered after the work already on `stream` and before the
    /// work queued on it next. The second launch in a row with the same alpha, beta and
    /// element type captures the buckets' launches as a CUDA graph, and later ones replay
    /// it: one driver call instead of one per bucket.
    ///
    /// # Safety
    /// As [`GpuKernel::launch_variable`] for the pointers given to [`Gpu::bucket_variable`]:
    /// they must still address live matrices of each problem's extent, C matrices disjoint.
    pub unsafe fn launch<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        alpha: f64,
        beta: f64,
    ) -> Result<(), CudaError> {
        let key = (alpha.to_bits(), beta.to_bits(), T::DTYPE);
        // A panic elsewhere while the lock was held leaves nothing half-done here.
        let mut replay = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        if replay.last != Some(key) {
            // Checked once for these scalars and element type, before anything launches;
            // the replays that follow reuse them.
            for b in &self.buckets {
                b.kernel.check::<T>(BatchKind::VariableSize, alpha, beta)?;
            }
            replay.last = Some(key);
            replay.graph = None;
            return self.issue(stream, alpha, beta);
        }
        if replay.graph.is_none() {
            replay.graph = Some(self.capture(alpha, beta)?);
        }
        let Some(Graph(graph)) = &replay.graph else {
            unreachable!("captured above")
        };
        // Launched on the caller's stream itself: joins with the capture stream would add
        // two cross-stream waits on the GPU to every launch.
        stream.context().bind_to_thread()?;
        // SAFETY: a live executable graph and a live stream of the graph's context.
        unsafe {
            cudarc::driver::result::graph::launch(graph.cu_graph_exec(), stream.cu_stream())
        }?;
        match replay
            .replayed
            .iter()
            .find(|(s, _)| s.cu_stream() == stream.cu_stream())
        {
            Some((_, event)) => event.record(stream)?,
            None => {
                let event = stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
                replay.replayed.push((stream.clone(), event));
            }
        }
        Ok(())
    }

    /// The buckets' launches on `stream`, each bucket on its lane.
    fn issue(&self, stream: &Arc<CudaStream>, alpha: f64, beta: f64) -> Result<(), CudaError> {
        for lane in &self.lanes {
            lane.join(stream)?;
        }
        // Raw addresses: `launch_variable` would have cudarc wait for and record an event
        // on each of the four arrays at every launch (it tracks buffers once streams are
        // forked), host work per bucket that buys nothing here: the arrays are only read,
        // and `Drop` waits for the lanes.
        for (i, b) in self.buckets.iter().enumerate() {
            let lane = &self.lanes[i % self.lanes.len()];
            let [a, bp, c, dims] = b.raw;
            b.kernel
                .launch(lane, [a, bp, c], Some(dims), b.len, alpha, beta)?;
        }
        for lane in &self.lanes {
            stream.join(lane)?;
        }
        Ok(())
    }

    /// [`Self::issue`] captured on the replay stream (nothing runs while capturing).
    fn capture(&self, alpha: f64, beta: f64) -> Result<Graph, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let s = &self.replay_stream;
        // Relaxed: the launches create and destroy the events of the lanes' joins.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let issued = self.issue(s, alpha, beta);
        // The capture ends even when issuing failed, leaving the stream usable.
        let captured = s.end_capture(CUgraphInstantiate_flags(0));
        issued?;
        let graph = captured?.ok_or_else(|| {
            CudaError::Driver("capturing the bucketed launches gave no graph".into())
        })?;
        graph.upload()?;
        Ok(Graph(graph))
    }
}

/// [`Gpu::bucket_variable`] splits a batch at multiples of this m and n: sizes uniform in
/// 1..32 fall in 2 x 2 buckets of m and n (8 buckets with [`BUCKET_K`]'s two of k; 32 with
/// 8 here). Measured on the H100, `bench --gpu --variable-only`, five rounds alternated
/// (docs/gpu-notes.md, version 24): f32 4940-4955 GFLOP/s with 8 -> 5035-5061 with 16
/// (81-82% -> 83% of the bound), f64 2536-2543 -> 2565-2580 (83% -> 84-85%); 4, 12, 32 and
/// 16 x 32 lost (f32 69-77%). Likely, not measured: a bucket's problems lie closer together
/// in memory.
pub const BUCKET_MN: usize = 16;

/// [`Gpu::bucket_variable`] splits a batch at multiples of this k (and of [`BUCKET_MN`] in
/// m and n): the buckets' kernels stage A and B only up to their k bound (the unrolled k
/// loop leaves at each problem's own k either way, but the staging writes the whole bound,
/// zeros past k). Measured on the H100 with f32 (docs/gpu-notes.md, version 10): 16 took
/// the bucketed batch from 78% of the bound to 80.6% (f64 within noise); 8 (64 buckets)
/// gained nothing.
pub const BUCKET_K: usize = 16;

/// Every bucket a variable-size batch bounded by `spec` may have, as its (m, n, k) bounds:
/// the multiples of [`BUCKET_MN`] (m, n) and [`BUCKET_K`] (k) up to `spec`'s extents, the
/// last one `spec`'s own, as [`Gpu::bucket_variable`] rounds them.
pub fn bucket_bounds(spec: &GemmSpec) -> Vec<(usize, usize, usize)> {
    let steps = |extent: usize, step: usize| -> Vec<usize> {
        (1..=extent.div_ceil(step))
            .map(|i| (i * step).min(extent))
            .collect()
    };
    let ns = steps(spec.n(), BUCKET_MN);
    let ks = steps(spec.k(), BUCKET_K);
    steps(spec.m(), BUCKET_MN)
        .into_iter()
        .flat_map(|m| ns.iter().map(move |&n| (m, n)))
        .flat_map(|(m, n)| ks.iter().map(move |&k| (m, n, k)))
        .collect()
}

/// The spec of the bucket of `spec`'s variable-size batch whose problems have m, n and k up
/// to `m`, `n` and `k` ([`Gpu::bucket_variable`] rounds m and n up to multiples of
/// [`BUCKET_MN`], k to one of [`BUCKET_K`]): its kernel, and its tuning database key, are
/// those of this spec
/// with `BatchKind::VariableSize`.
pub fn bucket_spec(spec: &GemmSpec, m: usize, n: usize, k: usize) -> Result<GemmSpec, CudaError> {
    Ok(GemmSpec::builder(spec.dtype(), m, n, k)
        .layout(spec.layout())
        .trans_a(spec.trans_a())
        .trans_b(spec.trans_b())
        .alpha(spec.alpha())
        .beta(spec.beta())
        .build()?)
}

impl Gpu {
    /// Splits a variable-size batch, given on the host as pointer arrays and six u32 per
    /// problem (`m, n, k, lda, ldb, ldc`, as for [`GpuKernel::launch_variable`]; every size
    /// at most `spec`'s), into buckets by size (see [`BucketedBatch`]), compiles each
    /// bucket's kernel (the layout, transposes and scalars of `spec`) and uploads each
    /// bucket's arrays. Problems with m = 0 or n = 0 have nothing to compute and are left out.
    pub fn bucket_variable(
        &self,
        spec: &GemmSpec,
        a: &[u64],
        b: &[u64],
        c: &[u64],
        dims: &[u32],
    ) -> Result<BucketedBatch, CudaError> {
        self.bucket_variable_on(spec, a, b, c, dims, 4)
    }

    /// [`Self::bucket_variable`] with up to `lanes` buckets running concurrently.
    pub fn bucket_variable_on(
        &self,
        spec: &GemmSpec,
        a: &[u64],
        b: &[u64],
        c: &[u64],
        dims: &[u32],
        lanes: usize,
    ) -> Result<BucketedBatch, CudaError> {
        let batch = a.len();
        if b.len() != batch || c.len() != batch || dims.len() != 6 * batch {
            return Err(CudaError::BufferTooShort {
                what: "pointer arrays and dims of one length".into(),
                len: b.len().min(c.len()).min(dims.len() / 6),
                required: batch,
                batch,
            });
        }
        check_dims(spec, dims)?;
        let bound = |v: u32, step: usize| (v as usize).div_ceil(step).max(1) * step;
        let mut groups: std::collections::BTreeMap<(usize, usize, usize), Vec<usize>> =
            std::collections::BTreeMap::new();
        for (i, d) in dims.chunks(6).enumerate() {
            if d[0] == 0 || d[1] == 0 {
                continue;
            }
            let key = (
                bound(d[0], BUCKET_MN).min(spec.m()),
                bound(d[1], BUCKET_MN).min(spec.n()),
                bound(d[2], BUCKET_K).min(spec.k()),
            );
            groups.entry(key).or_default().push(i);
        }
        let mut buckets = Vec::new();
        // Largest buckets first: the small ones fill the tails of the large ones' grids.
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by_key(|((m, n, k), members)| std::cmp::Reverse(m * n * k * members.len()));
        for ((m, n, k), members) in groups {
            let sub = bucket_spec(spec, m, n, k)?;
            let kernel = self.kernel(&sub, BatchKind::VariableSize)?;
            let pick = |v: &[u64]| members.iter().map(|&i| v[i]).collect::<Vec<u64>>();
            let d: Vec<u32> = members
                .iter()
                .flat_map(|&i| dims[6 * i..6 * i + 6].iter().copied())
                .collect();
            let (a, b, c, dims) = (
                self.upload_raw(&pick(a))?,
                self.upload_raw(&pick(b))?,
                self.upload_raw(&pick(c))?,
                self.upload_raw(&d)?,
            );
            let stream = self.stream();
            let raw = [
                cudarc::driver::DevicePtr::device_ptr(&a, stream).0,
                cudarc::driver::DevicePtr::device_ptr(&b, stream).0,
                cudarc::driver::DevicePtr::device_ptr(&c, stream).0,
                cudarc::driver::DevicePtr::device_ptr(&dims, stream).0,
            ];
            buckets.push(Bucket {
                kernel,
                _arrays: (a, b, c, dims),
                raw,
                len: members.len(),
            });
        }
        let lanes = (0..buckets.len().clamp(1, lanes.max(1)))
            .map(|_| self.stream().fork())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BucketedBatch {
            buckets,
            lanes,
            replay_stream: self.stream().fork()?,
            replay: Mutex::default(),
        })
    }
}

#[cfg(test)]
mod tuning_tests {
    use super::*;
    use smallgemm_ir::{Dtype, Staging};

    #[test]
    fn gpu_entries_round_trip_through_the_tuning_database() {
        let spec = GemmSpec::builder(Dtype::F32, 17, 17, 17).build().unwrap();
        let s = GpuSchedule::fma(4, 4, 5, Staging::Flat);
        let mut db = crate::tuning::TuningDb {
            version: crate::tuning::VERSION,
            ..Default::default()
        };
        let key = gpu_tuning_key("NVIDIA H100 80GB HBM3", &spec, BatchKind::Strided);
        db.gpu.insert(key.clone(), serde_json::to_value(s).unwrap());
        db.gpu.insert(
            gpu_tuning_key("NVIDIA H200", &spec, BatchKind::Strided),
            serde_json::to_value(s).unwrap(),
        );
        db.gpu
            .insert("NVIDIA H100 80GB HBM3 | junk".into(), serde_json::json!(3));
        let text = serde_json::to_string(&db).unwrap();
        let back: crate::tuning::TuningDb = serde_json::from_str(&text).unwrap();
        let tuned = tuned_schedules(&back, "NVIDIA H100 80GB HBM3");
        assert_eq!(tuned.len(), 1);
        assert_eq!(tuned.get(&key), Some(&s));
        assert_eq!(key, "NVIDIA H100 80GB HBM3 | strided f32 17x17x17 nn");
    }

    /// A batch's bucket bounds step by 16 up to its own extents, the last one those.
    #[test]
    fn bucket_bounds_end_at_the_batch_bound() {
        let spec = |m, n, k| GemmSpec::builder(Dtype::F64, m, n, k).build().unwrap();
        assert_eq!(bucket_bounds(&spec(32, 32, 32)).len(), 8);
        assert_eq!(
            bucket_bounds(&spec(20, 33, 16)),
            vec![
                (16, 16, 16),
                (16, 32, 16),
                (16, 33, 16),
                (20, 16, 16),
                (20, 32, 16),
                (20, 33, 16)
            ]
        );
    }

    /// The shipped database's GPU entries (an H200's squares, and the f64 buckets of its
    /// variable-size batches; docs/gpu-notes.md, versions 27 to 30) all parse, each belongs
    /// to a square strided shape or to a bucket's shape of the variable form, and each
    /// generates its kernel for that shape and form on sm_90.
    #[test]
    fn shipped_gpu_entries_generate_their_kernels() {
        let shipped = crate::tuning::shipped();
        // Every entry parses and belongs to one of the devices the sweeps ran on.
        let devices = ["NVIDIA H200", "NVIDIA H100 80GB HBM3"];
        let per_device: Vec<_> = devices
            .iter()
            .map(|device| tuned_schedules(shipped, device))
            .collect();
        let parsed: usize = per_device.iter().map(HashMap::len).sum();
        assert_eq!(parsed, shipped.gpu.len());
        let target = GpuTarget::new(Sm::Sm90);
        let mut shapes: Vec<(Dtype, [usize; 3], BatchKind)> = Vec::new();
        for dtype in [Dtype::F64, Dtype::F32, Dtype::F16] {
            shapes.extend((1..=128).map(|n| (dtype, [n; 3], BatchKind::Strided)));
            // The buckets of a batch of sizes up to 32 (the bench's).
            let bound = GemmSpec::builder(dtype, 32, 32, 32).build().unwrap();
            shapes.extend(
                bucket_bounds(&bound)
                    .into_iter()
                    .map(|(m, n, k)| (dtype, [m, n, k], BatchKind::VariableSize)),
            );
        }
        for (device, tuned) in devices.iter().zip(&per_device) {
            assert!(
                tuned.len() >= 40,
                "{device}: {} shipped GPU entries",
                tuned.len()
            );
            let mut generated = 0;
            for &(dtype, [m, n, k], kind) in &shapes {
                let spec = GemmSpec::builder(dtype, m, n, k).build().unwrap();
                let key = gpu_tuning_key(device, &spec, kind);
                if let Some(schedule) = tuned.get(&key) {
                    smallgemm_codegen_ptx::generate(&spec, &target, Some(schedule), kind)
                        .unwrap_or_else(|e| panic!("{key}: {e}"));
                    generated += 1;
                }
            }
            assert_eq!(generated, tuned.len(), "{device}");
        }
    }
}
