//! Weft's RDMA verbs provider, on `rdma-sys`.
//!
//! Only the `sys` modules call libibverbs/librdmacm; everything above them
//! is safe code. Built without the `rdma` feature, the provider offers
//! nothing and says why.

/// Provider name.
pub const NAME: &str = "verbs";

#[cfg(feature = "rdma")]
#[allow(unsafe_code)]
pub mod sys;

/// Why this build offers no verbs domains, or `None` when it was built
/// with RDMA support.
pub fn unavailable_reason() -> Option<&'static str> {
    if cfg!(feature = "rdma") {
        None
    } else {
        Some("weft was built without the `verbs` feature (no RDMA support compiled in)")
    }
}
