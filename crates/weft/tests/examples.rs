//! Runs the examples: `cargo test` builds them next to this test, and each
//! must finish on its own, verified, within a bound.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
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

#[test]
fn rma_service() {
    run("rma_service");
}

/// Starts one process of `name` per argument list and waits until each has
/// printed a line containing `done`. The processes stay up after that (as
/// a service's pods do), so they are killed then.
fn run_group(name: &str, members: &[Vec<String>], done: &str) {
    let (tx, rx) = mpsc::channel();
    let mut children = Vec::new();
    for (i, args) in members.iter().enumerate() {
        let mut child = Command::new(example(name))
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((i, Some(line)));
            }
            let _ = tx.send((i, None));
        });
        children.push(child);
    }
    let mut finished = vec![false; members.len()];
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !finished.iter().all(|&f| f) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, Some(line))) => {
                finished[i] |= line.contains(done);
                log.push_str(&format!("{i}: {line}\n"));
            }
            Ok((i, None)) => {
                log.push_str(&format!("{i}: exited\n"));
                break;
            }
            Err(_) => break,
        }
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        finished.iter().all(|&f| f),
        "{name}: not every member printed {done:?}:\n{log}"
    );
}

/// A port the kernel just found free on loopback.
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// Three processes find each other through `insert_sym` over numeric
/// names (127.0.0.1, .2, .3: all loopback on Linux), as the StatefulSet's
/// pods do over `weft-0`, `weft-1`, ..., which a test host cannot resolve.
#[test]
fn peer_group() {
    let port = free_port();
    let members: Vec<Vec<String>> = (1..=3)
        .map(|i| {
            args(&format!(
                "--first 127.0.0.1 -n 3 --port {port} --me 127.0.0.{i} --wait 30"
            ))
        })
        .collect();
    run_group("peer_group", &members, "exchanged hellos with all 2 peers");
}

/// A host name goes through the resolver rather than the numeric fast path.
#[test]
fn peer_group_of_one_by_name() {
    let me = args(&format!(
        "--first localhost -n 1 --port {} --me localhost",
        free_port()
    ));
    run_group("peer_group", &[me], "exchanged hellos with all 0 peers");
}
