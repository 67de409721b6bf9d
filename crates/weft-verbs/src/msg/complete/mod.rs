//! What the device holds for each posted operation, and how its work
//! completion ends it. Receives need more than a table of posted
//! operations: how they keep arrival order while one may be withdrawn is
//! [`rx_queue`]'s to say.

mod recv_finish;
mod recv_mem;
mod recv_side;
mod rx_queue;

use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::provider::PoolSend;
use weft_core::sync::lock;
use weft_core::Error;

use super::srx::SRX_WR_BIT;
use super::MsgShared;
use crate::cq_poller::CqSink;
use crate::local_mem::Src;
use crate::sys::{WcStatus, WorkCompletion};
use crate::user_bufs::RmaLocal;
use recv_finish::recv_error;

pub(super) use recv_mem::{RecvMem, Route};
pub(super) use recv_side::{
    cancel_flushing_on, deliver, offer_to_waiting, reroute_on, returned_arrival, RecvSide,
};
pub(super) use rx_queue::{RxQueue, Waiting};

/// Work request ids of an endpoint's own receives carry this bit (those
/// of a shared receive context carry [`SRX_WR_BIT`]), so a completion
/// finds its table without a lookup in the other.
pub(super) const RECV_WR_BIT: u64 = 1 << 62;

/// One posted send or RMA operation, owned by the in-flight table until
/// its completion: whatever the device may touch lives here until then.
pub(super) struct Inflight {
    pub done: OpDone,
    pub op: Held,
}

/// The memory behind a posted send or RMA operation.
pub(super) enum Held {
    /// A send of `len` bytes, copied inline into the work request.
    SendInline { len: usize },
    /// A send copied inline and posted unsignaled: nothing waits for it
    /// (an inject, or a send without `FI_COMPLETION`, with no counter),
    /// so the device reports it only if it fails; it ends with the next
    /// signaled work request's completion ([`end_quiet_before`]).
    SendQuiet { len: usize },
    /// A send copied into a bounce slot.
    SendSlot { len: usize, slot: u32 },
    /// A send from the caller's buffers, registered.
    SendRegistered { len: usize, _mrs: Vec<Src> },
    /// A send from one buffer of the caller's, registered (or a pool
    /// buffer).
    SendOne { len: usize, _src: Src },
    /// A send of a pool buffer the request carried itself
    /// (`SendReq::pool`): back in its pool when this is dropped.
    SendPool { len: usize, _buf: Option<PoolSend> },
    /// An RMA write or read of `len` bytes.
    Rma {
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    },
}

impl CqSink for MsgShared {
    fn on_completion(&self, wc: &WorkCompletion) {
        self.probe.heard();
        if let Some(err) = fatal(wc) {
            // Before the failed operation completes: whoever hears of it
            // finds the endpoint disabled already.
            self.critical(err);
        }
        if wc.wr_id == super::probe::PROBE_WR_ID {
            self.probe.landed();
            return;
        }
        if wc.wr_id & super::stream::STREAM_WR_BIT != 0 {
            if let Some(core) = self.stream_core() {
                core.on_completion(wc);
            }
            return;
        }
        if wc.wr_id & SRX_WR_BIT != 0 {
            // A receive of the shared receive context, taken by a message
            // that arrived here.
            if let Some(srx) = self.srx() {
                srx.on_completion(wc, &self.cfg);
            }
            return;
        }
        if wc.wr_id & RECV_WR_BIT != 0 {
            // Borrowed, not cloned: the guard, a temporary of the
            // condition, is held through the block either way (as it was
            // with a clone of the `Arc`), so this only saves its count's
            // increment and decrement.
            if let Some(l) = lock(&self.link).as_ref() {
                self.recv_side(&l.recv_pool)
                    .on_completion(wc, &Route::default());
            }
            return;
        }
        let (entry, quiet) = {
            let mut g = lock(&self.inflight);
            let quiet = end_quiet_before(&mut g, wc.wr_id);
            (g.remove(wc.wr_id), quiet)
        };
        if quiet > 0 {
            self.tx.release(quiet);
        }
        let Some(Inflight { done, op }) = entry else {
            return;
        };
        let len = match op {
            Held::Rma { len, kind, local } => return self.finish_rma(wc, done, len, kind, local),
            Held::SendInline { len }
            | Held::SendQuiet { len }
            | Held::SendRegistered { len, .. }
            | Held::SendOne { len, .. }
            | Held::SendPool { len, .. } => len,
            Held::SendSlot { len, slot } => {
                if let Some(l) = lock(&self.link).as_ref() {
                    l.send_pool.put(slot);
                }
                len
            }
        };
        // A send: its registrations (if any) were dropped with `op`.
        self.tx.release(1);
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                ..CqEntry::default()
            }),
            Some(e) => done.fail(CqErrEntry::new(0, OpFlags::SEND | OpFlags::MSG, e)),
        }
    }
}

/// Ends the unsignaled sends posted before work request `id`, whose
/// completion this is, and says how many (their credits come back).
/// An RC queue pair completes its send queue in order, and an unsignaled
/// request that fails is reported all the same (a completion in error is
/// always made, and takes its own entry by its id first): the quiet sends
/// ahead of a completed request succeeded. Nothing takes their success
/// (no entry, counter or future), so they are only dropped.
#[inline(always)]
pub(super) fn end_quiet_before(q: &mut super::post::InflightQueue, id: u64) -> usize {
    let mut n = 0;
    while let Some((
        front,
        Inflight {
            op: Held::SendQuiet { .. },
            ..
        },
    )) = q.front()
    {
        if front == id {
            break;
        }
        q.pop_front();
        n += 1;
    }
    n
}

impl MsgShared {
    /// Ends an RMA operation.
    fn finish_rma(
        &self,
        wc: &WorkCompletion,
        done: OpDone,
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    ) {
        self.tx.release(1);
        let bufs = local.into_bufs(wc.is_ok());
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                bufs,
                ..CqEntry::default()
            }),
            Some(e) => done.fail(CqErrEntry::new(0, kind, e).with_bufs(bufs)),
        }
    }
}

/// The critical error a completion reports, if it is one: any failure but
/// a flush. A failed work request leaves an RC queue pair in the error
/// state (a bad key or address at the peer, a message longer than the
/// receive it landed in, retries exhausted because the peer is gone);
/// flushes only follow from that state, whatever caused it (such an
/// error, a disconnect, our own close).
fn fatal(wc: &WorkCompletion) -> Option<Error> {
    match wc.status {
        WcStatus::Success | WcStatus::WrFlushErr => None,
        // Reported as the receive's own error is.
        _ if wc.wr_id & (RECV_WR_BIT | SRX_WR_BIT) != 0 => recv_error(wc),
        _ => wc.to_error(),
    }
}

#[cfg(test)]
pub(super) mod tests;
