//! Runs the built `weft` binary end to end.

use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    match Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env_remove("FI_PROVIDER")
        .output()
    {
        Ok(o) => o,
        Err(e) => unreachable!("cannot run weft: {e}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn info_lists_tcp() {
    let o = weft(&["info"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("provider: tcp"), "{out}");
    assert!(
        out.contains("FI_EP_RDM") && out.contains("FI_EP_MSG"),
        "{out}"
    );

    let o = weft(&["info", "--list"]);
    assert!(o.status.success());
    // tcp always; verbs too in a verbs build on a machine with a device.
    let list = text(&o.stdout);
    let names: Vec<&str> = list.lines().collect();
    assert_eq!(names.first(), Some(&"tcp"), "{list}");
    assert!(names.iter().all(|n| ["tcp", "verbs"].contains(n)), "{list}");
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
fn unknown_provider_fails() {
    let o = weft(&["info", "-p", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("weft info: no provider matches -p nope"),
        "{err}"
    );
    assert!(err.contains("tcp"), "{err}");

    let o = weft(&["pingpong", "--self", "-p", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("weft pingpong: "));
}

#[test]
fn bad_args_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["pingpong", "-I"],
        &["pingpong", "-S", "huge"],
        &["info", "--bogus"],
        &[],
    ] {
        let o = weft(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(text(&o.stderr).contains("Usage:"), "{args:?}");
    }
}

/// Inside the rxe VM of `integration/run-rxe` (in a verbs build): a
/// verified DGRAM pingpong over UD between rxe1 and rxe2, and a size past
/// the MTU refused before anything starts. Elsewhere it says why it
/// does nothing.
#[test]
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
    let common = [
        "pingpong", "-p", "verbs", "-e", "dgram", "-S", "1024", "-I", "200",
    ];
    let server = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(common)
            .args(["-d", "rxe1", "-B", "47311"])
            .output()
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    let mut args = common.to_vec();
    args.extend(["--verify", "-d", "rxe2", "-P", "47311", "10.66.0.1"]);
    let client = weft(&args);
    let server = match server.join() {
        Ok(Ok(o)) => o,
        other => unreachable!("server did not run: {other:?}"),
    };
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

#[test]
fn rma_pingpong_needs_an_rma_provider() {
    // tcp has no RMA: refused before anything runs, saying so.
    let o = weft(&["pingpong", "--self", "--rma", "write", "-I", "5"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("--rma write") && err.contains("-p tcp has no RMA at all"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

/// Inside the rxe VM (in a verbs build): `--rma write` and `--rma read`,
/// verified, over MSG and RDM between rxe1 and rxe2, with both APIs; and
/// DGRAM, which has no RMA, refused before the run.
#[test]
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
        std::thread::sleep(std::time::Duration::from_secs(2));
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
