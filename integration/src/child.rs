//! Peer processes of the multi-process tests: a child killed when the
//! test ends before it does, and its first line of output.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::within;

/// Kills the child if the test fails (or ends) before it exits.
#[derive(Debug)]
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `bin args` with its stdout piped and returns it with the first
/// line it prints (trimmed), waiting at most `TIMEOUT` for it.
///
/// # Panics
/// When the program cannot start or prints nothing in time: these are
/// test helpers.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub async fn spawn_peer(bin: &str, args: &[&str]) -> (Reap, String) {
    let mut child = Reap(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the peer starts"),
    );
    let out = child.0.stdout.take().expect("a piped stdout");
    let line = within(
        "the peer's first line",
        tokio::task::spawn_blocking(move || {
            let mut l = String::new();
            let _ = BufReader::new(out).read_line(&mut l);
            l.trim().to_owned()
        }),
    )
    .await
    .expect("the reader ran");
    (child, line)
}
