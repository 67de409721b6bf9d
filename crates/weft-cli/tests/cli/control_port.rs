//! A server's control port against peers that connect and misbehave, and
//! the helpers that run a server and read its stderr.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{text, weft};

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
