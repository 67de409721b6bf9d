//! The posting front of an RDM endpoint, shared by its transmit and
//! receive contexts when it is scalable (`scalable`): the checks and
//! hand-off of a send, an RMA or atomic operation, a receive, and the
//! cancel of a receive.

use weft_core::flags::OpFlags;
use weft_core::provider::{RecvReq, Rejected, RmaOp, RmaReq, SendReq};
use weft_core::sync::lock;
use weft_core::Error;

use super::{Deferred, RdmShared};

impl RdmShared {
    /// Posts a send (the endpoint's, or a transmit context's).
    pub(crate) fn send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let ep = self;
        // After the state check, as before the shared checks of `admit`.
        let too_big = req.len() > ep.cfg.info.tx_attr.inject_size;
        if !ep.is_closed() && req.flags.contains(OpFlags::INJECT) && too_big {
            return Err(Rejected {
                err: Error::MsgSize,
                req,
            });
        }
        match ep.admit(req.dest, req.len(), req.iov.len()) {
            Ok((dest, lane)) => {
                ep.submit_to(dest, lane, Deferred::Send(req));
                Ok(())
            }
            Err(err) => Err(Rejected { err, req }),
        }
    }

    /// Posts an RMA or atomic operation (the endpoint's, or a transmit
    /// context's).
    pub(crate) fn rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        let ep = self;
        let n = match &req.op {
            RmaOp::Write { iov, .. } => iov.len(),
            RmaOp::Read { bufs } => bufs.len(),
            RmaOp::Atomic(_) => 1,
        };
        match ep.admit(req.dest, req.len(), n) {
            Ok((dest, lane)) => {
                ep.submit_to(dest, lane, Deferred::Rma(req));
                Ok(())
            }
            Err(err) => Err(Rejected { err, req }),
        }
    }

    /// Posts a receive (the endpoint's, or a receive context's).
    pub(crate) fn post_recv_checked(
        &self,
        req: RecvReq,
    ) -> std::result::Result<(), Rejected<RecvReq>> {
        let ep = self;
        if ep.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        if req.bufs.len() > ep.cfg.info.rx_attr.iov_limit {
            return Err(Rejected {
                err: Error::Inval,
                req,
            });
        }
        ep.recv(req)
    }

    /// Cancels a posted receive (`fi_cancel`).
    pub(crate) fn cancel_recv(&self, context: u64) -> bool {
        let r = lock(&self.side.matcher).cancel(context);
        let found = match r {
            Some((_, req)) => {
                weft_core::recv_completion::cancel_recv(self, req);
                true
            }
            None => false,
        };
        // A dropped stream withdraws its buffer last (it may have ended
        // already): the places of its messages still arriving are taken.
        self.hold_all_places();
        found
    }
}
