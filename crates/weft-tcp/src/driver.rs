//! Who reads a connection: a Tokio task woken by the reactor (interrupt
//! mode) or one spinning thread per endpoint (busy-poll mode). Writes that
//! the posting thread could not finish always go to a Tokio writer task.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::Interest;
use weft_core::sync::lock;
use weft_core::Error;

use crate::conn::Conn;
use crate::endpoint::{busy, EpShared};
use crate::rx::RxStatus;

/// Starts the drivers of a new connection.
pub fn start(ep: &Arc<EpShared>, conn: &Arc<Conn>) {
    let w = ep.rt.spawn(conn.clone().writer());
    conn.add_task(w.abort_handle());
    if busy(ep) {
        if !ep.busy_running.swap(true, Ordering::AcqRel) {
            let ep2 = ep.clone();
            let spawned = std::thread::Builder::new()
                .name("weft-tcp-busy".into())
                .spawn(move || busy_loop(ep2));
            if spawned.is_err() {
                // No thread: fall back to the reactor rather than stall.
                ep.busy_running.store(false, Ordering::Release);
                spawn_reader(ep, conn);
            }
        }
    } else {
        spawn_reader(ep, conn);
    }
}

fn spawn_reader(ep: &Arc<EpShared>, conn: &Arc<Conn>) {
    let r = ep.rt.spawn(reader(ep.clone(), conn.clone()));
    conn.add_task(r.abort_handle());
}

pub(crate) fn end(conn: &Arc<Conn>, st: RxStatus) {
    match st {
        RxStatus::Closed(None) => conn.peer_ended(),
        RxStatus::Closed(Some(e)) => conn.fail(e),
        RxStatus::WouldBlock | RxStatus::Drained | RxStatus::Parked => {}
    }
}

async fn reader(ep: Arc<EpShared>, conn: Arc<Conn>) {
    loop {
        if ep.is_closed() || conn.abort_rx_if_dead(&ep) {
            return;
        }
        let progress = || {
            let mut rx = lock(&conn.rx);
            let c = conn.clone();
            rx.progress(&conn, &ep, &mut |b| c.read_reactor(b))
        };
        // The pass runs inside `try_io`, so a pass that ends on a short read
        // clears the reactor's readiness as of *before* its reads (what
        // Tokio's own `poll_read` does on epoll): the socket is known to be
        // empty without a read that says `EAGAIN`, and an edge that came
        // during the pass leaves it ready.
        let mut st = None;
        let _ = conn.tio.try_io(Interest::READABLE, || {
            let s = progress();
            let drained = s == RxStatus::Drained;
            st = Some(s);
            if drained {
                Err(std::io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        // Not ready as far as the reactor knows: the pass still runs (the
        // first one, or one a newly posted receive kicked).
        let st = match st {
            Some(s) => s,
            None => progress(),
        };
        // Nobody else drives this connection while the reactor does: the
        // acks the pass owes go out now rather than wait for a frame.
        conn.flush_acks();
        match st {
            RxStatus::WouldBlock | RxStatus::Drained => {
                stand_aside(&ep).await;
                if conn.tio.readable().await.is_err() {
                    conn.fail(Error::ConnReset);
                    return;
                }
            }
            // Woken by a receive that takes the parked message, by budget
            // coming back, or by the connection's end (a wake-up that came
            // before this wait left a permit, so none is missed).
            RxStatus::Parked => conn.kick.notified().await,
            st => {
                end(&conn, st);
                return;
            }
        }
    }
}

/// The connections a spinner walks, refreshed only when the set changed.
#[derive(Debug, Default)]
pub struct ConnCache {
    gen: usize,
    conns: Vec<Arc<Conn>>,
}

impl ConnCache {
    pub fn new() -> ConnCache {
        ConnCache {
            gen: usize::MAX,
            conns: Vec::new(),
        }
    }
}

/// One non-blocking pass over every connection's receive side, reading
/// with direct syscalls (no reactor), and one flush of each connection's
/// queued sends. Returns the work done (bytes read, flushes). A connection whose receive state another driver holds is
/// skipped: that driver is making the same progress.
pub fn poll_once(ep: &Arc<EpShared>, cache: &mut ConnCache) -> usize {
    let g = ep.conns_gen.load(Ordering::Acquire);
    if g != cache.gen {
        cache.conns = lock(&ep.conns).clone();
        cache.gen = g;
    }
    let mut work = 0;
    let mut acks_left = false;
    for c in &cache.conns {
        if c.abort_rx_if_dead(ep) {
            continue;
        }
        // Acks the last pass left for a frame to ride with: none came.
        c.flush_acks();
        // A large send the socket could not take at once continues here
        // rather than waiting for the reactor to wake the writer task.
        work += c.flush_if_queued();
        // A parked connection has nothing to read until it is woken.
        if c.parked.load(Ordering::Acquire) {
            continue;
        }
        let st = match c.rx.try_lock() {
            Ok(mut rx) => rx.progress(c, ep, &mut |b| {
                let r = c.read_direct(b);
                if let Ok(n) = &r {
                    work += n;
                }
                r
            }),
            Err(_) => continue,
        };
        end(c, st);
        c.abort_rx_if_dead(ep);
        acks_left |= c.acks_waiting();
    }
    if acks_left && ep.cfg.wait == weft_core::completion::WaitMode::Inline {
        ack_timer(ep);
    }
    work
}

/// Makes sure acks an inline pass left behind go out even if the waiter
/// that ran it returns and nobody polls again (the busy-poll thread's
/// next pass does this in that mode): once no waiter holds the endpoint,
/// a task sends them. One such task at a time; in a steady exchange it
/// sleeps through the hold and finds the acks already gone with frames.
fn ack_timer(ep: &Arc<EpShared>) {
    if ep.ack_timer.load(Ordering::Relaxed) || ep.ack_timer.swap(true, Ordering::AcqRel) {
        return;
    }
    let ep2 = ep.clone();
    ep.rt.spawn(async move {
        loop {
            let left = ep2.hold.remaining_ns();
            if left == 0 || ep2.is_closed() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_nanos(left)).await;
        }
        ep2.ack_timer.store(false, Ordering::Release);
        let conns = lock(&ep2.conns).clone();
        for c in &conns {
            c.flush_acks();
        }
    });
}

/// While an inline waiter spins on this endpoint it reads the sockets
/// itself; a reader woken by the reactor for the same bytes would only
/// find them gone, and on a small machine that wake-up costs the spinner
/// (or the peer) its core. So the reader waits until the waiter sleeps
/// (it says so through `idle`) or stops polling.
async fn stand_aside(ep: &EpShared) {
    if ep.cfg.wait != weft_core::completion::WaitMode::Inline {
        return;
    }
    weft_core::spin_hold::stand_aside(&ep.hold, || ep.inline_idle.notified(), tokio::time::sleep)
        .await;
}

fn busy_loop(ep: Arc<EpShared>) {
    let mut cache = ConnCache::new();
    while !ep.is_closed() {
        if ep.hold.park_while_held() {
            continue;
        }
        poll_once(&ep, &mut cache);
        if cache.conns.is_empty() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        } else {
            // Spinning must not starve the threads it completes work for:
            // on a machine with fewer cores than spinners, a bare spin
            // holds the core for a whole scheduler slice (milliseconds).
            std::thread::yield_now();
        }
    }
    ep.busy_running.store(false, Ordering::Release);
}

/// Inline progress: the waiting task runs [`poll_once`] itself. One
/// poller at a time; a second one finds the cache taken and returns, as
/// the first is already doing the work.
#[derive(Debug)]
pub struct InlineProgress {
    pub ep: Arc<EpShared>,
}

/// Lets go of connections that died since the inline cache was filled,
/// when no inline waiter is polling (one that is refreshes it itself).
pub fn trim_inline_cache(ep: &EpShared) {
    let gen = ep.conns_gen.load(Ordering::Acquire);
    if let Ok(mut c) = ep.inline_cache.try_lock() {
        if c.gen != gen {
            *c = ConnCache::new();
        }
    }
}

impl weft_core::progress::Progress for InlineProgress {
    fn progress(&self) -> usize {
        if self.ep.is_closed() {
            return 0;
        }
        self.ep.hold.waiter_active();
        match self.ep.inline_cache.try_lock() {
            Ok(mut c) => poll_once(&self.ep, &mut c),
            Err(_) => 0,
        }
    }

    fn idle(&self) {
        self.ep.hold.waiter_idle();
        self.ep.inline_idle.notify_waiters();
    }
}

impl InlineProgress {
    pub fn new(ep: Arc<EpShared>) -> InlineProgress {
        InlineProgress { ep }
    }
}
