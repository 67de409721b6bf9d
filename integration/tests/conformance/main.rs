//! Conformance tests of Weft: the behaviours of `docs/conformance.md`.
//!
//! Every test is written once, as an `async fn` taking a
//! [`weft_integration::Provider`], and instantiated for each provider of
//! [`weft_integration::providers`] by [`provider_tests!`]: the test
//! `av::tcp::insert_good_bad` is `av::insert_good_bad` run against `tcp`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod harness;

mod atomic;
mod av;
mod endpoint;
mod eq_cq_cntr;
mod flags;
mod mr;
mod msg_ep;
mod multi_recv;
mod ordering;
mod pool;
mod pool_post;
mod rma;
mod rma_events;
mod scalable;
mod scalable_multi;
mod sockets;
mod srx;
mod srx_multi;
mod stx;
mod tagged;

/// The provider list of the macro must be the library's list: adding a
/// provider to `providers()` without instantiating the tests for it fails.
#[test]
fn every_provider_is_instantiated() {
    assert_eq!(weft_integration::providers(), harness::INSTANTIATED);
    for p in weft_integration::providers() {
        // verbs is optional (a cargo feature); its tests say when skipped.
        assert!(
            weft::providers().contains(&p) || p == "verbs",
            "provider {p} is not compiled in"
        );
    }
}
