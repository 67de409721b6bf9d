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
use crate::bufs::{post_rma, RmaLocal};
use crate::sys::WorkCompletion;

/// An RMA operation on the wire.
pub(crate) struct RmaOpState {
    pub done: OpDone,
    pub len: usize,
    pub read: bool,
    pub held: RmaLocal,
    pub conn: Arc<Conn>,
}

fn kind(read: bool) -> OpFlags {
    if read {
        OpFlags::RMA | OpFlags::READ
    } else {
        OpFlags::RMA | OpFlags::WRITE
    }
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
        let read = matches!(req.op, RmaOp::Read { .. });
        let op = std::mem::replace(&mut req.op, RmaOp::Read { bufs: Vec::new() });
        let mut g = lock(&self.inflight);
        match post_rma(&c.qp, &self.res.pd, c.inline_max(), op, (addr, rkey), wr_id) {
            Ok(held) => {
                g.insert(
                    wr_id,
                    Op::Rma(RmaOpState {
                        done: req.done,
                        len,
                        read,
                        held,
                        conn: c.clone(),
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

    /// Ends an RMA operation that could not be posted.
    pub(crate) fn fail_rma(&self, req: RmaReq, err: Error) {
        self.tx.release(1);
        let read = matches!(req.op, RmaOp::Read { .. });
        let mut e = CqErrEntry::new(0, kind(read), err);
        if let RmaOp::Read { bufs } = req.op {
            e.bufs = bufs;
        }
        req.done.fail(e);
    }

    /// The device is done with an RMA operation.
    pub(crate) fn on_rma_done(&self, wc: &WorkCompletion, op: RmaOpState) {
        self.release_wr(&op.conn, super::TxHeld::Inline);
        self.tx.release(1);
        let bufs = op.held.into_bufs();
        match wc.to_error() {
            None => op.done.complete(CqEntry {
                len: op.len,
                bufs,
                ..CqEntry::default()
            }),
            Some(e) => {
                let mut entry = CqErrEntry::new(0, kind(op.read), e);
                entry.bufs = bufs;
                op.done.fail(entry);
            }
        }
    }
}
