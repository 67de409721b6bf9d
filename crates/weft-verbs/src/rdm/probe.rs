//! The liveness probe of RDM connections (`crate::liveness`).
//!
//! An RDM send that is owed the peer's "finished" (a rendezvous one, or
//! a delivery-complete one) has nothing of its own on the device once
//! its announcement is acknowledged: a peer that goes silent then would
//! leave it waiting for ever. Its connection probes the peer instead,
//! and a probe that fails kills the connection like any failed work
//! request, which fails the sends owed a "finished" with `ConnReset`.
//! Everything else an RDM endpoint waits on a peer for is a work request
//! that fails by itself once its retries are spent, and receives are not
//! tied to a peer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::sync::lock;

use super::{Conn, Op, RdmShared};
use crate::liveness;

impl RdmShared {
    /// Starts the endpoint's probe tick (one for all its connections).
    pub(super) fn start_probe(&self) {
        let t = liveness::every_tick(&self.rt, self.me.clone(), RdmShared::probe_tick);
        lock(&self.tasks).push(t);
    }

    /// One tick: every connection a send is owed a "finished" on that
    /// heard nothing since the last tick probes its peer. `false` once
    /// the endpoint is closed.
    fn probe_tick(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        let owed: Vec<Arc<Conn>> = lock(&self.rndv).values().map(|r| r.conn.clone()).collect();
        let conns: Vec<Arc<Conn>> = lock(&self.by_qp).values().cloned().collect();
        for c in conns {
            let waits = !c.is_dead() && owed.iter().any(|o| Arc::ptr_eq(o, &c));
            if c.probe.due(waits) {
                self.post_probe(&c);
            }
        }
        true
    }

    /// Posts `c`'s probe on send queue credits like any work request.
    /// Without them it waits for the next tick: either this connection
    /// has work requests out (which fail by themselves if the peer is
    /// silent), or traffic to other peers holds the endpoint's send
    /// queue credits, which only delays the probe.
    fn post_probe(&self, c: &Arc<Conn>) {
        if !self.take_credits(c) {
            return;
        }
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        match c.probe.post(&c.qp, wr_id) {
            Ok(()) => {
                g.insert(wr_id, Op::Probe { conn: c.clone() });
            }
            Err(_) => {
                drop(g);
                self.release_wr(c, super::TxHeld::Inline);
            }
        }
    }
}
