//! The tests of `examples/tagged_service.rs`. The example belongs to the
//! `weft` package, whose examples cargo builds but does not test (their
//! `test` defaults to false), and that package is not this one's to
//! change: compiled in here, its `#[cfg(test)]` tests run with
//! `cargo test -p weft-cli` and `cargo test --workspace`.

// The example's `main` and its client-only helpers have no caller here.
#[allow(dead_code)]
#[path = "../../../examples/tagged_service.rs"]
mod tagged_service;
