//! Noticing that the peer process is gone. Over RDM the benchmark waits
//! on receives that no connection failure would ever complete, so a peer
//! killed mid-run would leave this side waiting forever. Each side keeps
//! the control connection open for the whole run and says goodbye on it
//! when its part ends well; an end of stream without that goodbye means
//! the peer died.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fail::{Failure, Res};

/// The byte a side writes when its part of the run is done.
const GOODBYE: u8 = 0x5a;

/// Runs `work`, failing it as soon as `ctrl` ends without a goodbye.
///
/// The control connection is watched by a task of its own. As a branch
/// of the `select!` beside `work` it had its readiness polled at every
/// poll of `work`, and a spinning waiter (inline and busy-poll modes)
/// polls millions of times a second: a twentieth of a 64 B shm round
/// trip went to it (`docs/benchmarks.md`, "shm RDM"). The task's handle
/// costs an atomic load per poll.
pub async fn guarded<T>(ctrl: Option<TcpStream>, work: impl Future<Output = Res<T>>) -> Res<T> {
    let Some(ctrl) = ctrl else {
        return work.await;
    };
    let (mut rd, mut wr) = ctrl.into_split();
    let mut watch = tokio::spawn(async move { peer_gone(&mut rd).await });
    let r = {
        tokio::pin!(work);
        tokio::select! {
            r = &mut work => r,
            f = &mut watch => match f {
                Ok(Some(f)) => Err(f),
                // The peer finished first; our part can still complete.
                // (A watch that failed to run leaves the run unguarded.)
                Ok(None) | Err(_) => work.await,
            },
        }
    };
    watch.abort();
    if r.is_ok() {
        // The peer may already have left; then there is nobody to tell.
        let _ = wr.write_all(&[GOODBYE]).await;
    }
    r
}

/// `None` once the peer says goodbye; the failure if the stream ends (or
/// breaks) first.
async fn peer_gone(ctrl: &mut (impl AsyncRead + Unpin)) -> Option<Failure> {
    let mut b = [0u8; 1];
    let what = "peer";
    match ctrl.read(&mut b).await {
        Ok(1) if b[0] == GOODBYE => None,
        Ok(1) => Some(Failure::new(
            what,
            format!("unexpected byte {:#04x} on the control connection", b[0]),
        )),
        Ok(_) => Some(Failure::new(
            what,
            "the control connection closed before the run ended: the peer process is gone",
        )),
        Err(e) => Some(Failure::new(
            what,
            format!("the control connection failed before the run ended ({e}): the peer process is gone"),
        )),
    }
}
