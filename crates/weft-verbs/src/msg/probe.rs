//! A peer that goes silent without a disconnect (its host or its link
//! gone) ends an MSG connection like any other critical error
//! (`crate::liveness`): a send to it fails once its transport retries
//! are spent (`TimedOut`), and a connection whose receives wait while it
//! hears nothing probes the peer with a zero-length RDMA write every
//! tick, whose failure is that critical error. The waiting receives are
//! then flushed (`Canceled`) and the EQ hears the error: none waits for
//! ever. A byte stream runs the same probe itself (`super::stream`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::sync::lock;

use super::MsgShared;
use crate::liveness;

/// The work request id of the probe, apart from every other kind's.
pub(super) const PROBE_WR_ID: u64 = 1 << 59;

impl MsgShared {
    /// Starts the connection's probe tick.
    pub(super) fn start_probe(self: &Arc<Self>) {
        let t = liveness::every_tick(&self.rt, Arc::downgrade(self), MsgShared::probe_tick);
        lock(&self.tasks).push(t);
    }

    /// One tick: while receives wait on the connection (its own, or
    /// those of the shared context it takes messages for) and nothing
    /// has been heard, probe the peer. Sends need no probe: each fails
    /// by itself. `false` once the connection has ended.
    fn probe_tick(&self) -> bool {
        if self.is_closed() || self.ended.load(Ordering::Acquire) {
            return false;
        }
        let waits = lock(&self.rxq).waiting() > 0 || self.srx().is_some_and(|x| x.waiting() > 0);
        if self.probe.due(waits) {
            if let Some(l) = lock(&self.link).clone() {
                // A post that fails (the queue pair is in the error
                // state) is tried again on the next tick, if still needed.
                let _ = self.probe.post(&l.qp, PROBE_WR_ID);
            }
        }
        true
    }
}
