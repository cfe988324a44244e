//! smallgemm's C ABI (`include/smallgemm.h`): MKL's CBLAS batch functions with a
//! `smallgemm_` prefix and an `int` result. Arguments are validated in order and the first
//! invalid one is reported as `-i` (BLAS `info`), before anything runs; nothing panics
//! across the boundary.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_longlong, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rt::{blas_spec, Element, GemmGroup, Layout, Trans};

/// Result codes besides 0 and -i (see the header).
const ERROR_UNSUPPORTED_CPU: c_int = 1;
const ERROR_INTERNAL: c_int = 2;
const ERROR_TOO_LARGE: c_int = 3;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Why a call failed: an invalid argument (1-based position) or something else.
enum Failure {
    Invalid(c_int, String),
    Other(c_int, String),
}

impl From<rt::Error> for Failure {
    fn from(e: rt::Error) -> Self {
        let code = match e {
            rt::Error::NoSupportedIsa | rt::Error::IsaNotAvailable { .. } => ERROR_UNSUPPORTED_CPU,
            rt::Error::Spec(_) => ERROR_TOO_LARGE,
            _ => ERROR_INTERNAL,
        };
        Failure::Other(code, e.to_string())
    }
}

/// Runs `body`, turning failures and panics into a result code and a message.
fn guarded(function: &str, body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    let (code, message) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return 0,
        Ok(Err(Failure::Invalid(arg, why))) => (-arg, format!("{function}: argument {arg}: {why}")),
        Ok(Err(Failure::Other(code, why))) => (code, format!("{function}: {why}")),
        Err(_) => (
            ERROR_INTERNAL,
            format!("{function}: internal error (a panic); please report it"),
        ),
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    code
}

/// The message of this thread's last failing call ("" if none); valid until its next one.
#[no_mangle]
pub extern "C" fn smallgemm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

fn invalid(arg: c_int, why: impl Into<String>) -> Failure {
    Failure::Invalid(arg, why.into())
}

fn layout(value: c_int) -> Result<Layout, Failure> {
    match value {
        101 => Ok(Layout::RowMajor),
        102 => Ok(Layout::ColMajor),
        v => Err(invalid(
            1,
            format!("layout must be 101 (row-major) or 102 (column-major), not {v}"),
        )),
    }
}

fn trans(value: c_int, arg: c_int, name: &str) -> Result<Trans, Failure> {
    match value {
        111 => Ok(Trans::N),
        112 | 113 => Ok(Trans::T),
        v => Err(invalid(
            arg,
            format!("{name} must be 111, 112 or 113, not {v}"),
        )),
    }
}

fn size(value: c_int, arg: c_int, name: &str) -> Result<usize, Failure> {
    usize::try_from(value).map_err(|_| invalid(arg, format!("{name} = {value} is negative")))
}

/// BLAS's minimum leading dimension: max(1, the stored matrix's leading extent) for op(X)
/// of `rows` x `cols`.
fn min_ld(layout: Layout, trans: Trans, rows: usize, cols: usize) -> usize {
    let (r, c) = match trans {
        Trans::N => (rows, cols),
        Trans::T => (cols, rows),
    };
    match layout {
        Layout::ColMajor => r,
        Layout::RowMajor => c,
    }
    .max(1)
}

fn check_ld(ld: c_int, min: usize, arg: c_int, name: &str) -> Result<usize, Failure> {
    match usize::try_from(ld) {
        Ok(ld) if ld >= min => Ok(ld),
        _ => Err(invalid(
            arg,
            format!("{name} = {ld} must be at least {min}"),
        )),
    }
}

/// Elements a matrix of `lead` x `other` with leading dimension `ld` spans.
fn footprint(ld: usize, lead: usize, other: usize) -> usize {
    if lead == 0 || other == 0 {
        0
    } else {
        ld * (other - 1) + lead
    }
}

/// The shared body of the strided functions, arguments numbered as in the header.
#[allow(clippy::too_many_arguments)]
unsafe fn batch_strided<T: Element>(
    layout_v: c_int,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: T,
    a: *const T,
    lda: c_int,
    stridea: c_longlong,
    b: *const T,
    ldb: c_int,
    strideb: c_longlong,
    beta: T,
    c: *mut T,
    ldc: c_int,
    stridec: c_longlong,
    batch: c_int,
) -> Result<(), Failure> {
    let layout = layout(layout_v)?;
    let ta = trans(transa, 2, "transa")?;
    let tb = trans(transb, 3, "transb")?;
    let m = size(m, 4, "m")?;
    let n = size(n, 5, "n")?;
    let k = size(k, 6, "k")?;
    let batch_n = usize::try_from(batch).unwrap_or(0);
    let reads_ab = batch_n > 0 && m > 0 && n > 0 && k > 0 && alpha != T::default();
    let writes_c = batch_n > 0 && m > 0 && n > 0 && (reads_ab || beta != T::from_f64(1.0));
    if reads_ab && a.is_null() {
        return Err(invalid(8, "a is null"));
    }
    let lda = check_ld(lda, min_ld(layout, ta, m, k), 9, "lda")?;
    let stride = |s: c_longlong, arg, name| {
        usize::try_from(s).map_err(|_| invalid(arg, format!("{name} = {s} is negative")))
    };
    let stridea = stride(stridea, 10, "stridea")?;
    if reads_ab && b.is_null() {
        return Err(invalid(11, "b is null"));
    }
    let ldb = check_ld(ldb, min_ld(layout, tb, k, n), 12, "ldb")?;
    let strideb = stride(strideb, 13, "strideb")?;
    if writes_c && c.is_null() {
        return Err(invalid(15, "c is null"));
    }
    let ldc = check_ld(ldc, min_ld(layout, Trans::N, m, n), 16, "ldc")?;
    let stridec = stride(stridec, 17, "stridec")?;
    let (c_lead, c_other) = match layout {
        Layout::ColMajor => (m, n),
        Layout::RowMajor => (n, m),
    };
    let c_span = footprint(ldc, c_lead, c_other);
    if writes_c && batch_n > 1 && stridec < c_span {
        return Err(invalid(
            17,
            format!("stridec = {stridec} lets C matrices overlap (each spans {c_span})"),
        ));
    }
    if batch < 0 {
        return Err(invalid(18, format!("batch_size = {batch} is negative")));
    }
    // With one matrix the strides are never used; keep them out of the spec.
    let strides = if batch_n > 1 {
        [stridea, strideb, stridec]
    } else {
        [0, 0, c_span]
    };
    let Some(spec) = blas_spec(
        T::DTYPE,
        layout,
        (ta, tb),
        (m, n, k),
        (lda, ldb, ldc),
        alpha.to_f64(),
        beta.to_f64(),
        Some(strides),
    )?
    else {
        return Ok(());
    };
    let jit = rt::global()?;
    jit.gemm_batch_strided_raw(&spec, a, b, c, batch_n, alpha, beta)?;
    Ok(())
}

/// Reads `count` values from a C array argument, or reports it null.
unsafe fn array<'a, X>(
    p: *const X,
    count: usize,
    arg: c_int,
    name: &str,
) -> Result<&'a [X], Failure> {
    if p.is_null() {
        Err(invalid(arg, format!("{name} is null")))
    } else {
        Ok(std::slice::from_raw_parts(p, count))
    }
}

/// The shared body of the grouped functions, arguments numbered as in the header. Checks
/// run in argument order; `group_size` (16) is read first, tentatively, because it decides
/// which pointer entries (8, 10, 13) must be non-null.
#[allow(clippy::too_many_arguments)]
unsafe fn batch_grouped<T: Element>(
    layout_v: c_int,
    transa: *const c_int,
    transb: *const c_int,
    m: *const c_int,
    n: *const c_int,
    k: *const c_int,
    alpha: *const T,
    a: *const *const T,
    lda: *const c_int,
    b: *const *const T,
    ldb: *const c_int,
    beta: *const T,
    c: *const *mut T,
    ldc: *const c_int,
    group_count: c_int,
    group_size: *const c_int,
) -> Result<(), Failure> {
    let layout = layout(layout_v)?;
    let groups = size(group_count, 15, "group_count")?;
    if groups == 0 {
        return Ok(());
    }
    let sizes: Result<Vec<usize>, Failure> = array(group_size, groups, 16, "group_size")
        .and_then(|s| s.iter().map(|&v| size(v, 16, "group_size[g]")).collect());
    let ints = |p, arg, name: &str| array(p, groups, arg, name);
    let transes = |p, arg, name: &str| -> Result<Vec<Trans>, Failure> {
        ints(p, arg, name)?
            .iter()
            .map(|&v| trans(v, arg, name))
            .collect()
    };
    let dims = |p, arg, name: &str| -> Result<Vec<usize>, Failure> {
        ints(p, arg, name)?
            .iter()
            .map(|&v| size(v, arg, name))
            .collect()
    };
    let lds = |p, arg, name: &str, min: &dyn Fn(usize) -> usize| -> Result<Vec<usize>, Failure> {
        let v = ints(p, arg, name)?;
        (0..groups)
            .map(|g| check_ld(v[g], min(g), arg, name))
            .collect()
    };
    let ta = transes(transa, 2, "transa_array")?;
    let tb = transes(transb, 3, "transb_array")?;
    let ms = dims(m, 4, "m_array")?;
    let ns = dims(n, 5, "n_array")?;
    let ks = dims(k, 6, "k_array")?;
    let alphas = array(alpha, groups, 7, "alpha_array")?;
    // Which groups read A and B, and which write C (the latter needs beta, argument 12).
    let reads: Vec<bool> = (0..groups)
        .map(|g| ms[g] > 0 && ns[g] > 0 && ks[g] > 0 && alphas[g] != T::default())
        .collect();
    // Checks that the pointers of groups doing work are there (skipped while the group
    // sizes are invalid: that is reported as argument 16).
    let pointers = |p: *const *const u8, arg: c_int, name: &str, needed: &dyn Fn(usize) -> bool| {
        let Ok(sizes) = &sizes else { return Ok(()) };
        let total: usize = sizes.iter().sum();
        let mut start = 0;
        for (g, &s) in sizes.iter().enumerate() {
            if s > 0 && needed(g) {
                let ptrs = array(p, total, arg, name)?;
                if let Some(i) = (start..start + s).find(|&i| ptrs[i].is_null()) {
                    return Err(invalid(arg, format!("{name}[{i}] is null")));
                }
            }
            start += s;
        }
        Ok(())
    };
    pointers(a.cast(), 8, "a_array", &|g| reads[g])?;
    let lda_v = lds(lda, 9, "lda_array", &|g| {
        min_ld(layout, ta[g], ms[g], ks[g])
    })?;
    pointers(b.cast(), 10, "b_array", &|g| reads[g])?;
    let ldb_v = lds(ldb, 11, "ldb_array", &|g| {
        min_ld(layout, tb[g], ks[g], ns[g])
    })?;
    let betas = array(beta, groups, 12, "beta_array")?;
    let writes = |g: usize| ms[g] > 0 && ns[g] > 0 && (reads[g] || betas[g] != T::from_f64(1.0));
    pointers(c.cast(), 13, "c_array", &writes)?;
    let ldc_v = lds(ldc, 14, "ldc_array", &|g| {
        min_ld(layout, Trans::N, ms[g], ns[g])
    })?;
    let sizes = sizes?;
    let groups: Vec<GemmGroup<T>> = (0..groups)
        .map(|g| GemmGroup {
            trans_a: ta[g],
            trans_b: tb[g],
            m: ms[g],
            n: ns[g],
            k: ks[g],
            alpha: alphas[g],
            lda: lda_v[g],
            ldb: ldb_v[g],
            beta: betas[g],
            ldc: ldc_v[g],
            size: sizes[g],
        })
        .collect();
    let jit = rt::global()?;
    jit.gemm_batch_grouped_raw(layout, &groups, a, b, c)?;
    Ok(())
}

macro_rules! strided {
    ($name:ident, $t:ty) => {
        /// See `smallgemm.h`.
        ///
        /// # Safety
        /// The pointers follow the CBLAS contract: each matrix of the batch lies inside the
        /// memory the caller owns, and C matrices overlap neither each other nor A or B.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            layout: c_int,
            transa: c_int,
            transb: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: $t,
            a: *const $t,
            lda: c_int,
            stridea: c_longlong,
            b: *const $t,
            ldb: c_int,
            strideb: c_longlong,
            beta: $t,
            c: *mut $t,
            ldc: c_int,
            stridec: c_longlong,
            batch_size: c_int,
        ) -> c_int {
            guarded(stringify!($name), || {
                batch_strided(
                    layout, transa, transb, m, n, k, alpha, a, lda, stridea, b, ldb, strideb, beta,
                    c, ldc, stridec, batch_size,
                )
            })
        }
    };
}

macro_rules! grouped {
    ($name:ident, $t:ty) => {
        /// See `smallgemm.h`.
        ///
        /// # Safety
        /// The arrays hold `group_count` values (the pointer arrays Σ group_size pointers)
        /// and each matrix lies inside memory the caller owns; C matrices overlap neither
        /// each other nor any A or B.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            layout: c_int,
            transa_array: *const c_int,
            transb_array: *const c_int,
            m_array: *const c_int,
            n_array: *const c_int,
            k_array: *const c_int,
            alpha_array: *const $t,
            a_array: *const *const $t,
            lda_array: *const c_int,
            b_array: *const *const $t,
            ldb_array: *const c_int,
            beta_array: *const $t,
            c_array: *const *mut $t,
            ldc_array: *const c_int,
            group_count: c_int,
            group_size: *const c_int,
        ) -> c_int {
            guarded(stringify!($name), || {
                batch_grouped(
                    layout,
                    transa_array,
                    transb_array,
                    m_array,
                    n_array,
                    k_array,
                    alpha_array,
                    a_array,
                    lda_array,
                    b_array,
                    ldb_array,
                    beta_array,
                    c_array,
                    ldc_array,
                    group_count,
                    group_size,
                )
            })
        }
    };
}

strided!(smallgemm_dgemm_batch_strided, f64);
strided!(smallgemm_sgemm_batch_strided, f32);
grouped!(smallgemm_dgemm_batch, f64);
grouped!(smallgemm_sgemm_batch, f32);
