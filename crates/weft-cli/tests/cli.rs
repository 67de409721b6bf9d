//! Runs the built `weft` binary end to end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
        &["pingpong", "-I", "18446744073709551615"],
        &["pingpong", "-S", "0"],
        &["pingpong", "-P", "0", "127.0.0.1"],
        &["pingpong", "-B", "65536"],
        &["bw", "-W", "0"],
        &["bw", "-S", "1g"],
        &["pingpong", "--timeout", "0"],
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
    let common = [
        "pingpong", "-p", "verbs", "-e", "dgram", "-S", "1024", "-I", "200",
    ];
    let server = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(common)
            .args(["-d", "rxe1", "-B", "47311"])
            .output()
    });
    // No wait for the server: the client retries while it is refused.
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

/// A `weft` server on a port of the kernel's choosing: the child and its
/// stderr, line by line.
fn start_server(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = match Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env_remove("FI_PROVIDER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => unreachable!("cannot run weft: {e}"),
    };
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().map(BufReader::new);
    std::thread::spawn(move || {
        for line in stderr
            .into_iter()
            .flat_map(|r| r.lines())
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// The next stderr line containing `want`, waiting at most `patience`;
/// every line seen goes to `log`.
fn line_with(
    rx: &mpsc::Receiver<String>,
    want: &str,
    patience: Duration,
    log: &mut Vec<String>,
) -> Option<String> {
    let end = Instant::now() + patience;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        let line = rx.recv_timeout(left).ok()?;
        log.push(line.clone());
        if line.contains(want) {
            return Some(line);
        }
    }
    None
}

/// The child's exit, waiting at most `patience` (then it is killed).
fn wait_bounded(child: &mut Child, patience: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + patience;
    while Instant::now() < end {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Hostile peers on the control port: one that connects and says
/// nothing, one that sends a truncated address and holds the connection,
/// one that sends garbage. The server drops each with a line on stderr
/// (the silent ones once `--timeout` has passed) and a real client still
/// gets its run, well within the time a hung server would take.
#[test]
fn strangers_on_the_control_port_do_not_stop_a_real_client() {
    let t0 = Instant::now();
    let (mut server, rx) = start_server(&["pingpong", "-B", "0", "--timeout", "1"]);
    let mut log = Vec::new();
    let listening = line_with(&rx, "listening on port", Duration::from_secs(20), &mut log);
    let port: u16 = match listening.as_deref().and_then(|l| l.rsplit(' ').next()) {
        Some(p) => p.parse().unwrap_or(0),
        None => 0,
    };
    assert_ne!(port, 0, "no port announced: {log:?}");
    let ctrl = ("127.0.0.1", port);
    let mut idle = TcpStream::connect(ctrl).expect("idle connection");
    let mut truncated = TcpStream::connect(ctrl).expect("truncated connection");
    truncated.write_all(&[0, 0, 0, 16, 2, 0]).expect("write");
    let mut garbage = TcpStream::connect(ctrl).expect("garbage connection");
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");

    let e = line_with(
        &rx,
        "announced a 1195725856-byte",
        Duration::from_secs(10),
        &mut log,
    );
    assert!(e.is_some(), "garbage was not dropped: {log:?}");
    for _ in 0..2 {
        let e = line_with(
            &rx,
            "no endpoint address within 1 s",
            Duration::from_secs(10),
            &mut log,
        );
        assert!(e.is_some(), "a silent connection was not dropped: {log:?}");
    }
    // Dropped means closed: the idle peer reads the end of the stream.
    idle.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    assert_eq!(idle.read(&mut [0u8; 8]).ok(), Some(0));
    drop(truncated);

    let p = port.to_string();
    let client = weft(&[
        "pingpong",
        "-I",
        "50",
        "--verify",
        "--timeout",
        "5",
        "-P",
        &p,
        "127.0.0.1",
    ]);
    assert!(client.status.success(), "{}", text(&client.stderr));
    let row = text(&client.stdout);
    assert!(
        row.lines()
            .nth(1)
            .unwrap_or_default()
            .starts_with("64      50 "),
        "{row}"
    );
    let st = wait_bounded(&mut server, Duration::from_secs(20));
    assert!(st.is_some_and(|s| s.success()), "server: {st:?}: {log:?}");
    assert!(t0.elapsed() < Duration::from_secs(60));
}

/// `--help` of every subcommand: exit 0, on stdout, naming its key flags.
#[test]
fn every_subcommand_has_help() {
    let cases: [(&str, &[&str]); 5] = [
        (
            "info",
            &["-p <prov>", "-e <ep_type>", "--verbose", "--list", "--json"],
        ),
        (
            "pingpong",
            &[
                "-S <size>",
                "-I <iters>",
                "-B <port>",
                "-P <port>",
                "--timeout <s>",
                "--mode",
                "--api",
                "--verify",
                "--rma <op>",
                "--self",
                "--json",
                "[DEST]",
            ],
        ),
        (
            "bw",
            &[
                "-W <window>",
                "-S <size>",
                "-I <iters>",
                "--self",
                "--json",
                "[DEST]",
            ],
        ),
        ("completions", &["bash", "zsh", "fish"]),
        ("help", &["info", "pingpong", "bw", "completions"]),
    ];
    for (sub, flags) in cases {
        for help in ["--help", "-h"] {
            let args: &[&str] = if sub == "help" { &[sub] } else { &[sub, help] };
            let o = weft(args);
            assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
            let out = text(&o.stdout);
            assert!(out.contains("Usage: weft"), "{args:?}: {out}");
            for f in flags {
                assert!(out.contains(f), "{args:?} does not name {f}: {out}");
            }
        }
    }
    // Each option's own text, and the defaults, are in the long help.
    let out = text(&weft(&["pingpong", "--help"]).stdout);
    assert!(
        out.contains("WEFT_INLINE_SPIN_US") && out.contains("[default: 47592]"),
        "{out}"
    );
    let out = text(&weft(&["bw", "--help"]).stdout);
    assert!(
        !out.contains("--rma"),
        "bw's help offers pingpong's --rma: {out}"
    );
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let o = weft(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", text(&o.stderr));
        let script = text(&o.stdout);
        assert!(
            script.contains("pingpong") && script.contains("timeout"),
            "{shell}"
        );
    }
    // Each benchmark is offered its own options only.
    let bash = text(&weft(&["completions", "bash"]).stdout);
    let opts = |sub: &str| {
        let at = bash.find(&format!("weft__{sub})")).unwrap_or_default();
        bash[at..].lines().nth(1).unwrap_or_default().to_string()
    };
    assert!(
        opts("bw").contains(" -W ") && !opts("bw").contains("--rma"),
        "{}",
        opts("bw")
    );
    assert!(opts("pingpong").contains("--rma") && !opts("pingpong").contains(" -W "));
    let o = weft(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

/// The JSON document of a run: one object, the run's settings and a
/// result per size with the table's figures.
#[test]
fn pingpong_self_json() {
    let o = weft(&[
        "pingpong", "--self", "-S", "all", "-I", "100", "--verify", "--json", "--mode", "inline",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = match serde_json::from_slice(&o.stdout) {
        Ok(v) => v,
        Err(e) => unreachable!("not JSON ({e}): {}", text(&o.stdout)),
    };
    assert_eq!(doc["command"], "pingpong");
    assert_eq!(doc["role"], "self");
    assert_eq!(doc["provider"], "tcp");
    assert_eq!(doc["ep_type"], "rdm");
    assert_eq!(doc["mode"], "inline");
    assert_eq!(doc["api"], "post");
    assert_eq!(doc["verify"], true);
    assert_eq!(doc["warmup"], 10);
    assert!(doc["rma"].is_null() && doc["window"].is_null());
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let sizes: Vec<u64> = results.iter().filter_map(|r| r["bytes"].as_u64()).collect();
    assert_eq!(sizes, [64, 256, 1024, 4096, 65536, 1 << 20]);
    for r in &results {
        let bytes = r["bytes"].as_u64().unwrap_or_default();
        assert_eq!(r["iterations"], 100);
        assert_eq!(r["xfers_per_iter"], 2);
        assert_eq!(r["total_bytes"].as_u64(), Some(bytes * 200));
        let time = r["time_s"].as_f64().unwrap_or_default();
        let usec = r["usec_per_xfer"].as_f64().unwrap_or_default();
        let mbs = r["mb_per_sec"].as_f64().unwrap_or_default();
        assert!(time > 0.0 && usec > 0.0 && mbs > 0.0, "{r}");
        // The figures agree with each other as the table's do.
        assert!((usec * 200.0 / 1e6 - time).abs() < 1e-9, "{r}");
        assert!(
            (mbs * time * 1e6 - (bytes * 200) as f64).abs() < 1e-3,
            "{r}"
        );
    }
    // Nothing but the document on stdout; no table.
    assert!(!text(&o.stdout).contains("bytes   #sent"));
}

#[test]
fn bw_self_json() {
    let o = weft(&[
        "bw", "--self", "-S", "4k", "-I", "200", "-W", "16", "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(doc["command"], "bw");
    assert_eq!(doc["window"], 16);
    assert_eq!(doc["results"][0]["bytes"], 4096);
    assert_eq!(doc["results"][0]["xfers_per_iter"], 1);
    assert_eq!(doc["results"][0]["total_bytes"], 4096 * 200);
}

#[test]
fn info_json() {
    let o = weft(&["info", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let offers = doc["offers"].as_array().cloned().unwrap_or_default();
    // The same offers as the text, in the same order.
    let plain = text(&weft(&["info"]).stdout);
    let types: Vec<&str> = plain
        .lines()
        .filter_map(|l| l.trim().strip_prefix("type: "))
        .collect();
    assert_eq!(offers.len(), types.len(), "{doc}");
    for (o, t) in offers.iter().zip(&types) {
        assert_eq!(o["type"], *t);
        assert!(
            o["provider"].is_string() && o["protocol"].is_string(),
            "{o}"
        );
    }
    assert!(offers.iter().any(|o| o["provider"] == "tcp"));

    let o = weft(&["info", "-v", "-p", "tcp", "-e", "msg", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let first = &doc["offers"][0];
    assert_eq!(first["fi_ep_attr"]["type"], "FI_EP_MSG");
    assert_eq!(first["fi_fabric_attr"]["prov_name"], "tcp");
    assert!(first["caps"]
        .as_array()
        .is_some_and(|c| c.iter().any(|x| x == "FI_MSG")));
    assert!(first["fi_ep_attr"]["max_msg_size"].is_u64());

    let o = weft(&["info", "--list", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(doc["providers"][0], "tcp");
}

/// A run long enough for the progress line, with stderr a pipe: nothing
/// on stderr, the table alone on stdout.
#[test]
fn piped_runs_show_no_progress() {
    let o = weft(&["bw", "--self", "-S", "64", "-I", "300000"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 2);
}

/// `FI_LOG_LEVEL` turns diagnostics on when `RUST_LOG` is unset, and
/// `RUST_LOG` wins when both are.
#[test]
fn fi_log_level_is_honoured() {
    let run = |env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
        c.args(["pingpong", "--self", "-I", "10"])
            .env_remove("FI_PROVIDER")
            .env_remove("RUST_LOG")
            .env_remove("FI_LOG_LEVEL");
        for (k, v) in env {
            c.env(k, v);
        }
        match c.output() {
            Ok(o) => o,
            Err(e) => unreachable!("cannot run weft: {e}"),
        }
    };
    let quiet = run(&[]);
    assert!(quiet.status.success() && quiet.stderr.is_empty());
    let loud = run(&[("FI_LOG_LEVEL", "debug")]);
    assert!(loud.status.success());
    let err = text(&loud.stderr);
    assert!(
        err.contains("DEBUG") && err.contains("fabric open"),
        "{err}"
    );
    let rust_log_wins = run(&[("FI_LOG_LEVEL", "debug"), ("RUST_LOG", "error")]);
    assert!(
        rust_log_wins.stderr.is_empty(),
        "{}",
        text(&rust_log_wins.stderr)
    );
}

/// On a terminal (util-linux `script` gives the run one) a long run shows
/// its rate line on stderr, redrawn in place, and erases it before the
/// row.
#[test]
fn a_terminal_shows_progress() {
    let bin = env!("CARGO_BIN_EXE_weft");
    // --verify slows a debug build enough to last past the line's first
    // second everywhere.
    let cmd = format!("'{bin}' bw --self -S 64 -I 200000 --verify");
    let o = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env_remove("FI_PROVIDER")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no util-linux `script` to run weft on a terminal ({e})");
            return;
        }
    };
    assert!(o.status.success(), "{}", text(&o.stderr));
    let screen = text(&o.stdout);
    assert!(screen.contains("\r\x1b[2K64 B: "), "{screen:?}");
    assert!(screen.contains(" messages, "), "{screen:?}");
    // The row comes after the line is erased, whole.
    assert!(
        screen.contains("\r\x1b[2K64      200k    =200k"),
        "{screen:?}"
    );
}
