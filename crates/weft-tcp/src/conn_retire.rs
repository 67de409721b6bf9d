//! A connection's part in idle retirement (RDM): requests taken off a
//! retired connection for the next one, the peer's `Shutdown` (finish,
//! half-close, read on), and the end of the stream (close once what is
//! owed is out). The protocol is `docs/wire.md`, section 8.4.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::sync::lock;
use weft_core::wire::FrameKind;
use weft_core::Error;

use super::Conn;
use crate::endpoint::EpShared;
use crate::frame::TxFrame;

impl Conn {
    /// A request taken off this connection's queue before its first byte,
    /// to go over another: what it registered here comes back with it.
    pub(super) fn unqueued(&self, mut f: TxFrame) -> TxFrame {
        // Acks name this connection's sequence numbers: they mean nothing
        // on the next one.
        f.pre = None;
        if f.wait_ack {
            f.done = lock(&self.acks).remove(&f.hdr.seq).map(|(d, _)| d);
        }
        if matches!(
            f.hdr.kind,
            Some(FrameKind::RmaReadReq | FrameKind::AtomicReq)
        ) {
            f.read = lock(&self.reads).remove(&f.hdr.seq);
        }
        f
    }

    /// RDM: the peer retired this connection (its `Shutdown` arrived, after
    /// everything it sent before). Requests not yet begun go over the next
    /// connection, ahead of anything posted since; new ones follow them
    /// there. The connection itself stays up: a request part-way out is
    /// finished, then this end half-closes, and it reads on until the
    /// peer closes, so acks and answers the peer still owes for requests
    /// it already took arrive here instead of being failed. The sweeper
    /// bounds the wait (`retiring`, the stall timeout).
    pub fn peer_retired(&self, ep: &Arc<EpShared>) {
        if ep.is_closed() {
            return;
        }
        let mut peers = lock(&ep.peers);
        if self.is_dead() {
            return;
        }
        self.retiring.store(true, Ordering::Release);
        let (again, kick) = {
            let mut g = lock(&self.tx);
            g.retired = true;
            g.fin = true;
            let mut again = Vec::new();
            let mut kept = VecDeque::with_capacity(g.queue.len());
            let mut acks = Vec::new();
            for mut f in g.queue.drain(..) {
                if f.written == 0 && f.credit.held() {
                    // Acks riding on it are owed on this connection.
                    if let Some(p) = f.pre.take() {
                        acks.extend_from_slice(&p);
                    }
                    again.push(f);
                } else {
                    kept.push_back(f);
                }
            }
            g.queue = kept;
            g.acks_out.extend_from_slice(&acks);
            // The writer half-closes once the queue (and, on TLS, the
            // session's sealed records) is out; an idle one is woken for it.
            let kick = !g.writer_active;
            g.writer_active = true;
            (again, kick)
        };
        let again = again.into_iter().map(|f| self.unqueued(f)).collect();
        let failed = crate::connect::rdm_requeue(ep, &mut peers, self, again);
        drop(peers);
        for f in failed {
            self.fail_frame(f, Error::KeyRejected);
        }
        if kick {
            self.tx_kick.notify_one();
        }
    }

    /// RDM: a request that found this connection retired or retiring is
    /// sent to the peer over its next connection (it was never begun on
    /// this one); anything else fails with `Shutdown`.
    pub(super) fn resend(&self, f: TxFrame) {
        let ep = self.ep.upgrade().filter(|e| self.rdm && !e.is_closed());
        match ep {
            Some(ep) if f.written == 0 && f.credit.held() => {
                crate::connect::rdm_send(&ep, self.source(), f);
            }
            _ => self.fail_frame(f, Error::Shutdown),
        }
    }

    /// The peer's end of the stream was read (or, on MSG, its
    /// `Shutdown`). RDM: what is owed for the last frames (acks, read
    /// answers) goes out before the close, since the peer of a retired
    /// connection reads on until then for it.
    pub fn peer_ended(self: &Arc<Self>) {
        if self.rdm {
            self.flush_acks();
            if self.close_once_written() {
                return;
            }
        }
        self.fail(Error::Shutdown);
    }

    /// RDM, the peer's end of the stream read on a connection this end
    /// retired (the peer's half-close): whether to close only once what is
    /// queued (read answers, acks) is out, instead of now. Then the writer
    /// closes when it is (bounded by the sweeper: the connection is
    /// `retiring`, and looks quiet once bytes stop moving). Any other end
    /// of stream is a peer gone: the connection fails now, and requests
    /// not begun are sent again over a new one.
    fn close_once_written(&self) -> bool {
        if !self.rdm {
            return false;
        }
        let mut g = lock(&self.tx);
        let retired_here = g.retired && !g.fin;
        if !retired_here || g.closed.is_some() || (g.queue.is_empty() && !g.writer_active) {
            return false;
        }
        g.close_when_out = true;
        drop(g);
        self.retiring.store(true, Ordering::Release);
        true
    }
}
