//! The short form of the hostile-peer campaign (`src/campaign/`): every
//! attack class against the tcp provider with its bound asserted. The
//! long form is `cargo run --release -p weft-integration --bin
//! hostile-campaign -- --long`.
//!
//! The classes run one after another in one test: each measures the
//! process's descriptors and heap, which tests running beside it in the
//! same process would disturb.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use weft_integration::campaign::{self, Scale, CLASSES};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live_heap() -> usize {
    let s = GLOBAL.stats();
    s.bytes_allocated
        .saturating_add(s.bytes_reallocated.max(0) as usize)
        .saturating_sub(s.bytes_deallocated)
}

#[test]
fn every_attack_class_holds_its_bound() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut scale = Scale::short();
    scale.peer_exe = Some(env!("CARGO_BIN_EXE_hostile-campaign").into());
    let mut failures = Vec::new();
    for class in CLASSES {
        match rt.block_on(campaign::run(class, &scale, live_heap)) {
            Ok(r) => {
                println!("{class}: held");
                for l in r.lines {
                    println!("   {l}");
                }
            }
            Err(e) => {
                println!("{class}: NOT MET: {e}");
                failures.push(format!("{class}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "bounds not met: {failures:#?}");
}
