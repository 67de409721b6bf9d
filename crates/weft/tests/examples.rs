//! Runs the examples: `cargo test` builds them next to this test, and each
//! must finish on its own, verified, within a bound.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/examples/<name>`, from this test's own path
/// (`target/<profile>/deps/examples-<hash>`).
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let profile_dir = me.parent().and_then(|d| d.parent()).unwrap();
    profile_dir.join("examples").join(name)
}

fn run(name: &str) {
    let path = example(name);
    assert!(
        path.exists(),
        "{} was not built (cargo test builds the examples)",
        path.display()
    );
    let mut child = Command::new(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            assert!(
                status.success(),
                "{name} failed ({status}):\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{name} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn tagged_pair() {
    run("tagged_pair");
}

#[test]
fn av_events() {
    run("av_events");
}

#[test]
fn cq_pipeline() {
    run("cq_pipeline");
}

#[test]
fn msg_service() {
    run("msg_service");
}
