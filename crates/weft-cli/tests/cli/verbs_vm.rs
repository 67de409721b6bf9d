//! Runs over verbs between rxe1 and rxe2 inside the rxe VM of
//! `integration/run-rxe` (elsewhere they say why they do nothing).

use std::process::{Command, Output};

use super::{text, weft};

/// Inside the rxe VM of `integration/run-rxe` (in a verbs build): a
/// verified DGRAM pingpong over UD between rxe1 and rxe2, and a size past
/// the MTU refused before anything starts. Elsewhere it says why it
/// does nothing.
#[test]
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
fn verbs_dgram_pingpong_in_the_vm() {
    if !in_rxe_vm() {
        return;
    }
    let too_big = weft(&[
        "pingpong",
        "-p",
        "verbs",
        "-e",
        "dgram",
        "-d",
        "rxe2",
        "-S",
        "8192",
        "-P",
        "47399",
        "10.66.0.1",
    ]);
    assert_eq!(too_big.status.code(), Some(1));
    assert!(
        text(&too_big.stderr).contains("max_msg_size"),
        "{}",
        text(&too_big.stderr)
    );
    let (client, server) = vm_pair(
        &[
            "pingpong", "-p", "verbs", "-e", "dgram", "-S", "1024", "-I", "200",
        ],
        "47311",
    );
    assert!(client.status.success(), "{}", text(&client.stderr));
    assert!(server.status.success(), "{}", text(&server.stderr));
    let out = text(&client.stdout);
    assert!(
        out.lines()
            .nth(1)
            .unwrap_or_default()
            .starts_with("1k      200     =200"),
        "{out}"
    );
}

/// Inside the rxe VM (in a verbs build): `--api pool` pingpong between
/// rxe1 and rxe2 on MSG and RDM, posted pool buffers at every size path
/// (inline, bounce-slot sized, registered, rendezvous), every byte
/// checked.
#[test]
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
fn verbs_pool_pingpong_in_the_vm() {
    if !in_rxe_vm() {
        return;
    }
    for (ep, port) in [("msg", "47321"), ("rdm", "47322")] {
        let (client, server) = vm_pair(
            &[
                "pingpong", "-p", "verbs", "-e", ep, "--api", "pool", "-S", "all", "-I", "50",
            ],
            port,
        );
        assert!(client.status.success(), "{ep}: {}", text(&client.stderr));
        assert!(server.status.success(), "{ep}: {}", text(&server.stderr));
        let out = text(&client.stdout);
        let rows: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(rows.len(), 6, "{ep}: {out}");
        assert!(
            rows.iter()
                .all(|r| r.split_whitespace().nth(2) == Some("=50")),
            "{ep}: {out}"
        );
    }
}

/// Inside the rxe VM (in a verbs build): `--rma write` and `--rma read`,
/// verified, over MSG and RDM between rxe1 and rxe2, with both APIs; and
/// DGRAM, which has no RMA, refused before the run.
#[test]
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
fn verbs_rma_pingpong_in_the_vm() {
    if !in_rxe_vm() {
        return;
    }
    let dgram = weft(&[
        "pingpong",
        "-p",
        "verbs",
        "-e",
        "dgram",
        "-d",
        "rxe2",
        "--rma",
        "read",
        "-P",
        "47329",
        "10.66.0.1",
    ]);
    assert_eq!(dgram.status.code(), Some(1));
    let err = text(&dgram.stderr);
    assert!(
        err.contains("-p verbs -e dgram has no RMA") && err.contains("-e msg"),
        "{err}"
    );
    let runs = [
        ("msg", "write", "post", "47321"),
        ("rdm", "write", "async", "47322"),
        ("msg", "read", "async", "47323"),
        ("rdm", "read", "post", "47324"),
    ];
    for (ep, op, api, port) in runs {
        let what = format!("-e {ep} --rma {op} --api {api}");
        let common = [
            "pingpong", "-p", "verbs", "-e", ep, "-S", "4k", "-I", "100", "--api", api,
        ];
        // The server learns --rma (and --verify) from the client.
        let server = std::thread::spawn(move || {
            Command::new(env!("CARGO_BIN_EXE_weft"))
                .args(common)
                .args(["-d", "rxe1", "-B", port])
                .output()
        });
        // No wait for the server: the client retries while it is refused.
        let mut args = common.to_vec();
        args.extend([
            "--rma",
            op,
            "--verify",
            "-d",
            "rxe2",
            "-P",
            port,
            "10.66.0.1",
        ]);
        let client = weft(&args);
        let server = match server.join() {
            Ok(Ok(o)) => o,
            other => unreachable!("{what}: server did not run: {other:?}"),
        };
        assert!(client.status.success(), "{what}: {}", text(&client.stderr));
        assert!(server.status.success(), "{what}: {}", text(&server.stderr));
        let out = text(&client.stdout);
        let row = out.lines().nth(1).unwrap_or_default();
        // A write is two transfers per iteration, a read one.
        let want = if op == "write" {
            "4k      100     =100     800k"
        } else {
            "4k      100     =100     400k"
        };
        assert!(row.starts_with(want), "{what}: {out}");
        if op == "read" {
            // One-sided: the server prints the client's time.
            let srv = text(&server.stdout);
            assert_eq!(srv.lines().nth(1), Some(row), "{what}: {srv}");
        }
    }
}

/// In the rxe VM: a server on rxe1 listening on `port` and a verifying
/// client on rxe2, both with `common`; their outputs (client, server).
fn vm_pair(common: &[&'static str], port: &'static str) -> (Output, Output) {
    let server_args = common.to_vec();
    let server = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(server_args)
            .args(["-d", "rxe1", "-B", port])
            .output()
    });
    // No wait for the server: the client retries while it is refused.
    let mut args = common.to_vec();
    args.extend(["--verify", "-d", "rxe2", "-P", port, "10.66.0.1"]);
    let client = weft(&args);
    let server = match server.join() {
        Ok(Ok(o)) => o,
        other => unreachable!("server did not run: {other:?}"),
    };
    (client, server)
}

/// True inside the rxe VM of `integration/run-rxe` with a verbs build;
/// elsewhere says why the calling test does nothing.
fn in_rxe_vm() -> bool {
    let in_vm = std::env::var("RXE_VM").is_ok_and(|v| v == "1");
    let list = text(&weft(&["info", "--list"]).stdout);
    if !in_vm || !list.lines().any(|l| l == "verbs") {
        assert!(!in_vm, "inside the rxe VM but weft lists no verbs provider");
        eprintln!("skipped: needs the verbs build inside the rxe VM (integration/run-rxe)");
        return false;
    }
    true
}
