//! The endpoint's clock: one task per endpoint that looks at every
//! connection a few times per timeout and ends those that hold something
//! without making progress. The data path reads no clock; it only bumps
//! each connection's activity counter, which the sweeper compares.

use std::sync::Arc;
use std::time::Instant;

use weft_core::addr::encode_sockaddr;
use weft_core::attr::EpType;
use weft_core::provider::Iov;
use weft_core::sync::lock;
use weft_core::wire::{FrameKind, Header};
use weft_core::Error;

use crate::conn::Conn;
use crate::endpoint::EpShared;
use crate::frame::TxFrame;

/// A connection quiet for this long gives its staging buffer back (see
/// `RxMachine::shrink`); its next message allocates it again.
const SHRINK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the sweeper of `ep`; it ends with the endpoint.
pub fn start(ep: &Arc<EpShared>) {
    let weak = Arc::downgrade(ep);
    let every = ep.limits.sweep_interval();
    let t = ep.rt.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(ep) = weak.upgrade() else { return };
            if ep.is_closed() {
                return;
            }
            sweep(&ep, Instant::now());
        }
    });
    lock(&ep.tasks).push(t.abort_handle());
}

/// What the sweeper does to one connection.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Keep,
    /// Close it and say why on the EQ.
    Close(Error, &'static str),
    /// Idle: ask the peer to close (RDM reconnects on the next send).
    Retire,
}

fn sweep(ep: &Arc<EpShared>, now: Instant) {
    let conns = lock(&ep.conns).clone();
    for c in conns {
        match verdict(ep, &c, now) {
            Verdict::Keep => {}
            Verdict::Close(err, why) => {
                tracing::info!(peer = %c.peer, reason = why, "closing connection");
                ep.report(err, &c);
                c.fail(err);
            }
            Verdict::Retire => retire(ep, &c),
        }
    }
    crate::driver::trim_inline_cache(ep);
}

fn verdict(ep: &EpShared, c: &Conn, now: Instant) -> Verdict {
    if c.is_dead() {
        return Verdict::Keep;
    }
    let quiet = c.quiet_for(now);
    let l = &ep.limits;
    if c.retiring.load(std::sync::atomic::Ordering::Acquire) {
        return if quiet >= l.stall_timeout {
            Verdict::Close(Error::TimedOut, "peer did not close an idle connection")
        } else {
            Verdict::Keep
        };
    }
    // A driver holding the receive state is making progress right now.
    let Ok(mut rx) = c.rx.try_lock() else {
        return Verdict::Keep;
    };
    let (mid, parked) = (rx.mid_frame(), rx.is_parked());
    if !mid && quiet >= SHRINK_AFTER {
        rx.shrink();
        c.shrink_tls();
    }
    drop(rx);
    if c.stalled(now, mid, l.stall_timeout) {
        return Verdict::Close(Error::TimedOut, "frame stalled mid-way");
    }
    if parked {
        // Waiting for the application is not the peer's fault; waiting
        // for it after the peer has left only holds a descriptor.
        return match c.gone_for(now) {
            Some(g) if g >= l.stall_timeout => {
                Verdict::Close(Error::ConnReset, "peer left while its data waited")
            }
            _ => Verdict::Keep,
        };
    }
    match l.idle_timeout {
        Some(idle) if ep.ep_type == EpType::Rdm && !mid && quiet >= idle && c.tx_idle() => {
            Verdict::Retire
        }
        _ => Verdict::Keep,
    }
}

/// Idle close without losing anything in flight: sends stop using the
/// connection first, then `Shutdown` tells the peer, which re-sends what
/// it had not begun over a new connection, finishes what it had begun
/// and half-closes; this end keeps reading until then, sends what it
/// still owes and closes (`Conn::peer_ended`).
pub(crate) fn retire(ep: &EpShared, c: &Arc<Conn>) {
    tracing::debug!(peer = %c.peer, "retiring an idle connection");
    c.retiring.store(true, std::sync::atomic::Ordering::Release);
    ep.retire(c);
    c.send(TxFrame::new(
        Header::new(FrameKind::Shutdown),
        Iov::new(),
        None,
    ));
}

impl EpShared {
    /// Reports a connection the endpoint refused or closed on its EQ,
    /// with the peer's address. Bounded by the EQ's size: a flood of
    /// refusals must not grow an EQ nobody reads.
    pub fn report(&self, err: Error, c: &Conn) {
        self.report_addr(err, &c.peer);
    }

    /// [`report`](Self::report) for a peer without a connection.
    pub fn report_addr(&self, err: Error, peer: &std::net::SocketAddr) {
        self.cfg.eq_peer_error(err, encode_sockaddr(peer));
    }
}
