//! The competitors that are C libraries, each behind its cargo feature. With no feature on,
//! nothing here links to anything.

#[cfg(feature = "libxsmm")]
pub mod libxsmm;
#[cfg(feature = "mkl")]
pub mod mkl;
#[cfg(feature = "openblas")]
pub mod openblas;

/// Per-element-type entry points of the C libraries that are built in.
pub trait Ffi: Sized + Copy + 'static {
    #[cfg(feature = "openblas")]
    const CBLAS_GEMM: openblas::CblasGemm<Self>;
    #[cfg(feature = "libxsmm")]
    const XSMM_DISPATCH: libxsmm::Dispatch<Self>;
    #[cfg(feature = "mkl")]
    fn mkl_entry(mkl: &mkl::Mkl) -> (mkl::CreateFn<Self>, mkl::GetFn<Self>);
}

impl Ffi for f64 {
    #[cfg(feature = "openblas")]
    const CBLAS_GEMM: openblas::CblasGemm<f64> = openblas::cblas_dgemm;
    #[cfg(feature = "libxsmm")]
    const XSMM_DISPATCH: libxsmm::Dispatch<f64> = libxsmm::libxsmm_dmmdispatch;
    #[cfg(feature = "mkl")]
    fn mkl_entry(mkl: &mkl::Mkl) -> (mkl::CreateFn<f64>, mkl::GetFn<f64>) {
        (mkl.create_d, mkl.get_d)
    }
}

impl Ffi for f32 {
    #[cfg(feature = "openblas")]
    const CBLAS_GEMM: openblas::CblasGemm<f32> = openblas::cblas_sgemm;
    #[cfg(feature = "libxsmm")]
    const XSMM_DISPATCH: libxsmm::Dispatch<f32> = libxsmm::libxsmm_smmdispatch;
    #[cfg(feature = "mkl")]
    fn mkl_entry(mkl: &mkl::Mkl) -> (mkl::CreateFn<f32>, mkl::GetFn<f32>) {
        (mkl.create_s, mkl.get_s)
    }
}
