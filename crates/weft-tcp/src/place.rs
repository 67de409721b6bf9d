//! Placing a receive that holds its credit: matched against the buffered
//! messages, oldest first, or queued. A multi-receive buffer
//! (`FI_MULTI_RECV`, `weft_core::multi_recv`) may take several buffered
//! messages at once, each into a part of its own, and stays queued while
//! it has room; all of that happens under one hold of the matcher's lock,
//! so no message that arrives meanwhile can pass the ones it takes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::flags::OpFlags;
use weft_core::multi_recv;
use weft_core::provider::RecvReq;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use crate::endpoint::{spec_of, EpShared};
use crate::keys::Source;
use crate::rx::{copy_and_deliver, Unexpected};

impl EpShared {
    /// Matches `req` against the buffered messages, or queues it (at the
    /// head of the posted receives with `front`: a receive whose message
    /// died goes back where it was).
    pub(crate) fn place(&self, req: RecvReq, front: bool) {
        if let Some(l) = &self.srx {
            // A receive of the shared context (whose message died).
            l.core.place(req, front);
            return;
        }
        // The part of a buffer whose message died ends instead.
        let Some(req) = multi_recv::unless_piece(self, req, self.is_closed()) else {
            return;
        };
        let spec = spec_of(&req);
        let resolve = |s: &Source| self.resolve_src(s);
        let out = lock(&self.matcher).post_by(spec, req, &resolve, &mut multi_recv::take, front);
        if out.queued {
            // Checked after queueing: either this or `conn_failed` sees
            // the other's write, so no receive is left waiting on a
            // connection that is gone.
            if self.msg_dead.load(Ordering::Acquire) {
                self.flush_posted();
            }
            self.parked.wake_for_recv(&spec);
        }
        for (recv, info, payload) in out.matched {
            self.take_unexpected(recv, info, payload);
        }
        self.end_buffers(out.ended);
    }

    /// Reports the release of multi-receive buffers that ended without
    /// the message they were offered (it did not fit what was left, or
    /// nobody reads their stream any more). No lock of the endpoint held.
    pub(crate) fn end_buffers(&self, ended: impl IntoIterator<Item = RecvReq>) {
        for r in ended {
            multi_recv::end(self, r, false);
        }
    }

    /// A receive took an unexpected message: deliver it now, or when the
    /// rest of it arrives.
    pub(crate) fn take_unexpected(&self, req: RecvReq, info: MsgInfo, u: Arc<Unexpected>) {
        let mut g = lock(&u.st);
        if let Some(err) = g.failed {
            drop(g);
            if req.flags.contains(OpFlags::CLAIM) {
                // The caller asked for this very message; it is gone.
                crate::rx::fail_recv(self, req, info, 0, err);
                return;
            }
            // Its connection died mid-message: it was never delivered, so
            // the receive goes on to match the next message instead.
            self.place(req, false);
            return;
        }
        if g.complete {
            // Matched and complete: nobody else can reach this buffer now.
            let data = std::mem::take(&mut g.data);
            drop(g);
            copy_and_deliver(self, req, info, &data, &u.from);
        } else {
            g.waiter = Some(Box::new((req, info)));
        }
    }
}
