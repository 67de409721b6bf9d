//! What a run prints: JSON documents, the progress line on a terminal or
//! not, and the log level variables.

use std::process::{Command, Stdio};

use super::{text, weft};

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
