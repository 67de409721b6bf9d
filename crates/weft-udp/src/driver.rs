//! Who reads the socket, as for tcp: a Tokio task woken by the reactor
//! (interrupt mode, and inline mode once the waiter sleeps), a spinning
//! thread (busy-poll mode), or the waiter itself (inline and busy-poll
//! modes, through [`InlineProgress`]). Datagrams the posting thread could
//! not send are flushed by a writer task, or by whoever spins.
//!
//! The socket is in the reactor's epoll set only while a task may wait
//! on it: an inline waiter takes the reader's registration out when it
//! starts spinning and puts it back before it sleeps, and the writer
//! registers only while the socket is full. A registered socket makes the
//! kernel run epoll's wake-up callback for every datagram that arrives
//! (about 0.2 µs of the arrival's CPU time here, `docs/benchmarks.md`),
//! which a spinning waiter does not need; the reader task cannot drop the
//! registration itself, since it is not polled while the waiter spins.

use std::future::poll_fn;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::Interest;
use weft_core::completion::WaitMode;
use weft_core::sync::lock;
use weft_core::Result;

use crate::endpoint::EpShared;
use crate::rx::{pass, PassOutcome};
use crate::sock::recv_from;

/// Starts the endpoint's drivers for its wait mode.
pub fn start(ep: &Arc<EpShared>) -> Result<()> {
    if ep.cfg.wait == WaitMode::BusyPoll {
        let ep2 = ep.clone();
        std::thread::Builder::new()
            .name("weft-udp-busy".into())
            .spawn(move || busy_loop(ep2))?;
        return Ok(());
    }
    // The reader's first registration here, so that failing it fails the
    // open.
    *lock(&ep.reg) = Some(register(ep)?);
    ep.registered.store(true, Ordering::Release);
    let r = ep.rt.spawn(reader(ep.clone()));
    let w = ep.rt.spawn(writer(ep.clone()));
    lock(&ep.tasks).extend([r.abort_handle(), w.abort_handle()]);
    Ok(())
}

/// A pass that reads with direct syscalls, if no other driver holds the
/// staging buffer (then that one is making the same progress).
fn direct_pass(ep: &EpShared) -> Option<PassOutcome> {
    let mut st = ep.rx_state.try_lock()?;
    let v6 = ep.local.is_ipv6();
    Some(pass(ep, &mut st, ep.local, |b| recv_from(&ep.sock, v6, b)))
}

/// The socket registered with the reactor (a duplicate of its file
/// descriptor: dropping it leaves the epoll set and closes the duplicate
/// alone). Runs inside the runtime.
fn register(ep: &EpShared) -> io::Result<tokio::net::UdpSocket> {
    let _g = ep.rt.enter();
    tokio::net::UdpSocket::from_std(ep.sock.try_clone()?)
}

/// Puts the reader's registration back if a waiter took it out. False
/// when registering failed (file descriptors exhausted: try again later)
/// or the endpoint is closed: `close` sets `closed` before it takes the
/// registration under this lock, so a waiter going idle during a close
/// cannot put a duplicate of the socket (and its port) back in the set.
fn reregister(ep: &EpShared) -> bool {
    let mut g = lock(&ep.reg);
    if ep.is_closed() {
        return false;
    }
    if g.is_none() {
        match register(ep) {
            Ok(t) => *g = Some(t),
            Err(e) => {
                tracing::debug!(error = %e, "udp: reactor registration failed");
                return false;
            }
        }
    }
    ep.registered.store(true, Ordering::Release);
    true
}

/// Takes the reader's registration out of the epoll set (an inline waiter
/// starts spinning). Registering again reports the readiness of datagrams
/// that came meanwhile (epoll checks at insertion), so none is missed.
fn unregister(ep: &EpShared) {
    if ep.registered.swap(false, Ordering::AcqRel) {
        let gone = lock(&ep.reg).take();
        drop(gone);
        // A reader waiting on the registration just dropped would never
        // hear from it again: it goes back to standing aside, whose timer
        // covers a waiter that stops polling without saying it sleeps.
        ep.inline_idle.notify_waiters();
    }
}

async fn reader(ep: Arc<EpShared>) {
    loop {
        if ep.is_closed() {
            return;
        }
        if ep.cfg.wait == WaitMode::Inline && ep.hold.remaining_ns() > 0 {
            stand_aside(&ep).await;
            continue;
        }
        if !reregister(&ep) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        // The pass runs inside `try_io`: one that ends on `EAGAIN` clears
        // the reactor's readiness as of before its reads, so a datagram
        // that came during the pass leaves the socket ready.
        let mut out = None;
        let mut taken = false;
        if let Some(tio) = lock(&ep.reg).as_ref() {
            let _ = tio.try_io(Interest::READABLE, || {
                let Some(o) = direct_pass(&ep) else {
                    // An inline waiter is reading: readiness stays as it
                    // is (that pass may stop before the socket is empty).
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
        }
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
            // A waiter spins again: stand aside (the loop's top).
            _ if ep.cfg.wait == WaitMode::Inline && ep.hold.remaining_ns() > 0 => {}
            _ => {
                if !readable(&ep).await {
                    return;
                }
            }
        }
    }
}

/// Waits until the socket is readable, or its registration was taken out
/// (a waiter spins: `unregister` wakes this task, which then stands
/// aside), or a waiter went idle. False when the reactor is gone.
async fn readable(ep: &EpShared) -> bool {
    let idle = ep.inline_idle.notified();
    tokio::pin!(idle);
    idle.as_mut().enable();
    // The registration is looked at under its lock at every poll, never
    // held across one: a waiter may take it out at any time.
    let ready = poll_fn(|cx| match lock(&ep.reg).as_ref() {
        Some(t) => t.poll_recv_ready(cx).map(|r| r.is_ok()),
        None => Poll::Ready(true),
    });
    tokio::select! {
        ok = ready => ok,
        _ = idle => true,
    }
}

async fn writer(ep: Arc<EpShared>) {
    loop {
        ep.tx_kick.notified().await;
        // Registered only while the socket is full.
        let mut reg: Option<tokio::net::UdpSocket> = None;
        loop {
            if ep.is_closed() {
                return;
            }
            if ep.flush().1 || !ep.tx_pending.load(Ordering::Acquire) {
                break;
            }
            if reg.is_none() {
                match register(&ep) {
                    Ok(t) => reg = Some(t),
                    Err(e) => {
                        tracing::debug!(error = %e, "udp: reactor registration failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                }
            }
            let Some(tio) = reg.as_ref() else {
                continue;
            };
            // A flush that ends on `EAGAIN` inside `try_io` clears the
            // readiness as of before it (a fresh registration has none
            // yet, and `writable` then reports the room epoll found).
            let _ = tio.try_io(Interest::WRITABLE, || {
                if ep.flush().1 {
                    Ok(())
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                }
            });
            if !ep.tx_pending.load(Ordering::Acquire) {
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
    weft_core::spin_hold::stand_aside(&ep.hold, || ep.inline_idle.notified(), tokio::time::sleep)
        .await;
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
            if self.ep.cfg.wait == WaitMode::Inline && self.ep.registered.load(Ordering::Acquire) {
                // Spinning: out of the epoll set until `idle` (or until
                // the reader takes over after the hold ends).
                unregister(&self.ep);
            }
        }
        poll_once(&self.ep)
    }

    fn cheap_pass(&self) -> bool {
        // One socket: a pass is one non-blocking receive, however many
        // peers the AV holds.
        true
    }

    fn idle(&self) {
        // The next pass takes the hold again.
        self.ep.spins.store(0, Ordering::Relaxed);
        self.ep.hold.waiter_idle();
        // Registered again before the reader is told: the datagram this
        // waiter now sleeps for wakes the reader through the reactor.
        if self.ep.cfg.wait == WaitMode::Inline {
            reregister(&self.ep);
        }
        self.ep.inline_idle.notify_waiters();
    }
}
