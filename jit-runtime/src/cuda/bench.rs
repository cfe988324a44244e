//! GPU benchmark: smallgemm against cuBLAS `gemm_strided_batched` (its tensor-core path for
//! f16), C = 1.5 A B + 0.5 C on square sizes, data far larger than L2, every figure as a
//! fraction of the bandwidth bound measured in the same run (device-to-device copy).

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use smallgemm_ir::reference::SplitMix64;
use smallgemm_ir::{Dtype, GemmSpec, GpuSchedule, Scalar};

use super::{f16, BatchKind, CudaError, Gpu, GpuElement};

/// Bytes of A + B + C (each) the benchmark keeps on the device: 3 x 256 MiB ≫ 50 MiB of L2.
pub const BUFFER_BYTES: usize = 256 << 20;

/// One measured configuration.
#[derive(Clone, Debug)]
pub struct Row {
    pub dtype: Dtype,
    /// Square size, or 0 for the variable-size batch.
    pub n: usize,
    pub batch: usize,
    /// Bytes read (A, B, C) and written (C) per launch.
    pub bytes: f64,
    pub flops: f64,
    pub ours_s: f64,
    /// cuBLAS time; `None` for variable-size batches.
    pub cublas_s: Option<f64>,
    /// The schedule our kernel ran.
    pub schedule: GpuSchedule,
}

impl Row {
    /// Bound: flops / (bytes / bandwidth), in flop/s.
    pub fn bound(&self, bandwidth: f64) -> f64 {
        self.flops / (self.bytes / bandwidth)
    }
    pub fn ours_fraction(&self, bandwidth: f64) -> f64 {
        self.flops / self.ours_s / self.bound(bandwidth)
    }
    pub fn cublas_fraction(&self, bandwidth: f64) -> Option<f64> {
        self.cublas_s
            .map(|t| self.flops / t / self.bound(bandwidth))
    }
    pub fn speedup(&self) -> Option<f64> {
        self.cublas_s.map(|t| t / self.ours_s)
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub f64_sizes: Vec<usize>,
    pub f32_sizes: Vec<usize>,
    pub f16_sizes: Vec<usize>,
    /// Variable-size batches (sizes uniform in 1..=32) for these dtypes.
    pub variable: Vec<Dtype>,
    pub reps: usize,
    /// Bytes of each of A, B, C.
    pub buffer_bytes: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            f64_sizes: (2..=32).collect(),
            f32_sizes: (2..=32).collect(),
            f16_sizes: (2..=128).collect(),
            variable: vec![Dtype::F64, Dtype::F32],
            reps: 10,
            buffer_bytes: BUFFER_BYTES,
        }
    }
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    pub device: String,
    /// Device-to-device copy bandwidth (read + write bytes per second).
    pub bandwidth: f64,
    pub rows: Vec<Row>,
}

/// Times `f` (which enqueues work on `stream`): one warm-up, then the median of `reps`.
fn time<F: FnMut() -> Result<(), CudaError>>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    reps: usize,
    mut f: F,
) -> Result<f64, CudaError> {
    f()?;
    stream.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let start = gpu
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = gpu
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(stream)?;
        f()?;
        end.record(stream)?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64 * 1e-3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Device-to-device copy bandwidth over `bytes`, counting read + write.
pub fn copy_bandwidth(gpu: &Gpu, bytes: usize, reps: usize) -> Result<f64, CudaError> {
    let stream = gpu.stream().clone();
    let src: CudaSlice<u8> = stream.alloc_zeros(bytes)?;
    let mut dst: CudaSlice<u8> = stream.alloc_zeros(bytes)?;
    let t = time(gpu, &stream, reps, || {
        stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    Ok(2.0 * bytes as f64 / t)
}

fn random<T: GpuElement>(len: usize, seed: u64) -> Vec<T> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| T::from_f64(rng.nonzero())).collect()
}

struct Buffers<T: GpuElement> {
    a: CudaSlice<T>,
    b: CudaSlice<T>,
    c: CudaSlice<T>,
    len: usize,
}

fn buffers<T: GpuElement>(gpu: &Gpu, bytes: usize) -> Result<Buffers<T>, CudaError> {
    let len = bytes / T::DTYPE.size();
    Ok(Buffers {
        a: gpu.upload(&random::<T>(len, 1))?,
        b: gpu.upload(&random::<T>(len, 2))?,
        c: gpu.upload(&random::<T>(len, 3))?,
        len,
    })
}

fn spec(dtype: Dtype, n: usize) -> Result<GemmSpec, CudaError> {
    Ok(GemmSpec::builder(dtype, n, n, n)
        .alpha(Scalar::fixed(1.5)?)
        .beta(Scalar::fixed(0.5)?)
        .build()?)
}

/// cuBLAS strided batched GEMM for T (column-major, no transposes, tight).
trait Blas: GpuElement {
    fn cublas(
        blas: &CudaBlas,
        n: usize,
        batch: usize,
        a: &CudaSlice<Self>,
        b: &CudaSlice<Self>,
        c: &mut CudaSlice<Self>,
    ) -> Result<(), CudaError>;
}

macro_rules! blas_impl {
    ($t:ty, $alpha:expr, $beta:expr) => {
        impl Blas for $t {
            fn cublas(
                blas: &CudaBlas,
                n: usize,
                batch: usize,
                a: &CudaSlice<Self>,
                b: &CudaSlice<Self>,
                c: &mut CudaSlice<Self>,
            ) -> Result<(), CudaError> {
                let n32 = n as i32;
                let cfg = StridedBatchedConfig {
                    gemm: GemmConfig {
                        transa: cublasOperation_t::CUBLAS_OP_N,
                        transb: cublasOperation_t::CUBLAS_OP_N,
                        m: n32,
                        n: n32,
                        k: n32,
                        alpha: $alpha,
                        lda: n32,
                        ldb: n32,
                        beta: $beta,
                        ldc: n32,
                    },
                    batch_size: batch as i32,
                    stride_a: (n * n) as i64,
                    stride_b: (n * n) as i64,
                    stride_c: (n * n) as i64,
                };
                // SAFETY: the buffers hold `batch` tight n x n matrices (checked by caller).
                unsafe { blas.gemm_strided_batched(cfg, a, b, c) }?;
                Ok(())
            }
        }
    };
}

blas_impl!(f64, 1.5f64, 0.5f64);
blas_impl!(f32, 1.5f32, 0.5f32);
blas_impl!(f16, f16::from_f32(1.5), f16::from_f32(0.5));

fn square<T: Blas>(
    gpu: &Gpu,
    blas: Option<&CudaBlas>,
    bufs: &mut Buffers<T>,
    n: usize,
    reps: usize,
    schedule: Option<&GpuSchedule>,
) -> Result<Row, CudaError> {
    let spec = spec(T::DTYPE, n)?;
    let batch = (bufs.len / (n * n)).min(i32::MAX as usize / 2);
    let kernel = match schedule {
        Some(s) => gpu.kernel_with_schedule(&spec, BatchKind::Strided, s)?,
        None => gpu.kernel(&spec, BatchKind::Strided)?,
    };
    let stream = gpu.stream().clone();
    let ours = time(gpu, &stream, reps, || {
        kernel.launch_strided(&stream, &bufs.a, &bufs.b, &mut bufs.c, batch, 1.5, 0.5)
    })?;
    let cublas = match blas {
        Some(blas) => Some(time(gpu, &stream, reps, || {
            T::cublas(blas, n, batch, &bufs.a, &bufs.b, &mut bufs.c)
        })?),
        None => None,
    };
    let elt = T::DTYPE.size() as f64;
    Ok(Row {
        dtype: T::DTYPE,
        n,
        batch,
        bytes: 4.0 * (n * n) as f64 * elt * batch as f64,
        flops: 2.0 * (n * n * n) as f64 * batch as f64,
        ours_s: ours,
        cublas_s: cublas,
        schedule: kernel.ptx().schedule,
    })
}

/// The element types a [`Probe`] keeps buffers for: where its buffers are.
trait ProbeElement: GpuElement {
    fn slot(probe: &mut Probe) -> &mut Option<Buffers<Self>>;
}
impl ProbeElement for f64 {
    fn slot(probe: &mut Probe) -> &mut Option<Buffers<f64>> {
        &mut probe.f64
    }
}
impl ProbeElement for f32 {
    fn slot(probe: &mut Probe) -> &mut Option<Buffers<f32>> {
        &mut probe.f32
    }
}
impl ProbeElement for f16 {
    fn slot(probe: &mut Probe) -> &mut Option<Buffers<f16>> {
        &mut probe.f16
    }
}

/// The tuner's probe: times square sizes under explicit schedules (no cuBLAS), keeping one
/// set of device buffers per dtype across probes.
pub struct Probe {
    buffer_bytes: usize,
    f64: Option<Buffers<f64>>,
    f32: Option<Buffers<f32>>,
    f16: Option<Buffers<f16>>,
}

impl Probe {
    /// This probe's device buffers for `T`, allocated on first use.
    fn buffers<T: ProbeElement>(&mut self, gpu: &Gpu) -> Result<&mut Buffers<T>, CudaError> {
        let bytes = self.buffer_bytes;
        match T::slot(self) {
            Some(b) => Ok(b),
            slot => Ok(slot.insert(buffers(gpu, bytes)?)),
        }
    }

    pub fn new(buffer_bytes: usize) -> Probe {
        Probe {
            buffer_bytes,
            f64: None,
            f32: None,
            f16: None,
        }
    }

    /// Times the variable-size batch split into buckets ([`Gpu::bucket_variable_on`]) run
    /// `lanes` at a time, with the default schedules.
    pub fn time_bucketed(
        &mut self,
        gpu: &Gpu,
        dtype: Dtype,
        lanes: usize,
        reps: usize,
    ) -> Result<Row, CudaError> {
        match dtype {
            Dtype::F64 => variable::<f64>(gpu, self.buffers::<f64>(gpu)?, reps, None, Some(lanes)),
            Dtype::F32 => variable::<f32>(gpu, self.buffers::<f32>(gpu)?, reps, None, Some(lanes)),
            Dtype::F16 => variable::<f16>(gpu, self.buffers::<f16>(gpu)?, reps, None, Some(lanes)),
        }
    }

    /// Times the variable-size batch (sizes uniform in 1..=32) under `schedule`.
    pub fn time_variable(
        &mut self,
        gpu: &Gpu,
        dtype: Dtype,
        schedule: &GpuSchedule,
        reps: usize,
    ) -> Result<Row, CudaError> {
        match dtype {
            Dtype::F64 => {
                variable::<f64>(gpu, self.buffers::<f64>(gpu)?, reps, Some(schedule), None)
            }
            Dtype::F32 => {
                variable::<f32>(gpu, self.buffers::<f32>(gpu)?, reps, Some(schedule), None)
            }
            Dtype::F16 => {
                variable::<f16>(gpu, self.buffers::<f16>(gpu)?, reps, Some(schedule), None)
            }
        }
    }

    pub fn time(
        &mut self,
        gpu: &Gpu,
        dtype: Dtype,
        n: usize,
        schedule: &GpuSchedule,
        reps: usize,
    ) -> Result<Row, CudaError> {
        match dtype {
            Dtype::F64 => square::<f64>(
                gpu,
                None,
                self.buffers::<f64>(gpu)?,
                n,
                reps,
                Some(schedule),
            ),
            Dtype::F32 => square::<f32>(
                gpu,
                None,
                self.buffers::<f32>(gpu)?,
                n,
                reps,
                Some(schedule),
            ),
            Dtype::F16 => square::<f16>(
                gpu,
                None,
                self.buffers::<f16>(gpu)?,
                n,
                reps,
                Some(schedule),
            ),
        }
    }
}

/// Variable-size batch: sizes uniform in 1..=32 (m, n, k independent), tight, packed.
fn variable<T: GpuElement>(
    gpu: &Gpu,
    bufs: &mut Buffers<T>,
    reps: usize,
    schedule: Option<&GpuSchedule>,
    bucketed: Option<usize>,
) -> Result<Row, CudaError> {
    let max = 32;
    let spec = GemmSpec::builder(T::DTYPE, max, max, max)
        .alpha(Scalar::fixed(1.5)?)
        .beta(Scalar::fixed(0.5)?)
        .build()?;
    let kernel = match schedule {
        Some(s) => gpu.kernel_with_schedule(&spec, BatchKind::VariableSize, s)?,
        None => gpu.kernel(&spec, BatchKind::VariableSize)?,
    };
    let mut rng = SplitMix64::new(7);
    let (mut dims, mut pa, mut pb, mut pc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut oa, mut ob, mut oc) = (0usize, 0usize, 0usize);
    let (mut bytes, mut flops) = (0.0, 0.0);
    let elt = T::DTYPE.size();
    let stream = gpu.stream().clone();
    let base = |s: &CudaSlice<T>| cudarc::driver::DevicePtr::device_ptr(s, &stream).0;
    let (ba, bb, bc) = (base(&bufs.a), base(&bufs.b), base(&bufs.c));
    loop {
        let mut pick = || 1 + (rng.next_u64() % max as u64) as usize;
        let (m, n, k) = (pick(), pick(), pick());
        if oa + m * k > bufs.len || ob + k * n > bufs.len || oc + m * n > bufs.len {
            break;
        }
        dims.extend([m, n, k, m, k, m].map(|v| v as u32));
        pa.push(ba + (oa * elt) as u64);
        pb.push(bb + (ob * elt) as u64);
        pc.push(bc + (oc * elt) as u64);
        oa += m * k;
        ob += k * n;
        oc += m * n;
        bytes += ((m * k + k * n + 2 * m * n) * elt) as f64;
        flops += 2.0 * (m * n * k) as f64;
    }
    let batch = pa.len();
    super::check_dims(&spec, &dims)?;
    let (da, db, dc) = (
        gpu.upload_raw(&pa)?,
        gpu.upload_raw(&pb)?,
        gpu.upload_raw(&pc)?,
    );
    let dd = gpu.upload_raw(&dims)?;
    let ours = if let Some(lanes) = bucketed {
        let buckets = gpu.bucket_variable_on(&spec, &pa, &pb, &pc, &dims, lanes)?;
        time(gpu, &stream, reps, || {
            // SAFETY: as below, the same pointers.
            unsafe { buckets.launch::<T>(&stream, 1.5, 0.5) }
        })?
    } else {
        time(gpu, &stream, reps, || {
            // SAFETY: every pointer addresses its problem's tight matrices inside the
            // buffers, and the C matrices are disjoint (consecutive offsets).
            unsafe { kernel.launch_variable::<T>(&stream, &da, &db, &dc, &dd, batch, 1.5, 0.5) }
        })?
    };
    Ok(Row {
        dtype: T::DTYPE,
        // 0: one launch; 1: bucketed by size (BucketedBatch).
        n: usize::from(bucketed.is_some()),
        batch,
        bytes,
        flops,
        ours_s: ours,
        cublas_s: None,
        schedule: kernel.ptx().schedule,
    })
}

/// Runs the whole benchmark; `progress` sees each row as it is measured.
pub fn run(
    gpu: &Gpu,
    cfg: &BenchConfig,
    mut progress: impl FnMut(&Row, f64),
) -> Result<Report, CudaError> {
    let bandwidth = copy_bandwidth(gpu, cfg.buffer_bytes * 2, cfg.reps)?;
    let blas = if super::cublas_present() {
        Some(CudaBlas::new(gpu.stream().clone())?)
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut push = |row: Row, rows: &mut Vec<Row>| {
        progress(&row, bandwidth);
        rows.push(row);
    };
    if !cfg.f64_sizes.is_empty() || cfg.variable.contains(&Dtype::F64) {
        let mut bufs = buffers::<f64>(gpu, cfg.buffer_bytes)?;
        for &n in &cfg.f64_sizes {
            push(
                square(gpu, blas.as_ref(), &mut bufs, n, cfg.reps, None)?,
                &mut rows,
            );
        }
        if cfg.variable.contains(&Dtype::F64) {
            push(variable(gpu, &mut bufs, cfg.reps, None, None)?, &mut rows);
            push(
                variable(gpu, &mut bufs, cfg.reps, None, Some(4))?,
                &mut rows,
            );
        }
    }
    if !cfg.f32_sizes.is_empty() || cfg.variable.contains(&Dtype::F32) {
        let mut bufs = buffers::<f32>(gpu, cfg.buffer_bytes)?;
        for &n in &cfg.f32_sizes {
            push(
                square(gpu, blas.as_ref(), &mut bufs, n, cfg.reps, None)?,
                &mut rows,
            );
        }
        if cfg.variable.contains(&Dtype::F32) {
            push(variable(gpu, &mut bufs, cfg.reps, None, None)?, &mut rows);
            push(
                variable(gpu, &mut bufs, cfg.reps, None, Some(4))?,
                &mut rows,
            );
        }
    }
    if !cfg.f16_sizes.is_empty() {
        let mut bufs = buffers::<f16>(gpu, cfg.buffer_bytes)?;
        for &n in &cfg.f16_sizes {
            push(
                square(gpu, blas.as_ref(), &mut bufs, n, cfg.reps, None)?,
                &mut rows,
            );
        }
    }
    Ok(Report {
        device: gpu.name().to_string(),
        bandwidth,
        rows,
    })
}

impl Report {
    /// One line per row: dtype, size, batch, GFLOP/s and fraction of the bound for both,
    /// speedup.
    pub fn table(&self) -> String {
        let mut out = format!(
            "device {}; copy bandwidth {:.0} GB/s (read + write); bound = flops / (bytes / bandwidth), bytes = A + B + C read, C written\n",
            self.device,
            self.bandwidth / 1e9
        );
        out.push_str("dtype     n     batch  ours GF/s  ours %bound  cuBLAS GF/s  cuBLAS %bound  speedup  schedule\n");
        for r in &self.rows {
            out.push_str(&Self::line(r, self.bandwidth));
            out.push('\n');
        }
        out
    }

    pub fn line(r: &Row, bw: f64) -> String {
        let size = if r.n == 0 {
            "1..32".to_string()
        } else if r.n == 1 {
            "1..32b".to_string()
        } else {
            r.n.to_string()
        };
        let gf = |t: f64| r.flops / t / 1e9;
        let sched = r.schedule.label();
        format!(
            "{:<5} {:>5} {:>9} {:>10.1} {:>11.1}% {:>12} {:>13} {:>8}  {}",
            r.dtype.name(),
            size,
            r.batch,
            gf(r.ours_s),
            100.0 * r.ours_fraction(bw),
            r.cublas_s
                .map(|t| format!("{:.1}", gf(t)))
                .unwrap_or("-".into()),
            r.cublas_fraction(bw)
                .map(|f| format!("{:.1}%", 100.0 * f))
                .unwrap_or("-".into()),
            r.speedup()
                .map(|s| format!("{s:.2}x"))
                .unwrap_or("-".into()),
            sched
        )
    }

    pub fn csv(&self) -> String {
        let mut out = String::from(
            "dtype,n,batch,bytes,flops,ours_s,cublas_s,bandwidth,ours_fraction,cublas_fraction,speedup\n",
        );
        for r in &self.rows {
            let opt = |v: Option<f64>| v.map(|v| format!("{v:.6e}")).unwrap_or_default();
            out.push_str(&format!(
                "{},{},{},{:.0},{:.0},{:.6e},{},{:.6e},{:.4},{},{}\n",
                r.dtype.name(),
                r.n,
                r.batch,
                r.bytes,
                r.flops,
                r.ours_s,
                opt(r.cublas_s),
                self.bandwidth,
                r.ours_fraction(self.bandwidth),
                opt(r.cublas_fraction(self.bandwidth)),
                opt(r.speedup())
            ));
        }
        out
    }

    /// Fraction of the bound against n, one panel per dtype: ours solid, cuBLAS dashed.
    pub fn svg(&self) -> String {
        let (w, h, pad) = (900.0, 260.0, 40.0);
        let dtypes = [Dtype::F64, Dtype::F32, Dtype::F16];
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
            h * 3.0
        );
        for (i, d) in dtypes.iter().enumerate() {
            let rows: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| r.dtype == *d && r.n > 1)
                .collect();
            let y0 = i as f64 * h;
            let nmax = rows.iter().map(|r| r.n).max().unwrap_or(1) as f64;
            let x = |n: usize| pad + (n as f64 / nmax) * (w - 2.0 * pad);
            let y = |f: f64| y0 + h - pad - f.min(1.2) / 1.2 * (h - 2.0 * pad);
            out.push_str(&format!(
                "<text x=\"{pad}\" y=\"{}\">{} — fraction of bandwidth bound vs n (solid: smallgemm, dashed: cuBLAS)</text>\n",
                y0 + 15.0,
                d.name()
            ));
            for f in [0.0, 0.5, 0.9, 1.0] {
                out.push_str(&format!(
                    "<line x1=\"{pad}\" x2=\"{x2}\" y1=\"{yf}\" y2=\"{yf}\" stroke=\"#ccc\"/><text x=\"5\" y=\"{yf}\">{f}</text>\n",
                    x2 = w - pad,
                    yf = y(f)
                ));
            }
            let path = |f: &dyn Fn(&Row) -> Option<f64>| {
                rows.iter()
                    .filter_map(|r| f(r).map(|v| format!("{:.1},{:.1}", x(r.n), y(v))))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let bw = self.bandwidth;
            out.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"#c00\" stroke-width=\"2\" points=\"{}\"/>\n",
                path(&|r| Some(r.ours_fraction(bw)))
            ));
            out.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"#00c\" stroke-dasharray=\"4 3\" points=\"{}\"/>\n",
                path(&|r| r.cublas_fraction(bw))
            ));
            for r in rows.iter().filter(|r| r.n % 8 == 0 || r.n == 2) {
                out.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{}\">{}</text>\n",
                    x(r.n) - 4.0,
                    y0 + h - pad + 14.0,
                    r.n
                ));
            }
        }
        out.push_str("</svg>\n");
        out
    }
}
