//! Finding an RC peer that went silent: finite transport retries and a
//! liveness probe.
//!
//! RC has no keepalive. A peer gone without a disconnect reaching us (a
//! crashed host, a cut link, a lost network interface) is noticed only
//! by a work request of ours that it fails to acknowledge, once the
//! transport retries are spent. Two things make that happen:
//!
//! * Every connection is made with [`RC_RETRIES`](crate::sys::RC_RETRIES)
//!   transport retries (the connecting side's count is used by both):
//!   not 7, which rxe takes as "retry for ever", so that a send to a
//!   silent peer fails there too.
//! * Whoever waits on the peer with nothing of its own on the send queue
//!   (a posted receive, a byte stream's reader, an RDM send owed the
//!   peer's "finished") has no work request to fail. Such a connection
//!   that has heard nothing for a [`PROBE_AFTER`] tick posts a
//!   zero-length RDMA write ([`Probe`]): the peer's device acknowledges
//!   it without its application; a silent peer does not, and the failed
//!   write ends the connection like any other failed work request.
//!
//! The cost stays off the per-message path: a completion only stores a
//! flag, and each connection (or RDM endpoint) has one timer tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use weft_core::Result;

use crate::sys::{Payload, QueuePair, SendOp, SendRequest};

/// How long a waited-on connection may hear nothing before it probes
/// its peer.
pub(crate) const PROBE_AFTER: Duration = Duration::from_secs(5);

/// One connection's probe: whether anything was heard since the last
/// tick, and whether a probe is on the device.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    heard: AtomicBool,
    out: AtomicBool,
}

impl Probe {
    /// A completion of the connection arrived. The only per-message cost.
    #[inline]
    pub(crate) fn heard(&self) {
        self.heard.store(true, Ordering::Relaxed);
    }

    /// The probe's own completion arrived (successful or not).
    pub(crate) fn landed(&self) {
        self.out.store(false, Ordering::SeqCst);
        self.heard();
    }

    /// One tick: whether to probe now, i.e. someone `waits`, nothing was
    /// heard since the last tick and no probe is out. Clears what was
    /// heard either way.
    pub(crate) fn due(&self, waits: bool) -> bool {
        let heard = self.heard.swap(false, Ordering::Relaxed);
        !heard && waits && !self.out.load(Ordering::Relaxed)
    }

    /// Posts the probe on `qp` as work request `wr_id` (signalled). It
    /// needs no buffer, credit or key at the peer: a zero-length write
    /// touches no memory, and rdma_cm's RC queue pairs take remote
    /// writes. The caller accounts for its send queue entry.
    pub(crate) fn post(&self, qp: &QueuePair, wr_id: u64) -> Result<()> {
        let wr = SendRequest::new(
            wr_id,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            Payload::Sges(&[]),
        );
        // Marked out before the post: its completion (which clears the
        // mark) may be reaped on another thread before `post_send`
        // returns here, and a mark set after it would then stay for
        // ever and stop every later probe.
        self.out.store(true, Ordering::SeqCst);
        qp.post_send(&wr)
            .inspect_err(|_| self.out.store(false, Ordering::SeqCst))
    }
}

/// Runs `tick` on what `of` points at every [`PROBE_AFTER`], until it is
/// gone or `tick` says the connection has ended.
pub(crate) fn every_tick<T: Send + Sync + 'static>(
    rt: &Handle,
    of: Weak<T>,
    tick: fn(&T) -> bool,
) -> AbortHandle {
    rt.spawn(async move {
        loop {
            tokio::time::sleep(PROBE_AFTER).await;
            match of.upgrade() {
                Some(t) if tick(&t) => {}
                _ => return,
            }
        }
    })
    .abort_handle()
}
