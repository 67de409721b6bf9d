//! The hostile-peer campaign against the tcp provider, on loopback.
//!
//! ```sh
//! cargo run --release -p weft-integration --bin hostile-campaign -- --long
//! cargo run --release -p weft-integration --bin hostile-campaign -- --short parked_storm
//! ```
//!
//! Each class prints what it measured and whether its bound held; the
//! exit status is non-zero if any did not. `peer ADDR` is the peer that
//! the `kill9` class starts and kills.

use std::alloc::System;
use std::process::ExitCode;

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hostile-campaign: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.first().map(String::as_str) == Some("peer") {
        let Some(addr) = args.get(1).and_then(|a| a.parse().ok()) else {
            eprintln!("usage: hostile-campaign peer ADDR");
            return ExitCode::from(2);
        };
        return match rt.block_on(campaign::peer(addr)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    let mut scale = Scale::short();
    let mut only = Vec::new();
    for a in &args {
        match a.as_str() {
            "--long" => scale = Scale::long(),
            "--short" => scale = Scale::short(),
            "-h" | "--help" => {
                println!("usage: hostile-campaign [--short|--long] [CLASS...]");
                println!("classes: {}", CLASSES.join(" "));
                return ExitCode::SUCCESS;
            }
            c if CLASSES.contains(&c) => only.push(c.to_string()),
            other => {
                eprintln!("hostile-campaign: unknown argument {other} (see --help)");
                return ExitCode::from(2);
            }
        }
    }
    scale.peer_exe = std::env::current_exe().ok();
    let classes: Vec<String> = if only.is_empty() {
        CLASSES.iter().map(|c| c.to_string()).collect()
    } else {
        only
    };
    println!(
        "hostile-campaign ({} form), tcp provider on loopback",
        scale.name
    );
    let mut failed = 0;
    for class in &classes {
        let t0 = std::time::Instant::now();
        let r = rt.block_on(campaign::run(class, &scale, live_heap));
        match r {
            Ok(rep) => {
                println!("== {class}: held ({:.1?})", t0.elapsed());
                for l in rep.lines {
                    println!("   {l}");
                }
            }
            Err(e) => {
                failed += 1;
                println!("== {class}: NOT MET: {e}");
            }
        }
    }
    println!("{} passed, {failed} failed", classes.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
