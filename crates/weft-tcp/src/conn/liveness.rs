//! What the sweeper reads of a connection: activity counters, how long it
//! has been quiet or stalled part-way through a frame, and whether the peer is gone.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weft_core::sync::lock;

use super::Conn;

#[derive(Debug)]
pub(super) struct SweepMark {
    /// `rx_bytes + tx_ops` when last looked at, and since when unchanged.
    seen: u64,
    since: Instant,
    /// Since when a frame has been seen part-way in, and `rx_bytes` then.
    mid_since: Option<(Instant, u64)>,
    gone_since: Option<Instant>,
}

impl SweepMark {
    pub(super) fn new() -> SweepMark {
        SweepMark {
            seen: 0,
            since: Instant::now(),
            mid_since: None,
            gone_since: None,
        }
    }
}

/// Bytes a connection must deliver per stall window while a frame is
/// part-way in: a peer trickling a byte now and then is as stalled as one
/// sending nothing (at the default window, 1.6 KB/s; loopback and any
/// real network are far above it).
pub const STALL_MIN_BYTES: u64 = 16 * 1024;

impl Conn {
    pub(super) fn touch_tx(&self) {
        self.tx_ops.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn touch_rx(&self, n: usize) {
        self.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// How long nothing has moved either way, as of `now` (the sweeper's
    /// clock).
    pub fn quiet_for(&self, now: Instant) -> Duration {
        let a = self
            .rx_bytes
            .load(Ordering::Relaxed)
            .wrapping_add(self.tx_ops.load(Ordering::Relaxed));
        let mut m = lock(&self.sweep);
        if m.seen != a {
            m.seen = a;
            m.since = now;
        }
        now.saturating_duration_since(m.since)
    }

    /// Whether a frame part-way in (`mid`) has been so for a whole
    /// `window` while fewer than [`STALL_MIN_BYTES`] arrived.
    pub fn stalled(&self, now: Instant, mid: bool, window: Duration) -> bool {
        let rx = self.rx_bytes.load(Ordering::Relaxed);
        let mut m = lock(&self.sweep);
        if !mid {
            m.mid_since = None;
            return false;
        }
        let (t0, b0) = *m.mid_since.get_or_insert((now, rx));
        if now.saturating_duration_since(t0) < window {
            return false;
        }
        if rx.wrapping_sub(b0) < STALL_MIN_BYTES {
            return true;
        }
        // Enough came in this window: judge the next one afresh.
        m.mid_since = Some((now, rx));
        false
    }

    /// How long the peer has been seen gone (its end closed), as of `now`;
    /// `None` while it is there. Read from the reactor's readiness without
    /// a read, since a parked connection must leave its bytes unread.
    pub fn gone_for(&self, now: Instant) -> Option<Duration> {
        use futures::FutureExt;
        let closed = self
            .tio
            .ready(tokio::io::Interest::READABLE)
            .now_or_never()
            .is_some_and(|r| r.map_or(true, |r| r.is_read_closed()));
        let mut m = lock(&self.sweep);
        if !closed {
            m.gone_since = None;
            return None;
        }
        let since = *m.gone_since.get_or_insert(now);
        Some(now.saturating_duration_since(since))
    }

    /// Bytes read so far (a retiring connection still receiving is not
    /// waited out as if it had stalled).
    pub fn rx_total(&self) -> u64 {
        self.rx_bytes.load(Ordering::Relaxed)
    }
}
