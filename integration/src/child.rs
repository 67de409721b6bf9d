//! Peer processes of the multi-process tests: a child killed when the
//! test ends before it does, and its first line of output.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::within_for;

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

/// How long a peer process may take to start and print its first line:
/// far above [`crate::TIMEOUT`], since a process start (loading the
/// binary, opening a fabric) under TCG emulation on a loaded host once
/// took more than 5 s in the rxe VM. Nothing is measured by it.
pub const START_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts `bin args` with its stdout piped and returns it with the first
/// line it prints (trimmed), waiting at most [`START_LIMIT`] for it.
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
    let read = tokio::task::spawn_blocking(move || {
        let mut l = String::new();
        let _ = BufReader::new(out).read_line(&mut l);
        l.trim().to_owned()
    });
    let line = within_for(START_LIMIT, "the peer's first line", read)
        .await
        .expect("the reader ran");
    (child, line)
}
