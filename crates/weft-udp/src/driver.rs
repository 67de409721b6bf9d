//! Who reads the socket, as for tcp: a Tokio task woken by the reactor
//! (interrupt mode, and inline mode once the waiter sleeps), a spinning
//! thread (busy-poll mode), or the waiter itself (inline and busy-poll
//! modes, through [`InlineProgress`]). Datagrams the posting thread could
//! not send are flushed by a writer task, or by whoever spins.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use weft_core::completion::WaitMode;
use weft_core::sync::lock;
use weft_core::Result;

use crate::endpoint::EpShared;
use crate::rx::{pass, PassOutcome};

/// Starts the endpoint's drivers for its wait mode.
pub fn start(ep: &Arc<EpShared>) -> Result<()> {
    if ep.cfg.wait == WaitMode::BusyPoll {
        let ep2 = ep.clone();
        std::thread::Builder::new()
            .name("weft-udp-busy".into())
            .spawn(move || busy_loop(ep2))?;
        return Ok(());
    }
    let r = ep.rt.spawn(reader(ep.clone()));
    let w = ep.rt.spawn(writer(ep.clone()));
    lock(&ep.tasks).extend([r.abort_handle(), w.abort_handle()]);
    Ok(())
}

/// A pass that reads with direct syscalls, if no other driver holds the
/// staging buffer (then that one is making the same progress).
fn direct_pass(ep: &EpShared) -> Option<PassOutcome> {
    let mut st = ep.rx_state.try_lock().ok()?;
    Some(pass(ep, &mut st, ep.local, &mut |b| ep.sock.recv_from(b)))
}

async fn reader(ep: Arc<EpShared>) {
    let Some(tio) = ep.tio.as_ref() else {
        return;
    };
    loop {
        if ep.is_closed() {
            return;
        }
        // The pass runs inside `try_io`: one that ends on `EAGAIN` clears
        // the reactor's readiness as of before its reads, so a datagram
        // that came during the pass leaves the socket ready.
        let mut out = None;
        let mut taken = false;
        let _ = tio.try_io(Interest::READABLE, || {
            let Some(o) = direct_pass(&ep) else {
                // An inline waiter is reading: readiness stays as it is
                // (that pass may stop before the socket is empty).
                taken = true;
                return Ok(());
            };
            out = Some(o);
            if o.drained {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        if taken {
            stand_aside(&ep).await;
            tokio::task::yield_now().await;
            continue;
        }
        match out {
            // A receive completed, or the pass hit its limit: the task it
            // woke answers first, and the next read (most likely `EAGAIN`)
            // happens after that instead of on the latency path.
            Some(o) if !o.drained => tokio::task::yield_now().await,
            _ => {
                stand_aside(&ep).await;
                if tio.readable().await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn writer(ep: Arc<EpShared>) {
    let Some(tio) = ep.tio.as_ref() else {
        return;
    };
    loop {
        ep.tx_kick.notified().await;
        loop {
            if ep.is_closed() {
                return;
            }
            let mut empty = false;
            let _ = tio.try_io(Interest::WRITABLE, || {
                let (_, e) = ep.flush();
                empty = e;
                if e {
                    Ok(())
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                }
            });
            if empty || !ep.tx_pending.load(Ordering::Acquire) {
                break;
            }
            if tio.writable().await.is_err() {
                return;
            }
        }
    }
}

/// While an inline waiter spins on this endpoint it reads the socket
/// itself; the reader would only be woken for datagrams already gone, and
/// on a small machine that wake-up costs the spinner (or the peer) its
/// core. So the reader waits until the waiter sleeps (it says so through
/// `idle`) or stops polling.
async fn stand_aside(ep: &EpShared) {
    if ep.cfg.wait != WaitMode::Inline {
        return;
    }
    loop {
        let left = ep.hold.remaining_ns();
        if left == 0 {
            return;
        }
        let idle = ep.inline_idle.notified();
        tokio::pin!(idle);
        idle.as_mut().enable();
        if ep.hold.remaining_ns() == 0 {
            return;
        }
        tokio::select! {
            _ = idle => {}
            _ = tokio::time::sleep(Duration::from_nanos(left)) => {}
        }
    }
}

/// One non-blocking pass: queued sends, then the socket. Returns the
/// work done.
fn poll_once(ep: &EpShared) -> usize {
    let (sent, _) = ep.flush();
    sent + direct_pass(ep).map_or(0, |o| o.read)
}

fn busy_loop(ep: Arc<EpShared>) {
    ep.hold.spin(|| ep.is_closed(), || poll_once(&ep));
}

/// Inline passes between two clock reads for the hold: far fewer than a
/// hold lasts (a pass is about a microsecond, the hold a millisecond).
const CLOCK_EVERY: u32 = 8;

/// Inline progress: the waiting task drives the endpoint itself.
#[derive(Debug)]
pub struct InlineProgress {
    pub ep: Arc<EpShared>,
}

impl weft_core::progress::Progress for InlineProgress {
    fn progress(&self) -> usize {
        if self.ep.is_closed() {
            return 0;
        }
        // The hold (a millisecond) is taken again once in CLOCK_EVERY
        // passes: reading the clock at every pass was about 140
        // instructions of a 64 B round trip (`docs/benchmarks.md`).
        let k = self.ep.spins.load(Ordering::Relaxed);
        self.ep.spins.store(k.wrapping_add(1), Ordering::Relaxed);
        if k % CLOCK_EVERY == 0 {
            self.ep.hold.waiter_active();
        }
        poll_once(&self.ep)
    }

    fn idle(&self) {
        // The next pass takes the hold again.
        self.ep.spins.store(0, Ordering::Relaxed);
        self.ep.hold.waiter_idle();
        self.ep.inline_idle.notify_waiters();
    }
}
