//! Closing an endpoint bound to a shared receive context: the context's
//! receives that had matched messages this endpoint was still reading.
//!
//! A lone endpoint's close discards its outstanding operations without
//! completions (fi_endpoint(3)): they were its own. A context's receive
//! is the context's, which outlives the endpoint, so it must end: with
//! `Canceled` (as a cancel ends a receive; a message it had matched is
//! gone with the connections it was to be read over), its buffers handed
//! back and its credit returned to the context. It reports where a
//! context's receive that ends without a message does: on the first
//! bound endpoint still open, else on the queues it was pointed at.
//!
//! Where such a receive is at the close:
//! - queued behind its connection's send queue (`Deferred::Read`): never
//!   posted, it ends at once;
//! - cut off by its connection's death before (a connection's orphans):
//!   its read is in, it ends at once;
//! - a posted RDMA read (`Op::Read`): the device may still write into its
//!   buffers until the read's flushed completion (close moved every QP
//!   to the error state), and close stops the endpoint's CQ driver; so a
//!   task polls the CQ for those completions, ends each such receive when
//!   its completion is in, and drops every other completion (the
//!   endpoint's own operations end without completions). It stops once
//!   none is left, or after [`DRAIN_FOR`]; a read whose flush never came
//!   by then keeps its buffers registered (the device may own them) and
//!   its receive never ends, which a working device does not do;
//! - a receive waiting for a delivery-complete pull of its message
//!   (`Op::Pull`, `Deferred::Pull`): the pull ends `Canceled`, and its
//!   receive goes on to the next message (a claim fails), as when the
//!   pull fails on a live endpoint.

use std::sync::Arc;
use std::time::Duration;

use weft_core::multi_recv;
use weft_core::provider::RecvReq;
use weft_core::sync::lock;
use weft_core::Error;

use super::{Conn, Deferred, Op, RdmShared, ReadJob};
use crate::sys::WorkCompletion;

/// How long a closed endpoint keeps polling its CQ for the flushed
/// completions of a context's reads.
const DRAIN_FOR: Duration = Duration::from_secs(10);
/// The pause between two polls of that drain.
const DRAIN_PAUSE: Duration = Duration::from_millis(1);
/// Completions per poll of the drain.
const DRAIN_BATCH: usize = 32;

impl RdmShared {
    /// At close, bound to a context: ends the context's receives this
    /// endpoint held (see the module), given the connections close took
    /// down and the work their peers had waiting. Call with no lock of
    /// the endpoint held, after the QPs went to the error state.
    pub(crate) fn end_context_reads(self: &Arc<Self>, conns: &[Arc<Conn>], waiting: Vec<Deferred>) {
        for d in waiting {
            match d {
                Deferred::Read(job) => self.cancel_read(*job),
                Deferred::Pull(pull, _, _) => pull.finish(self, Err(Error::Canceled)),
                // The endpoint's own work ends without completions.
                _ => {}
            }
        }
        for c in conns {
            let cut: Vec<super::Orphan> = std::mem::take(&mut *lock(&c.orphans));
            self.cancel_orphans(cut);
        }
        if self.reads_posted() {
            let ep = self.clone();
            self.rt.spawn(async move { ep.drain_reads().await });
        }
    }

    /// The receives of a dead connection, at a close: they end rather
    /// than go back to the posted receives (a lone endpoint's are
    /// discarded, as its other operations are).
    pub(crate) fn cancel_orphans(&self, cut: Vec<super::Orphan>) {
        if self.srx.is_none() {
            return;
        }
        for o in cut {
            self.cancel_recv_at_close(o.req);
        }
    }

    /// Whether an RDMA read or a pull is still posted.
    fn reads_posted(&self) -> bool {
        lock(&self.inflight)
            .values()
            .any(|op| matches!(op, Op::Read { .. } | Op::Pull { .. }))
    }

    async fn drain_reads(self: Arc<Self>) {
        let start = tokio::time::Instant::now();
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(DRAIN_BATCH);
        while self.reads_posted() {
            if start.elapsed() >= DRAIN_FOR {
                tracing::warn!(local = %self.local, "reads of a closed endpoint never flushed");
                return;
            }
            wcs.clear();
            match self.res.cq.poll(&mut wcs, DRAIN_BATCH) {
                Ok(0) => tokio::time::sleep(DRAIN_PAUSE).await,
                Ok(_) => {
                    for wc in &wcs {
                        self.on_closed_completion(wc);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "polling a closed endpoint's CQ failed");
                    return;
                }
            }
        }
    }

    /// A completion polled after close: only a read's or a pull's ends
    /// anything (the device is done with their buffers).
    fn on_closed_completion(&self, wc: &WorkCompletion) {
        let Some(op) = lock(&self.inflight).remove(&wc.wr_id) else {
            return;
        };
        match op {
            Op::Read {
                mut job,
                into,
                conn,
                ..
            } => {
                conn.reads.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                match into {
                    super::ReadInto::Registered(mrs) => {
                        job.req.bufs = crate::user_bufs::unregister_before(mrs, job.req.bufs);
                    }
                    super::ReadInto::Staged(loan) => {
                        loan.land(false, 0, &mut []);
                    }
                }
                self.cancel_read(job);
            }
            Op::Pull { pull, into, .. } => {
                if let super::PullInto::Staged(loan) = into {
                    loan.land(false, 0, &mut []);
                }
                pull.finish(self, Err(Error::Canceled));
            }
            // Dropped here: the device is done with what it held.
            _ => {}
        }
    }

    /// Ends a context's receive matched to a message this closed
    /// endpoint can no longer read.
    fn cancel_read(&self, job: ReadJob) {
        let ReadJob { req, arriving, .. } = job;
        self.cancel_recv_at_close(req);
        // Unregistered once its part was ended.
        drop(arriving);
    }

    /// Ends a context's receive at this endpoint's close: `Canceled`,
    /// with its buffers; the part of a multi-receive buffer leaves its
    /// range unused instead, as when its message dies on a live one.
    fn cancel_recv_at_close(&self, req: RecvReq) {
        let Some(mut req) = multi_recv::unless_piece(self, req, false) else {
            return;
        };
        if let Some(c) = &self.srx {
            c.report_instead(&mut req);
        }
        weft_core::recv_completion::cancel_recv(self, req);
    }
}
