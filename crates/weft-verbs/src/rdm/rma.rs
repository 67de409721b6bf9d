//! RMA over the peer's RC connection: RDMA write and read straight
//! between the caller's buffer and the peer's registered region. The
//! local buffer is registered for the one operation (small writes go
//! inline and need none) and owned by the in-flight table until the
//! device is done with it.

use std::sync::Arc;

use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::provider::{RmaOp, RmaReq};
use weft_core::sync::lock;
use weft_core::Error;

use super::{Conn, Op, RdmShared};
use crate::sys::{Payload, SendOp, SendRequest, WorkCompletion};
use crate::user_bufs::{post_rma, wr_flags, RmaLocal};
use weft_core::wire::rdm::{Header, Op as WireOp};

/// An RMA operation on the wire.
pub(crate) struct RmaOpState {
    pub done: OpDone,
    pub len: usize,
    /// Completion flags (`RmaOp::flags`).
    pub kind: OpFlags,
    pub held: RmaLocal,
    pub conn: Arc<Conn>,
    /// The error of the write before this note (writes with remote CQ
    /// data): it, not the note's flush, is what the operation reports.
    pub err: Option<Error>,
}

impl RdmShared {
    /// Posts one RMA work request on `c`; on failure the request comes
    /// back whole.
    pub(crate) fn post_rma_on(
        &self,
        c: &Arc<Conn>,
        mut req: RmaReq,
    ) -> std::result::Result<(), (Error, RmaReq)> {
        let len = req.len();
        let wr_id = self.wr_id();
        let (addr, rkey) = match u32::try_from(req.key) {
            Ok(k) => (req.addr, k),
            // Verbs keys are 32 bits: no region has this key.
            Err(_) => return Err((Error::Access, req)),
        };
        let kind = req.op.flags();
        let data = match &req.op {
            RmaOp::Write { data, .. } => *data,
            RmaOp::Read { .. } | RmaOp::Atomic(_) => None,
        };
        let op = std::mem::replace(&mut req.op, RmaOp::Read { bufs: Vec::new() });
        // Cheap clones, to give back should the note fail to post.
        let keep = match (&op, data) {
            (RmaOp::Write { iov, .. }, Some(_)) => iov.clone(),
            _ => Vec::new(),
        };
        // With remote CQ data, the write gets its own work request and the
        // operation ends with the note after it.
        let write_id = if data.is_some() { self.wr_id() } else { wr_id };
        let mut g = lock(&self.inflight);
        match post_rma(
            &c.qp,
            (&c.lane.pd, c.lane.cache.as_ref(), Some(&c.lane.read_pool)),
            c.inline_max(),
            op,
            (addr, rkey),
            None,
            (write_id, wr_flags(req.flags)),
        ) {
            Ok(held) => {
                let held = match data {
                    None => held,
                    Some(d) => {
                        g.insert(
                            write_id,
                            Op::RmaPart {
                                held,
                                conn: c.clone(),
                                then: wr_id,
                            },
                        );
                        let mut h = Header::new(WireOp::WriteData);
                        h.data = Some(d);
                        h.len = len as u64;
                        let note = h.encode();
                        let posted = c.qp.post_send(&SendRequest::new(
                            wr_id,
                            SendOp::Send,
                            Payload::Inline(&note),
                        ));
                        if let Err(e) = posted {
                            // The write is on the queue: its completion
                            // frees its buffer; the connection goes so
                            // that it comes (flushed) now. The caller
                            // still holds its own bytes.
                            drop(g);
                            if let Some(ep) = self.me.upgrade() {
                                // In a task: the caller holds the peers'
                                // lock, which killing takes.
                                let c = c.clone();
                                self.rt.spawn(async move {
                                    super::peers::kill(&ep, &c, Error::ConnReset)
                                });
                            }
                            req.op = RmaOp::Write { iov: keep, data };
                            return Err((e, req));
                        }
                        RmaLocal::Inline
                    }
                };
                g.insert(
                    wr_id,
                    Op::Rma(RmaOpState {
                        done: req.done,
                        len,
                        kind,
                        held,
                        conn: c.clone(),
                        err: None,
                    }),
                );
                Ok(())
            }
            Err((e, op)) => {
                req.op = op;
                Err((e, req))
            }
        }
    }

    /// The write of a write with remote CQ data is done. On an error the
    /// note after it will be flushed: the operation reports this error.
    pub(crate) fn on_rma_part_done(&self, wc: &WorkCompletion, conn: &Arc<Conn>, then: u64) {
        if let Some(e) = wc.to_error() {
            if let Some(Op::Rma(st)) = lock(&self.inflight).get_mut(&then) {
                st.err.get_or_insert(e);
            }
            if e != Error::Canceled {
                if let Some(ep) = self.me.upgrade() {
                    super::peers::kill(&ep, conn, Error::ConnReset);
                }
            }
        }
    }

    /// Ends an RMA operation that could not be posted.
    pub(crate) fn fail_rma(&self, req: RmaReq, err: Error) {
        self.tx.release(1);
        let mut e = CqErrEntry::new(0, req.op.flags(), err);
        if let RmaOp::Read { bufs } = req.op {
            e.bufs = bufs;
        }
        req.done.fail(e);
    }

    /// The device is done with an RMA operation.
    pub(crate) fn on_rma_done(&self, wc: &WorkCompletion, op: RmaOpState) {
        self.release_wr(&op.conn, super::TxHeld::Inline);
        self.tx.release(1);
        let bufs = op.held.into_bufs(op.err.is_none() && wc.is_ok());
        match op.err.or(wc.to_error()) {
            None => op.done.complete(CqEntry {
                len: op.len,
                bufs,
                ..CqEntry::default()
            }),
            Some(e) => {
                let mut entry = CqErrEntry::new(0, op.kind, e);
                entry.bufs = bufs;
                op.done.fail(entry);
            }
        }
    }
}
