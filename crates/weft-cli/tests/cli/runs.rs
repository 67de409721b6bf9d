//! Pingpong and bandwidth runs on tcp, udp and shm, verified byte by byte:
//! self runs in every wait mode, the pool API, RMA.

use std::process::Command;

use super::{text, weft};

#[test]
fn udp_dgram_info_and_pingpong() {
    let o = weft(&["info", "-p", "udp"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("provider: udp") && out.contains("FI_EP_DGRAM"),
        "{out}"
    );
    assert!(out.contains("domain: lo"), "{out}");
    let o = weft(&[
        "pingpong", "--self", "-p", "udp", "-e", "dgram", "-S", "64", "-I", "200", "--verify",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let row = out.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with("64      200     =200     25k"), "{row}");
    // One datagram at most: a larger size is refused before anything runs.
    let o = weft(&[
        "pingpong", "--self", "-p", "udp", "-e", "dgram", "-S", "1m", "-I", "2",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("a datagram is one packet"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn shm_info_pingpong_and_bw() {
    let o = weft(&["info", "-p", "shm"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("provider: shm") && out.contains("FI_EP_RDM"),
        "{out}"
    );
    for mode in ["interrupt", "inline", "busy-poll"] {
        for size in ["64", "1m"] {
            let o = weft(&[
                "pingpong", "--self", "-p", "shm", "-S", size, "-I", "100", "--verify", "--mode",
                mode,
            ]);
            assert!(o.status.success(), "{mode}: {}", text(&o.stderr));
            let out = text(&o.stdout);
            let row = out.lines().nth(1).unwrap_or_default();
            assert!(row.starts_with(&format!("{size:<8}100")), "{mode}: {row}");
        }
        let o = weft(&[
            "bw", "--self", "-p", "shm", "-S", "4096", "-I", "300", "--verify", "--mode", mode,
        ]);
        assert!(o.status.success(), "{mode}: {}", text(&o.stderr));
    }
    // Across processes: the endpoint names go over the control connection.
    let server = std::thread::spawn(|| {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args([
                "pingpong", "-p", "shm", "-S", "64", "-I", "200", "-B", "47391",
            ])
            .env_remove("FI_PROVIDER")
            .output()
    });
    let o = weft(&[
        "pingpong",
        "-p",
        "shm",
        "-S",
        "64",
        "-I",
        "200",
        "-P",
        "47391",
        "127.0.0.1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = server.join().ok().and_then(Result::ok);
    assert!(s.is_some_and(|s| s.status.success()), "server failed");
}

#[test]
fn pingpong_self_verify() {
    let o = weft(&["pingpong", "--self", "-S", "64", "-I", "200", "--verify"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec")
    );
    let row = lines.next().unwrap_or_default();
    assert!(row.starts_with("64      200     =200     25k"), "{row}");
}

/// `pingpong --api pool`, every byte checked: from and into registered
/// pool buffers, the server echoing the buffer a message arrived in; on
/// tcp (both endpoint types), shm and udp, and refused with --rma.
#[test]
fn pingpong_pool_runs_verified() {
    let runs: [&[&str]; 4] = [
        &["-p", "tcp", "-e", "rdm", "-S", "all"],
        &["-p", "tcp", "-e", "msg", "-S", "4k"],
        &["-p", "shm", "-S", "64"],
        &["-p", "udp", "-e", "dgram", "-S", "1k"],
    ];
    for run in runs {
        let mut args = vec![
            "pingpong", "--self", "--api", "pool", "--verify", "-I", "50",
        ];
        args.extend_from_slice(run);
        let o = weft(&args);
        assert!(o.status.success(), "{run:?}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        let rows: Vec<&str> = out.lines().skip(1).collect();
        let want = if run.contains(&"all") { 6 } else { 1 };
        assert_eq!(rows.len(), want, "{run:?}: {out}");
        assert!(
            rows.iter()
                .all(|r| r.split_whitespace().nth(2) == Some("=50")),
            "{run:?}: {out}"
        );
    }
    let o = weft(&["pingpong", "--self", "--api", "pool", "--rma", "write"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--api pool: messages only"),
        "{}",
        text(&o.stderr)
    );
}

/// `bw --self` in every wait mode: the server side's runtime gets a
/// thread of its own (a current-thread one, which inline and interrupt
/// use, runs nothing unless a thread drives it).
#[test]
fn bw_self_in_every_mode() {
    for mode in ["interrupt", "inline", "busy-poll"] {
        let o = weft(&[
            "bw", "--self", "-S", "4096", "-I", "300", "--verify", "--mode", mode,
        ]);
        assert!(o.status.success(), "{mode}: {}", text(&o.stderr));
        let out = text(&o.stdout);
        let row = out.lines().nth(1).unwrap_or_default();
        assert!(row.starts_with("4k      300     =300"), "{mode}: {row}");
    }
}

#[test]
fn tcp_rma_pingpong_runs_verified() {
    // tcp has RMA: both operations, on both endpoint types, every byte
    // checked.
    for (op, ep) in [("write", "rdm"), ("read", "msg")] {
        let o = weft(&[
            "pingpong", "--self", "--rma", op, "-e", ep, "-c", "-S", "4k", "-I", "5",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        assert!(
            out.lines()
                .nth(1)
                .unwrap_or_default()
                .starts_with("4k      5       =5"),
            "{out}"
        );
    }
    // tcp has no DGRAM (so no RMA there): refused before anything runs,
    // saying so.
    let o = weft(&[
        "pingpong", "--self", "--rma", "write", "-e", "dgram", "-I", "5",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("offers FI_EP_RDM, FI_EP_MSG, FI_EP_SOCK_STREAM only"),
        "{}",
        text(&o.stderr)
    );
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}
